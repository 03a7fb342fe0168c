"""precision="auto" on a CPU with native bfloat16: float32 or mixed bfloat16, by measurement.

`engine/plan/precision_trial.py`. The CPU's flags are faked (the function that
reads /proc/cpuinfo is replaced), so these run on any CPU: bfloat16 runs
everywhere, natively or not; only which one wins the timing depends on the
machine, and no test asserts that.
"""

import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks
from tapeworks.engine.plan import precision_trial
from tapeworks.engine.step import precision as precision_lib


@pytest.fixture
def native_bf16(monkeypatch):
    monkeypatch.setattr(precision_lib, "cpu_flags", lambda path=None: {"avx2", "avx512_bf16"})


def model():
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(3)])
    m.compile(keras.optimizers.SGD(0.05),
              keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return m


def data(samples=640):
    rng = np.random.default_rng(0)
    return rng.normal(size=(samples, 8)).astype("float32"), rng.integers(0, 3, samples)


def weights(m):
    return [w.numpy() for w in m.weights]


# The decision, on hand-given figures ---------------------------------------------------


@pytest.mark.parametrize("seconds, low_losses, policy, says", [
    ({"float32": 0.20, "mixed_bfloat16": 0.10}, [2.01, 1.50, 1.0], "mixed_bfloat16",
     "2.00x float32's speed"),
    # 3% apart on the second call: beyond the 2% tolerance.
    ({"float32": 0.20, "mixed_bfloat16": 0.10}, [2.0, 1.545, 1.0], "float32",
     "more than the 2% tolerance"),
    # Faster, but under the 1.10x margin.
    ({"float32": 0.20, "mixed_bfloat16": 0.19}, [2.0, 1.5, 1.0], "float32",
     "under the 1.10x margin"),
    ({"float32": 0.20, "mixed_bfloat16": 0.10}, [2.0, float("nan"), 1.0], "float32",
     "not finite"),
    # The loop stopped early (a non-finite step under on_nonfinite="raise").
    ({"float32": 0.20, "mixed_bfloat16": 0.10}, [2.0], "float32", "not finite"),
])
def test_the_decision_on_figures(seconds, low_losses, policy, says):
    choice = precision_trial.decide(seconds, {"float32": [2.0, 1.5, 1.0],
                                              "mixed_bfloat16": low_losses})
    assert choice.policy == policy
    assert says in choice.reason


def test_a_cpu_without_native_bfloat16_stays_float32(monkeypatch):
    monkeypatch.setattr(precision_lib, "cpu_flags", lambda path=None: {"avx2", "fma"})
    plugin = precision_lib.resolve("auto")
    assert type(plugin) is precision_lib.Float32 and plugin.decided
    assert "no native bfloat16" in plugin.reason


def test_a_cpu_with_native_bfloat16_measures(native_bf16):
    plugin = precision_lib.resolve("auto")
    assert isinstance(plugin, precision_lib.Measured)
    assert plugin.policy == "float32" and not plugin.decided


# Whole fits ----------------------------------------------------------------------------


def test_auto_measures_once_keeps_its_choice_and_trains_as_that_precision_would(
        native_bf16, tmp_path):
    x, y = data()
    auto_model = model()
    trainer = tapeworks.Trainer(auto_model, precision="auto", jit_compile=False,
                                steps_per_call=4, seed=0, plan_cache=str(tmp_path))
    trainer.fit(x, y, batch_size=32, epochs=8, verbose=0)   # 160 steps: enough
    report = trainer.tuning["precision"]
    chosen = report["policy"]
    assert chosen in ("float32", "mixed_bfloat16") and report["reason"].startswith("measured")
    assert set(report["seconds_per_step"]) == {"float32", "mixed_bfloat16"}
    losses = report["losses"]
    assert len(losses["float32"]) == precision_trial.CALLS
    assert all(math.isfinite(v) for v in losses["float32"] + losses["mixed_bfloat16"])
    # The hidden layer follows the choice; the output layer stays float32.
    assert auto_model.layers[0].dtype_policy.name == chosen
    assert auto_model.layers[-1].dtype_policy.name == "float32"
    # Only the chosen precision's functions are kept.
    assert all(key.precision == chosen for key in trainer.compiled.keys())
    # The trial left no trace: the same weights as a fit in the chosen precision.
    fixed_model = model()
    fixed = tapeworks.Trainer(fixed_model, precision=chosen, jit_compile=False,
                              steps_per_call=4, seed=0, plan_cache=False)
    fixed.fit(x, y, batch_size=32, epochs=8, verbose=0)
    for a, b in zip(weights(auto_model), weights(fixed_model)):
        np.testing.assert_array_equal(a, b)
    # The trial traced one guarded loop per precision; training traced what the
    # fixed trainer traces (its rollback variant, where it runs one), or reused
    # the winner's loop.
    assert trainer.traces["train_step"] - fixed.traces["train_step"] in (1, 2)

    # A second run of the same script finds the choice in the plan cache.
    again = tapeworks.Trainer(model(), precision="auto", jit_compile=False,
                              steps_per_call=4, seed=0, plan_cache=str(tmp_path))
    again.fit(x, y, batch_size=32, epochs=8, verbose=0)
    assert again.tuning["precision"]["policy"] == chosen
    assert again.tuning["precision"]["reason"].startswith("from the plan cache")
    assert again.traces["train_step"] == 1


def test_a_shuffled_in_memory_pipeline_is_measured_on_its_arrays_and_trains_unchanged(
        native_bf16):
    """Its arrays are read from its graph: no iterator, so the shuffle's seeds do not move."""
    x, y = data()

    def pipeline():
        return (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(640, seed=3).batch(32)
                .prefetch(2))

    auto_model = model()
    trainer = tapeworks.Trainer(auto_model, precision="auto", jit_compile=False,
                                steps_per_call=4, seed=0, plan_cache=False)
    trainer.fit(pipeline(), epochs=8, verbose=0)
    chosen = trainer.tuning["precision"]["policy"]
    assert trainer.tuning["precision"]["reason"].startswith("measured")
    fixed_model = model()
    tapeworks.Trainer(fixed_model, precision=chosen, jit_compile=False, steps_per_call=4,
                      seed=0, plan_cache=False).fit(pipeline(), epochs=8, verbose=0)
    for a, b in zip(weights(auto_model), weights(fixed_model)):
        np.testing.assert_array_equal(a, b)


def test_short_fits_train_in_float32_until_their_steps_add_up(native_bf16, capsys):
    x, y = data(320)
    m = model()
    trainer = tapeworks.Trainer(m, precision="auto", jit_compile=False, steps_per_call=2,
                                seed=0, plan_cache=False)
    trainer.fit(x, y, batch_size=32, epochs=1, verbose=1)   # 10 steps
    assert not trainer.precision.decided and trainer.precision.policy == "float32"
    assert "too few to repay measuring" in capsys.readouterr().out
    assert m.layers[0].dtype_policy.name == "float32"
    trainer.fit(x, y, batch_size=32, epochs=1, verbose=1)   # 20 steps: said once only
    assert "too few to repay measuring" not in capsys.readouterr().out
    assert "20 steps so far" in trainer.precision.reason
    trainer.fit(x, y, batch_size=32, epochs=15, verbose=0)   # 20 + 150 steps
    assert trainer.precision.decided
    assert trainer.tuning["precision"]["reason"].startswith("measured")


def test_data_that_cannot_be_drawn_again_is_not_measured(native_bf16):
    x, y = data()

    def batches():
        for start in range(0, len(x), 32):
            yield x[start:start + 32], y[start:start + 32]

    trainer = tapeworks.Trainer(model(), precision="auto", jit_compile=False, seed=0,
                                plan_cache=False)
    trainer.fit(batches(), epochs=1, verbose=0)
    assert not trainer.precision.decided
    assert "cannot be drawn again" in trainer.precision.reason


@pytest.mark.parametrize("record", [
    {"format": 1, "policy": "int8", "reason": "x"},
    {"format": 1, "policy": "mixed_bfloat16"},              # no reason
    {"format": 1, "policy": "mixed_bfloat16", "reason": "x", "losses": [1, 2]},
    "not an object",
])
def test_an_invalid_plan_cache_record_is_ignored_and_measured_again(native_bf16, tmp_path,
                                                                   record):
    x, y = data()
    first = tapeworks.Trainer(model(), precision="auto", jit_compile=False, steps_per_call=4,
                              seed=0, plan_cache=str(tmp_path))
    first.fit(x, y, batch_size=32, epochs=8, verbose=0)
    [path] = tmp_path.glob("precision-*.json")
    path.write_text(json.dumps(record))
    again = tapeworks.Trainer(model(), precision="auto", jit_compile=False, steps_per_call=4,
                              seed=0, plan_cache=str(tmp_path))
    again.fit(x, y, batch_size=32, epochs=8, verbose=0)
    assert again.tuning["precision"]["reason"].startswith("measured")
    assert json.loads(path.read_text())["policy"] in ("float32", "mixed_bfloat16")
