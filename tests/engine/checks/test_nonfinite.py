"""on_nonfinite: a NaN planted in one named layer is named, with the step, and nothing is lost.

The data is 6 batches of 4; batch 3 (0-based) holds a negative feature, and
the model's first layer takes its square root: that layer's output is the
first non-finite value, while the data itself is finite. The weights after
the error must equal those of a run that trained on batches 0-2 only.
"""

import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tapeworks import CorrectnessWarning, NonFiniteError, Task, Trainer
from tapeworks.engine.step.sentinels import gradient_norms
from tapeworks.engine.checks.nonfinite import NonFiniteGuard, check_policy
from tapeworks.errors import ConfigError

BATCH = 4
BAD_BATCH = 3


class SqrtFeatures(keras.layers.Layer):
    def call(self, x):
        return tf.sqrt(x)


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.features = SqrtFeatures(name="sqrt_features")
        self.head = keras.layers.Dense(2, name="head")

    def call(self, x):
        return self.head(self.features(x))


def build(kind):
    keras.utils.set_random_seed(0)
    if kind == "sequential":
        return keras.Sequential([keras.Input((3,)), SqrtFeatures(name="sqrt_features"),
                                 keras.layers.Dense(2, name="head")])
    if kind == "functional":
        inputs = keras.Input((3,))
        hidden = SqrtFeatures(name="sqrt_features")(inputs)
        return keras.Model(inputs, keras.layers.Dense(2, name="head")(hidden))
    model = Subclassed()
    model(np.ones((1, 3), "float32"))
    return model


def data(bad_value=-1.0):
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 2.0, size=(6 * BATCH, 3)).astype("float32")
    x[BAD_BATCH * BATCH + 1, 0] = bad_value
    y = rng.normal(size=(6 * BATCH, 2)).astype("float32")
    return x, y


MODES = {
    "eager": dict(run_eagerly=True, jit_compile=False),
    "tf.function": dict(jit_compile=False),
    "xla": dict(jit_compile=True),
    "xla-update": dict(jit_compile="update"),
    # XLA gradients, the checks in TensorFlow, XLA update: what "xla" runs on
    # a CPU for large gradients (`CompiledSteps.splits_xla_step`), whatever
    # the gradients' size here.
    "xla-split": dict(jit_compile=True, split_xla_step_bytes=0),
}


def trainer_for(model, mode, accumulate=1, **options):
    trainer = Trainer(model, keras.optimizers.SGD(0.1), "mse", steps_per_call=2,
                      accumulate=accumulate, seed=0, **MODES[mode], **options)
    return trainer


# Every model kind in every mode; and with `monitor_every=2` (the bad step is
# then the call's last, monitored step) for the Functional model. The split
# XLA step on fewer of them.
BASE_MODES = [mode for mode in MODES if mode != "xla-split"]
CASES = [(kind, mode, accumulate, None) for kind in ("sequential", "functional", "subclassed")
         for mode in BASE_MODES for accumulate in (1, 2)] + [
    ("functional", mode, accumulate, 2) for mode in BASE_MODES for accumulate in (1, 2)] + [
    ("sequential", "xla-split", 1, None), ("subclassed", "xla-split", 2, None),
    ("functional", "xla-split", 2, 2)]


@pytest.mark.parametrize("kind,mode,accumulate,monitor_every", CASES)
def test_raise_names_the_layer_and_step_and_keeps_the_last_good_weights(
        kind, mode, accumulate, monitor_every, tmp_path):
    x, y = data()
    trainer = trainer_for(build(kind), mode, accumulate, nonfinite_dir=str(tmp_path),
                          monitor_every=monitor_every)
    with pytest.raises(NonFiniteError) as caught:
        trainer.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    report = caught.value.report
    message = str(caught.value)
    assert report.step == BAD_BATCH and report.batch == BAD_BATCH and report.epoch == 0
    assert report.first_layer.layer == "sqrt_features"
    assert "'sqrt_features' (SqrtFeatures)" in message and "step 3" in message
    assert not report.bad_data
    saved = np.load(report.batch_file)
    np.testing.assert_array_equal(saved["x"], x[BAD_BATCH * BATCH:(BAD_BATCH + 1) * BATCH])
    assert report.batch_file in message and os.path.dirname(report.batch_file) == str(tmp_path)

    # The reference: the same model trained on the good batches before the bad
    # one, as whole accumulation windows (a window holding the bad batch is
    # never applied).
    good = (BAD_BATCH // accumulate) * accumulate
    reference = trainer_for(build(kind), mode, accumulate)
    reference.fit(x[:good * BATCH], y[:good * BATCH], batch_size=BATCH, shuffle=False,
                  verbose=0)
    for got, want in zip(trainer.model.weights, reference.model.weights):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-7)
    assert int(trainer.optimizer.iterations) == int(reference.optimizer.iterations)
    assert all(np.isfinite(w.numpy()).all() for w in trainer.model.weights)


