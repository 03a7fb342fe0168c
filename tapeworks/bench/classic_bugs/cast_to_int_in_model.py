"""A Lambda rounds features to integer buckets inside the model: nothing before it trains."""
# named-if: gradient | int
import keras
import numpy as np
import tensorflow as tf
import tapeworks

rng = np.random.default_rng(0)
x = rng.uniform(0, 10, size=(256, 4)).astype("float32")
y = rng.normal(size=(256, 1)).astype("float32")
inputs = keras.Input((4,))
scaled = keras.layers.Dense(4, name="scale")(inputs)
buckets = keras.layers.Lambda(lambda t: tf.cast(tf.cast(t, tf.int32), tf.float32))(scaled)
model = keras.Model(inputs, keras.layers.Dense(1)(buckets))
tapeworks.Trainer(model, "adam", "mse").fit(x, y, batch_size=32, epochs=1)
