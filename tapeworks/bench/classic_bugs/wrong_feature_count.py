"""A new feature column was added to the data, not to the model's input."""
# named-if: 5 | 4
import keras
import numpy as np
import tapeworks

rng = np.random.default_rng(0)
x = rng.normal(size=(100, 5)).astype("float32")
y = rng.normal(size=(100, 1)).astype("float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
tapeworks.Trainer(model, "adam", "mse").fit(x, y, batch_size=10)
