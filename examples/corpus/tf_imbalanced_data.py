# Source: tensorflow/docs, site/en/tutorials/structured_data/imbalanced_data.ipynb (code cells),
# commit 7c3650212740204359d4ceae481abc79345541be (2026-03-11). Licence: Apache-2.0 (Copyright
# 2019 The TensorFlow Authors).
# Changed, and nothing else: pd.read_csv(creditcard.csv) -> columns of the same names and dtypes
# (Time, V1-V28, Amount float64; Class int64 with about 0.5% positives), size(20000, 4000) rows
# (seeded by corpus_fit), held in a dict of numpy columns since pandas is not installed here:
# the DataFrame steps (pop, log, train_test_split, the label/feature arrays) done on those
# columns with the same results; EPOCHS 100 -> size(10, 2); of the tutorial's fits, the one kept is
# the class-weighted model's (`class_weight`, early stopping, validation data), its earlier
# fits, predictions, evaluations and the plotting (matplotlib, seaborn) removed;
# weighted_model.fit(...) -> corpus_fit.fit(weighted_model, ...) with the same arguments (the
# switch: see corpus_fit.py); corpus_fit.report(weighted_history) at the end.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import tensorflow as tf
from tensorflow import keras

import os
import tempfile

import numpy as np

from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

# The CSV's stand-in, as columns (pandas is not installed here: see the header).
rng = np.random.default_rng(0)
rows = corpus_fit.size(20000, 4000)
raw_columns = {"Time": np.sort(rng.uniform(0, 172792, rows)),
               **{f"V{i}": rng.normal(size=rows) for i in range(1, 29)},
               "Amount": rng.exponential(88.0, rows),
               "Class": (rng.uniform(size=rows) < 0.005).astype("int64")}

neg, pos = np.bincount(raw_columns['Class'])
total = neg + pos
print('Examples:\n    Total: {}\n    Positive: {} ({:.2f}% of total)\n'.format(
    total, pos, 100 * pos / total))

cleaned_columns = dict(raw_columns)

# You don't want the `Time` column.
cleaned_columns.pop('Time')

# The `Amount` column covers a huge range. Convert to log-space.
eps = 0.001 # 0 => 0.1¢
cleaned_columns['Log Amount'] = np.log(cleaned_columns.pop('Amount')+eps)
cleaned_labels = cleaned_columns.pop('Class')
cleaned_features = np.stack(list(cleaned_columns.values()), axis=1)

# Use a utility from sklearn to split and shuffle your dataset.
train_features, test_features, train_labels, test_labels = train_test_split(
    cleaned_features, cleaned_labels, test_size=0.2)
train_features, val_features, train_labels, val_labels = train_test_split(
    train_features, train_labels, test_size=0.2)

# Form np arrays of labels and features.
train_labels = np.array(train_labels).reshape(-1, 1)
bool_train_labels = train_labels[:, 0] != 0
val_labels = np.array(val_labels).reshape(-1, 1)
test_labels = np.array(test_labels).reshape(-1, 1)

scaler = StandardScaler()

train_features = scaler.fit_transform(train_features)

val_features = scaler.transform(val_features)
test_features = scaler.transform(test_features)

train_features = np.clip(train_features, -5, 5)
val_features = np.clip(val_features, -5, 5)
test_features = np.clip(test_features, -5, 5)

METRICS = [
      keras.metrics.BinaryCrossentropy(name='cross entropy'),  # same as model's loss
      keras.metrics.MeanSquaredError(name='Brier score'),
      keras.metrics.TruePositives(name='tp'),
      keras.metrics.FalsePositives(name='fp'),
      keras.metrics.TrueNegatives(name='tn'),
      keras.metrics.FalseNegatives(name='fn'),
      keras.metrics.BinaryAccuracy(name='accuracy'),
      keras.metrics.Precision(name='precision'),
      keras.metrics.Recall(name='recall'),
      keras.metrics.AUC(name='auc'),
      keras.metrics.AUC(name='prc', curve='PR'), # precision-recall curve
]

def make_model(metrics=METRICS, output_bias=None):
  if output_bias is not None:
    output_bias = tf.keras.initializers.Constant(output_bias)
  model = keras.Sequential([
      keras.layers.Dense(
          16, activation='relu',
          input_shape=(train_features.shape[-1],)),
      keras.layers.Dropout(0.5),
      keras.layers.Dense(1, activation='sigmoid',
                         bias_initializer=output_bias),
  ])

  model.compile(
      optimizer=keras.optimizers.Adam(learning_rate=1e-3),
      loss=keras.losses.BinaryCrossentropy(),
      metrics=metrics)

  return model

EPOCHS = corpus_fit.size(10, 2)
BATCH_SIZE = 2048

def early_stopping():
 return tf.keras.callbacks.EarlyStopping(
    monitor='val_prc',
    verbose=1,
    patience=10,
    mode='max',
    restore_best_weights=True)

initial_bias = np.log([pos/neg])
model = make_model(output_bias=initial_bias)
initial_weights = os.path.join(tempfile.mkdtemp(), 'initial.weights.h5')
model.save_weights(initial_weights)

# Scaling by total/2 helps keep the loss to a similar magnitude.
# The sum of the weights of all examples stays the same.
weight_for_0 = (1 / neg) * (total / 2.0)
weight_for_1 = (1 / pos) * (total / 2.0)

class_weight = {0: weight_for_0, 1: weight_for_1}

print('Weight for class 0: {:.2f}'.format(weight_for_0))
print('Weight for class 1: {:.2f}'.format(weight_for_1))

weighted_model = make_model()
weighted_model.load_weights(initial_weights)

weighted_history = corpus_fit.fit(
    weighted_model,
    train_features,
    train_labels,
    batch_size=BATCH_SIZE,
    epochs=EPOCHS,
    callbacks=[early_stopping()],
    validation_data=(val_features, val_labels),
    # The class weights go here
    class_weight=class_weight)

corpus_fit.report(weighted_history)
