"""Checks that turn the classic silent or cryptic training failures into clear errors.

Each check runs where it is cheapest: the Keras-loop guard and the gradient and
loss checks run while the step is traced (Python, once), so a compiled step pays
nothing for them; the data check runs once before the first step. All of them
raise before any variable is assigned, so the model is left as it was.
"""

import functools
import threading

import keras
import numpy as np
import tensorflow as tf

from tapeworks.errors import (
    CorrectnessWarning,
    DataSpecError,
    KerasLoopInStepError,
    LossError,
    MissingGradientError,
    warn,
)

# Keras' own loops build a dataset, an iterator and a compiled function of
# their own; inside a step that is being traced or taped they either fail with
# an `IteratorGetNext` gradient error or cut the gradient path silently.
_FORBIDDEN_IN_STEP = (
    "predict",
    "predict_on_batch",
    "train_on_batch",
    "test_on_batch",
    "fit",
    "evaluate",
)

_state = threading.local()
_install_lock = threading.Lock()
_installed = False


class inside_step:
    """Context manager marking this thread as running (or tracing) a step.

    While it is active, calling one of Keras' loop methods on any model raises
    `KerasLoopInStepError`. Outside it the methods behave exactly as Keras
    wrote them: the wrappers check one thread-local flag and delegate.
    """

    def __enter__(self):
        _install_guards()
        _state.depth = getattr(_state, "depth", 0) + 1
        return self

    def __exit__(self, *exc):
        _state.depth -= 1
        return False


def _install_guards():
    global _installed
    if _installed:
        return
    with _install_lock:
        if _installed:
            return
        for name in _FORBIDDEN_IN_STEP:
            setattr(keras.Model, name, _guarded(name, getattr(keras.Model, name)))
        _installed = True


