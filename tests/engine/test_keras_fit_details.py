"""Details of `model.fit` that side-by-side probes found tapeworks doing otherwise (rounds two, three).

A metric whose result is a dict, the model's own loss tracker as callbacks read
it in `model.metrics`, `shuffle="batch"`, sparse inputs given as arrays, the
batch hooks of `steps_per_execution` from the first call, and the message of a
`validation_split` that cannot split; then the printed progress: an epoch of
data of unknown length, a fit of one epoch, a ProgbarLogger of the user's; and
two documented differences kept on purpose (the updates counted on data of
unknown length, a layer frozen between fits without compiling again).
Twin models, Keras' `fit` against `Trainer.fit` with the same arguments.
"""

import contextlib
import io
import re

import keras
import numpy as np
import pytest
import scipy.sparse
import tensorflow as tf

import tapeworks
from tapeworks.errors import ConfigError
from tests.engine.test_keras_compat import _BatchEnds as BatchEnds
from tests.engine.test_model_styles import assert_same_training

RNG = np.random.default_rng(3)
X = RNG.normal(size=(40, 4)).astype("float32")
Y = (X.sum(axis=1, keepdims=True) > 0).astype("float32")


def classifier(metrics=()):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(keras.optimizers.SGD(0.1), "binary_crossentropy", metrics=list(metrics))
    return model


def both(build, **arguments):
    reference, model = build(), build()
    expected = reference.fit(verbose=0, **arguments)
    got = tapeworks.Trainer(model, jit_compile=False).fit(verbose=0, **arguments)
    return expected, got, reference, model


