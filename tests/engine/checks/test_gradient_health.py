"""Dead gradients (`dead_gradient_steps`) and the per-layer monitor (`monitor_every`).

Dead: a Dense layer whose bias starts at -100 sees only negative
pre-activations, so its ReLU outputs zero for every sample: its kernel and
bias, and the next layer's kernel (fed zeros), get exactly zero gradients.
Monitor: with plain SGD one step changes the weights by lr x gradient, so the
expected norms are computed by hand from a GradientTape on the same batch.
"""

import glob
import math
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tapeworks import CorrectnessWarning, Trainer
from tapeworks.engine.checks.monitor import MonitorReport
from tapeworks.errors import ConfigError

# "xla-split": XLA gradients, the checks in TensorFlow, XLA update: what
# "xla" runs on a CPU for large gradients (`CompiledSteps.splits_xla_step`).
SPLIT_XLA = dict(jit_compile=True, split_xla_step_bytes=0)   # whatever the gradients' size
MODES = [dict(run_eagerly=True, jit_compile=False), dict(jit_compile=False),
         dict(jit_compile=True), dict(jit_compile="update"), SPLIT_XLA]
MODE_IDS = ["eager", "tf.function", "xla", "xla-update", "xla-split"]


def trainer_in(mode, *args, **kwargs):
    return Trainer(*args, **kwargs, **mode)


def regression_data(n=64, features=4, outputs=1, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(0, 1, (n, features)).astype("float32"),
            rng.normal(size=(n, outputs)).astype("float32"))


def dying_model():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, activation="relu", name="dying",
                                bias_initializer=keras.initializers.Constant(-100.0))(inputs)
    skip = keras.layers.Dense(1, name="skip")(inputs)
    return keras.Model(inputs, keras.layers.Add()([keras.layers.Dense(1, name="head")(hidden),
                                                   skip]))


def fit_recording(trainer, data, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(data, verbose=0, **kwargs)
    return [str(w.message) for w in caught if issubclass(w.category, CorrectnessWarning)]


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_a_dead_relu_layer_is_named_with_its_cause(mode):
    trainer = trainer_in(mode, dying_model(), "sgd", "mse", steps_per_call=4,
                         dead_gradient_steps=10)
    messages = fit_recording(trainer, regression_data(), batch_size=8, epochs=2)
    dead = [m for m in messages if "exactly zero" in m]
    assert len(dead) == 1, messages
    assert "dying (dying/kernel, dying/bias)" in dead[0]
    assert "head (head/kernel)" in dead[0]
    # The layers that do train are not named.
    assert "skip" not in dead[0].split("Likely causes")[0]
    assert "head/bias" not in dead[0]
    assert "layer 'dying' ends in relu" in dead[0]


def test_not_named_before_the_count_is_reached_and_named_once():
    trainer = Trainer(dying_model(), "sgd", "mse", steps_per_call=4, dead_gradient_steps=20)
    # 16 steps: fewer than 20.
    assert not [m for m in fit_recording(trainer, regression_data(), batch_size=4, epochs=1)
                if "exactly zero" in m]
    # The count goes on across fits: 16 more steps pass 20; named once, not again.
    first = fit_recording(trainer, regression_data(), batch_size=4, epochs=1)
    again = fit_recording(trainer, regression_data(), batch_size=4, epochs=1)
    assert len([m for m in first if "exactly zero" in m]) == 1
    assert not [m for m in again if "exactly zero" in m]


def test_a_sign_op_on_the_path_zeroes_the_gradient_and_is_named():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    binarised = keras.layers.Lambda(tf.sign)(keras.layers.Dense(3, name="binarised")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1, name="out")(binarised))
    trainer = Trainer(model, "sgd", "mse", dead_gradient_steps=8)
    dead = [m for m in fit_recording(trainer, regression_data(), batch_size=8, epochs=2)
            if "exactly zero" in m]
    assert len(dead) == 1 and "binarised (binarised/kernel, binarised/bias)" in dead[0]
    assert "out" not in dead[0].split("Likely causes")[0]
    assert "tf.sign" in dead[0]


def test_a_healthy_model_and_a_disabled_check_say_nothing():
    keras.utils.set_random_seed(0)
    healthy = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                keras.layers.Dense(1)])
    trainer = Trainer(healthy, "sgd", "mse", dead_gradient_steps=5)
    assert not fit_recording(trainer, regression_data(), batch_size=8, epochs=3)
    off = Trainer(dying_model(), "sgd", "mse", dead_gradient_steps=None)
    assert not fit_recording(off, regression_data(), batch_size=8, epochs=3)


