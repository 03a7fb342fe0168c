"""Fine-tuning with a BatchNormalization layer set trainable=False, expecting its statistics to adapt."""
# named-if: BatchNormalization | trainable
import keras
import numpy as np
import tapeworks

rng = np.random.default_rng(0)
x = (rng.normal(size=(512, 6)) * 5 + 3).astype("float32")
y = rng.normal(size=(512, 1)).astype("float32")
norm = keras.layers.BatchNormalization(name="norm")
norm.trainable = False
model = keras.Sequential([keras.Input((6,)), norm, keras.layers.Dense(1)])
tapeworks.Trainer(model, "adam", "mse").fit(x, y, batch_size=32, epochs=2)
