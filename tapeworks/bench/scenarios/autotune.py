"""Scenario `autotune`: the same in-memory data, tf.data's autotuning model on and off.

On this 2-core machine every benchmark used to show "two speed states": a
compute-bound XLA step ran at about 8,100 or 10,900 samples/s from repeat
to repeat, in tapeworks and in Keras alike. The cause is tf.data's
autotuning model (on by default): with it off for an in-memory dataset the
slow state does not appear. This scenario keeps that measured: the large
MLP of `loops`, trained by tapeworks' defaults and by the tuned Keras fit,
each from the same cached batches as built (model on by default) and through
`data.without_autotuning`, alternating. tapeworks reads the pipeline of the
dataset as built, finds it only slices memory and turns the model off
itself; Keras keeps it on. Slowest and fastest repeats are reported next to
the median, because the effect is a second mode, not a shift of the mean.
"""

import keras

from tapeworks.bench.data import cached_batches
from tapeworks.bench.scenarios.loops import QUICK_SIZES, SIZES, build_mlp, mlp_data, mlp_loss
from tapeworks.bench.timing import QUICK_SETTLING, Approach, alternate, settle_trainer
from tapeworks.data.pipeline import without_autotuning
from tapeworks.engine import Trainer

DESCRIPTION = "in-memory training data with tf.data's autotuning model on vs off"


def approaches(size, quick=False):
    x, y = mlp_data(size, size.steps)
    cached = cached_batches((x, y), size.batch)
    datasets = {"as built": cached, "through without_autotuning": without_autotuning(cached)}
    out = []
    for state, dataset in datasets.items():
        trainer = Trainer(build_mlp(size.widths), keras.optimizers.Adam(1e-3), mlp_loss())
        out.append(Approach(
            f"tapeworks (defaults), dataset {state}",
            lambda trainer=trainer, dataset=dataset: (trainer.fit(dataset, verbose=0), len(x))[1],
            setup=lambda trainer=trainer, dataset=dataset: settle_trainer(
                trainer, dataset, **(QUICK_SETTLING if quick else {}))))
    for state, dataset in datasets.items():
        model = build_mlp(size.widths)
        model.compile(keras.optimizers.Adam(1e-3), mlp_loss(), jit_compile=True,
                      steps_per_execution=32)
        out.append(Approach(
            f"keras fit (jit_compile=True, steps_per_execution=32), dataset {state}",
            lambda model=model, dataset=dataset: (model.fit(dataset, shuffle=False, verbose=0), len(x))[1]))
    return out


def run(quick=False, repeats=5):
    size = (QUICK_SIZES if quick else SIZES)[1]
    results = alternate(approaches(size, quick), repeats)
    rows = []
    for name, result in results.items():
        as_built = results[name.replace("through without_autotuning", "as built")]
        rows.append({
            "size": size.name,
            "approach": name,
            "samples_per_s": result["samples_per_s"],
            "slowest": min(result["runs"]),
            "fastest": max(result["runs"]),
            "vs_as_built": result["samples_per_s"] / as_built["samples_per_s"],
            "repeats": result["runs"],
            "notes": result["notes"],
        })
    return {
        "columns": [("size", "model"), ("approach", "approach"),
                    ("samples_per_s", "samples/s (median)"), ("slowest", "slowest repeat"),
                    ("fastest", "fastest repeat"),
                    ("vs_as_built", "x the same loop on the dataset as built")],
        "rows": rows,
        "chart": {"group": "size", "bar": "approach", "value": "vs_as_built",
                  "label": "median throughput relative to the same loop on the dataset as built"},
    }
