"""How a model with its own `train_step` is built before its first step: one trace, not two.

Keras' fit traces such a step twice when the step creates the model's
variables (`tf.function` traces once creating them, once more without).
tapeworks builds it in a scratch graph whose variables are created eagerly
(`training_state.trace_lifted`), then traces its compiled step: two traces
in all, where a `tf.function` build made three. A variable the step makes
from a tensor it computed cannot be made outside that graph: the build
falls back to `tf.function`'s, and trains the same.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks
from tapeworks.errors import ConfigError
from tests.engine.step.test_model_step import TwoOptimizers, X, Y


class Pair(TwoOptimizers):
    """Two unbuilt sub-models, two optimizers, and variables the step makes itself."""

    def __init__(self, computed_variable=False):
        super().__init__(built=False)
        self.computed_variable = computed_variable
        self.steps_seen = None     # a tf.Variable the step makes, as some scripts do
        self.last_kernel = None
        self.traces = 0

    def train_step(self, data):
        self.traces += 1
        logs = super().train_step(data)
        if self.steps_seen is None:
            self.steps_seen = tf.Variable(0, trainable=False)
        self.steps_seen.assign_add(1)
        if self.computed_variable:
            if self.last_kernel is None:
                # Made from a tensor the step computed: only tf.function lifts it.
                self.last_kernel = tf.Variable(tf.zeros_like(self.first.kernel),
                                               trainable=False)
            self.last_kernel.assign(self.first.kernel)
        return logs


def pair(computed_variable=False):
    model = Pair(computed_variable)
    model.compile(keras.optimizers.SGD(0.05), keras.optimizers.Adam(0.01))
    return model


def fit_both(computed_variable, **trainer_options):
    reference, model = pair(computed_variable), pair(computed_variable)
    expected = reference.fit(X, Y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    history = tapeworks.Trainer(model, **trainer_options).fit(
        X, Y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    assert sorted(history.history) == sorted(expected.history)
    for key, values in expected.history.items():
        np.testing.assert_allclose(history.history[key], values, rtol=1e-5, atol=1e-6)
    for got, want in zip(model.weights, reference.weights):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    return reference, model


@pytest.mark.parametrize("jit_compile", [False, True], ids=["tf_function", "xla"])
def test_an_unbuilt_own_step_model_is_traced_twice_as_keras_traces_it(jit_compile):
    reference, model = fit_both(False, jit_compile=jit_compile, steps_per_call=3)
    # Keras: two (tf.function's, as the step makes variables). tapeworks: the
    # scratch build and the compiled step.
    assert reference.traces == 2
    assert model.traces == 2
    # The step's own variable was made once, outside any graph, and counted every step.
    assert int(model.steps_seen.numpy()) == int(reference.steps_seen.numpy()) == 12
    assert int(model.second_optimizer.iterations.numpy()) == 12


def test_a_variable_made_from_a_computed_tensor_is_built_by_tf_function_and_trains_the_same():
    reference, model = fit_both(True, jit_compile=False, steps_per_call=3)
    np.testing.assert_allclose(model.last_kernel.numpy(), model.first.kernel.numpy())
    assert int(model.steps_seen.numpy()) == 12
    # The scratch trace stopped before that variable, with the layers and
    # optimizers built; the compiled step's `tf.function` made it (two traces).
    assert model.traces == 3


class HalfBuilt(keras.layers.Layer):
    """A layer whose build makes a weight, then a variable from a tensor it computed."""

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], 1), initializer="ones")
        self.shifted = tf.Variable(tf.zeros_like(self.kernel) + 1.0, trainable=False)

    def call(self, x):
        return tf.matmul(x, self.kernel + self.shifted)


class HalfBuiltModel(keras.Model):
    def __init__(self):
        super().__init__()
        self.layer = HalfBuilt()

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self.layer(x) - y))
        self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_weights),
                                           self.trainable_weights))
        return {"loss": loss}


def test_a_build_stopped_after_making_weights_is_refused_and_names_the_layer():
    model = HalfBuiltModel()
    model.compile(keras.optimizers.SGD(0.1))
    with pytest.raises(ConfigError) as caught:
        tapeworks.Trainer(model, jit_compile=False).fit(X, Y, batch_size=4, verbose=0)
    message = str(caught.value)
    assert "half_built" in message
    assert "from a tensor it computed" in message
    assert "add_weight" in message
    # Nothing trained: the one weight made keeps its initial value.
    np.testing.assert_array_equal(model.layer.kernel.numpy(), np.ones((2, 1), "float32"))