def _guarded(name, method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if getattr(_state, "depth", 0) > 0:
            raise KerasLoopInStepError(
                f"`{self.name}.{name}()` was called inside a training step. "
                f"`{name}()` runs a whole Keras loop of its own (dataset, "
                "iterator, compiled function) and cannot be differentiated: "
                "inside a GradientTape it fails with an `IteratorGetNext` "
                "gradient error or silently cuts the gradient. Expected a "
                f"direct call. Fix: use `{self.name}(x, training=False)` for a "
                "frozen helper model (or `training=True` for the model being "
                "trained)."
            )
        return method(self, *args, **kwargs)

    wrapper._tapeworks_guarded = True
    return wrapper


def check_loss(loss, where="the loss"):
    """Raises `LossError` unless `loss` is a floating-point scalar."""
    if loss is None:
        raise LossError(
            f"{where} is None. Expected a scalar floating-point tensor. Fix: "
            "pass `loss=` to the Trainer (a Keras loss or a function "
            "`loss(y_true, y_pred)`), or return the loss from `compute_loss`."
        )
    loss = tf.convert_to_tensor(loss)
    if not loss.dtype.is_floating:
        raise LossError(
            f"{where} has dtype {loss.dtype.name}. Expected a floating-point "
            "scalar (gradients of integer tensors do not exist). Fix: cast the "
            "inputs of the loss to float, e.g. `tf.cast(y_true, y_pred.dtype)`."
        )
    if loss.shape.rank != 0:
        raise LossError(
            f"{where} has shape {loss.shape}. Expected a scalar. A per-sample "
            "loss (for example a Keras loss built with `reduction=None`) "
            "would be summed silently by the gradient. Fix: reduce it, e.g. "
            "`tf.reduce_mean(...)`, or use the loss' default reduction."
        )
    return loss


def check_gradients(gradients, variables, allow_missing=False):
    """Returns (gradients, variables) pairs, without the missing ones if allowed.

    Raises `MissingGradientError` listing every trainable variable whose
    gradient is None, unless `allow_missing` is set.
    """
    missing = [v for g, v in zip(gradients, variables) if g is None]
    if missing and not allow_missing:
        names = ", ".join(v.path if hasattr(v, "path") else v.name for v in missing)
        raise MissingGradientError(
            f"{len(missing)} of {len(variables)} trainable variables received "
            f"no gradient: {names}. Expected every trainable variable to be "
            "connected to the loss. Causes: a layer not used by the loss, a "
            "model called via `predict()`, or an op without a gradient "
            "(argmax, casting to int). Fix: connect them, set "
            "`layer.trainable = False` for parts you do not train, or pass "
            "`allow_missing_gradients=True` to skip them."
        )
    return [(g, v) for g, v in zip(gradients, variables) if g is not None]


def check_data_spec(element_spec, model, needs_targets=True, name="data"):
    """Raises `DataSpecError` when batches cannot feed `model`.

    Compares the dataset's element structure, shapes and dtypes with the
    model's declared inputs. Models that declare none (an unbuilt subclassed
    model) are checked only for the (x, y[, sample_weight]) structure.
    """
    if needs_targets:
        if not isinstance(element_spec, tuple) or len(element_spec) not in (2, 3):
            raise DataSpecError(
                f"`{name}` yields {_describe(element_spec)}. Expected batches "
                "of (x, y) or (x, y, sample_weight). Fix: yield a tuple, e.g. "
                "`tf.data.Dataset.from_tensor_slices((x, y)).batch(32)`."
            )
        x_spec = element_spec[0]
    else:
        x_spec = element_spec[0] if isinstance(element_spec, tuple) else element_spec
    inputs = _declared_inputs(model)
    if inputs is None:
        return
    by_name = _by_input_name(x_spec, inputs)
    x_flat = by_name or tf.nest.flatten(x_spec)
    labels = ([f"Input `{tensor.name}`" for tensor in inputs] if by_name
              else [f"Input {i}" for i in range(len(x_flat))])
    if len(x_flat) != len(inputs):
        raise DataSpecError(
            f"`{name}` gives the model {len(x_flat)} input tensor(s) "
            f"({_describe(x_spec)}). Expected {len(inputs)}, the inputs of "
            f"`{model.name}`: {_describe_inputs(inputs)}. Fix: yield x with "
            "one tensor per model input, in the order of `model.inputs`."
        )
    for label, spec, expected in zip(labels, x_flat, inputs):
        if not isinstance(spec, tf.TensorSpec):
            continue
        want_shape = list(expected.shape)
        got_shape = spec.shape.as_list() if spec.shape.rank is not None else None
        if got_shape is not None:
            got_shape = keras_adjusted_shape(got_shape, want_shape)
        problem = None
        if got_shape is not None and len(got_shape) != len(want_shape):
            problem = f"rank {len(got_shape)} instead of {len(want_shape)}"
        elif got_shape is not None:
            for axis, (got, want) in enumerate(zip(got_shape[1:], want_shape[1:]), 1):
                if got is not None and want is not None and got != want:
                    problem = f"size {got} on axis {axis} instead of {want}"
                    break
        if problem is None and _kind(spec.dtype) != _kind(tf.as_dtype(expected.dtype)):
            problem = f"dtype {spec.dtype.name} instead of {expected.dtype}"
        if problem:
            raise DataSpecError(
                f"{label} of `{name}` does not fit `{model.name}`: it has "
                f"{problem}. Expected {_describe_inputs(inputs)}; received "
                f"{_describe(x_spec)}. Fix: reshape or cast the data in the "
                "input pipeline (or change the model's Input)."
            )


def keras_adjusted_shape(got, want):
    """`got` as Keras' Functional models feed it to an Input of shape `want`.

    Keras (`Functional._adjust_input_rank`) expands a last axis of 1 the data
    lacks (features of shape `(batch,)` for an `Input((1,))`: a CSV column)
    and squeezes one it has beyond the Input's rank.
    """
    got = list(got)
    if len(got) == len(want) - 1 and want and want[-1] == 1:
        return got + [1]
    if len(got) == len(want) + 1 and got and got[-1] == 1:
        return got[:-1]
    return got


def _by_input_name(x_spec, inputs):
    """A dict's specs in the order of the model's inputs, by their names, or None.

    As Keras' Functional models read a dict: each input takes the key of its
    name, and keys that name no input are left unused (a dataset of feature
    columns that also carries its target column trains in Keras).
    """
    if not isinstance(x_spec, dict):
        return None
    names = [getattr(tensor, "name", None) for tensor in inputs]
    if None in names or not set(names) <= set(x_spec):
        return None
    return [x_spec[name] for name in names]


def _declared_inputs(model):
    return _declared(model, "inputs")


def _declared(model, which):
    """`model.inputs` / `model.outputs` as a list, or None when the model declares none."""
    try:
        tensors = getattr(model, which)
    except (AttributeError, ValueError):
        return None
    return list(tensors) if tensors else None


def _kind(dtype):
    if dtype.is_floating or dtype.is_integer or dtype.is_bool:
        return "numeric"
    return dtype.name


def _describe(spec):
    def one(s):
        if isinstance(s, tf.TensorSpec):
            return f"{s.dtype.name}{s.shape.as_list() if s.shape.rank is not None else '[?]'}"
        return type(s).__name__

    return str(tf.nest.map_structure(one, spec)).replace("'", "")


def _describe_inputs(inputs):
    return ", ".join(f"{t.dtype}{list(t.shape)}" for t in inputs)


def check_array_inputs(x, model, name="x"):
    """Raises `DataSpecError` when arrays as passed cannot feed `model`, naming their shapes.

    Arrays are checked before they are sliced into batches, so the message
    shows the shape the user passed (`x[0]`: one sample without its batch
    axis), not the shape of a batch made from it.
    """
    inputs = _declared_inputs(model)
    if inputs is None:
        return
    if isinstance(x, dict):
        # As Keras reads a dict: by the inputs' names (`tf.nest.flatten` would
        # sort the keys, and pair `body` with an input named `title`).
        flat = _by_input_name(x, inputs)
        if flat is None:
            return   # check_data_spec reports keys that name no input
        labels = [f"Input `{tensor.name}` of `{name}`" for tensor in inputs]
    else:
        flat = tf.nest.flatten(x)
        labels = [f"`{name}`" if len(flat) == 1 else f"Input {i} of `{name}`"
                  for i in range(len(flat))]
    if len(flat) != len(inputs):
        return   # check_data_spec reports a wrong number of inputs
    for array, expected, label in zip(flat, inputs, labels):
        if isinstance(array, tf.RaggedTensor):
            continue   # rows of different lengths: the batch spec check covers them
        want = list(expected.shape)
        got = tuple(keras_adjusted_shape([int(d) for d in np.shape(array)], want))
        if len(got) == len(want) - 1 and all(
                w is None or g == w for g, w in zip(got, want[1:])):
            raise DataSpecError(
                f"{label} has shape {got}: the shape of one sample of `{model.name}` "
                f"{_sample_shape(want)}, without the batch axis. Expected an array of "
                f"shape {_batched(want)}. Fix: for one sample add "
                "the batch axis, `x[None]` (or slice `x[i:i + 1]` instead of `x[i]`).")
        problem = None
        if len(got) != len(want):
            problem = f"rank {len(got)} instead of {len(want)}"
        else:
            for axis, (g, w) in enumerate(zip(got[1:], want[1:]), 1):
                if w is not None and g != w:
                    problem = f"size {g} on axis {axis} instead of {w}"
                    break
        if problem:
            raise DataSpecError(
                f"{label} has shape {got}, which does not fit `{model.name}`: {problem}. "
                f"Expected {_batched(want)}. Fix: reshape the data "
                "(or change the model's Input).")


def check_targets(y, model, loss, name="y", values=None):
    """Raises `DataSpecError` when labels cannot be what `loss` expects of `model`'s output.

    Args:
        y: the targets' `TensorSpec` (from a dataset's element spec).
        model: the model; its one output is compared (several outputs are
            left to Keras' own checks).
        loss: what the model was compiled with (`model.loss`).
        values: the labels as an array, when they are in memory: class ids
            are then checked against the number of classes for sparse losses.

    Only Keras' built-in losses are checked: a custom loss may read labels
    any way it likes.
    """
    if not isinstance(y, tf.TensorSpec):
        return
    if not (y.dtype.is_floating or y.dtype.is_integer or y.dtype.is_bool):
        raise DataSpecError(
            f"The labels `{name}` have dtype {y.dtype.name}. Expected numbers: class ids "
            "(integers) or values (floats). Fix: turn them into integers first, e.g. "
            "`classes, y = np.unique(y, return_inverse=True)`, or "
            "`keras.layers.StringLookup` in the input pipeline.")
    kind = _loss_kind(loss)
    outputs = _declared_outputs(model)
    if kind is None or outputs is None or len(outputs) != 1 or y.shape.rank is None:
        _check_probability_targets(values, name, loss)
        return
    out_shape = list(outputs[0].shape)
    classes = out_shape[-1] if len(out_shape) > 1 else None
    y_shape = y.shape.as_list()
    loss_name = getattr(loss, "name", None) or getattr(loss, "__name__", None) or str(loss)
    if kind == "sparse":
        class_ids = len(y_shape) == len(out_shape) - 1 or (
            len(y_shape) == len(out_shape) and y_shape[-1] == 1)
        if not class_ids:
            hint = (" They look one-hot. Fix: use `categorical_crossentropy`, or pass "
                    "`y.argmax(-1)`." if classes and y_shape[-1] == classes else
                    " Fix: pass one integer class id per sample.")
            raise DataSpecError(
                f"The labels `{name}` have shape {_shape(y_shape)}, but `{loss_name}` expects "
                f"one class id per sample for the output of shape {_shape(out_shape)}, i.e. "
                f"labels of shape {_shape(out_shape[:-1])}.{hint}")
        if values is not None and classes:
            _check_class_ids(values, classes, name, loss_name)
        return
    if not classes or classes == 1:
        _check_probability_targets(values, name, loss)
        return
    if len(y_shape) == len(out_shape) - 1 or (len(y_shape) == len(out_shape)
                                              and y_shape[-1] == 1):
        raise DataSpecError(
            f"The labels `{name}` have shape {_shape(y_shape)}: one value per sample, but "
            f"`{model.name}` outputs {classes} per sample and `{loss_name}` compares them "
            "element by element (it would broadcast the labels silently). If they are class "
            "ids: Fix: use `sparse_categorical_crossentropy`, or one-hot them with "
            f"`keras.utils.to_categorical(y, {classes})`.")
    if len(y_shape) == len(out_shape) and y_shape[-1] is not None and y_shape[-1] != classes:
        raise DataSpecError(
            f"The labels `{name}` have shape {_shape(y_shape)}; `{model.name}` outputs "
            f"{_shape(out_shape)}. Expected labels with {classes} values per sample for "
            f"`{loss_name}`. Fix: change the labels or the model's last layer.")
    _check_probability_targets(values, name, loss)


# Keras' losses whose targets are probabilities: a target outside [0, 1] gives a
# cross-entropy with no minimum (the loss falls without bound).
_PROBABILITY_TARGETS = {"binary_crossentropy", "binary_focal_crossentropy",
                        "categorical_crossentropy", "categorical_focal_crossentropy"}


def expects_probability_targets(loss):
    """True for Keras' cross-entropies whose targets are probabilities in [0, 1]."""
    return _loss_fn_name(loss) in _PROBABILITY_TARGETS


def _check_probability_targets(values, name, loss):
    """After the shape checks (which say more): probability targets outside [0, 1]."""
    if values is None or _loss_fn_name(loss) not in _PROBABILITY_TARGETS or isinstance(
            values, (tf.RaggedTensor, dict, list, tuple)):
        return
    values = np.asarray(values)
    if values.size == 0 or values.dtype.kind not in "fiub":
        return
    low, high = values.min(), values.max()
    if low >= 0 and high <= 1:
        return
    loss_name = getattr(loss, "name", None) or getattr(loss, "__name__", None) or str(loss)
    raise DataSpecError(
        f"The labels `{name}` range from {low:g} to {high:g}, but `{loss_name}` expects "
        "probabilities in [0, 1]: the cross-entropy of a target outside them has no minimum, "
        "so the loss falls without bound (to -10,000 and below) while the model learns "
        "nothing useful. Fix: scale the targets to [0, 1] (masks stored as 0/255: `y / 255`), "
        "or use a loss for values, such as `mse`.")


def _check_class_ids(values, classes, name, loss_name):
    if isinstance(values, tf.RaggedTensor):
        return
    values = np.asarray(values)
    if values.size == 0:
        return
    if values.dtype.kind == "f" and not np.all(np.equal(np.mod(values, 1), 0)):
        raise DataSpecError(
            f"The labels `{name}` hold non-integer values, but `{loss_name}` expects class "
            f"ids 0..{classes - 1}. Fix: pass integer class ids (or use a dense loss).")
    low, high = values.min(), values.max()
    if low < 0 or high >= classes:
        raise DataSpecError(
            f"The labels `{name}` hold class ids from {low:g} to {high:g}, but the model "
            f"outputs {classes} classes (ids 0..{classes - 1}). Expected ids in that range. "
            "Fix: give the last layer as many units as there are classes, or renumber the "
            "labels (`np.unique(y, return_inverse=True)`).")


# Keras' built-in losses by what they expect of the labels. A custom loss is
# not checked: it may read labels any way it likes.
_DENSE_LOSSES = {
    "mean_squared_error", "mean_absolute_error", "mean_absolute_percentage_error",
    "mean_squared_logarithmic_error", "huber", "log_cosh", "binary_crossentropy",
    "binary_focal_crossentropy", "categorical_crossentropy", "categorical_focal_crossentropy",
    "kl_divergence", "poisson", "hinge", "squared_hinge", "categorical_hinge",
}


def _loss_fn_name(loss):
    """The name of a Keras built-in loss's function, or "" (a custom loss)."""
    if isinstance(loss, str):
        try:
            loss = keras.losses.get(loss)
        except ValueError:
            return ""
    fn = getattr(loss, "fn", loss)   # a Keras Loss class wraps its function as `fn`
    if not str(getattr(fn, "__module__", "")).startswith("keras"):
        return ""
    return getattr(fn, "__name__", "")


def _loss_kind(loss):
    """"sparse", "dense" (labels shaped like the output) or None (not a known Keras loss)."""
    fn_name = _loss_fn_name(loss)
    if fn_name.startswith("sparse_"):
        return "sparse"
    return "dense" if fn_name in _DENSE_LOSSES else None


def _declared_outputs(model):
    return _declared(model, "outputs")


def _shape(dims):
    return "(" + ", ".join("None" if d is None else str(d) for d in dims) + \
        ("," if len(dims) == 1 else "") + ")"


def _sample_shape(dims):
    """One sample's shape, from a shape with a batch axis."""
    return _shape(list(dims[1:]))


def _batched(dims):
    """The shape of an array of samples, with its first axis named."""
    return "(" + ", ".join(["num_samples"] + ["None" if d is None else str(d)
                                              for d in dims[1:]]) + ")"


# Keras' probability losses, by the names `compile` accepts, and the
# activation each expects on the model's output when from_logits is False.
_PROBABILITY_LOSSES = {
    "binary_crossentropy": "sigmoid", "bce": "sigmoid", "binary_focal_crossentropy": "sigmoid",
    "categorical_crossentropy": "softmax", "cce": "softmax",
    "sparse_categorical_crossentropy": "softmax", "categorical_focal_crossentropy": "softmax",
}


def check_output_matches_loss(model):
    """Warns when a linear output (logits) feeds a loss that expects probabilities.

    Keras warns about the opposite mistake (a softmax into `from_logits=True`),
    not this one: the loss clips the logits into [1e-7, 1 - 1e-7] and trains
    on almost no gradient, silently. Only a single loss on a single output
    is looked at, given by name, as a Keras loss function or a Keras loss
    object; the output layer must say its activation (`Dense`, `Conv*`).
    """
    from tapeworks.engine.step.precision import output_layers

    loss = getattr(model, "loss", None)
    if isinstance(loss, str):
        name, from_logits = loss, False
    elif isinstance(loss, keras.losses.Loss):
        name = getattr(getattr(loss, "fn", None), "__name__", "")
        from_logits = bool(getattr(loss, "from_logits", False) or getattr(
            loss, "_fn_kwargs", {}).get("from_logits", False))
    elif callable(loss) and getattr(loss, "__module__", "").startswith("keras"):
        name, from_logits = loss.__name__, False
    else:
        return
    expects = _PROBABILITY_LOSSES.get(name)
    layers = output_layers(model)
    if expects is None or from_logits or len(layers) != 1:
        return
    activation = getattr(getattr(layers[0], "activation", None), "__name__", None)
    if activation != "linear":
        return
    logits_loss = {"sigmoid": "BinaryCrossentropy", "softmax": (
        "SparseCategoricalCrossentropy" if name.startswith("sparse") else
        "CategoricalCrossentropy")}[expects]
    warn(f"tapeworks: the output layer `{layers[0].name}` has no activation (its outputs are "
         f"logits), but the loss `{name}` expects probabilities (from_logits=False): Keras "
         "clips the logits into [1e-7, 1 - 1e-7], so most samples give almost no gradient. "
         f"Fix: `loss=keras.losses.{logits_loss}(from_logits=True)` (numerically the better "
         f"choice), or `activation=\"{expects}\"` on `{layers[0].name}`.", CorrectnessWarning)