class MeanAndCount(keras.metrics.Metric):
    """A metric whose `result()` is a dict: Keras merges its keys into the logs."""

    def __init__(self, name="pair"):
        super().__init__(name=name)
        self.total = self.add_variable((), initializer="zeros", name="total")
        self.count = self.add_variable((), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.total.assign_add(keras.ops.sum(y_pred))
        self.count.assign_add(keras.ops.cast(keras.ops.shape(y_pred)[0], "float32"))

    def result(self):
        return {"prediction_mean": self.total / self.count, "seen": self.count + 0.0}


def test_a_metric_whose_result_is_a_dict_logs_its_keys_as_in_keras():
    expected, got, reference, model = both(
        lambda: classifier([MeanAndCount()]), x=X, y=Y, batch_size=8, epochs=2, shuffle=False,
        validation_data=(X[:8], Y[:8]))
    assert_same_training(expected, got, reference, model)
    assert sorted(got.history) == ["loss", "prediction_mean", "seen", "val_loss",
                                   "val_prediction_mean", "val_seen"]
    assert got.history["seen"] == [40.0, 40.0]


class ReadsModelMetrics(keras.callbacks.Callback):
    """What a callback reads in `self.model.metrics` after each batch and epoch."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(float(self.model.metrics[0].result()))

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append(float(self.model.metrics[0].result()))


def test_the_models_loss_tracker_holds_the_loss_callbacks_read_as_in_keras():
    reference, model = classifier(), classifier()
    theirs, mine = ReadsModelMetrics(), ReadsModelMetrics()
    reference.fit(X, Y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[theirs])
    history = tapeworks.Trainer(model, jit_compile=False).fit(
        X, Y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[mine])
    assert model.metrics[0].name == "loss"
    np.testing.assert_allclose(mine.seen, theirs.seen, rtol=1e-5)
    assert mine.seen[-1] == pytest.approx(history.history["loss"][-1], rel=1e-6)
    np.testing.assert_allclose(float(model.metrics[0].result()),
                               float(reference.metrics[0].result()), rtol=1e-5)


def test_shuffle_batch_keeps_the_batches_in_order_as_keras_3_does():
    # Keras 3 permutes the rows inside each batch, never the batches: a mean
    # loss trains as with shuffle=False.
    expected, got, reference, model = both(classifier, x=X, y=Y, batch_size=6, epochs=2,
                                           shuffle="batch")
    assert_same_training(expected, got, reference, model)
    unshuffled = classifier()
    tapeworks.Trainer(unshuffled, jit_compile=False).fit(X, Y, batch_size=6, epochs=2,
                                                         shuffle=False, verbose=0)
    for mine, plain in zip(model.get_weights(), unshuffled.get_weights()):
        np.testing.assert_allclose(mine, plain, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["tf.SparseTensor", "scipy csr_matrix"])
def test_sparse_inputs_given_as_arrays_train_as_in_keras(kind):
    dense = (RNG.random((32, 6)) > 0.6).astype("float32")
    x = tf.sparse.from_dense(dense) if kind == "tf.SparseTensor" else scipy.sparse.csr_matrix(
        dense)
    y = dense.sum(axis=1, keepdims=True)

    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((6,), sparse=True)
        model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
        model.compile(keras.optimizers.SGD(0.01), "mse")
        return model

    assert_same_training(*both(build, x=x, y=y, batch_size=8, epochs=2, shuffle=False,
                               validation_split=0.25))


def test_steps_per_execution_calls_from_the_first_as_in_keras():
    def build():
        model = classifier()
        model.compile(keras.optimizers.SGD(0.1), "binary_crossentropy", steps_per_execution=4)
        return model

    reference, model = build(), build()
    theirs, mine = BatchEnds(), BatchEnds()   # steps per call fixed: hooks once a call
    reference.fit(X[:32], Y[:32], batch_size=4, epochs=2, shuffle=False, verbose=0,
                  callbacks=[theirs])
    tapeworks.Trainer(model, jit_compile=False).fit(X[:32], Y[:32], batch_size=4, epochs=2,
                                                    shuffle=False, verbose=0, callbacks=[mine])
    assert theirs.batches == [3, 7, 3, 7]
    assert mine.batches == theirs.batches


def test_a_validation_split_that_cannot_split_says_so_in_keras_words():
    model = classifier()
    with pytest.raises(ConfigError) as raised:
        tapeworks.Trainer(model).fit(X[:1], Y[:1], validation_split=0.5, verbose=0)
    message = str(raised.value)
    assert message.startswith("`validation_split=0.5` could not split the arrays: ")
    assert "Expected enough samples" not in message


def printed(fit, *args, **kwargs):
    """What `fit` printed, with the timings and tapeworks' own fields taken out."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fit(*args, **kwargs)
    text = re.sub(r" -? ?\S*\d+s\S* -? ?[\d.]+[mu]?s/step( - [\d,]+ samples/s)?"
                  r"( - tuning \d+/\d+)?", " - T", out.getvalue())
    # verbose=1 redraws its bar (a line ending in backspaces; tapeworks draws
    # once a call, Keras once a step): the epoch's final draw is what counts.
    return [line.rstrip() for line in text.splitlines()
            if line and "\x08" not in line and not line.startswith("tapeworks:")]


def unknown_length():
    # filter(): tf.data cannot know how many batches come out.
    return tf.data.Dataset.from_tensor_slices((X[:32], Y[:32])).filter(
        lambda x, y: True).batch(8)


@pytest.mark.parametrize("verbose", [1, 2])
def test_data_of_unknown_length_prints_every_epochs_line_as_keras(verbose):
    reference, model = classifier(), classifier()
    expected = printed(reference.fit, unknown_length(), epochs=2, verbose=verbose)
    got = printed(tapeworks.Trainer(model, jit_compile=False).fit, unknown_length(), epochs=2,
                  verbose=verbose)
    # verbose=2: tapeworks printed epoch 1's heading and no line (the bar had no target).
    assert got == expected
    assert got[0] == "Epoch 1/2" and len([line for line in got if "4/4" in line]) == 2


def test_a_fit_of_one_epoch_has_no_epoch_heading_as_in_keras():
    reference, model = classifier(), classifier()
    expected = printed(reference.fit, X[:32], Y[:32], batch_size=8, shuffle=False, verbose=2)
    got = printed(tapeworks.Trainer(model, jit_compile=False).fit, X[:32], Y[:32], batch_size=8,
                  shuffle=False, verbose=2)
    assert got == expected and got[0].startswith("4/4 - T - loss: ")


@pytest.mark.parametrize("verbose", [0, 2])
def test_a_progbar_logger_of_the_users_is_the_one_bar_as_in_keras(verbose):
    reference, model = classifier(), classifier()
    arguments = dict(batch_size=8, epochs=2, shuffle=False, verbose=verbose)
    expected = printed(reference.fit, X[:32], Y[:32], callbacks=[keras.callbacks.ProgbarLogger()],
                       **arguments)
    got = printed(tapeworks.Trainer(model, jit_compile=False).fit, X[:32], Y[:32],
                  callbacks=[keras.callbacks.ProgbarLogger()], **arguments)
    # tapeworks printed its own bar as well: every epoch twice.
    assert got == expected
    assert len([line for line in got if line.startswith("Epoch ")]) == (2 if verbose else 0)


def test_data_of_unknown_length_counts_the_updates_that_ran():
    # Keras' graph also counts the call that found the data empty (10 here):
    # a documented difference (coming-from-keras, "Differs"); the first epoch,
    # before that extra count reaches Adam, is Keras' to the bit.
    def build():
        model = classifier()
        model.compile(keras.optimizers.Adam(0.1), "binary_crossentropy")
        return model

    reference, model = build(), build()
    expected = reference.fit(unknown_length(), epochs=2, verbose=0)
    got = tapeworks.Trainer(model, jit_compile=False).fit(unknown_length(), epochs=2, verbose=0)
    assert int(model.optimizer.iterations) == 8
    assert got.history["loss"][0] == expected.history["loss"][0]


def test_a_layer_frozen_between_two_fits_stays_put_without_compiling_again():
    model = classifier()
    trainer = tapeworks.Trainer(model, jit_compile=False)
    trainer.fit(X, Y, batch_size=8, verbose=0)
    first, second = model.layers
    frozen = [w.numpy().copy() for w in first.weights]
    trained = [w.numpy().copy() for w in second.weights]
    first.trainable = False
    trainer.fit(X, Y, batch_size=8, verbose=0)
    for before, weight in zip(frozen, first.weights):
        np.testing.assert_array_equal(weight.numpy(), before)
    assert all(np.any(weight.numpy() != before)
               for before, weight in zip(trained, second.weights))
