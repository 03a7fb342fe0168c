# Source: keras-team/keras, examples/demo_subclass.py, commit 3422977a5e38fb2f7709aaa9a08e47f0c43d0f60
# (2026-08-21). Licence: Apache-2.0 (Copyright The Keras Authors).
# Changed, and nothing else: 50,000 random samples -> size(4096, 256) (np.random.random of the
# same shapes and dtype, seeded by corpus_fit); epochs 6 -> size(3, 1); model.fit(...) ->
# corpus_fit.fit(model, ...) with the same arguments (the switch: see corpus_fit.py);
# corpus_fit.report(history) at the end.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import numpy as np

from keras import Model
from keras import layers
from keras import losses
from keras import metrics
from keras import optimizers


class MyModel(Model):
    def __init__(self, hidden_dim, output_dim):
        super().__init__()
        self.dense1 = layers.Dense(hidden_dim, activation="relu")
        self.dense2 = layers.Dense(hidden_dim, activation="relu")
        self.dense3 = layers.Dense(output_dim)

    def call(self, x):
        x = self.dense1(x)
        x = self.dense2(x)
        return self.dense3(x)


model = MyModel(hidden_dim=256, output_dim=16)

samples = corpus_fit.size(4096, 256)
x = np.random.random((samples, 128))
y = np.random.random((samples, 16))
batch_size = 32
epochs = corpus_fit.size(3, 1)

model.compile(
    optimizer=optimizers.SGD(learning_rate=0.001),
    loss=losses.MeanSquaredError(),
    metrics=[metrics.MeanSquaredError()],
)
history = corpus_fit.fit(
    model, x, y, batch_size=batch_size, epochs=epochs, validation_split=0.2
)

print("History:")
print(history.history)

model.summary()

corpus_fit.report(history)
