"""What an artefact takes: its raw inputs' names, shapes and dtypes, and the values that test it.

The raw inputs are the model's, or the preprocessing's when `export` puts a
preprocessing in front of the model. They are read from what fixes them (a
Functional model's `inputs`, a built layer's build shape), or from `sample`
where nothing does; `sample` is asked for only then, naming the input.
"""

import keras
import numpy as np

from tapeworks.errors import ConfigError

REPRESENTATIVE_EXAMPLES = 200   # calibration examples read from `representative_data`


def raw_specs(model, preprocessing):
    """[(name, shape with a None batch, numpy dtype)] of the raw inputs, or a refusal.

    Raises:
        ConfigError: what the inputs are cannot be known without `sample`
            (a function, an unbuilt layer, a subclassed model); the message
            says which input and how to give it.
    """
    if preprocessing is None:
        inputs = _fixed_inputs(model)
        if not inputs:
            raise ConfigError(
                f"{type(model).__name__} has no fixed inputs (a subclassed model): the "
                "artefact's signature cannot be read from it. Expected `sample`. Fix: "
                "export(model, path, sample=<a batch of real inputs>).")
        return [(t.name, tuple(t.shape), _dtype(t.dtype)) for t in inputs]
    model_inputs = _fixed_inputs(model)
    name = model_inputs[0].name if len(model_inputs) == 1 else "inputs"
    if isinstance(preprocessing, keras.Model) and _fixed_inputs(preprocessing):
        tensors = _fixed_inputs(preprocessing)
        # A Sequential built by a call names its input itself ("keras_tensor_3"):
        # the signature keeps the model's input name then.
        names = ([name] if len(tensors) == 1 and tensors[0].name.startswith("keras_tensor")
                 else [t.name for t in tensors])
        return [(n, (None,) + tuple(t.shape)[1:], _dtype(t.dtype))
                for n, t in zip(names, tensors)]
    if isinstance(preprocessing, keras.layers.Layer):
        shape = (preprocessing.get_build_config() or {}).get("input_shape") \
            if preprocessing.built else None
        if shape is not None and not isinstance(shape, dict) and (
                not shape or not isinstance(shape[0], (list, tuple))):
            return [(name, (None,) + tuple(shape)[1:], _dtype(preprocessing.input_dtype))]
        raise ConfigError(
            f"`preprocessing` needs `sample`: the layer {preprocessing.name!r} "
            f"({type(preprocessing).__name__}) is not built (on one input), so the shape and "
            f"dtype of the raw input {name!r} cannot be read from it. Fix: export(..., "
            "sample=<a few raw examples>), or adapt/build the layer first (e.g. "
            "layer.adapt(raw_training_data)).")
    raise ConfigError(
        f"`preprocessing` needs `sample`: a {type(preprocessing).__name__} (a Python "
        f"function) does not say the shape and dtype of the raw input {name!r} it takes. Fix: "
        "export(..., sample=<a few raw examples>), or write it as a Keras layer or Functional "
        "model (keras.layers.Normalization, Rescaling, ...), whose inputs are known.")


def _fixed_inputs(model):
    """A model's symbolic inputs, or [] (a subclassed model, a Sequential never built)."""
    try:
        return list(model.inputs or [])
    except (AttributeError, ValueError):
        return []


def _dtype(dtype):
    return np.dtype(keras.backend.standardize_dtype(dtype))


def verification_inputs(model, preprocessing, sample, representative_data, batch_size):
    """({input name: array} that tests the artefact, [calibration examples] or None).

    The user's `sample` when given. Without it, real inputs test more than
    random ones: the `representative_data` (up to REPRESENTATIVE_EXAMPLES)
    are the verification batch when given; random values of the raw inputs'
    shapes only otherwise.
    """
    if sample is not None:
        model_inputs = getattr(model, "inputs", None) or []
        names = [tensor.name for tensor in model_inputs]
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
        examples = (representative(representative_data, list(arrays))
                    if representative_data is not None else None)
        return arrays, examples
    specs = raw_specs(model, preprocessing)
    names = [name for name, _, _ in specs]
    if representative_data is not None:
        examples = representative(representative_data, names)
        return {name: np.concatenate([e[name] for e in examples]) for name in names}, examples
    return _random_inputs(specs, batch_size), None


def _random_inputs(specs, batch_size):
    rng = np.random.default_rng(0)
    arrays = {}
    for name, full_shape, dtype in specs:
        shape = tuple(full_shape)[1:]
        if any(d is None for d in shape):
            raise ConfigError(
                f"Input {name!r} has shape {tuple(full_shape)}: the verification "
                "needs values of a fixed shape, and random values of an unknown size would "
                "test nothing. Fix: export(..., sample=<a batch of real inputs>) (the "
                "signature keeps the shape as declared).")
        if dtype.kind == "f":
            arrays[name] = rng.standard_normal((batch_size,) + shape).astype(dtype)
        elif dtype.kind in "iu":
            arrays[name] = rng.integers(0, 2, (batch_size,) + shape).astype(dtype)
        else:
            raise ConfigError(
                f"Input {name!r} is {dtype}: no random values stand for it. Fix: "
                "export(..., sample=<a batch of real inputs>).")
    return arrays


def representative(data, names):
    """Up to REPRESENTATIVE_EXAMPLES calibration examples, one per dict, keyed by input name."""
    import tensorflow as tf

    examples = []
    if isinstance(data, tf.data.Dataset):
        for batch in data:
            features = batch[0] if isinstance(batch, tuple) and len(batch) in (2, 3) else batch
            named = as_named(features, names)
            rows = len(next(iter(named.values())))
            examples += [{k: v[i:i + 1] for k, v in named.items()} for i in range(rows)]
            if len(examples) >= REPRESENTATIVE_EXAMPLES:
                break
    else:
        named = as_named(data, names)
        rows = len(next(iter(named.values())))
        examples = [{k: v[i:i + 1] for k, v in named.items()} for i in range(rows)]
    if not examples:
        raise ConfigError("`representative_data` holds no examples. Fix: a few hundred "
                          "training inputs.")
    return [{k: np.asarray(v, np.float32) if np.asarray(v).dtype.kind == "f" else np.asarray(v)
             for k, v in example.items()} for example in examples[:REPRESENTATIVE_EXAMPLES]]


def as_named(data, names):
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
