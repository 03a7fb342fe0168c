"""`export(model, path, format=...)`: a verified artefact, or an error and nothing written.

The formats go through Keras' own writers: `keras.export.ExportArchive` for a
SavedModel (TF Serving's format), `Model.save` for the `.keras` archive.
What tapeworks adds is around them:

- the user's preprocessing inside the serving signature (a Keras layer or a
  function), so serving never drifts from training (`serving.py`), with the
  raw inputs read from the layer or model where they are fixed (`inputs.py`);
- checks before anything is written: a `.keras` archive whose loading would
  need unsafe deserialisation (a `Lambda`'s Python code) or classes nobody
  registered is refused with the reason and the fix;
- verification before the artefact is reported done: it is loaded in a fresh
  process (`tapeworks.deploy.verify`), the same inputs are run through it and
  through the in-memory model, and the outputs are compared (`judgement.py`);
  its size, load time and latency are measured there;
- atomic writes: the artefact is written beside `path` under a temporary
  name and renamed into place only once verified, so a failure leaves
  nothing at `path` (and an earlier artefact there, with `overwrite=True`,
  as it was).

LiteRT models (float32, or quantised: dynamic-range, float16, full int8
calibrated on `representative_data`) go through TensorFlow's converter from
that SavedModel (`litert.py`), and are verified with `ai-edge-litert`
(LiteRT's maintained runtime). An int8 model that fails is localised (which
layers lose the accuracy) and, unless `strict=True`, repaired by keeping the
worst layers in float (`quantisation.py`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import keras
import numpy as np

from tapeworks.deploy import inputs as inputs_lib
from tapeworks.deploy import judgement, litert, quantisation
from tapeworks.deploy import verify as verify_lib
from tapeworks.deploy.report import ExportError, ExportReport
from tapeworks.deploy.serving import Serving
from tapeworks import fileio
from tapeworks.errors import ConfigError

FORMATS = ("saved_model", "keras", "tflite")
QUANTIZE = (None, "dynamic", "float16", "int8")


def export(model: keras.Model, path: str | os.PathLike[str], format: str = "saved_model", *,
           preprocessing: keras.layers.Layer | Callable[..., Any] | None = None,
           sample: Any = None, quantize: str | None = None, representative_data: Any = None,
           validation_data: tuple[Any, Any] | list[Any] | None = None,
           signatures: Mapping[str, Callable[..., Any]] | None = None, overwrite: bool = False,
           batch_size: int = 32, strict: bool = False) -> ExportReport:
    """Writes `model` to `path` in `format`, verified; returns an `ExportReport`.

    Args:
        model: a built `keras.Model`.
        path: where the artefact goes (a folder for "saved_model"; a file
            ending in ".keras" for "keras", in ".tflite" for "tflite").
        format: "saved_model" (Keras' `ExportArchive`: TF Serving's format,
            with a `serving_default` signature whose inputs and outputs are
            named after the model's), "keras" (the `.keras` archive, loaded
            back with `safe_mode=True`) or "tflite" (LiteRT: that SavedModel
            through TensorFlow's converter, run by `ai-edge-litert`).
        preprocessing: applied to the raw inputs before the model, inside
            the artefact: a Keras layer or model (both formats), or a
            function of the raw input(s) written with TensorFlow ops
            ("saved_model" only). The raw inputs' shapes and dtypes are read
            from a Functional model's inputs or a built layer (an adapted
            `Normalization`); a function, or an unbuilt layer, needs `sample`.
        sample: example inputs (an array, a list in the model's input order,
            or a dict by input name), used for the signature's specs when
            nothing else fixes them (a subclassed model, a preprocessing
            function), and for the verification. Without it, the
            `representative_data` are the verification inputs when given,
            else random values of the inputs' shapes.
        quantize: "tflite" only: None (float32), "dynamic" (int8 weights,
            float activations), "float16" (float16 weights) or "int8" (int8
            weights and activations, float32 inputs and outputs, calibrated
            on `representative_data`).
        representative_data: for quantize="int8": examples like `sample`
            (arrays, or a tf.data.Dataset of inputs or (inputs, targets)
            batches); the first `inputs.REPRESENTATIVE_EXAMPLES` are read.
        validation_data: optional held-out (inputs, targets): the report
            gives the task metric (accuracy for class scores against integer
            labels, else mean squared error) of the model and of the
            artefact, and a quantised model is judged by it (at most 1 point
            of accuracy lost, or 10% more squared error: `judgement`).
        signatures: "saved_model" only: named extra signatures beside
            `serving_default`, {name: function}. Each function takes the same
            raw inputs, positionally in the signature's input order, and
            returns a tensor or a dict of named tensors, with TensorFlow ops
            (it may call the model: `lambda x: tf.nn.softmax(model(x))`). Each
            is verified like `serving_default`.
        overwrite: replace an artefact already at `path` (only once the new
            one is verified).
        batch_size: rows of the random verification inputs.
        strict: for an int8 model that fails its verification: refuse it,
            naming the layers that lose the accuracy, instead of keeping the
            worst of them in float32 (the default repair).

    Raises:
        ConfigError: bad arguments, or a model the format cannot hold; nothing
            is written.
        ExportError: the written artefact did not give the model's outputs
            (for int8: with the layers to blame); nothing is left at `path`.
    """
    path = os.fspath(path)
    signatures = dict(signatures or {})
    suffix = _check_arguments(model, path, format, preprocessing, sample, quantize,
                              representative_data, signatures, overwrite)
    inputs, examples = inputs_lib.verification_inputs(model, preprocessing, sample,
                                                      representative_data, batch_size)
    serving = Serving(model, preprocessing, inputs, signatures)
    held_out, targets = {}, None
    if validation_data is not None:
        if not isinstance(validation_data, (tuple, list)) or len(validation_data) != 2:
            raise ConfigError("`validation_data` must be (inputs, targets). Received: a "
                              f"{type(validation_data).__name__}. Fix: validation_data=(x, y).")
        held_out = inputs_lib.as_named(validation_data[0], list(inputs))
        targets = np.asarray(validation_data[1])
    if format == "keras":
        serving.check_keras_archive()
        archived = serving.keras_model()

        def reference_of(named):
            return verify_lib.named_outputs(archived, archived(
                verify_lib.model_inputs(archived, named), training=False))
    else:
        reference_of = serving.reference
    reference = reference_of(inputs)
    extra = {f"signature/{name}/{output}": value
             for name in signatures for output, value in serving.reference(inputs, name).items()}
    expected = reference_of(held_out) if held_out else None
    metric = judgement.Metric(targets, expected) if held_out else None

    def judge(produced):
        verdict = judgement.judge(
            format, quantize, reference, {k: v for k, v in produced.items() if "/" not in k},
            held_out=(expected, {k.split("/", 1)[1]: v for k, v in produced.items()
                                 if k.startswith("validation/")}) if held_out else None,
            metric=metric)
        if extra:
            verdict.differences.update(judgement.judge(format, None, extra, {
                k: v for k, v in produced.items() if k.startswith("signature/")}).differences)
        return verdict

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    # What an export killed mid-way left here (its process is gone).
    fileio.remove_abandoned(folder)
    name = os.path.basename(path.rstrip(os.sep))
    partial = os.path.join(folder, f".{name}.partial-{os.getpid()}"
                           + (suffix or ""))
    given = dict(inputs, **{f"validation/{k}": v for k, v in held_out.items()})
    # A SavedModel or LiteRT model holds traced graphs: no class code to import.
    modules = serving.modules() if format == "keras" else []

    def verify():
        measured, verified_in = _run_fresh(format, partial, given, modules)
        return measured, verified_in, judge(measured.pop("outputs"))

    def judge_in_this_process(flatbuffer):
        # The repair's candidates are judged here, with the same runtime and
        # inputs; only the one chosen is verified in a fresh process.
        _write(partial, flatbuffer)
        run, _ = verify_lib.load("tflite", partial)
        return judge(verify_lib.outputs_of("tflite", run, given))

    kept = []
    try:
        if format == "saved_model":
            serving.write_saved_model(partial)
        elif format == "tflite":
            _write(partial, litert.convert(serving, quantize, examples))
        else:
            archived.save(partial)
        measured, verified_in, verdict = verify()
        if not verdict.passed:
            flatbuffer, kept = _localise_and_repair(
                serving, examples, quantize, verdict, strict, judge_in_this_process,
                serving.output_layers(list(reference)), inputs)
            _write(partial, flatbuffer)
            measured, verified_in, verdict = verify()
            if not verdict.passed:   # passed in this process: the runtimes disagree
                raise ExportError(
                    f"The {quantize} LiteRT model with {', '.join(k.layer for k in kept)} in "
                    f"float passed in this process but not in a fresh one: {verdict.problem}. "
                    "Nothing was left at the path. Fix: report it, with the model.")
        _put_in_place(partial, path)
    finally:
        _remove(partial)
    if metric is not None:
        metric.artefact_value = verdict.metric_value
    return ExportReport(path=path, format=format, size_bytes=_size(path),
                        batch_size=len(next(iter(inputs.values()))),
                        max_difference=verdict.differences, verified_in=verified_in,
                        inputs=list(inputs), outputs=list(reference), quantize=quantize,
                        signatures=["serving_default"] + list(signatures),
                        metric=metric.as_dict() if metric is not None else None,
                        agreement=verdict.agreement, kept_float=kept,
                        advice=quantisation.preprocessing_note(kept), **measured)


def _localise_and_repair(serving, examples, quantize, verdict, strict, judge_candidate,
                         output_layers, inputs):
    """(flatbuffer, LayerErrors kept in float) of a repaired int8 model, or an ExportError."""
    if quantize not in ("int8", None):
        # No int8 calibration for the debugger: each layer's output against
        # the float32 model's instead; nothing to repair by keeping ops float.
        preprocessing = serving.preprocessing_layer_names()
        order = serving.layer_order()
        layers = quantisation.localise_drift(
            litert.activation_drift(serving, quantize, inputs), order, preprocessing)
        raise ExportError(quantisation.refusal(quantize, verdict, layers, strict))
    if quantize != "int8":
        raise ExportError(quantisation.refusal(quantize, verdict, [], strict))
    calibration = litert.Int8Calibration(serving, examples)
    layers = quantisation.localise(calibration, {layer.name for layer in serving.layers()},
                                   serving.preprocessing_layer_names(), output_layers)
    if strict:
        raise ExportError(quantisation.refusal(quantize, verdict, layers, strict=True))
    flatbuffer, kept, last = quantisation.repair(calibration, layers, judge_candidate)
    if flatbuffer is None:
        raise ExportError(quantisation.refusal(quantize, verdict, layers, strict=False,
                                               kept=kept, last=last))
    return flatbuffer, kept


def _write(path, flatbuffer):
    with open(path, "wb") as file:
        file.write(flatbuffer)


def _check_arguments(model, path, format, preprocessing, sample, quantize, representative_data,
                     signatures, overwrite):
    """Everything `export` refuses before writing anything; returns the artefact's suffix."""
    if format not in FORMATS:
        raise ConfigError(f"`format` must be one of {', '.join(map(repr, FORMATS))}. Received: "
                          f"format={format!r}.")
    if quantize not in QUANTIZE or (quantize is not None and format != "tflite"):
        raise ConfigError(
            f"`quantize` must be one of {', '.join(map(repr, QUANTIZE))}, with format=\"tflite\". "
            f"Received: quantize={quantize!r}, format={format!r}. Fix: format=\"tflite\", or "
            "quantize=None.")
    if signatures and format != "saved_model":
        raise ConfigError(f"Extra `signatures` are a SavedModel's: format={format!r} has one "
                          "entry point. Fix: format=\"saved_model\", or no signatures.")
    bad = [name for name, fn in signatures.items()
           if not isinstance(name, str) or not name.isidentifier() or name == "serving_default"
           or not callable(fn)]
    if bad:
        raise ConfigError(f"`signatures` must map names (identifiers, not \"serving_default\") "
                          f"to functions. Received: {bad!r}. Fix: "
                          "signatures={\"probabilities\": lambda x: tf.nn.softmax(model(x))}.")
    if quantize == "int8" and representative_data is None:
        raise ConfigError(
            "quantize=\"int8\" needs `representative_data`: the activations' int8 ranges are "
            "calibrated on real inputs. Fix: representative_data=<a few hundred training "
            "examples> (or quantize=\"dynamic\", which needs none).")
    if not isinstance(model, keras.Model) or not model.built:
        raise ConfigError(
            f"`model` must be a built keras.Model. Received: {type(model).__name__}"
            f"{'' if not isinstance(model, keras.Model) else ' (not built)'}. Fix: call the "
            "model on a batch (or train it) before exporting.")
    suffix = {"keras": ".keras", "tflite": ".tflite"}.get(format)
    if suffix and not path.endswith(suffix):
        raise ConfigError(f"A {format} artefact's path must end in \"{suffix}\". Received: "
                          f"{path!r}. Fix: {path!r} + \"{suffix}\".")
    if os.path.exists(path) and not overwrite:
        raise ConfigError(f"{path!r} already exists: nothing was written. Expected a new path. "
                          "Fix: another path, or overwrite=True (the old artefact is replaced "
                          "only once the new one is verified).")
    if (format == "keras" and preprocessing is not None
            and not isinstance(preprocessing, keras.layers.Layer)):
        raise ConfigError(
            "A .keras archive holds Keras layers, not a Python function: the preprocessing "
            f"given is a {type(preprocessing).__name__}. Fix: write it as Keras preprocessing "
            "layers (keras.layers.Normalization, Rescaling, ...), or format=\"saved_model\".")
    return suffix


