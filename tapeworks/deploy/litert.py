"""LiteRT models from the serving function: TensorFlow's converter on its SavedModel.

As Keras' own `export(format="litert")` does, the SavedModel's signature goes
through `tf.lite.TFLiteConverter`, with the quantisation asked for. For full
int8, `Int8Calibration` wraps TensorFlow's `QuantizationDebugger` (public
API, `tf.lite.experimental`): the model calibrated once on the representative
examples, each quantised op's error against the same op in float, and int8
models with chosen ops kept in float (its `denylisted_nodes`).
"""

import contextlib
import csv
import io
import re
import tempfile
import warnings

import numpy as np
import tensorflow as tf

from tapeworks.errors import ConfigError


@contextlib.contextmanager
def _quiet_converter():
    with warnings.catch_warnings():
        # The converter and the debugger calibrate with tf.lite.Interpreter,
        # which warns that it is deprecated; the verification uses ai-edge-litert.
        warnings.simplefilter("ignore", UserWarning)
        yield


@contextlib.contextmanager
def converter_for(serving, quantize, examples):
    """A `TFLiteConverter` for `serving`, set for `quantize`, while its SavedModel exists."""
    with tempfile.TemporaryDirectory(prefix="tapeworks-tflite-") as folder:
        serving.write_saved_model(folder)
        converter = tf.lite.TFLiteConverter.from_saved_model(
            folder, signature_keys=["serving_default"])
        if quantize is not None:
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if quantize == "float16":
            converter.target_spec.supported_types = [tf.float16]
        if quantize == "int8":
            converter.representative_dataset = lambda: iter(examples)
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        yield converter


def convert(serving, quantize, examples):
    """The LiteRT flatbuffer of `serving`, quantised as asked; a ConfigError if it cannot be."""
    with converter_for(serving, quantize, examples) as converter:
        try:
            with _quiet_converter():
                return converter.convert()
        except Exception as error:   # the converter raises ConverterError and friends
            raise ConfigError(conversion_problem(error, quantize)) from None


def conversion_problem(error, quantize):
    """What the converter's error means for the user, with the fix."""
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


class Int8Calibration:
    """One int8 calibration of `serving`: per-op errors, and models with ops kept in float.

    Each row of `ops` is one quantised op: its type ("FULLY_CONNECTED"), its
    output tensor's name in the calibrated model (what `denylisted_nodes`
    takes), the signature output it is (or None), the int8 activation range,
    the root-mean-square error the op adds (its int8 output against the same
    op computed in float on float inputs, TensorFlow's NumericVerify) and the
    root-mean-square spread of its float output about its mean (what that
    error is measured against).
    """

    def __init__(self, serving, examples):
        with converter_for(serving, "int8", examples) as converter, _quiet_converter():
            try:
                self.debugger = tf.lite.experimental.QuantizationDebugger(
                    converter=converter, debug_dataset=lambda: self._rows(examples))
            except Exception as error:
                raise ConfigError(conversion_problem(error, "int8")) from None
        self.examples = examples
        with _quiet_converter():
            self.debugger.run()
        self.ops = self._ops()

    def _signature(self):
        """({tensor index: signature input name}, {tensor name: signature output name})."""
        from ai_edge_litert.interpreter import Interpreter

        runner = Interpreter(model_content=self.debugger.calibrated_model).get_signature_runner(
            "serving_default")
        return ({d["index"]: name for name, d in runner.get_input_details().items()},
                {d["name"]: name for name, d in runner.get_output_details().items()})

    def _input_order(self):
        """The signature's input names in the order the debugger feeds the model's inputs."""
        from ai_edge_litert.interpreter import Interpreter

        by_index, _ = self._signature()
        details = Interpreter(model_content=self.debugger.calibrated_model).get_input_details()
        return [by_index[d["index"]] for d in details]

    def _rows(self, examples):
        order = self._input_order()
        return ([example[name] for name in order] for example in examples)

    def _ops(self):
        # The dump is the debugger's public view of each NumericVerify: the op,
        # its scale and zero point, in the order of `layer_statistics`.
        dump = io.StringIO()
        self.debugger.layer_statistics_dump(dump)
        dump.seek(0)
        rows = list(csv.DictReader(dump))
        names = self._calibrated_names()
        spread = self._float_spread(names)
        _, outputs = self._signature()
        ops = []
        for key, row in zip(self.debugger.layer_statistics, rows):
            tensor = _calibrated_name(key, names)
            scale, zero_point = float(row["scale"]), int(float(row["zero_point"]))
            ops.append({"op": row["op_name"], "tensor": tensor, "output": outputs.get(tensor),
                        "low": (-128 - zero_point) * scale, "high": (127 - zero_point) * scale,
                        "error": float(np.sqrt(float(row["mean_squared_error"]))),
                        "spread": spread.get(tensor, float("nan"))})
        return ops

    def _calibrated_names(self):
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_content=self.debugger.calibrated_model)
        return {detail["name"]: detail["index"] for detail in interpreter.get_tensor_details()}

    def _float_spread(self, names):
        """{tensor name: rms of its float value about its mean}, over the examples."""
        from ai_edge_litert.interpreter import Interpreter

        with warnings.catch_warnings():
            # It warns that keeping every intermediate tensor costs memory: here
            # that is the point, on a small calibration batch.
            warnings.simplefilter("ignore", UserWarning)
            interpreter = Interpreter(model_content=self.debugger.calibrated_model,
                                      experimental_preserve_all_tensors=True)
        inputs = interpreter.get_input_details()
        totals = {}
        for detail, value in zip(inputs, next(self._rows(self.examples))):
            interpreter.resize_tensor_input(detail["index"], value.shape)
        interpreter.allocate_tensors()
        for row in self._rows(self.examples):
            for detail, value in zip(inputs, row):
                interpreter.set_tensor(detail["index"], value)
            interpreter.invoke()
            for name, index in names.items():
                try:
                    value = interpreter.get_tensor(index)
                except ValueError:   # a tensor with no data (an optional input)
                    continue
                if value.dtype.kind != "f":
                    continue
                total = totals.setdefault(name, [0, 0.0, 0.0])
                total[0] += value.size
                total[1] += float(np.sum(value, dtype=np.float64))
                total[2] += float(np.sum(np.square(value, dtype=np.float64)))
        spread = {}
        for name, (count, first, second) in totals.items():
            if count:
                mean = first / count
                spread[name] = float(np.sqrt(max(second / count - mean * mean, 0.0)))
        return spread

    def model_keeping_float(self, tensors):
        """The int8 flatbuffer with the ops writing `tensors` kept in float32."""
        with _quiet_converter():
            self.debugger.options = tf.lite.experimental.QuantizationDebugOptions(
                denylisted_nodes=list(tensors))
            return self.debugger.get_nondebug_quantized_model()


