# Source: tensorflow/docs, site/en/guide/effective_tf2.ipynb (code cells 6, 13, 15, 17 and 21:
# "Combine tf.data.Datasets and tf.function" and "Use Keras training loops", with the
# `tf.config.run_functions_eagerly(True)` line of the guide's "Debugging" section, cells 36-37,
# placed before the model is built, as that section places it before its model), commit
# 7c3650212740204359d4ceae481abc79345541be (2026-03-11; the notebook last changed in
# 8c7a74f2e413e3700ff168d45a5ea19ca3a66a45, 2021-12-07). Licence: Apache-2.0 (Copyright 2020
# The TensorFlow Authors). No tutorial or guide in tensorflow/docs (nor in tensorflow/text's
# docs) calls tf.config.run_functions_eagerly(True) and then `fit`: this guide is the one that
# recommends the switch for debugging Keras models and trains one with `fit`, so the two are
# joined here, in its own order (Debugging comes after the fit in the guide).
# Changed, and nothing else: tfds.load(name='mnist', with_info=True, as_supervised=True)
# (tensorflow_datasets, not installed here, and a download) -> the two splits it returns,
# tf.data Datasets of (image, label) pairs (28x28x1 uint8, int64 0-9), size(1280, 320) train
# and size(640, 64) test images (seeded by corpus_fit; numpy imported for it), and `info`
# (unused) and the tensorflow_datasets import dropped;
# STEPS_PER_EPOCH 5 -> size(20, 5) and NUM_EPOCHS 5 -> size(5, 1), so the fit runs long
# enough to time; the cell that only takes one batch for display and the evaluate/print lines
# after the fit removed; model.fit(...) -> history = corpus_fit.fit(model, ...) with the same
# arguments (the switch: see corpus_fit.py); corpus_fit.report(history) at the end.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import numpy as np
import tensorflow as tf

# tfds.load(name='mnist', ...)'s stand-in: the (image, label) splits it returns.
_rng = np.random.default_rng(0)


def _mnist_split(n):
  images = _rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8)
  labels = _rng.integers(0, 10, (n,), dtype=np.int64)
  return tf.data.Dataset.from_tensor_slices((images, labels))


datasets = {'train': _mnist_split(corpus_fit.size(1280, 320)),
            'test': _mnist_split(corpus_fit.size(640, 64))}
mnist_train, mnist_test = datasets['train'], datasets['test']

BUFFER_SIZE = 10 # Use a much larger value for real code
BATCH_SIZE = 64
NUM_EPOCHS = corpus_fit.size(5, 1)


def scale(image, label):
  image = tf.cast(image, tf.float32)
  image /= 255

  return image, label

train_data = mnist_train.map(scale).shuffle(BUFFER_SIZE).batch(BATCH_SIZE)
test_data = mnist_test.map(scale).batch(BATCH_SIZE)

STEPS_PER_EPOCH = corpus_fit.size(20, 5)

train_data = train_data.take(STEPS_PER_EPOCH)
test_data = test_data.take(STEPS_PER_EPOCH)

# From the guide's "Debugging" section.
tf.config.run_functions_eagerly(True)

model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(32, 3, activation='relu',
                           kernel_regularizer=tf.keras.regularizers.l2(0.02),
                           input_shape=(28, 28, 1)),
    tf.keras.layers.MaxPooling2D(),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dropout(0.1),
    tf.keras.layers.Dense(64, activation='relu'),
    tf.keras.layers.BatchNormalization(),
    tf.keras.layers.Dense(10)
])

# Model is the full model w/o custom layers
model.compile(optimizer='adam',
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=['accuracy'])

history = corpus_fit.fit(model, train_data, epochs=NUM_EPOCHS)

corpus_fit.report(history)
