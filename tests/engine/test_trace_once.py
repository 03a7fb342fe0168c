"""The loss names are read from one trace into a scratch graph (`training_state.trace_once`).

As Keras' `fit` builds its metrics (`backend.compute_output_spec`): Keras'
variables made there are created eagerly when the trace ends; a trace that
would make any other `tf.Variable` stops before making it, and the caller
traces with `tf.function` instead, so such a task still trains.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks
from tapeworks.engine import training_state
from tapeworks.engine.step import graph_outputs


def test_keras_variables_made_in_the_trace_exist_eagerly_after_it_and_start_at_zero():
    mean = keras.metrics.Mean()
    created_inside = []

    def fn(x):
        metric = keras.metrics.Sum()   # variables made while tracing
        created_inside.append(metric)
        metric.update_state(x)
        mean.update_state(x)
        return {"b": tf.reduce_sum(x), "a": x * 2.0}

    out = training_state.trace_once(fn, tf.TensorSpec((None, 3), tf.float32))
    assert sorted(out) == ["a", "b"] and out["a"].shape.as_list() == [None, 3]
    (metric,) = created_inside
    assert metric.variables and all(v.numpy() == 0.0 for v in metric.variables)
    # The scratch trace ran nothing: the eager metric's state is untouched.
    assert float(mean.result()) == 0.0 and float(mean.count.numpy()) == 0.0


def test_a_trace_that_would_make_another_kind_of_variable_is_stopped_before_making_it():
    made = []

    def fn(x):
        made.append(tf.Variable(1.0))
        return {"loss": tf.reduce_sum(x)}

    assert training_state.trace_once(fn, tf.TensorSpec((None, 3), tf.float32)) is None
    assert made == []


def test_inputs_other_than_plain_tensors_are_left_to_tf_function():
    spec = tf.RaggedTensorSpec((None, None), tf.float32)
    assert training_state.trace_once(lambda x: {"loss": tf.reduce_sum(x)}, spec) is None


class LazyScale(tapeworks.Task):
    """Creates a raw `tf.Variable` the first time its losses are computed."""

    def __init__(self, model):
        super().__init__()
        self.net, self.scale = model, None
        self.add_update("net", "loss", model, keras.optimizers.SGD(0.1))

    def compute_losses(self, batch, training):
        if self.scale is None:
            self.scale = tf.Variable(0.5, trainable=False)
        x, y = batch
        return {"loss": self.scale * tf.reduce_mean((self.net(x, training=training) - y) ** 2)}


def test_a_task_that_makes_its_own_tf_variable_while_traced_still_trains():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    x = np.array([[1.0, 2.0], [3.0, -1.0]], "float32")
    y = np.array([[1.0], [0.0]], "float32")
    kernel = model.layers[0].kernel.numpy().copy()
    bias = model.layers[0].bias.numpy().copy()
    history = tapeworks.Trainer(LazyScale(model), jit_compile=False, steps_per_call=1,
                                plan_cache=False).fit(x, y, batch_size=2, epochs=1, verbose=0)
    # One SGD step on 0.5 * mean squared error, by hand.
    error = x @ kernel + bias - y
    expected_loss = 0.5 * float(np.mean(error ** 2))
    assert history.history["loss"][0] == pytest.approx(expected_loss, rel=1e-6)
    kernel_grad = 0.5 * 2.0 * x.T @ error / 2.0
    np.testing.assert_allclose(model.layers[0].kernel.numpy(), kernel - 0.1 * kernel_grad,
                               rtol=1e-6)


def test_a_trace_that_fails_is_left_to_tf_function():
    def fn(x):
        keras.optimizers.SGD(0.1).build([keras.Variable(1.0)])   # refused in a stateless scope
        return {"loss": tf.reduce_sum(x)}

    assert training_state.trace_once(fn, tf.TensorSpec((None, 3), tf.float32)) is None


def test_a_model_with_a_weight_regularizer_is_traced_once_and_its_penalty_reads_the_weights():
    # In Keras' stateless scope alone the regularizer read no value for a
    # variable made before it and failed (the trace then fell back to
    # tf.function's double trace); in the symbolic scope too it reads the
    # variable, as `backend.compute_output_spec` lets it.
    model = keras.Sequential([
        keras.Input((2,)),
        keras.layers.Dense(1, kernel_regularizer=keras.regularizers.L2(0.5), use_bias=False)])
    model.layers[0].kernel.assign([[1.0], [2.0]])

    def fn(x):
        out = model(x)
        return {"loss": tf.reduce_mean(out), "penalty": tf.add_n(model.losses)}

    out = training_state.trace_once(fn, tf.TensorSpec((None, 2), tf.float32))
    assert out is not None and sorted(out) == ["loss", "penalty"]
    assert out["penalty"].shape.rank == 0 and out["penalty"].dtype == tf.float32
    # Nothing ran and nothing was assigned: the eager penalty is 0.5 * (1 + 4).
    assert float(tf.add_n(model.losses)) == pytest.approx(2.5)


def test_a_regularized_model_trains_as_keras_trains_it():
    def fitted(fit):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((2,)),
            keras.layers.Dense(3, activation="relu", kernel_regularizer=keras.regularizers.L2(0.1)),
            keras.layers.Dense(1, kernel_regularizer=keras.regularizers.L2(0.1))])
        model.compile(keras.optimizers.SGD(0.1), "mse")
        x = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [-1.0, 1.0]], "float32")
        y = np.array([[1.0], [0.0], [0.5], [2.0]], "float32")
        history = fit(model)(x, y, batch_size=2, epochs=2, shuffle=False, verbose=0)
        return history.history["loss"], [w.numpy() for w in model.weights]

    keras_loss, keras_weights = fitted(lambda m: m.fit)
    ours_loss, ours_weights = fitted(lambda m: tapeworks.Trainer(
        m, jit_compile=False, steps_per_call=1, plan_cache=False).fit)
    np.testing.assert_allclose(ours_loss, keras_loss, rtol=1e-5)
    for ours, theirs in zip(ours_weights, keras_weights):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-7)


class CountsCalls(keras.layers.Layer):
    """A Dense-like layer that counts how often its `call` runs (traced or eager)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = 0

    def build(self, shape):
        self.kernel = self.add_weight(shape=(shape[-1], 1), initializer="ones")

    def call(self, x):
        self.calls += 1
        return x @ self.kernel


