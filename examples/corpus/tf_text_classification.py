# Source: tensorflow/docs, site/en/tutorials/keras/text_classification.ipynb (code cells),
# commit 7c3650212740204359d4ceae481abc79345541be (2026-03-11). Licence: Apache-2.0 (Copyright
# 2019 The TensorFlow Authors).
# Changed, and nothing else: the downloaded aclImdb folders -> folders of the same layout
# (train/{neg,pos}, test/{neg,pos}, one review a .txt file; the 'unsup' folder, which the
# tutorial deletes, not written) in a temporary folder, holding size(2000, 400) training and
# size(400, 96) test reviews of 20-200 words from a 2,000-word vocabulary with an HTML break
# and punctuation (seeded by corpus_fit), read by the tutorial's own
# text_dataset_from_directory calls; epochs 10 -> size(3, 1); the display-only
# cells (printing reviews and vocabulary) and the cells after the fit (evaluate, plots, export
# model) removed; model.fit(...) -> corpus_fit.fit(model, ...) with the same arguments (the
# switch: see corpus_fit.py); corpus_fit.report(history) at the end.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import os
import re
import string
import tempfile

import numpy as np
import tensorflow as tf

from tensorflow.keras import layers
from tensorflow.keras import losses

batch_size = 32
seed = 42

# The downloaded folders' stand-in: synthetic reviews written as aclImdb's files are
# (train/{neg,pos}, test/{neg,pos}, one review a file), read by the tutorial's own calls.
rng = np.random.default_rng(0)
words = np.array([f"w{i}" for i in range(2000)] + ["the", "movie", "great", "bad"])
dataset_dir = tempfile.mkdtemp()
for subset, count in (("train", corpus_fit.size(2000, 400)), ("test", corpus_fit.size(400, 96))):
  for label in ("neg", "pos"):
    os.makedirs(os.path.join(dataset_dir, 'aclImdb', subset, label))
    for i in range(count // 2):
      with open(os.path.join(dataset_dir, 'aclImdb', subset, label, f"{i}_7.txt"), "w") as f:
        f.write(" ".join(rng.choice(words, rng.integers(20, 200))) + ". <br />Good!")
train_dir = os.path.join(dataset_dir, 'aclImdb', 'train')
test_dir = os.path.join(dataset_dir, 'aclImdb', 'test')

raw_train_ds = tf.keras.utils.text_dataset_from_directory(
    train_dir,
    batch_size=batch_size,
    validation_split=0.2,
    subset='training',
    seed=seed)

raw_val_ds = tf.keras.utils.text_dataset_from_directory(
    train_dir,
    batch_size=batch_size,
    validation_split=0.2,
    subset='validation',
    seed=seed)

raw_test_ds = tf.keras.utils.text_dataset_from_directory(
    test_dir,
    batch_size=batch_size)

def custom_standardization(input_data):
  lowercase = tf.strings.lower(input_data)
  stripped_html = tf.strings.regex_replace(lowercase, '<br />', ' ')
  return tf.strings.regex_replace(stripped_html,
                                  '[%s]' % re.escape(string.punctuation),
                                  '')

max_features = 10000
sequence_length = 250

vectorize_layer = layers.TextVectorization(
    standardize=custom_standardization,
    max_tokens=max_features,
    output_mode='int',
    output_sequence_length=sequence_length)

# Make a text-only dataset (without labels), then call adapt
train_text = raw_train_ds.map(lambda x, y: x)
vectorize_layer.adapt(train_text)

def vectorize_text(text, label):
  text = tf.expand_dims(text, -1)
  return vectorize_layer(text), label

train_ds = raw_train_ds.map(vectorize_text)
val_ds = raw_val_ds.map(vectorize_text)
test_ds = raw_test_ds.map(vectorize_text)

AUTOTUNE = tf.data.AUTOTUNE

train_ds = train_ds.cache().prefetch(buffer_size=AUTOTUNE)
val_ds = val_ds.cache().prefetch(buffer_size=AUTOTUNE)
test_ds = test_ds.cache().prefetch(buffer_size=AUTOTUNE)

embedding_dim = 16

model = tf.keras.Sequential([
  layers.Embedding(max_features, embedding_dim),
  layers.Dropout(0.2),
  layers.GlobalAveragePooling1D(),
  layers.Dropout(0.2),
  layers.Dense(1, activation='sigmoid')])

model.summary()

model.compile(loss=losses.BinaryCrossentropy(),
              optimizer='adam',
              metrics=[tf.metrics.BinaryAccuracy(threshold=0.5)])

epochs = corpus_fit.size(3, 1)
history = corpus_fit.fit(
    model,
    train_ds,
    validation_data=val_ds,
    epochs=epochs)

corpus_fit.report(history)
