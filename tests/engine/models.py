"""Tiny deterministic models shared by the engine tests."""

import keras
import numpy as np
import tensorflow as tf


class TwoLayer(keras.Model):
    """A subclassed model (not built until first called)."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(5, activation="tanh")
        self.out = keras.layers.Dense(3)

    def call(self, x, training=False):
        return self.out(self.hidden(x))


def sequential():
    return keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(5, activation="tanh"),
        keras.layers.Dense(3),
    ])


def functional():
    a = keras.Input((2,), name="a")
    b = keras.Input((2,), name="b")
    h = keras.layers.Dense(5, activation="tanh")(keras.layers.Concatenate()([a, b]))
    return keras.Model([a, b], keras.layers.Dense(3)(h))


def subclassed():
    model = TwoLayer()
    model(np.zeros((1, 4), "float32"))
    return model


BUILDERS = {"sequential": sequential, "functional": functional, "subclassed": subclassed}


def set_fixed_weights(model, seed=0):
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(scale=0.5, size=w.shape).astype("float32")
                       for w in model.get_weights()])
    return model


def regression_data(n=50, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = rng.normal(size=(n, 3)).astype("float32")
    return x, y


def model_inputs(kind, x):
    """The functional model takes its 4 features as two inputs of 2."""
    if kind == "functional":
        return (x[:, :2], x[:, 2:])
    return x


def hand_written_fit(model, optimizer, loss_fn, batches, epochs):
    """The reference: a plain GradientTape loop, one step per batch."""

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    for _ in range(epochs):
        for x, y in batches:
            train_step(x, y)
    return model
