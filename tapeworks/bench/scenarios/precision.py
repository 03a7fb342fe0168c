"""Scenario `precision`: float32 against mixed bfloat16, and what precision="auto" keeps.

On each of the bench models (small and large MLP, the digits CNN, the demo's
super-resolution network, an LSTM) in one run, alternated:

- tapeworks with precision="float32", "mixed_bfloat16" and "auto" (its own
  choice of XLA and steps per call, as users get it; "auto" measures float32
  against bfloat16 where the CPU has native bfloat16: `plan/precision_trial.py`);
- Keras `fit` under each global policy, compiled as a tuned Keras user would:
  `jit_compile=True, steps_per_execution=32` (`jit_compile=False` where XLA cannot
  compile the model, as that user would after the error).

The float32 and bfloat16 matmul peaks of the same run are in the facts: the
roofline each precision's throughput is bounded by. mixed_float16 is not
here: CPUs compute float16 by conversion, never faster.
"""

import keras
import numpy as np
import tensorflow as tf

from tapeworks.bench.data import in_memory_dataset
from tapeworks.bench.peak import matmul_peak_gflops
from tapeworks.bench.scenarios.wallclock import model_and_data
from tapeworks.bench.timing import QUICK_SETTLING, Approach, alternate, settle_trainer
from tapeworks.engine import Trainer

DESCRIPTION = ("float32 vs mixed_bfloat16 vs precision=\"auto\", tapeworks and Keras fit "
               "(jit_compile=True, steps_per_execution=32), on five bench models")

POLICIES = ("float32", "mixed_bfloat16")
MODELS = ("small MLP", "large MLP", "digits CNN", "super-resolution", "LSTM")
QUICK_MODELS = ("small MLP",)


def _model_and_data(name, quick):
    """(model, loss, (x, y), batch) of a bench model, built under the current global policy."""
    if name != "LSTM":
        model, loss, train, _, batch = model_and_data(name, quick)
        return model, loss, train, batch
    # A sequence classifier: 32 steps of 16 features, as a sensor or text model.
    keras.utils.set_random_seed(0)
    steps, units, samples = (8, 16, 256) if quick else (32, 128, 2048)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, steps, 16)).astype("float32")
    y = rng.integers(0, 10, samples).astype("int32")
    model = keras.Sequential([keras.Input((steps, 16)), keras.layers.LSTM(units),
                              keras.layers.Dense(10)])
    return model, keras.losses.SparseCategoricalCrossentropy(from_logits=True), (x, y), 64


def _built_under(policy, name, quick):
    keras.mixed_precision.set_global_policy(policy)
    try:
        return _model_and_data(name, quick)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def _approaches(name, quick=False):
    _, _, (x, y), batch = _model_and_data(name, quick)
    dataset = in_memory_dataset((x, y), batch)
    samples = len(x) // batch * batch
    out = []
    for precision in POLICIES + ("auto",):
        model, loss, _, _ = _model_and_data(name, quick)
        trainer = Trainer(model, keras.optimizers.Adam(1e-3), loss, precision=precision)

        def setup(trainer=trainer):
            # Short settling for the quick (test) run: there "auto" keeps XLA modes
            # waiting (epochs too short to repay them), so settling would run to max_epochs.
            notes = settle_trainer(trainer, dataset, **(QUICK_SETTLING if quick else {}))
            choice = trainer.tuning.get("precision")
            return dict(notes, precision=trainer.precision.policy,
                        precision_reason=choice["reason"] if choice else
                        trainer.precision.reason)

        out.append(Approach(f"tapeworks precision={precision}",
                            lambda trainer=trainer: (trainer.fit(dataset, verbose=0), samples)[1],
                            setup=setup))
    for policy in POLICIES:
        model, loss, _, _ = _built_under(policy, name, quick)

        def setup(model=model, loss=loss):
            # A tuned Keras user's settings; where XLA cannot compile the model
            # (the super-resolution network's bicubic resize), what that user
            # falls back to after the error.
            for jit_compile in (True, False):
                model.compile(keras.optimizers.Adam(1e-3), loss, jit_compile=jit_compile,
                              steps_per_execution=32)
                try:
                    model.fit(dataset, shuffle=False, verbose=0)
                    return {"jit_compile": jit_compile, "steps_per_execution": 32}
                except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError):
                    continue
            raise RuntimeError(f"Keras' fit of {name} failed with and without XLA")

        out.append(Approach(f"keras fit, policy {policy}",
                            lambda model=model: (model.fit(dataset, shuffle=False, verbose=0),
                                                 samples)[1], setup=setup))
    return out


def run(quick=False, repeats=5):
    peaks = {"float32 matmul peak (GFLOP/s)": matmul_peak_gflops(512 if quick else 2048,
                                                                 repeats=3),
             "bfloat16 matmul peak (GFLOP/s)": matmul_peak_gflops(512 if quick else 2048,
                                                                  dtype=tf.bfloat16, repeats=3)}
    rows = []
    for name in QUICK_MODELS if quick else MODELS:
        results = alternate(_approaches(name, quick), repeats)
        float32 = results["tapeworks precision=float32"]["samples_per_s"]
        keras_bf16 = results["keras fit, policy mixed_bfloat16"]["samples_per_s"]
        for approach, result in results.items():
            policy = result["notes"].get("precision") or approach.rsplit(" ", 1)[-1]
            keras_same = results[f"keras fit, policy {policy}"]["samples_per_s"]
            rows.append({
                "model": name, "approach": approach, "samples_per_s": result["samples_per_s"],
                "vs_tapeworks_float32": result["samples_per_s"] / float32,
                "vs_keras_same_policy": result["samples_per_s"] / keras_same,
                "vs_keras_bfloat16": result["samples_per_s"] / keras_bf16,
                "repeats": result["runs"], "notes": result["notes"],
            })
    return {
        "columns": [("model", "model"), ("approach", "approach"),
                    ("samples_per_s", "samples/s"),
                    ("vs_tapeworks_float32", "x tapeworks float32"),
                    ("vs_keras_same_policy", "x Keras fit, same policy"),
                    ("vs_keras_bfloat16", "x Keras fit, mixed_bfloat16")],
        "rows": rows,
        "facts": peaks,
        "chart": {"group": "model", "bar": "approach", "value": "vs_tapeworks_float32",
                  "label": "throughput relative to tapeworks float32"},
    }
