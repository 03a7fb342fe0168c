"""Data sorted by class, fed through tf.data without shuffling: each batch holds one class."""
# named-if: shuffl
import keras
import numpy as np
import tensorflow as tf
import tapeworks

rng = np.random.default_rng(0)
x = rng.normal(size=(600, 8)).astype("float32")
y = np.repeat(np.arange(3), 200)            # sorted: all 0s, then 1s, then 2s
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).prefetch(tf.data.AUTOTUNE)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
tapeworks.Trainer(model, "adam", loss).fit(dataset, epochs=2)
