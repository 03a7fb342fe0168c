"""One-hot labels passed to sparse_categorical_crossentropy."""
# named-if: sparse | one-hot
import keras
import numpy as np
import tapeworks

rng = np.random.default_rng(0)
x = rng.normal(size=(300, 5)).astype("float32")
y = keras.utils.to_categorical(rng.integers(0, 4, 300), 4)
model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="softmax")])
tapeworks.Trainer(model, "adam", "sparse_categorical_crossentropy").fit(x, y, batch_size=30)
