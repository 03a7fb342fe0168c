"""A regression target column has a missing value, read as NaN."""
# named-if: NaN | y
import keras
import numpy as np
import tapeworks

rng = np.random.default_rng(0)
x = rng.normal(size=(400, 5)).astype("float32")
y = (x.sum(axis=1, keepdims=True) * 2.0).astype("float32")
y[137, 0] = np.nan
model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(1)])
tapeworks.Trainer(model, "adam", "mse").fit(x, y, batch_size=20, epochs=2)
