"""Retracing: a user's tf.function that retraces during fit is named with the argument that changed."""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

from tapeworks import PerformanceWarning, Trainer
from tapeworks.engine.checks import retracing


def _data(n=32):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 3)).astype("float32"), rng.normal(size=(n, 1)).astype("float32")


def _trainer():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    return Trainer(model, "sgd", "mse", jit_compile=False, steps_per_call=1)


shadow = tf.Variable(0.0)


@tf.function
def ema_update(value, decay):
    shadow.assign(decay * shadow + (1.0 - decay) * value)


class EmaCallback(keras.callbacks.Callback):
    """The classic bug: a Python float that changes every batch."""

    def on_train_batch_end(self, batch, logs=None):
        ema_update(tf.constant(1.0), 0.9 + 0.001 * batch)


def test_a_changing_python_argument_is_named():
    trainer = _trainer()
    x, y = _data()
    with pytest.warns(PerformanceWarning, match=r"`ema_update`.*argument `decay` changed from "
                                                r"the Python value 0.9 to the Python value 0.901.*tf.constant"):
        trainer.fit(x, y, batch_size=8, callbacks=[EmaCallback()], verbose=0)
    assert len(trainer.retraces) == 1
    report = trainer.retraces[0]
    assert report.function == "ema_update" and report.traces == 2
    assert report.changes == [("decay", ("python", 0.9), ("python", 0.901))]
    assert "test_retracing.py" in report.where


class MethodEma(keras.callbacks.Callback):
    """The same bug in a decorated method (TensorFlow wraps it: the location must still be ours)."""

    def on_train_begin(self, logs=None):
        self.shadow = tf.Variable(0.0)

    @tf.function
    def update(self, decay):
        self.shadow.assign(decay * self.shadow + (1.0 - decay))

    def on_train_batch_end(self, batch, logs=None):
        self.update(0.5 + 0.01 * batch)


def test_a_decorated_method_is_named_where_it_is_written():
    trainer = _trainer()
    x, y = _data()
    with pytest.warns(PerformanceWarning, match=r"`MethodEma.update` \(.*test_retracing.py:\d+\)"
                                                r".*argument `decay` changed"):
        trainer.fit(x, y, batch_size=8, callbacks=[MethodEma()], verbose=0)
    assert trainer.retraces[0].function == "MethodEma.update"


@tf.function
def feature_stats(x):
    return tf.reduce_mean(x, axis=0)


@tf.function
def column_means(x):
    return tf.reduce_mean(x, axis=0)


class ShapeCallback(keras.callbacks.Callback):
    def __init__(self, function, sizes):
        super().__init__()
        self.function, self.sizes = function, sizes

    def on_train_batch_end(self, batch, logs=None):
        self.function(tf.zeros((self.sizes[batch % len(self.sizes)], 3)))


def test_changing_shapes_are_reported_from_the_third_trace():
    trainer = _trainer()
    x, y = _data()
    # Two shapes: one extra trace, as a last, smaller batch gives: not reported.
    trainer.fit(x, y, batch_size=8, callbacks=[ShapeCallback(feature_stats, [8, 8, 8, 5])],
                verbose=0)
    assert trainer.retraces == []
    with pytest.warns(PerformanceWarning, match=r"`column_means`.*argument `x` changed from a "
                      r"tensor of shape \(5, 3\) and dtype float32 to a tensor of shape "
                      r"\(6, 3\).*input_signature"):
        trainer.fit(x, y, batch_size=8, callbacks=[ShapeCallback(column_means, [4, 5, 6, 7])],
                    verbose=0)
    assert [r.function for r in trainer.retraces] == ["column_means"]
    assert trainer.retraces[0].traces == 3


def test_the_watch_restores_tf_function_after_fit_even_on_error():
    original = retracing.TfFunction.__call__
    trainer = _trainer()
    with pytest.raises(Exception):
        trainer.fit(np.zeros((4, 7), "float32"), np.zeros((4, 1), "float32"), verbose=0)
    assert retracing.TfFunction.__call__ is original
    trainer.fit(*_data(), verbose=0)
    assert retracing.TfFunction.__call__ is original


def test_several_trainers_do_not_trip_tensorflows_retracing_warning(caplog):
    x, y = _data()
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        for _ in range(6):
            trainer = _trainer()
            trainer.fit(x, y, batch_size=8, verbose=0)
            trainer.evaluate(x, y, verbose=0)
            trainer.predict(x, verbose=0)
    assert "retracing" not in caplog.text
    assert trainer.retraces == []


def test_describe_and_changes():
    assert retracing.describe(tf.zeros((2, 3))) == ("tensor", (2, 3), "float32")
    assert retracing.describe(3) == ("python", 3)
    assert retracing.describe(tf.Variable(1.0)) == ("variable", (), "float32")
    before = {"x": ("tensor", (2, 3), "float32"), "k": ("python", 1)}
    after = {"x": ("tensor", (2, 3), "float64"), "k": ("python", 1)}
    assert retracing.changes(before, after) == [
        ("x", ("tensor", (2, 3), "float32"), ("tensor", (2, 3), "float64"))]