def test_nan_in_the_data_is_reported_as_bad_data(tmp_path):
    x, y = data(bad_value=np.nan)
    trainer = trainer_for(build("sequential"), "tf.function", nonfinite_dir=str(tmp_path))
    with pytest.raises(NonFiniteError, match=r"bad data.*x: 1 NaN, 0 Inf of 12 values"):
        trainer.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    assert all(np.isfinite(w.numpy()).all() for w in trainer.model.weights)


class ZeroScaledSqrt(keras.layers.Layer):
    """sqrt(w * x^2) with w = 0: a finite forward (0), an infinite gradient for w."""

    def build(self, shape):
        self.w = self.add_weight(shape=(), initializer="zeros", name="scale")

    def call(self, x):
        return tf.sqrt(self.w * tf.square(x))


def test_a_finite_forward_with_a_non_finite_gradient_names_the_variable(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), ZeroScaledSqrt(name="scaled_sqrt"),
                              keras.layers.Dense(2, name="head")])
    x, y = data(bad_value=1.0)
    trainer = trainer_for(model, "tf.function", nonfinite_dir=str(tmp_path))
    with pytest.raises(NonFiniteError) as caught:
        trainer.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    report = caught.value.report
    assert report.step == 0 and report.first_layer is None
    assert report.first_gradient == model.get_layer("scaled_sqrt").w.path
    assert "forward pass is finite" in str(caught.value)
    assert float(model.get_layer("scaled_sqrt").w.numpy()) == 0.0   # never updated


@pytest.mark.parametrize("mode", ["tf.function", "xla", "xla-update"])
def test_skip_trains_on_and_counts(mode):
    x, y = data()
    trainer = trainer_for(build("sequential"), mode, on_nonfinite="skip")
    history = trainer.fit(x, y, batch_size=BATCH, shuffle=False, epochs=2, verbose=0)
    # One bad batch per epoch; the count runs over the fit.
    assert history.history["nonfinite_steps"] == [1, 2]
    # Skipping batch 3 equals training on the other batches (plain SGD).
    keep = np.ones(len(x), bool)
    keep[BAD_BATCH * BATCH:(BAD_BATCH + 1) * BATCH] = False
    reference = trainer_for(build("sequential"), mode)
    reference.fit(x[keep], y[keep], batch_size=BATCH, shuffle=False, epochs=2, verbose=0)
    for got, want in zip(trainer.model.weights, reference.model.weights):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_skip_with_accumulation_skips_the_whole_window():
    x, y = data()
    trainer = trainer_for(build("sequential"), "tf.function", accumulate=2,
                          on_nonfinite="skip")
    trainer.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    # Windows (0, 1), (2, 3), (4, 5): the second holds the bad batch.
    keep = np.ones(len(x), bool)
    keep[2 * BATCH:4 * BATCH] = False
    reference = trainer_for(build("sequential"), "tf.function", accumulate=2)
    reference.fit(x[keep], y[keep], batch_size=BATCH, shuffle=False, verbose=0)
    for got, want in zip(trainer.model.weights, reference.model.weights):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_warn_applies_the_update_and_warns():
    x, y = data()
    trainer = trainer_for(build("sequential"), "tf.function", on_nonfinite="warn")
    with pytest.warns(CorrectnessWarning, match=r"3 non-finite step\(s\) in this fit so far"):
        history = trainer.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    # The NaN update was applied: every later step is non-finite too (3, 4, 5).
    assert history.history["nonfinite_steps"] == [3]
    assert not np.isfinite(trainer.model.get_layer("head").kernel.numpy()).all()


