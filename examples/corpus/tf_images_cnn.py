# Source: tensorflow/docs, site/en/tutorials/images/cnn.ipynb (code cells), commit
# 7c3650212740204359d4ceae481abc79345541be (2026-03-11). Licence: Apache-2.0 (Copyright 2019 The
# TensorFlow Authors).
# Changed, and nothing else: datasets.cifar10.load_data() -> random uint8 images (N, 32, 32, 3)
# and uint8 labels (N, 1) 0-9 of CIFAR-10's shapes and dtypes, size(1024, 128) training and
# size(256, 64) test samples (seeded by corpus_fit); epochs 10 -> size(2, 1); model.fit(...) ->
# corpus_fit.fit(model, ...) with the same arguments (the switch: see corpus_fit.py); the
# plotting cells (matplotlib) and the evaluate cell after the fit removed;
# corpus_fit.report(history) at the end.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import numpy as np
import tensorflow as tf

from tensorflow.keras import datasets, layers, models

rng = np.random.default_rng(0)
train_samples, test_samples = corpus_fit.size(1024, 128), corpus_fit.size(256, 64)
(train_images, train_labels), (test_images, test_labels) = (
    (rng.integers(0, 256, (train_samples, 32, 32, 3), dtype="uint8"),
     rng.integers(0, 10, (train_samples, 1), dtype="uint8")),
    (rng.integers(0, 256, (test_samples, 32, 32, 3), dtype="uint8"),
     rng.integers(0, 10, (test_samples, 1), dtype="uint8")))

# Normalize pixel values to be between 0 and 1
train_images, test_images = train_images / 255.0, test_images / 255.0

class_names = ['airplane', 'automobile', 'bird', 'cat', 'deer',
               'dog', 'frog', 'horse', 'ship', 'truck']

model = models.Sequential()
model.add(layers.Conv2D(32, (3, 3), activation='relu', input_shape=(32, 32, 3)))
model.add(layers.MaxPooling2D((2, 2)))
model.add(layers.Conv2D(64, (3, 3), activation='relu'))
model.add(layers.MaxPooling2D((2, 2)))
model.add(layers.Conv2D(64, (3, 3), activation='relu'))

model.summary()

model.add(layers.Flatten())
model.add(layers.Dense(64, activation='relu'))
model.add(layers.Dense(10))

model.summary()

model.compile(optimizer='adam',
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=['accuracy'])

history = corpus_fit.fit(model, train_images, train_labels, epochs=corpus_fit.size(2, 1),
                    validation_data=(test_images, test_labels))

corpus_fit.report(history)
