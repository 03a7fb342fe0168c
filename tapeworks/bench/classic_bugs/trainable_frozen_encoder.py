"""A "frozen" pretrained encoder called with training=False, but its weights are still trained."""
# named-if: encoder | trainable
import keras
import numpy as np
import tapeworks

rng = np.random.default_rng(0)
encoder = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                            keras.layers.Dense(8)], name="encoder")
# ... imagine encoder.load_weights("pretrained.weights.h5") here

inputs = keras.Input((16,))
features = encoder(inputs, training=False)      # "freeze" it
outputs = keras.layers.Dense(3, activation="softmax")(features)
model = keras.Model(inputs, outputs)
x = rng.normal(size=(512, 16)).astype("float32")
y = rng.integers(0, 3, 512)
trainer = tapeworks.Trainer(model, "adam", "sparse_categorical_crossentropy")
trainer.fit(x, y, batch_size=32, epochs=2)
