"""`Trainer.explain` and `python -m tapeworks.explain`: where the time goes, nothing trained.

The two verdicts checked have margins of 10x and more on any machine: a
one-unit Dense layer on batches of 8 (the host's cost per call, ~0.5 ms, is
many times the step's compute), and a pipeline that sleeps 3 ms per example
in Python (~100 ms per batch of 32, against a step under 1 ms).
"""

import glob
import json
import os
import subprocess
import sys
import textwrap
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from tapeworks import Trainer
from tapeworks.engine.explanation import Explanation, split_step, verdict_of


def tiny_trainer(**kwargs):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    return Trainer(model, "adam", "mse", **kwargs)


def tiny_data(n=256):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 4)).astype("float32"), rng.normal(size=(n, 1)).astype("float32")


def test_a_tiny_model_at_one_step_per_call_is_explained_and_nothing_is_trained():
    # What the figures are depends on the machine and its load (a CI run under
    # xdist measured 0.68 ms a step at ten per call where an idle one measured
    # 0.22): this checks that the explanation agrees with its own measurements,
    # not which part wins; `verdict_of` and `split_step` are checked exactly below.
    trainer = tiny_trainer(steps_per_call=1, jit_compile=False)
    x, y = tiny_data()
    trainer.fit((x, y), batch_size=8, epochs=1, verbose=0)
    weights = [w.copy() for w in trainer.model.get_weights()]
    optimizer = [np.array(v) for v in trainer.optimizer.variables]
    step = int(trainer.counters.step)
    result = trainer.explain((x, y), batch_size=8, steps=10, try_xla=False)
    assert isinstance(result, Explanation)
    assert result.verdict == verdict_of(result.input_wait, result.host, result.compute)
    measured = [c for c in result.changes + result.tried if c.what == "steps_per_call=10"]
    assert len(measured) == 1 and measured[0].speedup > 0, str(result)
    assert result.batch_size == 8 and result.steps_per_call == 1 and result.mode is False
    assert result.seconds_per_step == pytest.approx(
        result.input_wait + result.compute + result.host)
    assert 0 < result.compute < result.seconds_per_step
    text = str(result)
    assert f"Verdict: {result.verdict.upper()}" in text and "steps_per_call=10: " in text
    # Nothing trained: weights, optimizer state and counters as they were.
    for before, after in zip(weights, trainer.model.get_weights()):
        np.testing.assert_array_equal(before, after)
    for before, after in zip(optimizer, trainer.optimizer.variables):
        np.testing.assert_array_equal(before, np.array(after))
    assert int(trainer.counters.step) == step
    # And training goes on from there as if explain had not run.
    trainer.fit((x, y), batch_size=8, epochs=1, verbose=0)
    assert int(trainer.counters.step) == step + 32


def test_the_verdict_is_the_largest_part():
    assert verdict_of(input_wait=0.0, host=0.9e-3, compute=0.1e-3) == "host overhead"
    assert verdict_of(input_wait=0.0, host=0.1e-3, compute=0.9e-3) == "compute-bound"
    assert verdict_of(input_wait=2e-3, host=0.1e-3, compute=0.9e-3) == "input-bound"


def test_a_step_is_split_into_compute_and_host_as_the_two_call_sizes_measure_it():
    # 1 ms of compute and 9 ms a call: 10 ms a step at one per call, 1.9 ms at ten.
    compute, host, call = split_step(bulk=0.0019, one=0.010, many=10, current=0.010,
                                     per_call=1)
    assert (compute, host, call) == pytest.approx((0.001, 0.009, 0.009))
    # The same step measured slower in other rounds (a busy machine) keeps its proportions.
    compute, host, _ = split_step(bulk=0.0019, one=0.010, many=10, current=0.020,
                                  per_call=1)
    assert (compute, host) == pytest.approx((0.002, 0.018))
    # At five steps per call the host's share is a fifth of a call: 1.8 ms of 2.8 ms.
    compute, host, _ = split_step(bulk=0.0019, one=0.010, many=10, current=0.0028,
                                  per_call=5)
    assert (compute, host) == pytest.approx((0.001, 0.0018))
    # Where many steps cost as much as one, all of it is compute.
    assert split_step(bulk=0.004, one=0.004, many=10, current=0.004, per_call=1) \
        == pytest.approx((0.004, 0.0, 0.0))


def slow_pipeline():
    x, y = tiny_data(64)

    def slow(row):
        time.sleep(0.003)
        return row

    def load(row, target):
        row = tf.numpy_function(slow, [row], tf.float32)
        return tf.ensure_shape(row, [4]), target

    return tf.data.Dataset.from_tensor_slices((x, y)).map(load).batch(32)


