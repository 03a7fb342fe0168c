"""An exponential decay whose decay_steps was meant in epochs: the learning rate is ~0 after a few steps."""
# named-if: learning rate
import keras
import numpy as np
import tapeworks

rng = np.random.default_rng(0)
x = rng.normal(size=(2048, 10)).astype("float32")
y = (x @ rng.normal(size=(10, 1))).astype("float32")
schedule = keras.optimizers.schedules.ExponentialDecay(1e-2, decay_steps=1, decay_rate=0.5)
model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(1)])
tapeworks.Trainer(model, keras.optimizers.Adam(schedule), "mse").fit(x, y, batch_size=32,
                                                                     epochs=5)
