"""A compiled model's metrics in tapeworks' step: updated as Keras' `compute_metrics` updates them.

Keras' own `compute_metrics` updates the compiled metrics and then returns
every metric's result; tapeworks reads the results once at the end of a
call, so its step updates without reading them. An override of
`compute_metrics` is called as Keras' `train_step` calls it.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks
from tapeworks.engine.step import task as task_lib

X = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5], [-1.0, 1.0]], "float32")
Y = np.array([[1.0], [0.0], [1.0], [0.0]], "float32")


def _model(cls=keras.Sequential):
    keras.utils.set_random_seed(0)
    if cls is keras.Sequential:
        return cls([keras.Input((2,)), keras.layers.Dense(1, activation="sigmoid")])
    inputs = keras.Input((2,))
    return cls(inputs, keras.layers.Dense(1, activation="sigmoid")(inputs))


def test_the_step_updates_the_metrics_without_reading_their_results():
    model = _model()
    model.compile("sgd", "binary_crossentropy", metrics=["accuracy", "mae"])
    task = task_lib.SupervisedTask(model)
    x, y = tf.constant(X), tf.constant(Y)

    def step():
        _, outputs = task.compute_losses((x, y), training=False)
        task.update_metrics((x, y), outputs)

    graph = tf.function(step).get_concrete_function().graph
    # A metric's result is a division (`divide_no_nan`); the loss' mean has
    # its own, inside `compile_loss`: nothing else divides in the step.
    divisions = [op.name for op in graph.get_operations() if op.type == "DivNoNan"]
    assert all(name.startswith("compile_loss/") for name in divisions), divisions
    tf.function(step)()
    results = {k: float(v) for k, v in task.metric_results().items()}
    expected = {k: float(v) for k, v in model.get_metrics_result().items() if k != "loss"}
    assert results == expected and sorted(results) == ["accuracy", "mae"]
    assert results["accuracy"] == pytest.approx(
        float(np.mean((model.predict(X, verbose=0) > 0.5) == Y)))


class CountsPositives(keras.Model):
    """A model with its own `compute_metrics`, as Keras' docs show it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.positives = keras.metrics.Sum(name="positives")

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        results = super().compute_metrics(x, y, y_pred, sample_weight)
        self.positives.update_state(tf.reduce_sum(tf.cast(y_pred > 0.5, "float32")))
        results["positives"] = self.positives.result()
        return results


def test_an_override_of_compute_metrics_is_called_as_keras_calls_it():
    def fitted(fit):
        model = _model(CountsPositives)
        model.compile(keras.optimizers.SGD(0.1), "binary_crossentropy", metrics=["accuracy"])
        history = fit(model)(X, Y, batch_size=2, epochs=2, shuffle=False, verbose=0)
        return history.history

    keras_history = fitted(lambda m: m.fit)
    ours = fitted(lambda m: tapeworks.Trainer(m, jit_compile=False, steps_per_call=1,
                                               plan_cache=False).fit)
    assert sorted(ours) == sorted(keras_history) == ["accuracy", "loss", "positives"]
    for key in keras_history:
        np.testing.assert_allclose(ours[key], keras_history[key], rtol=1e-6)
