"""`export(model, path, format=...)`: a verified artefact, or an error and nothing written.

The formats go through Keras' own writers: `keras.export.ExportArchive` for a
SavedModel (TF Serving's format), `Model.save` for the `.keras` archive.
What tapeworks adds is around them:

- the user's preprocessing inside the serving signature (a Keras layer or a
  function), so serving never drifts from training;
- checks before anything is written: a `.keras` archive whose loading would
  need unsafe deserialisation (a `Lambda`'s Python code) or classes nobody
  registered is refused with the reason and the fix;
- verification before the artefact is reported done: it is loaded in a fresh
  process (`tapeworks.deploy.verify`), the same inputs are run through it and
  through the in-memory model, and the outputs are compared with the
  format's tolerance; its size, load time and latency are measured there;
- atomic writes: the artefact is written beside `path` under a temporary
  name and renamed into place only once verified, so a failure leaves
  nothing at `path` (and an earlier artefact there, with `overwrite=True`,
  as it was).

LiteRT conversion and pruning (issue 15's other parts) are not built yet.
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile

import keras
import numpy as np
import tensorflow as tf

from tapeworks.deploy import verify as verify_lib
from tapeworks.errors import ConfigError, TapeworksError

FORMATS = ("saved_model", "keras")
# (rtol, atol) of the artefact's outputs against the in-memory model's. A
# SavedModel runs the traced graph, which TensorFlow's graph optimiser may
# fuse differently from eager execution (a MatMul, its bias and ReLU as one
# kernel): float32 rounding, not a different model. A .keras archive is the
# same Keras layers with the same weights.
TOLERANCE = {"saved_model": (1e-4, 1e-5), "keras": (1e-5, 1e-6)}


class ExportError(TapeworksError, RuntimeError):
    """An artefact failed its verification; nothing was left at the path."""


@dataclasses.dataclass
class ExportReport:
    """What `export` wrote and measured."""

    path: str
    format: str
    size_bytes: int
    load_seconds: float        # loading the artefact in the verifying process
    single_seconds: float      # median latency of one example
    batch_seconds: float       # median latency of the verification batch
    batch_size: int
    max_difference: dict       # output name -> largest absolute difference from the model
    verified_in: str           # "a fresh process", or why it was this one
    inputs: list               # the signature's input names
    outputs: list              # its output names

    def __str__(self):
        worst = max(self.max_difference.values()) if self.max_difference else 0.0
        return (f"{self.format} artefact at {self.path}: {self.size_bytes / 1024:,.1f} KiB, "
                f"inputs {', '.join(self.inputs)} -> outputs {', '.join(self.outputs)}; "
                f"verified in {self.verified_in}: largest difference {worst:.2e} from the "
                f"model; load {self.load_seconds:.2f} s, latency "
                f"{self.single_seconds * 1e3:.2f} ms for one example, "
                f"{self.batch_seconds * 1e3:.2f} ms for {self.batch_size}")


def export(model, path, format="saved_model", *, preprocessing=None, sample=None,
           overwrite=False, batch_size=32):
    """Writes `model` to `path` in `format`, verified; returns an `ExportReport`.

    Args:
        model: a built `keras.Model`.
        path: where the artefact goes (a folder for "saved_model"; a file
            ending in ".keras" for "keras").
        format: "saved_model" (Keras' `ExportArchive`: TF Serving's format,
            with a `serving_default` signature whose inputs and outputs are
            named after the model's) or "keras" (the `.keras` archive, loaded
            back with `safe_mode=True`).
        preprocessing: applied to the raw inputs before the model, inside
            the artefact: a Keras layer or model (both formats), or a
            function of the raw input(s) written with TensorFlow ops
            ("saved_model" only). Needs `sample`, which fixes the raw
            inputs' shapes and dtypes.
        sample: example inputs (an array, a list in the model's input order,
            or a dict by input name), used for the signature's specs when
            the model has no fixed inputs (a subclassed model) or is
            preceded by `preprocessing`, and for the verification. Without
            it, random inputs of the model's input shapes are used.
        overwrite: replace an artefact already at `path` (only once the new
            one is verified).
        batch_size: rows of the random verification inputs.

    Raises:
        ConfigError: bad arguments, or a model the format cannot hold; nothing
            is written.
        ExportError: the written artefact did not give the model's outputs;
            nothing is left at `path`.
    """
    if format not in FORMATS:
        raise ConfigError(f"`format` must be one of {', '.join(map(repr, FORMATS))}. Received: "
                          f"format={format!r}. (LiteRT export is not built yet: Keras' own "
                          "`model.export(path, format=\"litert\")` writes one, unverified.)")
    if not isinstance(model, keras.Model) or not model.built:
        raise ConfigError(
            f"`model` must be a built keras.Model. Received: {type(model).__name__}"
            f"{'' if not isinstance(model, keras.Model) else ' (not built)'}. Fix: call the "
            "model on a batch (or train it) before exporting.")
    path = os.fspath(path)
    if format == "keras" and not path.endswith(".keras"):
        raise ConfigError(f"A .keras archive's path must end in \".keras\". Received: {path!r}. "
                          f"Fix: {path!r} + \".keras\", or format=\"saved_model\".")
    if os.path.exists(path) and not overwrite:
        raise ConfigError(f"{path!r} already exists: nothing was written. Expected a new path. "
                          "Fix: another path, or overwrite=True (the old artefact is replaced "
                          "only once the new one is verified).")
    if preprocessing is not None and sample is None:
        raise ConfigError(
            "`preprocessing` needs `sample`: example raw inputs, which fix the shapes and dtypes "
            "the artefact takes (its signature). Fix: export(..., preprocessing=..., "
            "sample=<a few raw examples>).")
    if (format == "keras" and preprocessing is not None
            and not isinstance(preprocessing, keras.layers.Layer)):
        raise ConfigError(
            "A .keras archive holds Keras layers, not a Python function: the preprocessing "
            f"given is a {type(preprocessing).__name__}. Fix: write it as Keras preprocessing "
            "layers (keras.layers.Normalization, Rescaling, ...), or format=\"saved_model\".")
    inputs = _sample_inputs(model, sample, batch_size)
    serving = _Serving(model, preprocessing, inputs)
    if format == "keras":
        serving.check_keras_archive()
        archived = serving.keras_model()
        reference = verify_lib.named_outputs(archived, archived(
            verify_lib.model_inputs(archived, inputs), training=False))
    else:
        reference = serving.reference(inputs)

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    name = os.path.basename(path.rstrip(os.sep))
    partial = os.path.join(folder, f".{name}.partial-{os.getpid()}"
                           + (".keras" if format == "keras" else ""))
    try:
        if format == "saved_model":
            serving.write_saved_model(partial)
        else:
            archived.save(partial)
        measured, verified_in = _run_fresh(format, partial, inputs, serving.modules())
        differences = _compare(format, reference, measured.pop("outputs"))
        _put_in_place(partial, path)
    finally:
        _remove(partial)
    return ExportReport(path=path, format=format, size_bytes=_size(path),
                        batch_size=len(next(iter(inputs.values()))),
                        max_difference=differences, verified_in=verified_in,
                        inputs=list(inputs), outputs=list(reference), **measured)


class _Serving:
    """What an artefact serves: raw named inputs -> preprocessing -> model -> named outputs."""

    def __init__(self, model, preprocessing, inputs):
        self.model = model
        self.preprocessing = preprocessing
        self.names = list(inputs)
        self.specs = [tf.TensorSpec((None,) + array.shape[1:], tf.as_dtype(array.dtype), name=n)
                      for n, array in inputs.items()]

    def __call__(self, *tensors):
        raw = tensors[0] if len(tensors) == 1 else list(tensors)
        features = self.preprocessing(raw) if self.preprocessing is not None else raw
        outputs = self.model(features, training=False)
        if isinstance(outputs, dict):
            return dict(outputs)
        flat = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        return dict(zip(verify_lib.output_names(self.model, len(flat)), flat))

    def reference(self, inputs):
        """The in-memory model's outputs on `inputs`, as numpy, by output name."""
        outputs = self(*[tf.constant(inputs[name]) for name in self.names])
        return {name: np.asarray(value) for name, value in outputs.items()}

    def write_saved_model(self, folder):
        archive = keras.export.ExportArchive()
        archive.track(self.model)
        if isinstance(self.preprocessing, keras.layers.Layer):
            archive.track(self.preprocessing)
        archive.add_endpoint("serving_default", self, input_signature=self.specs)
        archive.write_out(folder, verbose=False)

    def keras_model(self):
        """The model, preceded by the preprocessing layer when there is one."""
        if self.preprocessing is None:
            return self.model
        raw = [keras.Input(shape=spec.shape[1:], dtype=spec.dtype.name, name=spec.name)
               for spec in self.specs]
        features = self.preprocessing(raw[0] if len(raw) == 1 else raw)
        return keras.Model(raw if len(raw) > 1 else raw[0], self.model(features),
                           name=f"{self.model.name}_with_preprocessing")

    def _layers(self):
        parts = [self.model] + ([self.preprocessing]
                                if isinstance(self.preprocessing, keras.layers.Layer) else [])
        return [layer for part in parts for layer in part._flatten_layers(include_self=True)]

    def _custom_classes(self):
        seen = {}
        for layer in self._layers():
            cls = type(layer)
            if not cls.__module__.startswith("keras."):
                seen[cls] = layer.name
        loss = getattr(self.model, "loss", None)
        if loss is not None and not isinstance(loss, str):
            cls = loss if isinstance(loss, type) or callable(loss) and not hasattr(
                loss, "get_config") else type(loss)
            module = getattr(cls, "__module__", "") or ""
            if not module.startswith("keras."):
                seen[cls] = "the compiled loss"
        return seen

    def check_keras_archive(self):
        """Refuses what a .keras archive cannot load safely, or without custom_objects."""
        lambdas = [layer.name for layer in self._layers()
                   if isinstance(layer, keras.layers.Lambda)]
        if lambdas:
            raise ConfigError(
                f"The model has Lambda layer(s) {', '.join(map(repr, lambdas))}: a .keras "
                "archive stores a Lambda's Python code as bytecode, and loading it needs "
                "safe_mode=False, which runs code from the file. Nothing was written. Expected "
                "layers a safe load can rebuild. Fix: write the computation as a custom layer "
                "registered with @keras.saving.register_keras_serializable(), or "
                "format=\"saved_model\" (a traced graph: no Python code to run).")
        for cls, where in self._custom_classes().items():
            registered = keras.saving.get_registered_object(keras.saving.get_registered_name(cls))
            if registered is not cls:
                raise ConfigError(
                    f"{cls.__module__}.{cls.__qualname__} ({where}) is not registered with "
                    "Keras: the .keras archive would name it, and loading it would need "
                    "`custom_objects=`. Nothing was written. Fix: decorate the class with "
                    "@keras.saving.register_keras_serializable(package=\"<your package>\") "
                    "(and give it a get_config() that holds its constructor's arguments), or "
                    "format=\"saved_model\".")

    def modules(self):
        """The modules a fresh process must import to rebuild the custom classes."""
        return sorted({cls.__module__ for cls in self._custom_classes()})


