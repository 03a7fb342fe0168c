# Source: keras-team/keras-io, examples/structured_data/structured_data_classification_from_scratch.py
# (Setup through "Train the model"), commit b0d68751937c4e87063b1267e6562a70481d879f (date not
# known here: the keras-io snapshot is too large to fetch, and the file index gives no date;
# this is the TensorFlow version with raw dict inputs, thal as a string Input).
# Licence: Apache-2.0 (Copyright The Keras Authors).
# Changed, and nothing else: the downloaded heart.csv -> a CSV of the same 14 columns, names and
# kinds of values (age, sex, cp, trestbps, chol, fbs, restecg, thalach, exang, slope, ca,
# target: integers; oldpeak: one-decimal floats; thal: the strings "fixed", "normal",
# "reversible"), size(1515, 303) rows (seeded by corpus_fit), written to a temporary folder
# and read back with the example's own pd.read_csv(file_url). pandas is not installed here,
# so when `import pandas` fails `pd` is a stand-in (below) that does the few things the
# example asks of pandas with the same results: read_csv (the csv module; int64, float64 or
# str object columns, as pandas infers them), .shape, .head(), .sample(frac, random_state),
# .drop(index), .index, .copy(), .pop(), len() and dict(dataframe); with pandas installed the
# real one runs. epochs 50 -> size(20, 2); the display-only lines (shape, head, the one-batch
# printout) and plot_model (needs pydot) removed, and the inference section after the fit;
# model.fit(...) -> history = corpus_fit.fit(model, ...) with the same arguments (the switch:
# see corpus_fit.py); corpus_fit.report(history) at the end.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import csv
import os
import tempfile

import numpy as np


class _FrameStandIn:
    """The part of a pandas DataFrame the example uses (pandas is not installed here)."""

    def __init__(self, columns, index):
        self._columns = columns
        self.index = index

    @property
    def shape(self):
        return (len(self.index), len(self._columns))

    def _take(self, positions):
        return _FrameStandIn({k: v[positions] for k, v in self._columns.items()},
                             self.index[positions])

    def head(self, n=5):
        return self._take(np.arange(min(n, len(self.index))))

    def sample(self, frac, random_state):
        rows = int(round(frac * len(self.index)))
        return self._take(np.random.RandomState(random_state).permutation(len(self.index))[:rows])

    def drop(self, labels):
        return self._take(np.nonzero(~np.isin(self.index, labels))[0])

    def copy(self):
        return _FrameStandIn({k: v.copy() for k, v in self._columns.items()}, self.index.copy())

    def pop(self, name):
        return self._columns.pop(name)

    def keys(self):
        return self._columns.keys()

    def __getitem__(self, name):
        return self._columns[name]

    def __len__(self):
        return len(self.index)


class _PandasStandIn:
    @staticmethod
    def read_csv(path):
        with open(path, newline="") as f:
            header, *rows = list(csv.reader(f))
        columns = {}
        for j, name in enumerate(header):
            values = [row[j] for row in rows]
            for kind in (np.int64, np.float64):
                try:
                    columns[name] = np.array([kind(v) if kind is np.float64 else int(v)
                                              for v in values], dtype=kind)
                    break
                except ValueError:
                    continue
            else:
                columns[name] = np.array(values, dtype=object)
        return _FrameStandIn(columns, np.arange(len(rows)))


# The downloaded heart.csv's stand-in: same columns and kinds of values, seeded.
_rng = np.random.default_rng(0)
_rows = corpus_fit.size(1515, 303)
_data_dir = tempfile.mkdtemp()
_csv_path = os.path.join(_data_dir, "heart.csv")
with open(_csv_path, "w", newline="") as _f:
    _w = csv.writer(_f)
    _w.writerow(["age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalach",
                 "exang", "oldpeak", "slope", "ca", "thal", "target"])
    for _ in range(_rows):
        _w.writerow([_rng.integers(29, 78), _rng.integers(0, 2), _rng.integers(0, 5),
                     _rng.integers(94, 201), _rng.integers(126, 565), _rng.integers(0, 2),
                     _rng.integers(0, 3), _rng.integers(71, 203), _rng.integers(0, 2),
                     f"{_rng.uniform(0.0, 6.2):.1f}", _rng.integers(1, 4),
                     _rng.integers(0, 4),
                     _rng.choice(["fixed", "normal", "reversible"], p=[0.1, 0.55, 0.35]),
                     _rng.integers(0, 2)])

"""
## Setup
"""

import tensorflow as tf
import numpy as np
try:
    import pandas as pd
except ImportError:  # not installed here: the stand-in above
    pd = _PandasStandIn
from tensorflow import keras
from tensorflow.keras import layers

"""
## Preparing the data

Let's download the data and load it into a Pandas dataframe:
"""

file_url = _csv_path
dataframe = pd.read_csv(file_url)

"""
Let's split the data into a training and validation set:
"""

val_dataframe = dataframe.sample(frac=0.2, random_state=1337)
train_dataframe = dataframe.drop(val_dataframe.index)

print(
    "Using %d samples for training and %d for validation"
    % (len(train_dataframe), len(val_dataframe))
)

