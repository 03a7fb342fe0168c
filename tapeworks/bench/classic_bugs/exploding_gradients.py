"""Prices in thousands of dollars as targets, a deep ReLU network, SGD with momentum, no clipping."""
# named-if: exploding gradients | clipnorm
import keras
import numpy as np
import tapeworks

keras.utils.set_random_seed(42)
rng = np.random.default_rng(0)
x = rng.normal(size=(2000, 10)).astype("float32")                 # standardised features
price = 200_000 + 50_000 * x[:, :3].sum(axis=1) + rng.normal(0, 10_000, 2000)
y = (price / 1000).astype("float32")[:, None]
model = keras.Sequential([keras.Input((10,))] + [keras.layers.Dense(64, activation="relu")
                                                 for _ in range(4)] + [keras.layers.Dense(1)])
trainer = tapeworks.Trainer(model, keras.optimizers.SGD(learning_rate=1e-3, momentum=0.9), "mse")
trainer.fit(x, y, batch_size=32, epochs=20)
