"""A hand-written cross-entropy takes log() of a softmax that saturated to exactly 0."""
# named-if: NonFiniteError | loss
import keras
import numpy as np
import tensorflow as tf
import tapeworks

x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32") * 1000.0
y = keras.utils.to_categorical(np.random.default_rng(1).integers(0, 3, 256), 3)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3, activation="softmax")])


def my_crossentropy(y_true, y_pred):
    return -tf.reduce_mean(tf.reduce_sum(y_true * tf.math.log(y_pred), axis=-1))


tapeworks.Trainer(model, "adam", my_crossentropy).fit(x, y, batch_size=32, epochs=2)
