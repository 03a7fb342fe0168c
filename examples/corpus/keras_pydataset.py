# Source: keras-team/keras, guides/training_with_built_in_methods.py (Setup; the MNIST cell of
# "API overview"; get_uncompiled_model/get_compiled_model; "Training & evaluation using
# `PyDataset` instances"), commit 3422977a5e38fb2f7709aaa9a08e47f0c43d0f60 (2026-08-21).
# Licence: Apache-2.0 (Copyright The Keras Authors).
# Changed, and nothing else: keras.datasets.mnist.load_data() -> random uint8 images (N, 28, 28)
# and uint8 labels 0-9 of MNIST's shapes and dtypes (seeded by corpus_fit), N = size(60000, 3000)
# training and size(10000, 500) test samples, so the reshape's 60000/10000 and the 10,000
# validation samples reserved read size(60000, 3000), size(10000, 500) and size(10000, 500)
# (small is MNIST's own size); epochs 1 -> size(2, 1) in both fits;
# `import torch` dropped (only the guide's PyTorch DataLoader section uses it, and torch is
# not installed here); the guide's other sections (the first end-to-end fit, custom losses and
# metrics, tf.data, DataLoader, weighting, multi-input, callbacks...) not taken; both
# model.fit(...) calls of the PyDataset section -> corpus_fit.fit(model, ...) with the same
# arguments (the switch: see corpus_fit.py), the second one's result kept as `history`;
# corpus_fit.report(history) at the end.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import tensorflow as tf

import os
import numpy as np
import keras
from keras import layers
from keras import ops

inputs = keras.Input(shape=(784,), name="digits")
x = layers.Dense(64, activation="relu", name="dense_1")(inputs)
x = layers.Dense(64, activation="relu", name="dense_2")(x)
outputs = layers.Dense(10, activation="softmax", name="predictions")(x)

model = keras.Model(inputs=inputs, outputs=outputs)

# MNIST's stand-in (see the header).
rng = np.random.default_rng(0)
train_samples, test_samples = corpus_fit.size(60000, 3000), corpus_fit.size(10000, 500)
(x_train, y_train), (x_test, y_test) = (
    (rng.integers(0, 256, (train_samples, 28, 28), dtype="uint8"),
     rng.integers(0, 10, (train_samples,), dtype="uint8")),
    (rng.integers(0, 256, (test_samples, 28, 28), dtype="uint8"),
     rng.integers(0, 10, (test_samples,), dtype="uint8")),
)

# Preprocess the data (these are NumPy arrays)
x_train = x_train.reshape(corpus_fit.size(60000, 3000), 784).astype("float32") / 255
x_test = x_test.reshape(corpus_fit.size(10000, 500), 784).astype("float32") / 255

y_train = y_train.astype("float32")
y_test = y_test.astype("float32")

# Reserve 10,000 samples for validation
x_val = x_train[-corpus_fit.size(10000, 500):]
y_val = y_train[-corpus_fit.size(10000, 500):]
x_train = x_train[:-corpus_fit.size(10000, 500)]
y_train = y_train[:-corpus_fit.size(10000, 500)]


def get_uncompiled_model():
    inputs = keras.Input(shape=(784,), name="digits")
    x = layers.Dense(64, activation="relu", name="dense_1")(inputs)
    x = layers.Dense(64, activation="relu", name="dense_2")(x)
    outputs = layers.Dense(10, activation="softmax", name="predictions")(x)
    model = keras.Model(inputs=inputs, outputs=outputs)
    return model


def get_compiled_model():
    model = get_uncompiled_model()
    model.compile(
        optimizer="rmsprop",
        loss="sparse_categorical_crossentropy",
        metrics=["sparse_categorical_accuracy"],
    )
    return model


class ExamplePyDataset(keras.utils.PyDataset):
    def __init__(self, x, y, batch_size, **kwargs):
        super().__init__(**kwargs)
        self.x = x
        self.y = y
        self.batch_size = batch_size

    def __len__(self):
        return int(np.ceil(len(self.x) / float(self.batch_size)))

    def __getitem__(self, idx):
        batch_x = self.x[idx * self.batch_size : (idx + 1) * self.batch_size]
        batch_y = self.y[idx * self.batch_size : (idx + 1) * self.batch_size]
        return batch_x, batch_y


train_py_dataset = ExamplePyDataset(x_train, y_train, batch_size=32)
val_py_dataset = ExamplePyDataset(x_val, y_val, batch_size=32)

model = get_compiled_model()
corpus_fit.fit(
    model, train_py_dataset, batch_size=64, validation_data=val_py_dataset,
    epochs=corpus_fit.size(2, 1)
)

model.evaluate(val_py_dataset)

train_py_dataset = ExamplePyDataset(x_train, y_train, batch_size=32, workers=4)
val_py_dataset = ExamplePyDataset(x_val, y_val, batch_size=32, workers=4)

model = get_compiled_model()
history = corpus_fit.fit(
    model, train_py_dataset, batch_size=64, validation_data=val_py_dataset,
    epochs=corpus_fit.size(2, 1)
)

corpus_fit.report(history)
