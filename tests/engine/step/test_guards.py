"""Each guard raises a clear tapeworks error and leaves the model as it was."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks
from tests.engine import models

MODES = {
    "eager": dict(run_eagerly=True, jit_compile=False, steps_per_call=1),
    "tf.function": dict(jit_compile=False, steps_per_call=2),
    "xla": dict(jit_compile=True, steps_per_call=2),
}


def _unchanged(model, before):
    return all(np.array_equal(a, b) for a, b in zip(model.get_weights(), before))


@pytest.fixture
def data():
    return models.regression_data(n=16)


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("method", ["predict", "predict_on_batch", "train_on_batch"])
def test_keras_loop_inside_the_step(data, mode, method):
    helper = models.set_fixed_weights(models.sequential(), seed=3)
    model = models.set_fixed_weights(models.sequential())
    before = model.get_weights()

    def perceptual_loss(y_true, y_pred):
        if method == "train_on_batch":
            helper.compile("sgd", "mse")
            helper.train_on_batch(y_pred[:, :3], y_true)
        features = getattr(helper, method)(tf.concat([y_pred, y_pred[:, :1]], -1))
        return tf.reduce_mean((features - y_true) ** 2)

    trainer = tapeworks.Trainer(model, "sgd", perceptual_loss, **MODES[mode])
    with pytest.raises(tapeworks.KerasLoopInStepError) as info:
        trainer.fit(data, batch_size=8, verbose=0)
    message = str(info.value)
    assert f"{method}()" in message and "training=False" in message
    assert _unchanged(model, before)


def test_keras_loops_work_normally_outside_steps(data):
    model = models.set_fixed_weights(models.sequential())
    tapeworks.Trainer(model, "sgd", "mse", jit_compile=False).fit(data, batch_size=8, verbose=0)
    # The guard is inert outside a tapeworks step.
    assert model.predict(data[0], verbose=0).shape == (16, 3)


class PartlyUnused(keras.Model):
    def __init__(self):
        super().__init__()
        self.used = keras.layers.Dense(3)
        self.unused = keras.layers.Dense(3, name="forgotten")

    def build(self, shape):
        self.used.build(shape)
        self.unused.build(shape)

    def call(self, x, training=False):
        return self.used(x)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_missing_gradients_are_named(data, mode):
    model = PartlyUnused()
    model.build((None, 4))
    before = model.get_weights()
    trainer = tapeworks.Trainer(model, "sgd", "mse", **MODES[mode])
    with pytest.raises(tapeworks.MissingGradientError) as info:
        trainer.fit(data, batch_size=8, verbose=0)
    assert "forgotten/kernel" in str(info.value) and "forgotten/bias" in str(info.value)
    assert "allow_missing_gradients=True" in str(info.value)
    assert _unchanged(model, before)


def test_missing_gradients_can_be_allowed(data):
    model = PartlyUnused()
    model.build((None, 4))
    unused_before = [w.numpy() for w in model.unused.weights]
    trainer = tapeworks.Trainer(model, "sgd", "mse", jit_compile=False,
                                allow_missing_gradients=True)
    trainer.fit(data, batch_size=8, verbose=0)
    assert all(np.array_equal(w.numpy(), b) for w, b in zip(model.unused.weights, unused_before))
    assert int(trainer.optimizer.iterations) == 2


@pytest.mark.parametrize("dataset, pattern", [
    (lambda x, y: tf.data.Dataset.from_tensor_slices((x[:, :3], y)).batch(8),
     "size 3 on axis 1 instead of 4"),
    # (x[:, :, None] would fit: Keras squeezes a last axis of 1 the Input lacks.)
    (lambda x, y: tf.data.Dataset.from_tensor_slices((x[:, None, :], y)).batch(8),
     "rank 3 instead of 2"),
    (lambda x, y: tf.data.Dataset.from_tensor_slices(x).batch(8),
     "Expected batches of \\(x, y\\)"),
    (lambda x, y: tf.data.Dataset.from_tensor_slices(
        (tf.strings.as_string(x), y)).batch(8), "dtype string"),
    (lambda x, y: tf.data.Dataset.from_tensor_slices(((x, x), y)).batch(8),
     "2 input tensor"),
])
def test_data_that_does_not_fit_the_model(data, dataset, pattern):
    model = models.set_fixed_weights(models.sequential())
    before = model.get_weights()
    trainer = tapeworks.Trainer(model, "sgd", "mse", jit_compile=False)
    with pytest.raises(tapeworks.DataSpecError, match=pattern) as info:
        trainer.fit(dataset(*data), verbose=0)
    assert "Expected" in str(info.value) and "Fix" in str(info.value)
    assert _unchanged(model, before)


def test_non_scalar_loss(data):
    model = models.set_fixed_weights(models.sequential())
    before = model.get_weights()
    trainer = tapeworks.Trainer(model, "sgd", keras.losses.MeanSquaredError(reduction=None),
                                jit_compile=False)
    with pytest.raises(tapeworks.LossError, match="has shape \\((None|8),\\).*Expected a scalar"):
        trainer.fit(data, batch_size=8, verbose=0)
    assert _unchanged(model, before)


class IntegerLoss(keras.Sequential):
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return tf.reduce_sum(tf.cast(y_pred > 0, tf.int32))


def test_integer_loss(data):
    model = IntegerLoss([keras.Input((4,)), keras.layers.Dense(3)])
    before = model.get_weights()
    trainer = tapeworks.Trainer(model, "sgd", "mse", jit_compile=False)
    with pytest.raises(tapeworks.LossError, match="dtype int32.*floating-point"):
        trainer.fit(data, batch_size=8, verbose=0)
    assert _unchanged(model, before)


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(jit_compile="yes"), "jit_compile"),
    (dict(loss=None), "not compiled, and `optimizer` and `loss` were not both given"),
    (dict(optimizer=None), "not compiled, and `optimizer` and `loss` were not both given"),
    (dict(run_eagerly=True, jit_compile=True), "run_eagerly"),
])
def test_bad_arguments(kwargs, pattern):
    args = dict(optimizer="sgd", loss="mse")
    args.update(kwargs)
    with pytest.raises(tapeworks.ConfigError, match=pattern):
        tapeworks.Trainer(models.sequential(), **args)


def test_bad_fit_arguments(data):
    trainer = tapeworks.Trainer(models.sequential(), "sgd", "mse", jit_compile=False)
    with pytest.raises(tapeworks.ConfigError, match="epochs"):
        trainer.fit(data, batch_size=8, epochs=-1)
    with pytest.warns(tapeworks.CorrectnessWarning, match="batch_size"):
        trainer.fit(tf.data.Dataset.from_tensor_slices(data).batch(2), batch_size=8, verbose=0)
    with pytest.raises(tapeworks.DataSpecError, match="different numbers of samples"):
        trainer.fit((data[0], data[1][:5]), batch_size=8)
    with pytest.raises(tapeworks.ConfigError, match="verbose"):
        trainer.fit(data, batch_size=8, verbose=5)
