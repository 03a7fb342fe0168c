# Source: keras-team/keras, examples/demo_mnist_convnet.py, commit 3422977a5e38fb2f7709aaa9a08e47f0c43d0f60
# (2026-08-21). Licence: Apache-2.0 (Copyright The Keras Authors).
# Changed, and nothing else: keras.datasets.mnist.load_data() -> random uint8 images (N, 28, 28)
# and uint8 labels 0-9 of MNIST's shapes and dtypes, size(1536, 256) training and 256 test
# samples (seeded by corpus_fit); epochs 3 -> size(2, 1); model.fit(...) ->
# corpus_fit.fit(model, ...) with the same arguments (the switch: see corpus_fit.py); the
# evaluate cell after the fit removed; corpus_fit.report(...) at the end.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import numpy as np
import keras
from keras import layers
from keras.utils import to_categorical

# Model / data parameters
num_classes = 10
input_shape = (28, 28, 1)

# Load the data and split it between train and test sets
rng = np.random.default_rng(0)
train_samples = corpus_fit.size(1536, 256)
(x_train, y_train), (x_test, y_test) = (
    (rng.integers(0, 256, (train_samples, 28, 28), dtype="uint8"),
     rng.integers(0, 10, train_samples, dtype="uint8")),
    (rng.integers(0, 256, (256, 28, 28), dtype="uint8"),
     rng.integers(0, 10, 256, dtype="uint8")))

# Scale images to the [0, 1] range
x_train = x_train.astype("float32") / 255
x_test = x_test.astype("float32") / 255
# Make sure images have shape (28, 28, 1)
x_train = np.expand_dims(x_train, -1)
x_test = np.expand_dims(x_test, -1)
print("x_train shape:", x_train.shape)
print(x_train.shape[0], "train samples")
print(x_test.shape[0], "test samples")


# convert class vectors to binary class matrices
y_train = to_categorical(y_train, num_classes)
y_test = to_categorical(y_test, num_classes)

batch_size = 128
epochs = corpus_fit.size(2, 1)

model = keras.Sequential(
    [
        layers.Input(shape=input_shape),
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(num_classes, activation="softmax"),
    ]
)

model.summary()

model.compile(
    loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"]
)

history = corpus_fit.fit(
    model, x_train, y_train, batch_size=batch_size, epochs=epochs, validation_split=0.1
)

corpus_fit.report(history)
