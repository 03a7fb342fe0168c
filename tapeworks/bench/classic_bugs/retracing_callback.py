"""A callback keeps an exponential moving average of the weights through a tf.function that takes a Python float."""
# named-if: decay | retrac
import keras
import numpy as np
import tensorflow as tf
import tapeworks


class EMA(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.shadow = [tf.Variable(w) for w in self.model.weights]

    @tf.function
    def update(self, decay):
        for s, w in zip(self.shadow, self.model.weights):
            s.assign(decay * s + (1.0 - decay) * w)

    def on_train_batch_end(self, batch, logs=None):
        decay = min(0.999, (1.0 + batch) / (10.0 + batch))   # warm-up of the decay
        self.update(decay)


rng = np.random.default_rng(0)
x = rng.normal(size=(640, 8)).astype("float32")
y = rng.normal(size=(640, 1)).astype("float32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
tapeworks.Trainer(model, "adam", "mse").fit(x, y, batch_size=32, epochs=2, callbacks=[EMA()])
