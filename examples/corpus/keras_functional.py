# Source: keras-team/keras, examples/demo_functional.py, commit 3422977a5e38fb2f7709aaa9a08e47f0c43d0f60
# (2026-08-21). Licence: Apache-2.0 (Copyright The Keras Authors).
# Changed, and nothing else: 50,000 random samples -> size(1024, 256) (np.random.random of the
# same shapes and dtype, seeded by corpus_fit); epochs 5 -> size(3, 1); model.fit(...) ->
# corpus_fit.fit(model, ...) with the same arguments (the switch: see corpus_fit.py); the
# evaluate/predict cells after the fit removed; corpus_fit.report(history) at the end.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import numpy as np

from keras import Model
from keras import layers
from keras import losses
from keras import metrics
from keras import optimizers
import keras

keras.config.disable_traceback_filtering()

inputs = layers.Input((100,))
x = layers.Dense(512, activation="relu")(inputs)
residual = x
x = layers.Dense(512, activation="relu")(x)
x = layers.Dense(512, activation="relu")(x)
x += residual
x = layers.Dense(512, activation="relu")(x)
residual = x
x = layers.Dense(512, activation="relu")(x)
x = layers.Dense(512, activation="relu")(x)
x += residual
residual = x
x = layers.Dense(512, activation="relu")(x)
x = layers.Dense(512, activation="relu")(x)
x += residual
outputs = layers.Dense(16)(x)
model = Model(inputs, outputs)

model.summary()

samples = corpus_fit.size(1024, 256)
x = np.random.random((samples, 100))
y = np.random.random((samples, 16))
batch_size = 32
epochs = corpus_fit.size(3, 1)

model.compile(
    optimizer=optimizers.Adam(learning_rate=0.001),
    loss=losses.MeanSquaredError(),
    metrics=[
        metrics.CategoricalAccuracy(name="acc"),
        metrics.MeanSquaredError(name="mse"),
    ],
)

print("\nTrain model")
history = corpus_fit.fit(
    model, x, y, batch_size=batch_size, epochs=epochs, validation_split=0.2
)
print("\nHistory:")
print(history.history)

corpus_fit.report(history)
