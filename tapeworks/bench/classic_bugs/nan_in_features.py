"""A missing value in the table became NaN and went into training."""
# named-if: NaN | data
import keras
import numpy as np
import tapeworks

rng = np.random.default_rng(0)
table = rng.normal(size=(500, 6)).astype("float32")
table[321, 4] = np.nan       # an empty cell in the CSV
labels = rng.integers(0, 2, 500)
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
trainer = tapeworks.Trainer(model, "adam", "binary_crossentropy", metrics=["accuracy"])
trainer.fit(table, labels, batch_size=32, epochs=3)
