# Source: tensorflow/docs, site/en/tutorials/structured_data/preprocessing_layers.ipynb (code
# cells), commit 7c3650212740204359d4ceae481abc79345541be (2026-03-11). Licence: Apache-2.0
# (Copyright 2019 The TensorFlow Authors).
# Changed, and nothing else: the downloaded petfinder-mini.csv -> columns of the same names and
# dtypes (Type, Breed1, Gender, Color1, Color2, MaturitySize, FurLength,
# Vaccinated, Sterilized, Health, Description: strings; Age, Fee, PhotoAmt, AdoptionSpeed:
# int64), size(2000, 400) rows (seeded by corpus_fit), held in a dict of numpy columns since
# pandas is not installed here: drop, sample(frac=1) + np.split, .copy(), .pop, len and
# to_numpy() done on that dict with the same results (strings as numpy object arrays, as
# pandas holds them); epochs 10 -> size(3, 1); the display-only
# cells (the single-column previews, plot_model, which needs pydot) and the cells after the fit
# (evaluate, save, reload, predict) removed; model.fit(...) -> corpus_fit.fit(model, ...) with
# the same arguments (the switch: see corpus_fit.py); corpus_fit.report(history) at the end.
# Kept as the tutorial has them: compile(run_eagerly=True), and df_to_dataset's features taken
# from `dataframe` (so 'target' is among the dataset's features, not an input of the model).
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import numpy as np
import tensorflow as tf

from tensorflow.keras import layers

rng = np.random.default_rng(0)
rows = corpus_fit.size(2000, 400)


def pick(*values):
  return rng.choice(np.array(values, dtype=object), rows)


# The CSV's stand-in, as columns (pandas is not installed here: see the header).
dataframe = {
    'Type': pick('Cat', 'Dog'), 'Age': rng.integers(0, 120, rows),
    'Breed1': pick('Tabby', 'Mixed Breed', 'Domestic Short Hair', 'Poodle', 'Terrier'),
    'Gender': pick('Male', 'Female'), 'Color1': pick('Black', 'Brown', 'Golden', 'White'),
    'Color2': pick('No Color', 'White', 'Brown', 'Cream'),
    'MaturitySize': pick('Small', 'Medium', 'Large'), 'FurLength': pick('Short', 'Medium', 'Long'),
    'Vaccinated': pick('No', 'Yes', 'Not Sure'), 'Sterilized': pick('No', 'Yes', 'Not Sure'),
    'Health': pick('Healthy', 'Minor Injury'), 'Fee': rng.integers(0, 300, rows),
    'Description': pick('Nibble is a 3+ month old ball of cuteness.', 'A playful dog.'),
    'PhotoAmt': rng.integers(0, 30, rows), 'AdoptionSpeed': rng.integers(0, 5, rows)}

# In the original dataset, `'AdoptionSpeed'` of `4` indicates
# a pet was not adopted.
dataframe['target'] = np.where(dataframe['AdoptionSpeed']==4, 0, 1)

# Drop unused features.
dataframe = {k: v for k, v in dataframe.items() if k not in ('AdoptionSpeed', 'Description')}

order = rng.permutation(rows)
train, val, test = ({k: v[part] for k, v in dataframe.items()}
                    for part in np.split(order, [int(0.8*rows), int(0.9*rows)]))

print(len(train['target']), 'training examples')
print(len(val['target']), 'validation examples')
print(len(test['target']), 'test examples')

def df_to_dataset(dataframe, shuffle=True, batch_size=32):
  df = dataframe.copy()
  labels = df.pop('target')
  df = {key: value[:,tf.newaxis] for key, value in dataframe.items()}
  ds = tf.data.Dataset.from_tensor_slices((dict(df), labels))
  if shuffle:
    ds = ds.shuffle(buffer_size=len(labels))
  ds = ds.batch(batch_size)
  ds = ds.prefetch(batch_size)
  return ds

def get_normalization_layer(name, dataset):
  # Create a Normalization layer for the feature.
  normalizer = layers.Normalization(axis=None)

  # Prepare a Dataset that only yields the feature.
  feature_ds = dataset.map(lambda x, y: x[name])

  # Learn the statistics of the data.
  normalizer.adapt(feature_ds)

  return normalizer

def get_category_encoding_layer(name, dataset, dtype, max_tokens=None):
  # Create a layer that turns strings into integer indices.
  if dtype == 'string':
    index = layers.StringLookup(max_tokens=max_tokens)
  # Otherwise, create a layer that turns integer values into integer indices.
  else:
    index = layers.IntegerLookup(max_tokens=max_tokens)

  # Prepare a `tf.data.Dataset` that only yields the feature.
  feature_ds = dataset.map(lambda x, y: x[name])

  # Learn the set of possible values and assign them a fixed integer index.
  index.adapt(feature_ds)

  # Encode the integer indices.
  encoder = layers.CategoryEncoding(num_tokens=index.vocabulary_size())

  # Apply multi-hot encoding to the indices. The lambda function captures the
  # layer, so you can use them, or include them in the Keras Functional model later.
  return lambda feature: encoder(index(feature))

batch_size = 256
train_ds = df_to_dataset(train, batch_size=batch_size)
val_ds = df_to_dataset(val, shuffle=False, batch_size=batch_size)
test_ds = df_to_dataset(test, shuffle=False, batch_size=batch_size)

all_inputs = {}
encoded_features = []

# Numerical features.
for header in ['PhotoAmt', 'Fee']:
  numeric_col = tf.keras.Input(shape=(1,), name=header)
  normalization_layer = get_normalization_layer(header, train_ds)
  encoded_numeric_col = normalization_layer(numeric_col)
  all_inputs[header] = numeric_col
  encoded_features.append(encoded_numeric_col)

age_col = tf.keras.Input(shape=(1,), name='Age', dtype='int64')

encoding_layer = get_category_encoding_layer(name='Age',
                                             dataset=train_ds,
                                             dtype='int64',
                                             max_tokens=5)
encoded_age_col = encoding_layer(age_col)
all_inputs['Age'] = age_col
encoded_features.append(encoded_age_col)

categorical_cols = ['Type', 'Color1', 'Color2', 'Gender', 'MaturitySize',
                    'FurLength', 'Vaccinated', 'Sterilized', 'Health', 'Breed1']

for header in categorical_cols:
  categorical_col = tf.keras.Input(shape=(1,), name=header, dtype='string')
  encoding_layer = get_category_encoding_layer(name=header,
                                               dataset=train_ds,
                                               dtype='string',
                                               max_tokens=5)
  encoded_categorical_col = encoding_layer(categorical_col)
  all_inputs[header] = categorical_col
  encoded_features.append(encoded_categorical_col)

all_features = tf.keras.layers.concatenate(encoded_features)
x = tf.keras.layers.Dense(32, activation="relu")(all_features)
x = tf.keras.layers.Dropout(0.5)(x)
output = tf.keras.layers.Dense(1)(x)

model = tf.keras.Model(all_inputs, output)

model.compile(optimizer='adam',
              loss=tf.keras.losses.BinaryCrossentropy(from_logits=True),
              metrics=["accuracy"],
              run_eagerly=True)

history = corpus_fit.fit(model, train_ds, epochs=corpus_fit.size(3, 1), validation_data=val_ds)

corpus_fit.report(history)
