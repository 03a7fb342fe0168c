# Source: keras-team/keras, examples/keras_io/timeseries/timeseries_classification_from_scratch.py
# (all code; the Keras 3 port of keras-io's examples/timeseries/
# timeseries_classification_from_scratch.py, kept in keras-team/keras until e5dad39 removed the
# keras-io copies), commit bc4308ce1c0cbd322117ad90a5ce0ca710495913 (2023-11-03).
# Licence: Apache-2.0 (keras-team/keras' licence; the example's author: hfawaz).
# Changed, and nothing else: the FordA_TRAIN.tsv / FordA_TEST.tsv downloads -> TSV files of the
# same layout (label -1 or 1 in the first column, then 500 z-normalised float values a row) written
# in a temporary folder and read by the example's own readucr(), size(800, 128) training and
# size(256, 64) test rows (seeded by corpus_fit); root_url -> that folder; epochs 500 ->
# size(6, 1); matplotlib (import, the two plotting cells) and keras.utils.plot_model (needs
# pydot) removed; model.fit(...) -> corpus_fit.fit(model, ...) with the same arguments (the
# switch: see corpus_fit.py); corpus_fit.report(history) at the end. The callbacks
# (ModelCheckpoint save_best_only to "best_model.keras", ReduceLROnPlateau, EarlyStopping), the
# validation_split and the reload of the best checkpoint with its evaluate are kept.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

import os
import tempfile

import keras
import numpy as np


def readucr(filename):
    data = np.loadtxt(filename, delimiter="\t")
    y = data[:, 0]
    x = data[:, 1:]
    return x, y.astype(int)


# The downloaded files' stand-in (see the header).
rng = np.random.default_rng(0)
root_url = tempfile.mkdtemp() + os.sep
for name, rows in (("FordA_TRAIN.tsv", corpus_fit.size(800, 128)),
                   ("FordA_TEST.tsv", corpus_fit.size(256, 64))):
    series = rng.normal(size=(rows, 500))
    series = (series - series.mean(axis=1, keepdims=True)) / series.std(axis=1, keepdims=True)
    labels = rng.choice([-1.0, 1.0], size=(rows, 1))
    np.savetxt(root_url + name, np.concatenate([labels, series], axis=1), delimiter="\t")

x_train, y_train = readucr(root_url + "FordA_TRAIN.tsv")
x_test, y_test = readucr(root_url + "FordA_TEST.tsv")

classes = np.unique(np.concatenate((y_train, y_test), axis=0))

x_train = x_train.reshape((x_train.shape[0], x_train.shape[1], 1))
x_test = x_test.reshape((x_test.shape[0], x_test.shape[1], 1))

num_classes = len(np.unique(y_train))

idx = np.random.permutation(len(x_train))
x_train = x_train[idx]
y_train = y_train[idx]

y_train[y_train == -1] = 0
y_test[y_test == -1] = 0


def make_model(input_shape):
    input_layer = keras.layers.Input(input_shape)

    conv1 = keras.layers.Conv1D(filters=64, kernel_size=3, padding="same")(
        input_layer
    )
    conv1 = keras.layers.BatchNormalization()(conv1)
    conv1 = keras.layers.ReLU()(conv1)

    conv2 = keras.layers.Conv1D(filters=64, kernel_size=3, padding="same")(
        conv1
    )
    conv2 = keras.layers.BatchNormalization()(conv2)
    conv2 = keras.layers.ReLU()(conv2)

    conv3 = keras.layers.Conv1D(filters=64, kernel_size=3, padding="same")(
        conv2
    )
    conv3 = keras.layers.BatchNormalization()(conv3)
    conv3 = keras.layers.ReLU()(conv3)

    gap = keras.layers.GlobalAveragePooling1D()(conv3)

    output_layer = keras.layers.Dense(num_classes, activation="softmax")(gap)

    return keras.models.Model(inputs=input_layer, outputs=output_layer)


model = make_model(input_shape=x_train.shape[1:])

epochs = corpus_fit.size(6, 1)
batch_size = 32

callbacks = [
    keras.callbacks.ModelCheckpoint(
        "best_model.keras", save_best_only=True, monitor="val_loss"
    ),
    keras.callbacks.ReduceLROnPlateau(
        monitor="val_loss", factor=0.5, patience=20, min_lr=0.0001
    ),
    keras.callbacks.EarlyStopping(monitor="val_loss", patience=50, verbose=1),
]
model.compile(
    optimizer="adam",
    loss="sparse_categorical_crossentropy",
    metrics=["sparse_categorical_accuracy"],
)
history = corpus_fit.fit(
    model,
    x_train,
    y_train,
    batch_size=batch_size,
    epochs=epochs,
    callbacks=callbacks,
    validation_split=0.2,
    verbose=1,
)

model = keras.models.load_model("best_model.keras")

test_loss, test_acc = model.evaluate(x_test, y_test)

print("Test accuracy", test_acc)
print("Test loss", test_loss)

corpus_fit.report(history)