def test_an_unbuilt_model_is_built_by_the_losses_scratch_trace_not_traced_twice_more():
    x = np.array([[1.0, 2.0], [3.0, -1.0]], "float32")
    y = np.array([[1.0], [0.0]], "float32")
    layer = CountsCalls()
    model = keras.Sequential([layer])   # no Input: built by the first batch
    model.compile(keras.optimizers.SGD(0.1), "mse")
    trainer = tapeworks.Trainer(model, jit_compile=False, steps_per_call=1, plan_cache=False)
    history = trainer.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    # Keras' Sequential build calls it once (symbolically), then once in
    # the scratch trace (loss names) and once in the step's trace; building
    # with tf.function first traced the model twice more (5 calls).
    assert layer.calls == 3 and trainer.traces["train_step"] == 1
    error = x @ np.ones((2, 1), "float32") - y
    assert history.history["loss"][0] == pytest.approx(float(np.mean(error ** 2)), rel=1e-6)
    np.testing.assert_allclose(layer.kernel.numpy(),
                               np.ones((2, 1)) - 0.1 * 2.0 * x.T @ error / 2.0, rtol=1e-6)


class RawVariableAfterWeights(keras.layers.Layer):
    """Makes a weight with add_weight, then a tf.Variable of its own, in build."""

    def build(self, shape):
        self.kernel = self.add_weight(shape=(shape[-1], 1), initializer="ones")
        self.scale = tf.Variable(1.0)

    def call(self, x):
        return x @ self.kernel * self.scale


def test_a_build_stopped_after_making_weights_is_refused_naming_the_layer_not_built_twice():
    model = keras.Sequential([RawVariableAfterWeights(name="mixed")])
    model.compile("sgd", "mse")
    expected = r"build of mixed.*`tf.Variable` of its own after weights made with `add_weight`"
    with pytest.raises(tapeworks.ConfigError, match=expected):
        tapeworks.Trainer(model, jit_compile=False, plan_cache=False).fit(
            np.ones((4, 2), "float32"), np.ones((4, 1), "float32"), verbose=0)
    assert len(model.weights) == 1   # not a second kernel beside the first


class ReadsAValueInBuild(keras.layers.Layer):
    """Makes a weight, then reads a tensor's value in build (which only eager code can)."""

    def build(self, shape):
        self.kernel = self.add_weight(shape=(shape[-1], 1), initializer="ones")
        self.scale = float(tf.reduce_sum(self.kernel).numpy())

    def call(self, x):
        return x @ self.kernel * self.scale