def test_an_input_bound_run_is_named_with_the_input_fixes():
    trainer = tiny_trainer(jit_compile=False, steps_per_call=1)
    with pytest.warns(Warning):   # the data checker's findings on this pipeline
        result = trainer.explain(slow_pipeline(), steps=3, try_xla=False)
    assert result.verdict == "input-bound", str(result)
    assert result.input_wait > 10 * result.compute
    assert result.changes[0].what in ("cache", "prefetch"), str(result)
    assert any(f.startswith("TD007") for f in result.findings)
    assert "Verdict: INPUT-BOUND" in str(result)


def test_xla_modes_are_measured_and_their_compile_time_reported():
    trainer = tiny_trainer(jit_compile=False, steps_per_call=4)
    x, y = tiny_data()
    result = trainer.explain((x, y), batch_size=8, steps=6)
    measured = {c.what.split(",")[0] for c in result.changes + result.tried}
    assert {"jit_compile=True", "jit_compile='update'"} <= measured
    assert result.compile_seconds[True] > 0 and result.compile_seconds["update"] > 0
    assert json.loads(json.dumps(result.to_dict(), default=str))["mode"] == "tf.function"


class HostIdentity(keras.layers.Layer):
    """A NumPy call inside the model: fine in tf.function, no XLA kernel."""

    def call(self, x):
        return tf.ensure_shape(tf.numpy_function(lambda a: a, [x], tf.float32), x.shape)


def test_an_xla_mode_that_cannot_compile_is_listed_as_tried_not_as_help():
    """Whole-step XLA fails on the NumPy call; it must not appear among the helpful changes."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), HostIdentity(), keras.layers.Dense(1)])
    trainer = Trainer(model, "sgd", "mse", jit_compile=False, steps_per_call=2)
    x, y = tiny_data()
    result = trainer.explain((x, y), batch_size=8, steps=4)
    assert not [c for c in result.changes if c.what.startswith("jit_compile=True")]
    failed = [c for c in result.tried if "XLA cannot compile" in c.note]
    assert [c.what for c in failed] == ["jit_compile=True"]
    assert "XLA cannot compile this step" in str(result)
    # The update alone compiles (the NumPy call is in the forward pass): it is measured.
    [update] = [c for c in result.changes + result.tried
                if c.what.startswith("jit_compile='update'")]
    assert update.speedup is not None


def test_profile_writes_a_tensorboard_trace(tmp_path):
    trainer = tiny_trainer(jit_compile=False, steps_per_call=2)
    x, y = tiny_data()
    result = trainer.explain((x, y), batch_size=8, steps=4, try_xla=False,
                             profile_dir=str(tmp_path / "profile"))
    assert result.profile_dir == str(tmp_path / "profile")
    assert glob.glob(str(tmp_path / "profile" / "plugins" / "profile" / "*" / "*.xplane.pb"))


def test_steps_and_eager_trainers_are_refused_clearly():
    x, y = tiny_data()
    with pytest.raises(Exception, match="steps` must be an integer >= 2"):
        tiny_trainer().explain((x, y), batch_size=8, steps=1)
    with pytest.raises(Exception, match="runs eagerly"):
        tiny_trainer(run_eagerly=True, jit_compile=False).explain((x, y), batch_size=8)


TARGET = textwrap.dedent("""
    import keras
    import numpy as np
    import tapeworks

    def make():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        x = np.zeros((64, 4), "float32")
        return tapeworks.Trainer(model, "sgd", "mse", steps_per_call=1), (x, x[:, :1])
""")


@pytest.mark.slow
def test_the_module_command_explains_a_named_entry_point(tmp_path):
    (tmp_path / "my_training.py").write_text(TARGET)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-m", "tapeworks.explain", "my_training:make", "--steps", "4",
         "--batch-size", "8", "--no-xla", "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["batch_size"] == 8 and report["verdict"] in (
        "host overhead", "compute-bound", "input-bound")
    wrong = subprocess.run(
        [sys.executable, "-m", "tapeworks.cli", "explain", "my_training:missing"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert wrong.returncode == 2
    assert "`my_training` has no function `missing`" in wrong.stderr


def test_the_entry_point_is_checked_before_anything_runs(tmp_path, monkeypatch):
    from tapeworks.errors import ConfigError
    from tapeworks.explain import load

    (tmp_path / "entry.py").write_text("def make():\n    return 42\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="Expected `module:function`.*Received: 'entry'"):
        load("entry")
    with pytest.raises(ConfigError, match="`entry:make` returned int. Expected "
                                          r"\(trainer, data\)"):
        load("entry:make")