def test_none_checks_nothing():
    x, y = data()
    trainer = trainer_for(build("sequential"), "tf.function", on_nonfinite=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorrectnessWarning)
        history = trainer.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    assert "nonfinite_steps" not in history.history
    assert np.isnan(history.history["loss"][0])


def test_terminate_on_nan_stops_as_in_keras_with_the_cause_as_a_warning(tmp_path):
    x, y = data()
    trainer = trainer_for(build("sequential"), "tf.function", nonfinite_dir=str(tmp_path))
    with pytest.warns(CorrectnessWarning, match="sqrt_features.*Training stopped"):
        history = trainer.fit(x, y, batch_size=BATCH, shuffle=False, epochs=3, verbose=0,
                              callbacks=[keras.callbacks.TerminateOnNaN()])
    assert len(history.history["loss"]) == 1
    assert all(np.isfinite(w.numpy()).all() for w in trainer.model.weights)


def test_a_fit_after_a_raise_starts_clean(tmp_path):
    x, y = data()
    trainer = trainer_for(build("sequential"), "tf.function", nonfinite_dir=str(tmp_path))
    with pytest.raises(NonFiniteError):
        trainer.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    x_clean, _ = data(bad_value=1.0)
    history = trainer.fit(x_clean, y, batch_size=BATCH, shuffle=False, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_policy_is_checked():
    with pytest.raises(ConfigError, match="on_nonfinite"):
        check_policy("ignore")
    with pytest.raises(ConfigError, match="on_nonfinite"):
        Trainer(build("sequential"), "sgd", "mse", on_nonfinite="stop")


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_guard_verdict_by_hand(policy):
    guard = NonFiniteGuard(policy)

    def verdict(loss, gradients, loss_scaled=False):
        return guard.verdict(tf.constant(loss), gradient_norms(gradients),
                             loss_scaled=loss_scaled)

    ok = verdict(1.0, [tf.ones(3), None])
    assert bool(ok) and int(guard.count) == 0 and not guard.halted
    assert bool(guard.should_continue())
    # Inf in one gradient, -Inf in another: caught (norms do not cancel).
    bad = verdict(1.0, [tf.constant([1.0, np.inf]), tf.constant([-np.inf])])
    assert not bool(bad) and int(guard.count) == 1
    assert guard.halted == (policy == "raise") and not bool(guard.should_continue())
    assert not bool(verdict(np.nan, [tf.ones(2)]))
    assert not bool(verdict(1.0, [tf.constant([0.0, np.nan])]))
    # Under loss scaling the gradients' verdict is the loss scale's.
    assert bool(verdict(1.0, [tf.constant([np.inf])], loss_scaled=True))
    assert int(guard.count) == 3
    guard.reset()
    assert int(guard.count) == 0 and not guard.halted


class TwoUpdates(Task):
    """A discriminator-like update on a finite loss; a second update whose loss goes NaN."""

    def __init__(self):
        super().__init__()
        keras.utils.set_random_seed(0)
        self.first = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="first")])
        self.second = keras.Sequential([keras.Input((3,)), SqrtFeatures(name="sqrt_features"),
                                        keras.layers.Dense(2, name="second_head")])
        self.add_update("first", "first_loss", self.first, keras.optimizers.SGD(0.1))
        self.add_update("second", "second_loss", self.second, keras.optimizers.SGD(0.1))

    def compute_losses(self, batch, training):
        x, y = batch
        return {"first_loss": tf.reduce_mean(tf.square(self.first(x) - y)),
                "second_loss": tf.reduce_mean(tf.square(self.second(x) - y))}


@pytest.mark.parametrize("mode", ["tf.function", "xla", "xla-split"])
def test_several_updates_nothing_of_the_bad_step_is_applied(mode, tmp_path):
    x, y = data()
    task = TwoUpdates()
    trainer = Trainer(task, steps_per_call=2, seed=0, nonfinite_dir=str(tmp_path),
                      **MODES[mode])
    with pytest.raises(NonFiniteError) as caught:
        trainer.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    assert caught.value.report.update == "second"
    assert caught.value.report.first_layer.layer == "sqrt_features"
    reference = TwoUpdates()
    Trainer(reference, steps_per_call=2, seed=0, **MODES[mode]).fit(
        x[:BAD_BATCH * BATCH], y[:BAD_BATCH * BATCH], batch_size=BATCH, shuffle=False,
        verbose=0)
    # The first update's loss was finite at the bad step, and still it was withheld.
    for got, want in zip(task.first.weights + task.second.weights,
                         reference.first.weights + reference.second.weights):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-7)


