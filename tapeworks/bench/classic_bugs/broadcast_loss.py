"""A regression Task whose own MSE subtracts (B, 1) predictions from (B,) targets."""
# named-if: broadcasts | (B,) and (B, 1) | squeeze
import keras
import numpy as np
import tensorflow as tf
import tapeworks


class Regression(tapeworks.Task):
    def __init__(self):
        super().__init__()
        self.net = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                                     keras.layers.Dense(1)])
        self.add_update("net", "loss", self.net, keras.optimizers.Adam(1e-3))

    def compute_losses(self, batch, training):
        x, y = batch
        pred = self.net(x, training=training)
        return {"loss": tf.reduce_mean(tf.square(y - pred))}


rng = np.random.default_rng(0)
x = rng.normal(size=(1024, 8)).astype("float32")
y = (x @ rng.normal(size=8) + 0.1 * rng.normal(size=1024)).astype("float32")
tapeworks.Trainer(Regression()).fit(x, y, batch_size=64, epochs=3)
