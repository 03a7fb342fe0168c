"""A binary classifier ends in a linear Dense(1) while the loss expects probabilities."""
# named-if: from_logits
import keras
import numpy as np
import tapeworks

rng = np.random.default_rng(0)
x = rng.normal(size=(512, 6)).astype("float32")
y = (x[:, :1] > 0).astype("float32")
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1)])          # no sigmoid
tapeworks.Trainer(model, "adam", "binary_crossentropy").fit(x, y, batch_size=32, epochs=3)