def _run_fresh(format, artefact, inputs, modules):
    """Outputs and timings of the artefact, from a fresh process when one can rebuild it."""
    if "__main__" in modules:
        # Classes defined in the running script: a fresh process cannot
        # import them (it would run the script). A fresh load in this
        # process still rebuilds the model from the files alone.
        return verify_lib.check(format, artefact, inputs), (
            "this process (a fresh load; its custom classes are defined in __main__, which a "
            "fresh process cannot import)")
    with tempfile.TemporaryDirectory(prefix="tapeworks-verify-") as scratch:
        given, produced = os.path.join(scratch, "in.npz"), os.path.join(scratch, "out.npz")
        np.savez(given, **inputs)
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                   PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        result = subprocess.run(
            [sys.executable, "-m", "tapeworks.deploy.verify", format, artefact, given, produced,
             *[m for m in modules if m != "__main__"]],
            capture_output=True, text=True, env=env, timeout=600)
        if result.returncode != 0:
            tail = "\n".join(result.stderr.strip().splitlines()[-6:])
            raise ExportError(
                f"The {format} artefact does not load in a fresh process, so nothing was left "
                f"at the path. The loader said:\n{tail}\nFix: for a .keras archive, every "
                "custom class must be importable and registered, with a get_config() that "
                "holds its constructor's arguments.")
        timings = json.loads(result.stdout.strip().splitlines()[-1])
        with np.load(produced) as data:
            timings["outputs"] = {name: data[name] for name in data.files}
    return timings, "a fresh process"


def _put_in_place(partial, path):
    """Renames the verified artefact to `path`, replacing what was there only now."""
    if os.path.isdir(path) and not os.path.islink(path):
        # Hidden, with this PID: a kill between the renames leaves it for
        # `fileio.remove_abandoned`.
        head, tail = os.path.split(path.rstrip(os.sep))
        old = os.path.join(head, f".{tail}.old-{os.getpid()}")
        os.replace(path, old)
        os.replace(partial, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        if os.path.isdir(partial) and os.path.exists(path):
            os.remove(path)
        os.replace(partial, path)


def _remove(path):
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.remove(path)


def _size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, f))
               for root, _, files in os.walk(path) for f in files)
