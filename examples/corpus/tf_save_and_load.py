# Source: tensorflow/docs, site/en/tutorials/keras/save_and_load.ipynb (code cells 9-34: setup,
# data, model, "Save checkpoints during training", "Checkpoint callback options", "Manually save
# weights"), commit 7c3650212740204359d4ceae481abc79345541be (2026-03-11). Licence: Apache-2.0
# (Copyright 2019 The TensorFlow Authors; the notebook also carries an MIT notice, Copyright (c)
# 2017 François Chollet).
# Changed, and nothing else: tf.keras.datasets.mnist.load_data() -> random uint8 images
# (N, 28, 28) and uint8 labels 0-9 of MNIST's shapes and dtypes, N = size(1000, 256) for both
# splits (seeded by corpus_fit; the tutorial keeps the first 1,000 of each, kept); epochs 10 ->
# size(10, 2) and 50 -> size(30, 5); the `!pip install` cell dropped; the whole-model sections
# after cell 34 (another fit to save a .keras file, SavedModel and HDF5 with `!mkdir`/`!ls`
# shell lines) not taken; both model.fit(...) calls -> corpus_fit.fit(model, ...) with the same
# arguments (the switch: see corpus_fit.py), the second one's result kept as `history`;
# corpus_fit.report(history) at the end. The checkpoints are written where the tutorial writes
# them (training_1/, training_2/, checkpoints/ under the working folder).
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import os

import numpy as np
import tensorflow as tf
from tensorflow import keras

print(tf.version.VERSION)

# MNIST's stand-in (see the header).
rng = np.random.default_rng(0)
samples = corpus_fit.size(1000, 256)
(train_images, train_labels), (test_images, test_labels) = (
    (rng.integers(0, 256, (samples, 28, 28), dtype="uint8"),
     rng.integers(0, 10, (samples,), dtype="uint8")),
    (rng.integers(0, 256, (samples, 28, 28), dtype="uint8"),
     rng.integers(0, 10, (samples,), dtype="uint8")),
)

train_labels = train_labels[:1000]
test_labels = test_labels[:1000]

train_images = train_images[:1000].reshape(-1, 28 * 28) / 255.0
test_images = test_images[:1000].reshape(-1, 28 * 28) / 255.0

# Define a simple sequential model
def create_model():
  model = tf.keras.Sequential([
    keras.layers.Dense(512, activation='relu', input_shape=(784,)),
    keras.layers.Dropout(0.2),
    keras.layers.Dense(10)
  ])

  model.compile(optimizer='adam',
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=[tf.keras.metrics.SparseCategoricalAccuracy()])

  return model

# Create a basic model instance
model = create_model()

# Display the model's architecture
model.summary()

checkpoint_path = "training_1/cp.weights.h5" # Since you're only saving weights, you should use the .weights.h5 extension. If you're saving the whole model, you would use the .keras extension instead
checkpoint_dir = os.path.dirname(checkpoint_path)

# Create a callback that saves the model's weights
cp_callback = tf.keras.callbacks.ModelCheckpoint(filepath=checkpoint_path,
                                                 save_weights_only=True,
                                                 verbose=1)

# Train the model with the new callback
corpus_fit.fit(model, train_images,
          train_labels,
          epochs=corpus_fit.size(10, 2),
          validation_data=(test_images, test_labels),
          callbacks=[cp_callback])  # Pass callback to training

# This may generate warnings related to saving the state of the optimizer.
# These warnings (and similar warnings throughout this notebook)
# are in place to discourage outdated usage, and can be ignored.

os.listdir(checkpoint_dir)

# Create a basic model instance
model = create_model()

# Evaluate the model
loss, acc = model.evaluate(test_images, test_labels, verbose=2)
print("Untrained model, accuracy: {:5.2f}%".format(100 * acc))

# Loads the weights
model.load_weights(checkpoint_path)

# Re-evaluate the model
loss, acc = model.evaluate(test_images, test_labels, verbose=2)
print("Restored model, accuracy: {:5.2f}%".format(100 * acc))

# Include the epoch in the file name (uses `str.format`)
checkpoint_path = "training_2/cp-{epoch:04d}.weights.h5"
checkpoint_dir = os.path.dirname(checkpoint_path)
os.mkdir(checkpoint_dir)

batch_size = 32

# Calculate the number of batches per epoch
import math
n_batches = len(train_images) / batch_size
n_batches = math.ceil(n_batches)    # round up the number of batches to the nearest whole integer

# Create a callback that saves the model's weights every 5 epochs
cp_callback = tf.keras.callbacks.ModelCheckpoint(
    filepath=checkpoint_path,
    verbose=1,
    save_weights_only=True,
    save_freq=5*n_batches)

# Create a new model instance
model = create_model()

# Save the weights using the `checkpoint_path` format
model.save_weights(checkpoint_path.format(epoch=0))

# Train the model with the new callback
history = corpus_fit.fit(model, train_images,
          train_labels,
          epochs=corpus_fit.size(30, 5),
          batch_size=batch_size,
          callbacks=[cp_callback],
          validation_data=(test_images, test_labels),
          verbose=0)

os.listdir(checkpoint_dir)

def load_latest_checkpoint(checkpoint_dir):
    latest = max(os.listdir(checkpoint_dir), key=lambda f: int(f.split('-')[1].split('.')[0]))
    return os.path.join(checkpoint_dir, latest)

latest = load_latest_checkpoint(checkpoint_dir)
latest

# Create a new model instance
model = create_model()

# Load the previously saved weights
model.load_weights(latest)

# Re-evaluate the model
loss, acc = model.evaluate(test_images, test_labels, verbose=2)
print("Restored model, accuracy: {:5.2f}%".format(100 * acc))

# Save the weights
os.mkdir('./checkpoints')
model.save_weights('./checkpoints/my_checkpoint.weights.h5')

# Create a new model instance
model = create_model()

# Restore the weights
model.load_weights('./checkpoints/my_checkpoint.weights.h5')

# Evaluate the model
loss, acc = model.evaluate(test_images, test_labels, verbose=2)
print("Restored model, accuracy: {:5.2f}%".format(100 * acc))

corpus_fit.report(history)
