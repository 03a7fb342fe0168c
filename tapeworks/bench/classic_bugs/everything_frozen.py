"""Transfer learning: the base was frozen for the first stage and never unfrozen for fine-tuning."""
# named-if: trainable
import keras
import numpy as np
import tapeworks

rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = rng.integers(0, 2, 256)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(2)])
model.trainable = False          # stage 1 froze it ...
# stage 2, "fine-tune everything", forgot `model.trainable = True`
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
tapeworks.Trainer(model, keras.optimizers.Adam(1e-5), loss).fit(x, y, batch_size=32, epochs=2)
