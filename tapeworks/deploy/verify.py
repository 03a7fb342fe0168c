"""Loads an exported artefact and runs inputs through it: `export`'s check, in a fresh process.

A fresh process is the honest test of an artefact: it has none of the
exporting process's state (registered classes, traced functions, variables),
only what the files hold and what it imports. Run as

    python -m tapeworks.deploy.verify FORMAT ARTEFACT INPUTS.npz OUTPUTS.npz [MODULE ...]

where INPUTS.npz holds one array per named input (and, as "validation/<name>",
held-out inputs whose outputs are written as "validation/<output>"), and each MODULE is
imported first (the modules that define and register a `.keras` archive's
custom classes: a user installs them beside the archive too). It writes the
outputs, one array per named output, and the timings as JSON on stdout.
"""

import json
import sys
import time


def load(format, artefact):
    """The artefact as a callable `run(named inputs) -> named outputs`, and the seconds it took."""
    start = time.perf_counter()
    if format == "saved_model":
        import tensorflow as tf

        loaded = tf.saved_model.load(artefact)
        serve = loaded.signatures["serving_default"]
        others = {k: f for k, f in loaded.signatures.items() if k != "serving_default"}

        def run(inputs, every_signature=False):
            tensors = {name: tf.constant(array) for name, array in inputs.items()}
            outputs = {name: value.numpy() for name, value in serve(**tensors).items()}
            for key, signature in (others.items() if every_signature else ()):
                outputs.update({f"signature/{key}/{name}": value.numpy()
                                for name, value in signature(**tensors).items()})
            return outputs
    elif format == "tflite":
        # LiteRT's maintained runtime, not the deprecated tf.lite.Interpreter.
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=artefact)
        serve = interpreter.get_signature_runner("serving_default")

        def run(inputs):
            return {name: value.copy() for name, value in serve(**inputs).items()}
    else:
        import keras

        model = keras.saving.load_model(artefact, safe_mode=True)

        def run(inputs):
            return named_outputs(model, model(model_inputs(model, inputs), training=False))
    return run, time.perf_counter() - start


def model_inputs(model, inputs):
    """What a Keras model is called with, from {input name: array}: by its inputs' order."""
    try:
        names = [tensor.name for tensor in model.inputs]
    except (AttributeError, ValueError):   # a subclassed model has no fixed inputs
        names = []
    if sorted(names) != sorted(inputs):
        names = list(inputs)
    return [inputs[name] for name in names] if len(names) > 1 else inputs[names[0]]


def named_outputs(model, outputs):
    """{name: array} of a model's outputs, named as `export` names them."""
    import keras
    import numpy as np

    if isinstance(outputs, dict):
        return {name: np.asarray(keras.ops.convert_to_numpy(v)) for name, v in outputs.items()}
    flat = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    names = output_names(model, len(flat))
    return {name: np.asarray(keras.ops.convert_to_numpy(v)) for name, v in zip(names, flat)}


def output_names(model, count):
    names = list(getattr(model, "output_names", None) or [])
    if len(names) != count or len(set(names)) != count:
        names = [f"output_{i}" for i in range(count)]
    return names


def latency(run, inputs, repeats=20):
    """Median seconds of one call of `run` on `inputs`, after a warm-up call."""
    import statistics

    run(inputs)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(inputs)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv):
    import numpy as np

    format, artefact, inputs_path, outputs_path, *modules = argv
    import importlib

    for module in modules:
        importlib.import_module(module)
    result = check(format, artefact, dict(np.load(inputs_path)))
    np.savez(outputs_path, **result.pop("outputs"))
    print(json.dumps(result))


def check(format, artefact, given):
    """Loads the artefact, runs `given` through it, times it: {"outputs", timings}.

    `given` holds the inputs by name, and held-out inputs as "validation/<name>"
    (their outputs come back as "validation/<output>").
    """
    run, load_seconds = load(format, artefact)
    outputs = outputs_of(format, run, given)
    inputs = {name: array for name, array in given.items() if "/" not in name}
    single = {name: array[:1] for name, array in inputs.items()}
    return {"outputs": outputs, "load_seconds": load_seconds,
            "single_seconds": latency(run, single), "batch_seconds": latency(run, inputs)}


def outputs_of(format, run, given):
    """The artefact's outputs on `given` (see `check`), by name."""
    inputs = {name: array for name, array in given.items() if "/" not in name}
    # A SavedModel's extra signatures too, as "signature/<name>/<output>".
    outputs = run(inputs, every_signature=True) if format == "saved_model" else run(inputs)
    held_out = {name.split("/", 1)[1]: array for name, array in given.items()
                if name.startswith("validation/")}
    if held_out:
        outputs.update({f"validation/{name}": value for name, value in run(held_out).items()})
    return outputs


if __name__ == "__main__":
    main(sys.argv[1:])