def test_a_variable_allowed_to_have_no_gradient_is_not_called_dead():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    unused = keras.layers.Dense(2, name="unused")
    unused(inputs)   # built, never on the loss's path
    model = keras.Model(inputs, keras.layers.Dense(1, name="used")(inputs))
    model.unused = unused
    trainer = Trainer(model, "sgd", "mse", allow_missing_gradients=True,
                      dead_gradient_steps=4)
    assert not fit_recording(trainer, regression_data(), batch_size=8, epochs=2)


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "50"])
def test_dead_gradient_steps_is_validated(value):
    with pytest.raises(ConfigError, match="dead_gradient_steps"):
        Trainer(dying_model(), "sgd", "mse", dead_gradient_steps=value)


# The monitor ------------------------------------------------------------------

def small_model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="first"),
                             keras.layers.Dense(2, name="second")])


def by_hand(model, x, y):
    """Per-layer (gradient norm, weight norm) of the mean squared error on (x, y)."""
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    grads = tape.gradient(loss, model.trainable_variables)
    grad_of = {id(v): g for v, g in zip(model.trainable_variables, grads)}
    out = {}
    for layer in model.layers:
        g = sum(float(tf.reduce_sum(tf.square(grad_of[id(v)])))
                for v in layer.trainable_variables)
        w = sum(float(tf.reduce_sum(tf.square(v))) for v in layer.trainable_variables)
        out[layer.name] = (math.sqrt(g), math.sqrt(w))
    return out


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_monitor_values_equal_norms_computed_by_hand(mode):
    x, y = regression_data(8, features=3, outputs=2)
    model = small_model()
    expected = by_hand(model, x, y)
    lr = 0.1
    trainer = trainer_in(mode, model, keras.optimizers.SGD(lr), "mse", monitor_every=1,
                         dead_gradient_steps=None)
    history = trainer.fit((x, y), batch_size=8, epochs=1, verbose=0, shuffle=False)
    [record] = trainer.monitor_history
    assert record["step"] == 0
    for layer, (grad, weight) in expected.items():
        stats = record["layers"][layer]
        assert stats["gradient_norm"] == pytest.approx(grad, rel=1e-5)
        assert stats["weight_norm"] == pytest.approx(weight, rel=1e-5)
        # SGD: the update is lr x gradient.
        assert stats["update_ratio"] == pytest.approx(lr * grad / weight, rel=1e-4)
        assert history.history[f"gradient_norm/{layer}"][0] == pytest.approx(grad, rel=1e-5)