def test_a_build_stopped_for_another_reason_names_what_it_raised():
    model = keras.Sequential([ReadsAValueInBuild(name="reads")])
    model.compile("sgd", "mse")
    with pytest.raises(tapeworks.ConfigError, match=r"build of reads.*it raised \w+"):
        tapeworks.Trainer(model, jit_compile=False, plan_cache=False).fit(
            np.ones((4, 2), "float32"), np.ones((4, 1), "float32"), verbose=0)
    assert len(model.weights) == 1


def test_a_built_functional_model_is_not_called_by_the_build_only_by_its_step():
    # Its outputs' shapes and dtypes are in its graph of layers: the build's
    # scratch trace reads them there (`graph_outputs`) instead of tracing
    # the model once more before the step's own trace.
    x = np.array([[1.0, 2.0], [3.0, -1.0]], "float32")
    y = np.array([[1.0], [0.0]], "float32")
    layer = CountsCalls()
    model = keras.Sequential([keras.Input((2,)), layer])
    model.compile(keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
    built_by_keras = layer.calls   # the Sequential's own symbolic call
    trainer = tapeworks.Trainer(model, jit_compile=False, steps_per_call=1, plan_cache=False)
    history = trainer.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    assert layer.calls - built_by_keras == 1 and trainer.traces["train_step"] == 1
    error = x @ np.ones((2, 1), "float32") - y
    assert history.history["loss"][0] == pytest.approx(float(np.mean(error ** 2)), rel=1e-6)
    assert history.history["mae"][0] == pytest.approx(float(np.mean(np.abs(error))), rel=1e-6)


def test_the_output_spec_read_from_the_graph_is_what_a_call_returns():
    inputs = {"a": keras.Input((3,), name="a"), "b": keras.Input((4, 2), name="b")}
    flat = keras.layers.Concatenate()([inputs["a"], keras.layers.Flatten()(inputs["b"])])
    model = keras.Model(inputs, {"score": keras.layers.Dense(1)(flat),
                                 "classes": keras.layers.Dense(5, dtype="float16")(flat)})
    spec = graph_outputs.output_spec(model)
    called = model({"a": tf.zeros((7, 3)), "b": tf.zeros((7, 4, 2))})
    assert sorted(spec) == sorted(called) == ["classes", "score"]
    for name, out in called.items():
        assert spec[name].shape.as_list() == [None, *out.shape[1:]]
        assert spec[name].dtype == out.dtype
    single = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    assert graph_outputs.output_spec(single) == tf.TensorSpec((None, 3), tf.float32)


class OwnCall(keras.Model):
    def call(self, x):
        return {"twice": super().call(x) * 2.0}


def test_models_whose_outputs_only_a_call_tells_are_called():
    variable_length = keras.Input((None,))
    assert graph_outputs.output_spec(keras.Model(
        variable_length, keras.layers.Dense(2)(variable_length[..., None]))) is None
    assert graph_outputs.output_spec(keras.Sequential([keras.layers.Dense(2)])) is None
    inputs = keras.Input((2,))
    assert graph_outputs.output_spec(OwnCall(inputs, keras.layers.Dense(1)(inputs))) is None


class LossNeedsTheCall(keras.Model):
    """A Functional model whose loss only traces after the model was called."""

    def __call__(self, *args, **kwargs):
        self.was_called = True
        return super().__call__(*args, **kwargs)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        self.loss_traces.append(getattr(self, "was_called", False))
        if not self.was_called:
            raise ValueError("the loss was asked for before the model was called")
        return super().compute_loss(x, y, y_pred, sample_weight, training=training)


def test_a_loss_that_fails_without_the_models_call_is_traced_again_with_it():
    inputs = keras.Input((2,))
    model = LossNeedsTheCall(inputs, keras.layers.Dense(1, kernel_initializer="ones")(inputs))
    model.was_called, model.loss_traces = False, []
    model.compile(keras.optimizers.SGD(0.1), "mse")
    x = np.array([[1.0, 2.0], [3.0, -1.0]], "float32")
    y = np.array([[1.0], [0.0]], "float32")
    history = tapeworks.Trainer(model, jit_compile=False, steps_per_call=1, plan_cache=False).fit(
        x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    # The build's trace without the call failed, the one with it named the
    # loss, then the step's own trace.
    assert model.loss_traces[:2] == [False, True]
    error = x @ np.ones((2, 1), "float32") - y
    assert history.history["loss"][0] == pytest.approx(float(np.mean(error ** 2)), rel=1e-6)