def _sample_inputs(model, sample, batch_size):
    """{input name: array}: the user's sample, or random values of the model's input shapes."""
    model_inputs = getattr(model, "inputs", None) or []
    names = [tensor.name for tensor in model_inputs]
    if sample is not None:
        if isinstance(sample, dict):
            arrays = {str(k): np.asarray(v) for k, v in sample.items()}
        else:
            parts = list(sample) if isinstance(sample, (list, tuple)) else [sample]
            given = names if len(names) == len(parts) else (
                ["inputs"] if len(parts) == 1 else [f"input_{i}" for i in range(len(parts))])
            arrays = {name: np.asarray(part) for name, part in zip(given, parts)}
        rows = {len(a) for a in arrays.values() if a.ndim}
        if len(rows) != 1 or any(a.ndim == 0 for a in arrays.values()):
            raise ConfigError(
                "`sample` must hold the same number of examples (rows) for every input. "
                f"Received shapes {[a.shape for a in arrays.values()]}. Fix: one batch of "
                "examples per input.")
        return arrays
    if not model_inputs:
        raise ConfigError(
            f"{type(model).__name__} has no fixed inputs (a subclassed model): the artefact's "
            "signature cannot be read from it. Expected `sample`. Fix: export(model, path, "
            "sample=<a batch of real inputs>).")
    rng = np.random.default_rng(0)
    arrays = {}
    for tensor in model_inputs:
        shape = tuple(tensor.shape)[1:]
        if any(d is None for d in shape):
            raise ConfigError(
                f"Input {tensor.name!r} has shape {tuple(tensor.shape)}: the verification "
                "needs values of a fixed shape, and random values of an unknown size would "
                "test nothing. Fix: export(..., sample=<a batch of real inputs>) (the "
                "signature keeps the shape as declared).")
        dtype = np.dtype(keras.backend.standardize_dtype(tensor.dtype))
        if dtype.kind == "f":
            arrays[tensor.name] = rng.standard_normal((batch_size,) + shape).astype(dtype)
        elif dtype.kind in "iu":
            arrays[tensor.name] = rng.integers(0, 2, (batch_size,) + shape).astype(dtype)
        else:
            raise ConfigError(
                f"Input {tensor.name!r} is {dtype}: no random values stand for it. Fix: "
                "export(..., sample=<a batch of real inputs>).")
    return arrays