@pytest.mark.parametrize("steps_per_call", [2, 8])
def test_monitor_runs_every_k_steps_without_changing_training(steps_per_call):
    x, y = regression_data(64, features=3, outputs=2)
    plain = Trainer(small_model(), "adam", "mse", steps_per_call=steps_per_call,
                    jit_compile=False)
    plain.fit((x, y), batch_size=8, epochs=2, verbose=0, shuffle=False)
    monitored = Trainer(small_model(), "adam", "mse", steps_per_call=steps_per_call,
                        monitor_every=3, jit_compile=False)
    monitored.fit((x, y), batch_size=8, epochs=2, verbose=0, shuffle=False)
    # Every 3rd step, inside calls of 2 steps and of 8 (up to three monitored
    # steps in one call, between plain ones).
    assert [r["step"] for r in monitored.monitor_history] == [2, 5, 8, 11, 14]
    for a, b in zip(plain.model.get_weights(), monitored.model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # Adam's first steps move each weight by about lr: ratios are small and positive.
    assert all(0 < s["update_ratio"] < 0.1 for r in monitored.monitor_history
               for s in r["layers"].values())


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_each_monitored_step_of_a_call_keeps_its_own_statistics(mode):
    # monitor_every=1 with 6 steps per call: every step is monitored, four
    # records a call at most (the call then ends on the fourth). SGD moves
    # each weight by lr x its gradient, so each record's update norm is lr
    # times its own gradient norm, whatever slot it was kept in.
    x, y = regression_data(48, features=3, outputs=2)
    lr = 0.1
    trainer = trainer_in(mode, small_model(), keras.optimizers.SGD(lr), "mse",
                         monitor_every=1, steps_per_call=6, dead_gradient_steps=None)
    trainer.fit((x, y), batch_size=8, epochs=1, verbose=0, shuffle=False)
    history = trainer.monitor_history
    assert [r["step"] for r in history] == list(range(6))
    for record in history:
        for stats in record["layers"].values():
            assert stats["update_ratio"] * stats["weight_norm"] == pytest.approx(
                lr * stats["gradient_norm"], rel=1e-4)
    # The weights move from record to record: no slot was read twice.
    norms = [r["layers"]["first"]["weight_norm"] for r in history]
    assert len(set(norms)) == len(norms)
    assert int(trainer.optimizer.iterations) == 6


@pytest.mark.parametrize("steps_per_call", [2, 8])
def test_with_accumulation_the_monitored_step_is_the_first_window_close_after_each_kth(
        steps_per_call):
    # accumulate=4: windows close at steps 3, 7, 11, 15; monitor_every=3: the
    # 3rd steps are 2, 5, 8, 11, 14. With 2 steps per call, step 5 is due when
    # a call ends at step 5 and its window closes in the next call, at 7.
    x, y = regression_data(128, features=3, outputs=2)
    trainer = Trainer(small_model(), "sgd", "mse", accumulate=4, monitor_every=3,
                      steps_per_call=steps_per_call, jit_compile=False)
    trainer.fit((x, y), batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert [r["step"] for r in trainer.monitor_history] == [3, 7, 11, 15]


def test_monitor_with_accumulation_sees_the_window_gradient():
    x, y = regression_data(16, features=3, outputs=2)
    model = small_model()
    expected = by_hand(model, x, y)   # the window's two micro-batches of 8 = one batch of 16
    trainer = Trainer(model, keras.optimizers.SGD(0.1), "mse", accumulate=2, monitor_every=1,
                      jit_compile=False)
    trainer.fit((x, y), batch_size=8, epochs=1, verbose=0, shuffle=False)
    [record] = trainer.monitor_history
    assert record["step"] == 1   # the step that closed the window
    for layer, (grad, weight) in expected.items():
        assert record["layers"][layer]["gradient_norm"] == pytest.approx(grad, rel=1e-5)
        assert record["layers"][layer]["weight_norm"] == pytest.approx(weight, rel=1e-5)


def test_monitor_writes_tensorboard_scalars_and_gradient_histograms(tmp_path):
    x, y = regression_data(32, features=3, outputs=2)
    trainer = Trainer(small_model(), "sgd", "mse", monitor_every=2)
    board = keras.callbacks.TensorBoard(str(tmp_path), histogram_freq=1)
    trainer.fit((x, y), batch_size=8, epochs=1, verbose=0, callbacks=[board])
    tags = {}
    for path in glob.glob(str(tmp_path / "train" / "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(event.step)
    assert tags["monitor/gradient_norm/first"] == [1, 3]
    assert "monitor/update_ratio/second" in tags
    [kernel] = [t for t in tags if t.startswith("gradients/") and t.endswith("/second/kernel")]
    assert tags[kernel] == [1, 3]


def test_monitor_warns_when_a_layer_explodes_or_vanishes():
    report = MonitorReport()
    for step in range(5):
        report.add(step, {"a": {"gradient_norm": 1.0, "weight_norm": 1.0, "update_ratio": 0.01},
                          "b": {"gradient_norm": 2.0, "weight_norm": 1.0, "update_ratio": 0.01}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report.add(5, {"a": {"gradient_norm": 500.0, "weight_norm": 1.0, "update_ratio": 1.0},
                       "b": {"gradient_norm": 0.001, "weight_norm": 1.0, "update_ratio": 0.0}})
        report.add(6, {"a": {"gradient_norm": 900.0, "weight_norm": 1.0, "update_ratio": 1.0},
                       "b": {"gradient_norm": 2.0, "weight_norm": 1.0, "update_ratio": 0.0}})
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2   # each layer and kind once
    assert "'a' exploded at step 5: 500, 500x its running median (1)" in messages[0]
    assert "'b' vanished at step 5" in messages[1]


def test_monitor_every_is_validated():
    with pytest.raises(ConfigError, match="monitor_every"):
        Trainer(small_model(), "sgd", "mse", monitor_every=0)
    # Calls longer than monitor_every hold several monitored steps.
    Trainer(small_model(), "sgd", "mse", monitor_every=4, steps_per_call=8)
    with pytest.raises(ConfigError, match="larger than `capture_every` \\(4\\): a call would "
                                          "hold several captures"):
        Trainer(small_model(), "sgd", "mse", capture_every=4, steps_per_call=8)
