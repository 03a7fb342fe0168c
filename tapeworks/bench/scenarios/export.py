"""Scenario `export`: each artefact format's size, load time, latency and task metric.

The digits CNN (scikit-learn's digits, accuracy on 288 held-out images) and
the demo's super-resolution network (PSNR on held-out patches) are trained
with tapeworks, then written by `tapeworks.deploy.export` in every format:
SavedModel, .keras, and LiteRT in float32, dynamic-range, float16 and full
int8 (calibrated on 200 training examples). Each artefact is verified in a
fresh process, which also measures its load time and the median latency of
one example and of a batch of 32 (20 calls each, after a warm-up); the task
metric of the model and of the artefact comes from the same held-out data.
A format that cannot hold a model is a row that says why. Targets (issue
15): int8 within 1 accuracy point of float32 on digits, at most 0.3x its size.
"""

import math
import os
import shutil
import tempfile

import keras

from tapeworks.bench.scenarios.wallclock import model_and_data as _model_and_data
from tapeworks.engine import Trainer

DESCRIPTION = ("size, load time, latency and accuracy/PSNR of each export format (SavedModel, "
               ".keras, LiteRT float32/dynamic/float16/int8) for the digits CNN and the demo "
               "network")
FORMATS = [("saved_model", None), ("keras", None), ("tflite", None), ("tflite", "dynamic"),
           ("tflite", "float16"), ("tflite", "int8")]
QUICK_FORMATS = [("tflite", None), ("tflite", "int8")]   # for tests: no TensorFlow to load


def _trained(name, quick):
    model, loss, train, validation, batch = _model_and_data(name, quick)
    x, y = train
    if validation is None:   # the super-resolution patches: hold out the last tenth
        cut = len(x) * 9 // 10
        x, y, validation = x[:cut], y[:cut], (x[cut:], y[cut:])
    model.compile(keras.optimizers.Adam(1e-3), loss)
    epochs = 1 if quick else (20 if name == "digits CNN" else 5)
    Trainer(model, seed=0).fit(x, y, batch_size=batch, epochs=epochs, verbose=0)
    return model, x, validation


def _metric_row(name, metric):
    """The metric as the model's task reads: accuracy in points, PSNR in dB (images in [0, 1])."""
    if metric is None:
        return {}
    if metric["name"] == "accuracy":
        return {"metric": "accuracy %", "model_metric": 100 * metric["model"],
                "artefact_metric": 100 * metric["artefact"],
                "metric_change": 100 * (metric["artefact"] - metric["model"])}
    psnr = [10 * math.log10(1.0 / max(metric[k], 1e-12)) for k in ("model", "artefact")]
    return {"metric": "PSNR dB", "model_metric": psnr[0], "artefact_metric": psnr[1],
            "metric_change": psnr[1] - psnr[0]}


def run(quick=False, repeats=3):
    from tapeworks import TapeworksError
    from tapeworks.deploy import export

    rows = []
    scratch = tempfile.mkdtemp(prefix="tapeworks-bench-export-")
    try:
        for name in ("digits CNN",) if quick else ("digits CNN", "super-resolution"):
            model, x, validation = _trained(name, quick)
            float_size = None
            for format, quantize in QUICK_FORMATS if quick else FORMATS:
                label = format + (f" {quantize}" if quantize else "")
                suffix = {"keras": ".keras", "tflite": ".tflite"}.get(format, "")
                path = os.path.join(scratch, f"{name}-{label}".replace(" ", "-") + suffix)
                row = {"model": name, "format": label}
                try:
                    report = export(model, path, format=format, quantize=quantize,
                                    sample=x[:32], validation_data=validation,
                                    representative_data=x[:200] if quantize == "int8" else None)
                except TapeworksError as error:
                    row["notes"] = {"not written": str(error).split(". ")[0][:160]}
                    rows.append(row)
                    continue
                if format == "tflite" and quantize is None:
                    float_size = report.size_bytes
                row.update(size_kib=report.size_bytes / 1024,
                           load_ms=1e3 * report.load_seconds,
                           single_ms=1e3 * report.single_seconds,
                           batch_ms=1e3 * report.batch_seconds,
                           max_difference=max(report.max_difference.values()),
                           **_metric_row(name, report.metric))
                if format == "tflite" and float_size:
                    row["vs_float_size"] = report.size_bytes / float_size
                rows.append(row)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    digits = {r["format"]: r for r in rows if r["model"] == "digits CNN"}
    facts = {"targets": "digits CNN: LiteRT int8 within 1 accuracy point of float32 LiteRT, "
                        "at most 0.3x its size",
             "latency": "median of 20 calls after a warm-up, in the verifying process (batch 32 "
                        "and one example); --repeats is not used",
             "trained": "digits CNN 20 epochs, super-resolution 5 epochs (Trainer defaults)"}
    integer, floating = digits.get("tflite int8"), digits.get("tflite")
    if integer and floating and "artefact_metric" in integer:
        facts["digits int8 vs float32"] = (
            f"{integer['artefact_metric'] - floating['artefact_metric']:+.2f} accuracy points, "
            f"{integer['vs_float_size']:.2f}x the size")
    return {
        "columns": [("model", "model"), ("format", "format"), ("size_kib", "size KiB"),
                    ("vs_float_size", "x LiteRT float32 size"), ("load_ms", "load ms"),
                    ("single_ms", "1 example ms"), ("batch_ms", "32 examples ms"),
                    ("metric", "metric"), ("model_metric", "model"),
                    ("artefact_metric", "artefact"), ("metric_change", "change"),
                    ("max_difference", "largest output difference")],
        "rows": rows,
        "facts": facts,
        "chart": {"group": "model", "bar": "format", "value": "size_kib",
                  "label": "artefact size (KiB)"},
    }