def _run_fresh(format, artefact, inputs, modules):
    """Outputs and timings of the artefact, from a fresh process when one can rebuild it."""
    if "__main__" in modules:
        # Classes defined in the running script: a fresh process cannot
        # import them (it would run the script). A fresh load in this
        # process still rebuilds the model from the files alone.
        run, load_seconds = verify_lib.load(format, artefact)
        single = {name: array[:1] for name, array in inputs.items()}
        return {"outputs": run(inputs), "load_seconds": load_seconds,
                "single_seconds": verify_lib.latency(run, single),
                "batch_seconds": verify_lib.latency(run, inputs)}, (
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


def _compare(format, reference, produced):
    rtol, atol = TOLERANCE[format]
    if sorted(produced) != sorted(reference):
        raise ExportError(
            f"The {format} artefact's outputs are named {sorted(produced)}, the model's "
            f"{sorted(reference)}: nothing was left at the path.")
    differences = {}
    for name, expected in reference.items():
        got = produced[name]
        if got.shape != expected.shape:
            raise ExportError(
                f"The {format} artefact's output {name!r} has shape {got.shape}, the model's "
                f"{expected.shape}: nothing was left at the path.")
        difference = float(np.max(np.abs(got.astype(np.float64) - expected))) if got.size \
            else 0.0
        if not np.allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True):
            raise ExportError(
                f"The {format} artefact does not give the model's outputs: output {name!r} "
                f"differs by up to {difference:.3g} (tolerance rtol={rtol}, atol={atol}), on "
                "the same inputs. Nothing was left at the path. The usual cause is a custom "
                "layer whose get_config() does not hold every constructor argument (the "
                "loaded layer is built with the defaults), or a layer that behaves differently "
                "when called again. Fix that layer and export again.")
        differences[name] = difference
    return differences


def _put_in_place(partial, path):
    """Renames the verified artefact to `path`, replacing what was there only now."""
    if os.path.isdir(path) and not os.path.islink(path):
        old = f"{path.rstrip(os.sep)}.old-{os.getpid()}"
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
