"""Class names read from a CSV are passed as labels without encoding them."""
# named-if: string | label
import keras
import numpy as np
import tapeworks

rng = np.random.default_rng(0)
x = rng.normal(size=(120, 4)).astype("float32")
y = np.array(["setosa", "versicolor", "virginica"] * 40)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
tapeworks.Trainer(model, "adam", "sparse_categorical_crossentropy").fit(x, y, batch_size=16)
