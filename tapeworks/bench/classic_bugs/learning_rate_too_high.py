"""Plain SGD with a learning rate copied from a normalised problem, on raw-scale targets."""
# named-if: learning rate
import keras
import numpy as np
import tapeworks

rng = np.random.default_rng(0)
x = rng.uniform(0, 100, size=(1000, 4)).astype("float32")    # not normalised
y = (x @ np.array([3.0, -2.0, 1.0, 0.5], "float32"))[:, None] + 50.0
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(1)])
trainer = tapeworks.Trainer(model, keras.optimizers.SGD(learning_rate=0.1), "mse")
trainer.fit(x, y, batch_size=32, epochs=5)
