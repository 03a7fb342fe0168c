"""A bias initialiser meant for the output layer was put on the hidden ReLU layer."""
# named-if: hidden | relu
import keras
import numpy as np
import tapeworks

rng = np.random.default_rng(0)
x = rng.uniform(0, 1, size=(2000, 10)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 5).astype("float32")
model = keras.Sequential([
    keras.Input((10,)),
    keras.layers.Dense(64, activation="relu", name="hidden",
                       bias_initializer=keras.initializers.Constant(-20.0)),
    keras.layers.Dense(1, activation="sigmoid", name="output"),
])
trainer = tapeworks.Trainer(model, "adam", "binary_crossentropy")
trainer.fit(x, y, batch_size=32, epochs=3)