def test_localising_leaves_batchnorm_statistics_as_they_were(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), SqrtFeatures(name="sqrt_features"),
                              keras.layers.BatchNormalization(name="norm"),
                              keras.layers.Dense(2, name="head")])
    x, y = data()
    trainer = trainer_for(model, "tf.function", nonfinite_dir=str(tmp_path))
    with pytest.raises(NonFiniteError, match="sqrt_features"):
        trainer.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    keras.utils.set_random_seed(0)
    reference_model = keras.Sequential([keras.Input((3,)), SqrtFeatures(name="sqrt_features"),
                                        keras.layers.BatchNormalization(name="norm"),
                                        keras.layers.Dense(2, name="head")])
    reference = trainer_for(reference_model, "tf.function")
    reference.fit(x[:BAD_BATCH * BATCH], y[:BAD_BATCH * BATCH], batch_size=BATCH,
                  shuffle=False, verbose=0)
    for got, want in zip(model.weights, reference_model.weights):   # moving stats included
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-7)


def test_a_loss_function_that_makes_the_nan_itself_is_named(tmp_path):
    """log() of a softmax saturated to exactly 0: every layer output finite, the loss NaN."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)),
                              keras.layers.Dense(3, activation="softmax", name="probs")])

    def my_crossentropy(y_true, y_pred):
        return -tf.reduce_mean(tf.reduce_sum(y_true * tf.math.log(y_pred), axis=-1))

    x = np.array([[1000.0, -1000.0, 500.0]] * 4, "float32")
    y = np.eye(3, dtype="float32")[[0, 1, 2, 0]]
    trainer = Trainer(model, "sgd", my_crossentropy, nonfinite_dir=str(tmp_path))
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(NonFiniteError, match="Every layer's output is finite, and the loss "
                                             "term 'loss' is non-finite") as caught:
        trainer.fit(x, y, batch_size=4, verbose=0)
    assert caught.value.report.loss_term == "loss" and caught.value.report.first_layer is None
    for got, want in zip(model.get_weights(), before):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("loss, norms, loss_scaled, expected", [
    (1.0, [2.0, None, 3.0], False, True),
    (float("nan"), [2.0], False, False),
    (1.0, [float("inf"), 2.0], False, False),
    (1.0, [2e38, 2e38], False, False),       # the float32 sum overflows
    (-3e38, [2e38], False, True),
    (1.0, [float("nan")], True, True),       # loss-scaled: the loss scale judges gradients
    (float("inf"), [], True, False),
])
def test_the_eager_verdict_is_the_graph_verdict(loss, norms, loss_scaled, expected):
    # Eagerly the verdict is summed on the host (`NonFiniteGuard._host_verdict`).
    def verdict_of(guard):
        return guard.verdict(tf.constant(loss), [None if n is None else tf.constant(n)
                                                 for n in norms], loss_scaled=loss_scaled)

    eager, graph = NonFiniteGuard("raise"), NonFiniteGuard("raise")
    assert bool(verdict_of(eager)) is expected
    assert bool(tf.function(lambda: verdict_of(graph), autograph=False)()) is expected
    assert int(eager.count.value()) == int(graph.count.value()) == (0 if expected else 1)


def test_default_batch_folder_does_not_shadow_the_package(tmp_path, monkeypatch):
    # The batch of a non-finite step goes to the temp directory by default;
    # a folder there named "tapeworks" made `python -m tapeworks.cli` run
    # from that directory import it (an empty namespace package) and fail.
    import subprocess
    import sys
    import tempfile

    from tapeworks.engine.checks import nonfinite

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = nonfinite.save_batch([("x", np.zeros(2, "float32"))], 0, None)
    assert path is not None and path.startswith(str(tmp_path))
    assert np.load(path)["x"].tolist() == [0.0, 0.0]
    run = subprocess.run([sys.executable, "-m", "tapeworks.cli", "--version"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("tapeworks ")