"""
Let's generate `tf.data.Dataset` objects for each dataframe:
"""


def dataframe_to_dataset(dataframe):
    dataframe = dataframe.copy()
    labels = dataframe.pop("target")
    ds = tf.data.Dataset.from_tensor_slices((dict(dataframe), labels))
    ds = ds.shuffle(buffer_size=len(dataframe))
    return ds


train_ds = dataframe_to_dataset(train_dataframe)
val_ds = dataframe_to_dataset(val_dataframe)

"""
Let's batch the datasets:
"""

train_ds = train_ds.batch(32)
val_ds = val_ds.batch(32)

"""
## Feature preprocessing with Keras layers
"""

from tensorflow.keras.layers import IntegerLookup
from tensorflow.keras.layers import Normalization
from tensorflow.keras.layers import StringLookup


def encode_numerical_feature(feature, name, dataset):
    # Create a Normalization layer for our feature
    normalizer = Normalization()

    # Prepare a Dataset that only yields our feature
    feature_ds = dataset.map(lambda x, y: x[name])
    feature_ds = feature_ds.map(lambda x: tf.expand_dims(x, -1))

    # Learn the statistics of the data
    normalizer.adapt(feature_ds)

    # Normalize the input feature
    encoded_feature = normalizer(feature)
    return encoded_feature


def encode_categorical_feature(feature, name, dataset, is_string):
    lookup_class = StringLookup if is_string else IntegerLookup
    # Create a lookup layer which will turn strings into integer indices
    lookup = lookup_class(output_mode="binary")

    # Prepare a Dataset that only yields our feature
    feature_ds = dataset.map(lambda x, y: x[name])
    feature_ds = feature_ds.map(lambda x: tf.expand_dims(x, -1))

    # Learn the set of possible string values and assign them a fixed integer index
    lookup.adapt(feature_ds)

    # Turn the string input into integer indices
    encoded_feature = lookup(feature)
    return encoded_feature


"""
## Build a model

With this done, we can create our end-to-end model:
"""

# Categorical features encoded as integers
sex = keras.Input(shape=(1,), name="sex", dtype="int64")
cp = keras.Input(shape=(1,), name="cp", dtype="int64")
fbs = keras.Input(shape=(1,), name="fbs", dtype="int64")
restecg = keras.Input(shape=(1,), name="restecg", dtype="int64")
exang = keras.Input(shape=(1,), name="exang", dtype="int64")
ca = keras.Input(shape=(1,), name="ca", dtype="int64")

# Categorical feature encoded as string
thal = keras.Input(shape=(1,), name="thal", dtype="string")

# Numerical features
age = keras.Input(shape=(1,), name="age")
trestbps = keras.Input(shape=(1,), name="trestbps")
chol = keras.Input(shape=(1,), name="chol")
thalach = keras.Input(shape=(1,), name="thalach")
oldpeak = keras.Input(shape=(1,), name="oldpeak")
slope = keras.Input(shape=(1,), name="slope")

all_inputs = [
    sex,
    cp,
    fbs,
    restecg,
    exang,
    ca,
    thal,
    age,
    trestbps,
    chol,
    thalach,
    oldpeak,
    slope,
]

# Integer categorical features
sex_encoded = encode_categorical_feature(sex, "sex", train_ds, False)
cp_encoded = encode_categorical_feature(cp, "cp", train_ds, False)
fbs_encoded = encode_categorical_feature(fbs, "fbs", train_ds, False)
restecg_encoded = encode_categorical_feature(restecg, "restecg", train_ds, False)
exang_encoded = encode_categorical_feature(exang, "exang", train_ds, False)
ca_encoded = encode_categorical_feature(ca, "ca", train_ds, False)

# String categorical features
thal_encoded = encode_categorical_feature(thal, "thal", train_ds, True)

# Numerical features
age_encoded = encode_numerical_feature(age, "age", train_ds)
trestbps_encoded = encode_numerical_feature(trestbps, "trestbps", train_ds)
chol_encoded = encode_numerical_feature(chol, "chol", train_ds)
thalach_encoded = encode_numerical_feature(thalach, "thalach", train_ds)
oldpeak_encoded = encode_numerical_feature(oldpeak, "oldpeak", train_ds)
slope_encoded = encode_numerical_feature(slope, "slope", train_ds)

all_features = layers.concatenate(
    [
        sex_encoded,
        cp_encoded,
        fbs_encoded,
        restecg_encoded,
        exang_encoded,
        slope_encoded,
        ca_encoded,
        thal_encoded,
        age_encoded,
        trestbps_encoded,
        chol_encoded,
        thalach_encoded,
        oldpeak_encoded,
    ]
)
x = layers.Dense(32, activation="relu")(all_features)
x = layers.Dropout(0.5)(x)
output = layers.Dense(1, activation="sigmoid")(x)
model = keras.Model(all_inputs, output)
model.compile("adam", "binary_crossentropy", metrics=["accuracy"])

"""
## Train the model
"""

history = corpus_fit.fit(model, train_ds, epochs=corpus_fit.size(20, 2), validation_data=val_ds)

corpus_fit.report(history)
