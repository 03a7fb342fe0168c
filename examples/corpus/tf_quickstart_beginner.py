# Source: tensorflow/docs, site/en/tutorials/quickstart/beginner.ipynb (code cells), commit
# 7c3650212740204359d4ceae481abc79345541be (2026-03-11). Licence: Apache-2.0 (Copyright 2019 The
# TensorFlow Authors).
# Changed, and nothing else: mnist.load_data() -> random uint8 images (N, 28, 28) and uint8
# labels 0-9 of MNIST's shapes and dtypes, size(4096, 256) training and 256 test samples
# (seeded by corpus_fit); epochs 5 -> size(3, 1); model.fit(...) -> corpus_fit.fit(model, ...)
# with the same arguments (the switch: see corpus_fit.py); the display-only cells' bare
# expressions kept as statements, the cells after the fit (evaluate, probability model)
# removed; corpus_fit.report(history) at the end.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import numpy as np
import tensorflow as tf
print("TensorFlow version:", tf.__version__)

rng = np.random.default_rng(0)
train_samples = corpus_fit.size(4096, 256)
(x_train, y_train), (x_test, y_test) = (
    (rng.integers(0, 256, (train_samples, 28, 28), dtype="uint8"),
     rng.integers(0, 10, train_samples, dtype="uint8")),
    (rng.integers(0, 256, (256, 28, 28), dtype="uint8"),
     rng.integers(0, 10, 256, dtype="uint8")))
x_train, x_test = x_train / 255.0, x_test / 255.0

model = tf.keras.models.Sequential([
  tf.keras.layers.Flatten(input_shape=(28, 28)),
  tf.keras.layers.Dense(128, activation='relu'),
  tf.keras.layers.Dropout(0.2),
  tf.keras.layers.Dense(10)
])

predictions = model(x_train[:1]).numpy()
tf.nn.softmax(predictions).numpy()

loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
loss_fn(y_train[:1], predictions).numpy()

model.compile(optimizer='adam',
              loss=loss_fn,
              metrics=['accuracy'])

history = corpus_fit.fit(model, x_train, y_train, epochs=corpus_fit.size(3, 1))

corpus_fit.report(history)
