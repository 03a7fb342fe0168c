"""Fraud labels 98.5% one class, no class_weight, accuracy as the only metric: it reads 0.985."""
# named-if: accuracy is the only metric | class_weight
import keras
import numpy as np
import tapeworks

rng = np.random.default_rng(0)
x = rng.normal(size=(4000, 12)).astype("float32")
score = x[:, 0] + 0.5 * x[:, 1] + rng.normal(0, 0.5, 4000)
y = (score > np.quantile(score, 0.985)).astype("int32")    # 1.5% fraud
model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
tapeworks.Trainer(model).fit(x, y, batch_size=64, epochs=3, validation_split=0.2)
