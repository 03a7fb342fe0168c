"""The model ends in a softmax, and the loss is told its inputs are logits."""
# named-if: from_logits | softmax
import keras
import numpy as np
import tapeworks

rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = rng.integers(0, 3, 256)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3, activation="softmax")])
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
tapeworks.Trainer(model, "adam", loss).fit(x, y, batch_size=32, epochs=2)
