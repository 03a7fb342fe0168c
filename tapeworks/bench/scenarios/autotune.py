"""Scenario `autotune`: the same in-memory data, tf.data's autotuning model on and off.

On this 2-core machine every benchmark used to show "two speed states": a
compute-bound XLA step ran at about 8,100 or 10,900 samples/s from repeat
to repeat, in tapeworks and in Keras alike. The cause is tf.data's
autotuning model (on by default): with it off for an in-memory dataset the
slow state does not appear. This scenario keeps that measured: the large
MLP of `loops`, trained by tapeworks' defaults and by the tuned Keras fit,
each from the same cached batches with the model on and off, alternating.
Slowest and fastest repeats are reported next to the median, because the
effect is a second mode, not a shift of the mean.
"""

import keras
import tensorflow as tf

from tapeworks.bench.scenarios.loops import SIZES, QUICK_SIZES, _data, _loss, build_mlp
from tapeworks.bench.timing import Approach, alternate, settle_trainer
from tapeworks.data.pipeline import without_autotuning
from tapeworks.engine import Trainer

DESCRIPTION = "in-memory training data with tf.data's autotuning model on vs off"


def approaches(size):
    x, y = _data(size, size.steps)
    cached = tf.data.Dataset.from_tensor_slices((x, y)).batch(size.batch).cache()
    datasets = {"on": cached, "off": without_autotuning(cached)}
    out = []
    for state, dataset in datasets.items():
        trainer = Trainer(build_mlp(size.widths), keras.optimizers.Adam(1e-3), _loss())
        out.append(Approach(
            f"tapeworks (defaults), autotuning model {state}",
            lambda trainer=trainer, dataset=dataset: (trainer.fit(dataset, verbose=0), len(x))[1],
            setup=lambda trainer=trainer, dataset=dataset: settle_trainer(trainer, dataset)))
    for state, dataset in datasets.items():
        model = build_mlp(size.widths)
        model.compile(keras.optimizers.Adam(1e-3), _loss(), jit_compile=True,
                      steps_per_execution=32)
        out.append(Approach(
            f"keras fit (jit_compile=True, steps_per_execution=32), autotuning model {state}",
            lambda model=model, dataset=dataset: (model.fit(dataset, verbose=0), len(x))[1]))
    return out


def run(quick=False, repeats=5):
    size = (QUICK_SIZES if quick else SIZES)[1]
    results = alternate(approaches(size), repeats)
    rows = []
    for name, result in results.items():
        with_model_on = results[name.replace("model off", "model on")]["samples_per_s"]
        rows.append({
            "size": size.name,
            "approach": name,
            "samples_per_s": result["samples_per_s"],
            "slowest": min(result["runs"]),
            "fastest": max(result["runs"]),
            "vs_model_on": result["samples_per_s"] / with_model_on,
            "repeats": result["runs"],
            "notes": result["notes"],
        })
    return {
        "columns": [("size", "model"), ("approach", "approach"),
                    ("samples_per_s", "samples/s (median)"), ("slowest", "slowest repeat"),
                    ("fastest", "fastest repeat"),
                    ("vs_model_on", "x the same loop with the model on")],
        "rows": rows,
        "chart": {"group": "size", "bar": "approach", "value": "vs_model_on",
                  "label": "median throughput relative to the same loop with the model on"},
    }
