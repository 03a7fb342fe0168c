"""A tf.data pipeline without .batch(): every step trains on one example."""
# named-if: batch
import keras
import numpy as np
import tensorflow as tf
import tapeworks

rng = np.random.default_rng(0)
x = rng.normal(size=(200, 3)).astype("float32")
y = rng.normal(size=(200, 1)).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(200).prefetch(tf.data.AUTOTUNE)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
tapeworks.Trainer(model, "sgd", "mse").fit(dataset, epochs=1)
