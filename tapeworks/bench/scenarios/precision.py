"""Scenario `precision`: float32 against mixed bfloat16 and mixed float16.

Each precision is trained by tapeworks (its own choice of XLA and steps per
call, as users get it) and by Keras `fit` with the same global policy, on the
large MLP of `loops` and on a small convolutional net, alternating in one run.
"""

import keras
import numpy as np
import tensorflow as tf

from tapeworks.bench.data import in_memory_dataset
from tapeworks.bench.peak import matmul_peak_gflops
from tapeworks.bench.scenarios.accumulate import build_convnet
from tapeworks.bench.scenarios.loops import build_mlp
from tapeworks.bench.timing import QUICK_SETTLING, Approach, alternate, settle_trainer
from tapeworks.engine import Trainer

DESCRIPTION = ("float32 vs mixed_bfloat16 vs mixed_float16 (and \"auto\"), tapeworks and "
               "Keras fit, on the large MLP and a small convnet")

POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")


def _models(quick):
    if quick:
        return [
            ("MLP 64-256-256-10, batch 64", lambda: build_mlp((64, 256, 256, 10)), (64,), 64, 20),
            ("convnet 16x16x3, batch 32", lambda: build_convnet(16, 8), (16, 16, 3), 32, 10),
        ]
    return [
        ("large MLP 512-2048-2048-10, batch 256",
         lambda: build_mlp((512, 2048, 2048, 10)), (512,), 256, 24),
        ("convnet 32x32x3 width 32, batch 64", lambda: build_convnet(32, 32), (32, 32, 3), 64, 40),
    ]


def _loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _approaches(build, shape, batch, steps, quick=False):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * batch, *shape)).astype("float32")
    y = rng.integers(0, 10, steps * batch).astype("int32")
    dataset = in_memory_dataset((x, y), batch)
    samples = len(x)
    out = []
    for precision in POLICIES + ("auto",):
        trainer = Trainer(build(), keras.optimizers.Adam(1e-3), _loss(), precision=precision)

        def setup(trainer=trainer):
            # Short settling for the quick (test) run: there "auto" keeps XLA modes
            # waiting (epochs too short to repay them), so settling would run to max_epochs.
            notes = settle_trainer(trainer, dataset, **(QUICK_SETTLING if quick else {}))
            return dict(notes, precision=trainer.precision.policy)

        out.append(Approach(f"tapeworks precision={precision}",
                            lambda trainer=trainer: (trainer.fit(dataset, verbose=0), samples)[1],
                            setup=setup))
    for policy in POLICIES:
        keras.mixed_precision.set_global_policy(policy)
        try:
            model = build()
        finally:
            keras.mixed_precision.set_global_policy("float32")
        # Keras wraps the optimizer in a LossScaleOptimizer for mixed_float16.
        model.compile(keras.optimizers.Adam(1e-3), _loss())
        out.append(Approach(f"keras fit, policy {policy}",
                            lambda model=model: (model.fit(dataset, shuffle=False, verbose=0), samples)[1]))
    return out


def run(quick=False, repeats=5):
    peaks = {"float32 matmul peak (GFLOP/s)": matmul_peak_gflops(512 if quick else 2048,
                                                                 repeats=3),
             "bfloat16 matmul peak (GFLOP/s)": matmul_peak_gflops(512 if quick else 2048,
                                                                  dtype=tf.bfloat16, repeats=3)}
    rows = []
    for name, build, shape, batch, steps in _models(quick):
        results = alternate(_approaches(build, shape, batch, steps, quick), repeats)
        float32 = results["tapeworks precision=float32"]["samples_per_s"]
        for approach, result in results.items():
            policy = result["notes"].get("precision") or approach.rsplit(" ", 1)[-1]
            keras_same = results[f"keras fit, policy {policy}"]["samples_per_s"]
            rows.append({
                "model": name, "approach": approach, "samples_per_s": result["samples_per_s"],
                "vs_tapeworks_float32": result["samples_per_s"] / float32,
                "vs_keras_same_policy": result["samples_per_s"] / keras_same,
                "repeats": result["runs"], "notes": result["notes"],
            })
    return {
        "columns": [("model", "model"), ("approach", "approach"),
                    ("samples_per_s", "samples/s"),
                    ("vs_tapeworks_float32", "x tapeworks float32"),
                    ("vs_keras_same_policy", "x Keras fit, same policy")],
        "rows": rows,
        "facts": peaks,
        "chart": {"group": "model", "bar": "approach", "value": "vs_tapeworks_float32",
                  "label": "throughput relative to tapeworks float32"},
    }
