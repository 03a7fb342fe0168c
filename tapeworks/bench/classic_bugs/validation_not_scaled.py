"""Training images scaled to [0, 1]; the validation images passed to fit raw (0..255)."""
# named-if: prepared differently | validation_data
import keras
import numpy as np
from sklearn.datasets import load_digits
import tapeworks

digits = load_digits()
images = (digits.images * 16).clip(0, 255).astype("uint8")[..., None]   # 8x8 grey, 0..255
labels = digits.target
x_train, x_val = images[:1400], images[1400:]
y_train, y_val = labels[:1400], labels[1400:]
x_train = x_train.astype("float32") / 255.0

model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(16, 3, activation="relu"),
                          keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")])
model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
tapeworks.Trainer(model).fit(x_train, y_train, batch_size=32, epochs=3,
                             validation_data=(x_val, y_val))
