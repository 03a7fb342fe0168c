"""Exploding gradients named when the non-finite check stops training (issue 37 #6): from the
gradients' sizes the dead-gradient sums already give, and this step's gradients at the kept
weights; a log of zero keeps its own message."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tapeworks import NonFiniteError, Trainer
from tapeworks.engine.checks import gradient_health, nonfinite


def diverging_regression():
    """Targets in the hundreds, a deep ReLU network, SGD with momentum: diverges in a few steps."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 10)).astype("float32")
    y = (200 + 50 * x[:, :3].sum(axis=1)).astype("float32")[:, None]
    model = keras.Sequential([keras.Input((10,))] + [
        keras.layers.Dense(64, activation="relu") for _ in range(4)] + [keras.layers.Dense(1)])
    return model, x, y


def test_a_diverging_run_is_named_as_exploding_gradients_with_clipping_as_the_fix():
    model, x, y = diverging_regression()
    trainer = Trainer(model, keras.optimizers.SGD(1e-3, momentum=0.9), "mse",
                      jit_compile=False, steps_per_call=1)
    with pytest.raises(NonFiniteError) as caught:
        trainer.fit(x, y, batch_size=32, epochs=5, verbose=0)
    text, report = str(caught.value), caught.value.report
    assert "Exploding gradients" in text and "global_clipnorm=1.0" in text
    typical, latest = report.growth
    # One step a call: the history holds steps before the bad one.
    assert typical.last < report.step
    assert latest.size >= nonfinite.EXPLODED * typical.size
    assert f"{latest.size / typical.size:.3g}-fold" in text
    assert f"over steps {typical.first}-{typical.last}" in text


def test_a_log_of_zero_keeps_its_message():
    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32") * 1000.0
    y = keras.utils.to_categorical(np.random.default_rng(1).integers(0, 3, 64), 3)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3, activation="softmax")])

    def my_crossentropy(y_true, y_pred):
        return -tf.reduce_mean(tf.reduce_sum(y_true * tf.math.log(y_pred), axis=-1))

    with pytest.raises(NonFiniteError) as caught:
        Trainer(model, "adam", my_crossentropy, jit_compile=False).fit(
            x, y, batch_size=32, epochs=2, verbose=0)
    assert "the loss function itself makes it" in str(caught.value)
    assert "Exploding" not in str(caught.value)


def test_the_watch_records_the_mean_size_between_its_reads():
    a, b = tf.Variable([0.0]), tf.Variable([0.0, 0.0])
    sums = gradient_health.DeadGradients([a, b])
    watch = gradient_health.DeadGradientWatch([sums], steps=4, owners_of=dict)
    sums.observe([a, b], [tf.constant(1.0), tf.constant(2.0)])
    watch.after_call(1, step=1)                     # step 1 reached: a read, no reset
    for _ in range(2):
        sums.observe([a, b], [tf.constant(10.0), tf.constant(20.0)])
    watch.after_call(2, step=3)                     # step 2 passed: a read
    sums.observe([a, b], [tf.constant(100.0), tf.constant(200.0)])
    watch.after_call(1, step=4)                     # 4 steps: the window's read, reset
    sums.observe([a], [tf.constant(5.0)])           # b has no gradient: it adds -1
    watch.after_call(1, step=5)
    assert watch.history == [gradient_health.GradientSize(0, 0, 3.0),
                             gradient_health.GradientSize(1, 2, 30.0),
                             gradient_health.GradientSize(3, 3, 300.0)]
    assert sums.sums().tolist() == [5.0, -1.0]      # step 5: no read due (next at 8 steps)


def report(**fields):
    base = dict(step=7, epoch=0, batch=7, update="model", loss_terms={"loss": float("nan")},
                bad_data=[])
    base.update(fields)
    return nonfinite.NonFiniteReport(**base)


def test_a_layer_fed_values_a_million_times_the_batch_s_names_grown_weights():
    layer = nonfinite.LayerOutput("dense_4", "Dense", False, (0.0, 4e26), 32)
    grown = nonfinite.message(report(first_layer=layer, batch_largest=3.0))
    assert "Exploding gradients" in grown and "the weights before it have grown" in grown
    # Raw inputs that large are the data's own scale: the layer's message stays.
    raw = nonfinite.message(report(first_layer=layer, batch_largest=1e25))
    assert "Exploding" not in raw and "The first non-finite output is layer 'dense_4'" in raw


def test_steady_gradients_are_not_called_exploding():
    steady = [gradient_health.GradientSize(0, 0, 3.0), gradient_health.GradientSize(1, 49, 40.0)]
    layer = nonfinite.LayerOutput("dense", "Dense", False, (-2.0, 2.0), 4)
    text = nonfinite.message(report(first_layer=layer, batch_largest=2.0))
    assert "Exploding" not in text
    found = report(first_layer=layer, batch_largest=2.0)
    nonfinite.measure_gradient_growth(found, steady)
    assert found.growth is None


def test_growth_is_measured_from_the_typical_size_not_the_smallest():
    # Gradients that all but vanished (a near-perfect fit), then one ordinary batch.
    vanished = [gradient_health.GradientSize(0, 0, 50.0), gradient_health.GradientSize(1, 1, 40.0),
                gradient_health.GradientSize(2, 3, 1e-3), gradient_health.GradientSize(4, 7, 45.0)]
    found = report()
    nonfinite.measure_gradient_growth(found, vanished)
    assert found.growth is None
    exploded = vanished + [gradient_health.GradientSize(8, 15, 4.5e4)]
    nonfinite.measure_gradient_growth(found, exploded)
    assert found.growth == (gradient_health.GradientSize(4, 7, 45.0), exploded[-1])