def _calibrated_name(key, names):
    """The calibrated model's name of the tensor a NumericVerify statistic is about.

    The statistic is keyed "NumericVerify/<quantised tensor>:<index>", and the
    quantiser names a quantised tensor after the float one with a digit
    appended ("dense/Relu" -> "dense/Relu1").
    """
    quantised = re.sub(r"^NumericVerify/|:\d+$", "", key)
    if quantised in names:
        return quantised
    if quantised[:-1] in names and quantised[-1:].isdigit():
        return quantised[:-1]
    return quantised


def activation_drift(serving, quantize, inputs):
    """How far each intermediate tensor of the `quantize` model is from the float32 model's.

    For float16 and dynamic-range models, which have no int8 calibration for
    the QuantizationDebugger to measure: both flatbuffers run on the
    verification `inputs` ({signature input name: array}) with every tensor
    kept, and each activation (a tensor whose first dimension is the batch's:
    it is told from a weight by running the float model on one row fewer)
    that both models hold in float is compared by name, channel by channel
    (its last axis): a channel whose values all collapsed reads 100% however
    large its neighbours (a channel that barely varies is measured against
    the tensor's median channel).

    Returns [{"tensor", "relative", "error", "spread"}]: the worst channel's
    rms error against that channel's spread about its mean (inf where the
    quantised values are not finite), and that channel's two figures.
    """
    reference_fb, quantised_fb = convert(serving, None, None), convert(serving, quantize, None)
    rows = len(next(iter(inputs.values())))
    reference = _all_tensors(reference_fb, inputs)
    shorter = _all_tensors(reference_fb, {k: v[:rows - 1] for k, v in inputs.items()})
    quantised = _all_tensors(quantised_fb, inputs)
    drift = []
    for name, value in reference.items():
        other = quantised.get(name)
        fewer = shorter.get(name)
        if (other is None or fewer is None or value.dtype.kind != "f"
                or other.dtype.kind != "f" or other.shape != value.shape or value.ndim == 0
                or value.shape[0] != rows or fewer.shape[:1] != (rows - 1,)):
            continue
        drift.append(dict(tensor=name, **_worst_channel(value, other)))
    return drift


def _worst_channel(reference, quantised):
    channels = reference.shape[-1] if reference.ndim > 1 else 1
    reference = reference.reshape(-1, channels).astype(np.float64)
    quantised = quantised.reshape(-1, channels).astype(np.float64)
    if not np.all(np.isfinite(quantised)):
        return {"relative": float("inf"), "error": float("inf"),
                "spread": float(np.max(np.std(reference, axis=0)))}
    error = np.sqrt(np.mean((quantised - reference) ** 2, axis=0))
    spread = np.std(reference, axis=0)
    # A channel that barely varies in float (a unit that seldom fires) is
    # measured against the tensor's median channel instead: rounding its
    # inputs moves it by their steps, not by its own spread.
    typical = float(np.median(spread)) or float(np.mean(np.abs(reference))) or 1.0
    scale = np.maximum(spread, typical)
    worst = int(np.argmax(error / scale))
    return {"relative": float(error[worst] / scale[worst]), "error": float(error[worst]),
            "spread": float(spread[worst])}


def _all_tensors(flatbuffer, inputs):
    """{tensor name: value} of every tensor after one run of `flatbuffer` on `inputs`."""
    from ai_edge_litert.interpreter import Interpreter

    with warnings.catch_warnings():
        # Keeping every tensor costs memory: here that is the point, on one batch.
        warnings.simplefilter("ignore", UserWarning)
        interpreter = Interpreter(model_content=flatbuffer,
                                  experimental_preserve_all_tensors=True)
    details = interpreter.get_signature_runner("serving_default").get_input_details()
    for name, detail in details.items():
        interpreter.resize_tensor_input(detail["index"], inputs[name].shape)
    interpreter.allocate_tensors()
    for name, detail in details.items():
        interpreter.set_tensor(detail["index"], inputs[name])
    interpreter.invoke()
    values = {}
    for detail in interpreter.get_tensor_details():
        try:
            values[detail["name"]] = interpreter.get_tensor(detail["index"])
        except ValueError:   # a tensor with no data (a resource, an optional input)
            continue
    return values
