# Source: tensorflow/docs, site/en/tutorials/generative/autoencoder.ipynb (code cells), commit
# 7c3650212740204359d4ceae481abc79345541be (2026-03-11). Licence: Apache-2.0 (Copyright 2020 The
# TensorFlow Authors).
# Changed, and nothing else: fashion_mnist.load_data() -> random uint8 images (N, 28, 28) of
# Fashion-MNIST's shape and dtype, size(1024, 128) training and size(256, 64) test images
# (seeded by corpus_fit; the labels, unused, left out); epochs 10 -> size(2, 1); of the
# tutorial's three models, the one kept is the convolutional denoiser (`Denoise`, a subclassed
# model of two Sequentials), the first autoencoder, the anomaly detector and all plotting
# (matplotlib) removed; autoencoder.fit(...) -> corpus_fit.fit(autoencoder, ...) with the same
# arguments (the switch: see corpus_fit.py); corpus_fit.report(history) at the end.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import numpy as np
import tensorflow as tf

from tensorflow.keras import layers, losses
from tensorflow.keras.models import Model

rng = np.random.default_rng(0)
(x_train, _), (x_test, _) = (
    (rng.integers(0, 256, (corpus_fit.size(1024, 128), 28, 28), dtype="uint8"), None),
    (rng.integers(0, 256, (corpus_fit.size(256, 64), 28, 28), dtype="uint8"), None))

x_train = x_train.astype('float32') / 255.
x_test = x_test.astype('float32') / 255.

x_train = x_train[..., tf.newaxis]
x_test = x_test[..., tf.newaxis]

print(x_train.shape)

noise_factor = 0.2
x_train_noisy = x_train + noise_factor * tf.random.normal(shape=x_train.shape)
x_test_noisy = x_test + noise_factor * tf.random.normal(shape=x_test.shape)

x_train_noisy = tf.clip_by_value(x_train_noisy, clip_value_min=0., clip_value_max=1.)
x_test_noisy = tf.clip_by_value(x_test_noisy, clip_value_min=0., clip_value_max=1.)

class Denoise(Model):
  def __init__(self):
    super(Denoise, self).__init__()
    self.encoder = tf.keras.Sequential([
      layers.Input(shape=(28, 28, 1)),
      layers.Conv2D(16, (3, 3), activation='relu', padding='same', strides=2),
      layers.Conv2D(8, (3, 3), activation='relu', padding='same', strides=2)])

    self.decoder = tf.keras.Sequential([
      layers.Conv2DTranspose(8, kernel_size=3, strides=2, activation='relu', padding='same'),
      layers.Conv2DTranspose(16, kernel_size=3, strides=2, activation='relu', padding='same'),
      layers.Conv2D(1, kernel_size=(3, 3), activation='sigmoid', padding='same')])

  def call(self, x):
    encoded = self.encoder(x)
    decoded = self.decoder(encoded)
    return decoded

autoencoder = Denoise()

autoencoder.compile(optimizer='adam', loss=losses.MeanSquaredError())

history = corpus_fit.fit(autoencoder, x_train_noisy, x_train,
                epochs=corpus_fit.size(2, 1),
                shuffle=True,
                validation_data=(x_test_noisy, x_test))

corpus_fit.report(history)
