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

LiteRT models (float32, or quantised: dynamic-range, float16, full int8
calibrated on `representative_data`) go through TensorFlow's converter from
that SavedModel, as Keras' own LiteRT export does, and are verified with
`ai-edge-litert` (LiteRT's maintained runtime), against a bound for the
quantised ones and, given `validation_data`, the task metric before and after.
Pruning (issue 15's other part) is not built yet.
"""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import keras
import numpy as np
import tensorflow as tf

from tapeworks.deploy import verify as verify_lib
from tapeworks.errors import ConfigError, TapeworksError

FORMATS = ("saved_model", "keras", "tflite")
QUANTIZE = (None, "dynamic", "float16", "int8")
# (rtol, atol) of the artefact's outputs against the in-memory model's. A
# SavedModel runs the traced graph, which TensorFlow's graph optimiser may
# fuse differently from eager execution (a MatMul, its bias and ReLU as one
# kernel): float32 rounding, not a different model. A .keras archive is the
# same Keras layers with the same weights. A float32 LiteRT model runs
# other kernels (XNNPACK) on the same weights.
TOLERANCE = {"saved_model": (1e-4, 1e-5), "keras": (1e-5, 1e-6), "tflite": (1e-4, 1e-5)}
# A quantised LiteRT model is another model, close to the float one: its
# outputs may differ by up to this share of the range of the model's outputs
# on the same inputs (a bound that catches a broken conversion, not a
# measure of quality: `validation_data` gives the task metric before and
# after). Measured on a small MLP (one-off): float16 0.03% of the range,
# int8 0.4%.
RANGE_BOUND = {"float16": 0.01, "dynamic": 0.05, "int8": 0.1}
REPRESENTATIVE_EXAMPLES = 200   # calibration examples read from `representative_data`


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
    quantize: str = None       # tflite: None (float32), "dynamic", "float16" or "int8"
    metric: dict = None        # with validation_data: {"name", "model", "artefact"}
    signatures: list = None    # saved_model: "serving_default" and the extra ones

    def __str__(self):
        worst = max(self.max_difference.values()) if self.max_difference else 0.0
        kind = self.format + (f" ({self.quantize})" if self.quantize else "")
        metric = (f"; {self.metric['name']} {self.metric['model']:.4g} (model) -> "
                  f"{self.metric['artefact']:.4g} (artefact) on the validation data"
                  if self.metric else "")
        return (f"{kind} artefact at {self.path}: {self.size_bytes / 1024:,.1f} KiB, "
                f"inputs {', '.join(self.inputs)} -> outputs {', '.join(self.outputs)}; "
                f"verified in {self.verified_in}: largest difference {worst:.2e} from the "
                f"model; load {self.load_seconds:.2f} s, latency "
                f"{self.single_seconds * 1e3:.3f} ms for one example, "
                f"{self.batch_seconds * 1e3:.3f} ms for {self.batch_size}{metric}")


def export(model, path, format="saved_model", *, preprocessing=None, sample=None,
           quantize=None, representative_data=None, validation_data=None, signatures=None,
           overwrite=False, batch_size=32):
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
            ("saved_model" only). Needs `sample`, which fixes the raw
            inputs' shapes and dtypes.
        sample: example inputs (an array, a list in the model's input order,
            or a dict by input name), used for the signature's specs when
            the model has no fixed inputs (a subclassed model) or is
            preceded by `preprocessing`, and for the verification. Without
            it, random inputs of the model's input shapes are used.
        quantize: "tflite" only: None (float32), "dynamic" (int8 weights,
            float activations), "float16" (float16 weights) or "int8" (int8
            weights and activations, float32 inputs and outputs, calibrated
            on `representative_data`).
        representative_data: for quantize="int8": examples like `sample`
            (arrays, or a tf.data.Dataset of inputs or (inputs, targets)
            batches); the first `REPRESENTATIVE_EXAMPLES` are read.
        validation_data: optional held-out (inputs, targets): the report
            gives the task metric (accuracy for class scores against integer
            labels, else mean squared error) of the model and of the artefact.
        signatures: "saved_model" only: named extra signatures beside
            `serving_default`, {name: function}. Each function takes the same
            raw inputs, positionally in the signature's input order, and
            returns a tensor or a dict of named tensors, with TensorFlow ops
            (it may call the model: `lambda x: tf.nn.softmax(model(x))`). Each
            is verified like `serving_default`.
        overwrite: replace an artefact already at `path` (only once the new
            one is verified).
        batch_size: rows of the random verification inputs.

    Raises:
        ConfigError: bad arguments, or a model the format cannot hold; nothing
            is written.
        ExportError: the written artefact did not give the model's outputs;
            nothing is left at `path`.
    """
    path = os.fspath(path)
    signatures = dict(signatures or {})
    suffix = _check_arguments(model, path, format, preprocessing, sample, quantize,
                              representative_data, signatures, overwrite)
    inputs = _sample_inputs(model, sample, batch_size)
    serving = _Serving(model, preprocessing, inputs, signatures)
    held_out, targets = {}, None
    if validation_data is not None:
        if not isinstance(validation_data, (tuple, list)) or len(validation_data) != 2:
            raise ConfigError("`validation_data` must be (inputs, targets). Received: a "
                              f"{type(validation_data).__name__}. Fix: validation_data=(x, y).")
        held_out = _as_named(validation_data[0], list(inputs))
        targets = np.asarray(validation_data[1])
    if format == "keras":
        serving.check_keras_archive()
        archived = serving.keras_model()
        reference = verify_lib.named_outputs(archived, archived(
            verify_lib.model_inputs(archived, inputs), training=False))
    else:
        reference = serving.reference(inputs)
    extra = {f"signature/{name}/{output}": value
             for name in signatures for output, value in serving.reference(inputs, name).items()}
    metric = None
    if held_out:
        expected = (verify_lib.named_outputs(archived, archived(verify_lib.model_inputs(
            archived, held_out), training=False)) if format == "keras"
            else serving.reference(held_out))
        metric = _Metric(targets, expected)

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    name = os.path.basename(path.rstrip(os.sep))
    partial = os.path.join(folder, f".{name}.partial-{os.getpid()}"
                           + (suffix or ""))
    try:
        if format == "saved_model":
            serving.write_saved_model(partial)
        elif format == "tflite":
            serving.write_tflite(partial, quantize, representative_data)
        else:
            archived.save(partial)
        given = dict(inputs, **{f"validation/{k}": v for k, v in held_out.items()})
        # A SavedModel or LiteRT model holds traced graphs: no class code to import.
        modules = serving.modules() if format == "keras" else []
        measured, verified_in = _run_fresh(format, partial, given, modules)
        produced = measured.pop("outputs")
        if metric is not None:
            metric.artefact_value = metric.of({k.split("/", 1)[1]: v for k, v in produced.items()
                                               if k.startswith("validation/")})
        differences = _compare(format, quantize, reference,
                               {k: v for k, v in produced.items() if "/" not in k})
        if extra:
            differences.update(_compare(format, quantize, extra, {
                k: v for k, v in produced.items() if k.startswith("signature/")}))
        _put_in_place(partial, path)
    finally:
        _remove(partial)
    return ExportReport(path=path, format=format, size_bytes=_size(path),
                        batch_size=len(next(iter(inputs.values()))),
                        max_difference=differences, verified_in=verified_in,
                        inputs=list(inputs), outputs=list(reference), quantize=quantize,
                        signatures=["serving_default"] + list(signatures),
                        metric=metric.as_dict() if metric is not None else None, **measured)


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
    return suffix


class _Serving:
    """What an artefact serves: raw named inputs -> preprocessing -> model -> named outputs."""

    def __init__(self, model, preprocessing, inputs, signatures=None):
        self.model = model
        self.preprocessing = preprocessing
        self.signatures = {name: self._named(fn) for name, fn in (signatures or {}).items()}
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

    @staticmethod
    def _named(fn):
        def signature(*tensors):
            outputs = fn(*tensors)
            return dict(outputs) if isinstance(outputs, dict) else {"output_0": outputs}
        return signature

    def reference(self, inputs, signature=None):
        """Outputs on `inputs` of the model (or of an extra signature), as numpy, by name."""
        fn = self if signature is None else self.signatures[signature]
        outputs = fn(*[tf.constant(inputs[name]) for name in self.names])
        return {name: np.asarray(value) for name, value in outputs.items()}

    def write_saved_model(self, folder):
        archive = keras.export.ExportArchive()
        archive.track(self.model)
        if isinstance(self.preprocessing, keras.layers.Layer):
            archive.track(self.preprocessing)
        archive.add_endpoint("serving_default", self, input_signature=self.specs)
        for name, fn in self.signatures.items():
            archive.add_endpoint(name, fn, input_signature=self.specs)
        archive.write_out(folder, verbose=False)

    def write_tflite(self, path, quantize, representative_data):
        """The SavedModel's signature through TensorFlow's LiteRT converter (as Keras' own
        `export(format="litert")` does), with the quantisation asked for."""
        import warnings

        with tempfile.TemporaryDirectory(prefix="tapeworks-tflite-") as folder:
            self.write_saved_model(folder)
            converter = tf.lite.TFLiteConverter.from_saved_model(
                folder, signature_keys=["serving_default"])
            if quantize is not None:
                converter.optimizations = [tf.lite.Optimize.DEFAULT]
            if quantize == "float16":
                converter.target_spec.supported_types = [tf.float16]
            if quantize == "int8":
                examples = _representative(representative_data, self.names)
                converter.representative_dataset = lambda: iter(examples)
                converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            try:
                with warnings.catch_warnings():
                    # The converter calibrates with tf.lite.Interpreter, which warns
                    # that it is deprecated; the verification uses ai-edge-litert.
                    warnings.simplefilter("ignore", UserWarning)
                    flatbuffer = converter.convert()
            except Exception as error:   # the converter raises ConverterError and friends
                raise ConfigError(_conversion_problem(error, quantize)) from None
        with open(path, "wb") as file:
            file.write(flatbuffer)

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


def _conversion_problem(error, quantize):
    text = str(error)
    flex = sorted(set(re.findall(r"Flex(\w+)", text)))
    ops = flex or sorted(set(re.findall(r"'tf\.(\w+)'", text)))
    if ops:
        return (f"LiteRT cannot convert op(s) {', '.join(ops)}: its built-in kernels do not "
                "include them" + (" in int8" if quantize == "int8" else "") + ". Nothing was "
                "written. Fix: write that part of the model with ops LiteRT has (see "
                "ai.google.dev/edge/litert/models/ops_compatibility), or convert it yourself "
                "with tf.lite.OpsSet.SELECT_TF_OPS, whose models need TensorFlow's Flex delegate "
                "at run time (which tapeworks' verification with ai-edge-litert does not "
                "load).")
    lines = [line for line in text.splitlines() if line.strip()]
    return ("LiteRT could not convert the model: " + (lines[-1][:300] if lines else
            type(error).__name__) + ". Nothing was written.")


def _representative(data, names):
    """Up to REPRESENTATIVE_EXAMPLES calibration examples, one per dict, keyed by input name."""
    examples = []
    if isinstance(data, tf.data.Dataset):
        for batch in data:
            features = batch[0] if isinstance(batch, tuple) and len(batch) in (2, 3) else batch
            named = _as_named(features, names)
            rows = len(next(iter(named.values())))
            examples += [{k: v[i:i + 1] for k, v in named.items()} for i in range(rows)]
            if len(examples) >= REPRESENTATIVE_EXAMPLES:
                break
    else:
        named = _as_named(data, names)
        rows = len(next(iter(named.values())))
        examples = [{k: v[i:i + 1] for k, v in named.items()} for i in range(rows)]
    if not examples:
        raise ConfigError("`representative_data` holds no examples. Fix: a few hundred "
                          "training inputs.")
    return [{k: np.asarray(v, np.float32) if np.asarray(v).dtype.kind == "f" else np.asarray(v)
             for k, v in example.items()} for example in examples[:REPRESENTATIVE_EXAMPLES]]


def _as_named(data, names):
    """{input name: array} from an array, a list in `names`' order or a dict."""
    if isinstance(data, dict):
        named = {str(k): np.asarray(v) for k, v in data.items()}
    else:
        parts = list(data) if isinstance(data, (list, tuple)) else [data]
        named = {name: np.asarray(part) for name, part in zip(names, parts)}
    if sorted(named) != sorted(names):
        raise ConfigError(f"The data's inputs are {sorted(named)}; the artefact takes "
                          f"{sorted(names)}. Fix: the same inputs as `sample`.")
    return named


class _Metric:
    """The task metric of the model and of the artefact on held-out data."""

    def __init__(self, targets, expected):
        self.targets = targets
        first = next(iter(expected.values()))
        self.classes = (first.ndim == 2 and first.shape[1] > 1
                        and np.issubdtype(targets.dtype, np.integer))
        self.name = "accuracy" if self.classes else "mean squared error"
        self.model_value = self.of(expected)
        self.artefact_value = None

    def of(self, outputs):
        first = next(iter(outputs.values()))
        if self.classes:
            return float(np.mean(np.argmax(first, axis=-1) == self.targets.reshape(-1)))
        return float(np.mean((first.reshape(self.targets.shape) - self.targets) ** 2))

    def as_dict(self):
        return {"name": self.name, "model": self.model_value, "artefact": self.artefact_value}


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


def _compare(format, quantize, reference, produced):
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
        if quantize is not None:
            bound = RANGE_BOUND[quantize] * float(np.ptp(expected)) if expected.size else 0.0
            if difference > bound:
                raise ExportError(
                    f"The {quantize} LiteRT model is too far from the model: output {name!r} "
                    f"differs by up to {difference:.3g}, over {RANGE_BOUND[quantize]:.0%} of "
                    f"the outputs' range ({bound:.3g}). Nothing was left at the path. Fix: "
                    "for int8, representative_data that covers the inputs' real range; or a "
                    "lighter quantisation (\"float16\", \"dynamic\").")
            differences[name] = difference
            continue
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
