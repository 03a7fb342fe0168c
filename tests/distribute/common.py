"""The data and model the multi-worker scripts share: tiny, seeded, the same in every process."""

import keras
import numpy as np


def regression_data():
    rng = np.random.default_rng(0)
    return (rng.normal(size=(64, 4)).astype("float32"),
            rng.normal(size=(64, 2)).astype("float32"))


def small_mlp():
    """Built under the caller's strategy scope, from seed 1."""
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(2)])
