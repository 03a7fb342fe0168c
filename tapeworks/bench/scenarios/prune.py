"""Scenario `prune`: magnitude pruning of the digits CNN: accuracy, sparsity, compressed size.

The digits CNN (scikit-learn's digits: 1,149 training and 288 held-out
images) is trained three ways for the same number of epochs with the same
optimizer: dense; pruned to 80% (`PolynomialDecay(0 -> 0.8)` from 20% to 70%
of the updates, masks recomputed 4 times an epoch, as in Zhu & Gupta's
recipe); and 2:4 structured (50% of the kernels whose input channels group by
4). Each is trained once per seed (`--repeats` seeds: the initialisation and
the data order); the held-out accuracy is the median, with the range. The
first seed's model of each variant is exported by `tapeworks.deploy.export`
(verified in a fresh process, with its accuracy measured on the held-out
images) as LiteRT float32 and full int8, and the file is compressed with gzip
(zlib level 9): masked weights are exact zeros, which the format stores as
they are, so pruning shows in the compressed size, not in the file size.
Target (issue 15): 80% sparsity with a stated accuracy change, and the
compressed .tflite against the dense one.
"""

import gzip
import os
import shutil
import statistics
import tempfile

import keras
import numpy as np

from tapeworks.bench.scenarios.wallclock import model_and_data
from tapeworks.engine import Trainer

DESCRIPTION = ("digits CNN dense vs 80% magnitude-pruned vs 2:4: held-out accuracy, "
               "sparsity, LiteRT size raw and gzip-compressed")
TARGET_SPARSITY = 0.8


def _variants(updates, per_epoch):
    from tapeworks.prune import ConstantSparsity, PolynomialDecay, Pruning

    frequency = max(1, per_epoch // 4)
    return [
        ("dense", None),
        ("80% magnitude", lambda: Pruning(PolynomialDecay(
            0.0, TARGET_SPARSITY, begin_step=updates // 5, end_step=updates * 7 // 10,
            frequency=frequency))),
        ("2:4 structured", lambda: Pruning(ConstantSparsity(0.5, begin_step=updates // 5,
                                                            frequency=frequency),
                                           structure="2:4")),
    ]


def _train(variant, seed, epochs):
    model, loss, (x, y), (vx, vy), batch = model_and_data("digits CNN", quick=False)
    keras.utils.set_random_seed(seed)
    model = keras.models.clone_model(model)   # initialised from this seed
    pruning = variant() if variant else None
    trainer = Trainer(model, keras.optimizers.Adam(1e-3), loss, metrics=["accuracy"],
                      pruning=pruning, seed=seed, plan_cache=False)
    history = trainer.fit(x, y, batch_size=batch, epochs=epochs, verbose=0, shuffle=True)
    if pruning is not None:
        pruning.strip()
    accuracy = float(np.mean(np.argmax(model.predict(vx, verbose=0), -1) == vy))
    logs = {k: v[-1] for k, v in history.history.items()}
    return model, accuracy, logs, (x, (vx, vy))


def _gzip_size(path):
    with open(path, "rb") as f:
        return len(gzip.compress(f.read(), compresslevel=9))


def run(quick=False, repeats=3):
    from tapeworks.deploy import export

    epochs = 2 if quick else 20
    per_epoch = -(-1149 // 32)
    seeds = range(1 if quick else repeats)
    formats = [None] if quick else [None, "int8"]
    variants = _variants(epochs * per_epoch, per_epoch)
    if quick:
        variants = variants[:2]
    rows, dense_gzip, dense_accuracy = [], {}, None
    scratch = tempfile.mkdtemp(prefix="tapeworks-bench-prune-")
    try:
        for name, variant in variants:
            accuracies, first = [], None
            for seed in seeds:
                model, accuracy, logs, data = _train(variant, seed, epochs)
                accuracies.append(100 * accuracy)
                if first is None:
                    first = (model, logs, data)
            model, logs, (x, validation) = first
            median = statistics.median(accuracies)
            if dense_accuracy is None:
                dense_accuracy = median
            sparsity = {k.split("/", 1)[1]: v for k, v in logs.items()
                        if k.startswith("sparsity/")}
            for quantize in formats:
                label = "LiteRT " + (quantize or "float32")
                path = os.path.join(scratch, f"{name}-{label}.tflite".replace(" ", "-"))
                report = export(model, path, format="tflite", quantize=quantize,
                                sample=x[:32], validation_data=validation,
                                representative_data=x[:200] if quantize == "int8" else None)
                compressed = _gzip_size(path)
                if name == "dense":
                    dense_gzip[label] = compressed
                rows.append({
                    "variant": name, "format": label,
                    "sparsity": 100 * logs.get("sparsity", 0.0),
                    "accuracy": median, "accuracy_range": f"{min(accuracies):.2f}-"
                                                          f"{max(accuracies):.2f}",
                    "accuracy_change": median - dense_accuracy,
                    "artefact_accuracy": 100 * report.metric["artefact"],
                    "size_kib": report.size_bytes / 1024, "gzip_kib": compressed / 1024,
                    "vs_dense_gzip": compressed / dense_gzip[label],
                    "notes": {"per-layer sparsity %": ", ".join(
                        f"{k} {100 * v:.0f}" for k, v in sparsity.items())} if sparsity else {},
                })
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    facts = {"trained": f"{epochs} epochs, batch 32, Adam(1e-3), Trainer defaults; accuracy on "
                        f"the 288 held-out images, median over {len(seeds)} seed(s) (range "
                        "in its column)",
             "pruning": "80%: PolynomialDecay(0 -> 0.8, power 3) from 20% to 70% of the "
                        "updates, masks recomputed every quarter epoch; 2:4: from 20% of the "
                        "updates, layers whose input channels are a multiple of 4",
             "compressed": "gzip level 9 of the .tflite file; x dense: against the dense "
                           "model's file of the same format",
             "artefact accuracy": "the exported file's, first seed, measured by its verification"}
    pruned = [r for r in rows if r["variant"] == "80% magnitude" and r["format"] ==
              "LiteRT float32"]
    if pruned:
        facts["80% vs dense"] = (f"{pruned[0]['accuracy_change']:+.2f} accuracy points (median), "
                                 f"{pruned[0]['vs_dense_gzip']:.2f}x the compressed float32 "
                                 "LiteRT file")
    return {
        "method": (f"Nothing is timed: each variant is trained once per seed ({len(seeds)} "
                   "seed(s)), and its first seed's model exported."),
        "columns": [("variant", "variant"), ("format", "format"), ("sparsity", "sparsity %"),
                    ("accuracy", "accuracy %"), ("accuracy_range", "range"),
                    ("accuracy_change", "vs dense"), ("artefact_accuracy", "file accuracy %"),
                    ("size_kib", "file KiB"), ("gzip_kib", "gzip KiB"),
                    ("vs_dense_gzip", "x dense gzip")],
        "rows": rows,
        "facts": facts,
        "chart": {"group": "format", "bar": "variant", "value": "gzip_kib",
                  "label": "gzip-compressed LiteRT size (KiB)"},
    }
