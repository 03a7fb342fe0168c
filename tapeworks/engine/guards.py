"""Checks that turn the classic silent or cryptic training failures into clear errors.

Each check runs where it is cheapest: the Keras-loop guard and the gradient and
loss checks run while the step is traced (Python, once), so a compiled step pays
nothing for them; the data check runs once before the first step. All of them
raise before any variable is assigned, so the model is left as it was.
"""

import functools
import threading

import keras
import tensorflow as tf

from tapeworks.errors import (
    DataSpecError,
    KerasLoopInStepError,
    LossError,
    MissingGradientError,
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
    x_flat = tf.nest.flatten(x_spec)
    if len(x_flat) != len(inputs):
        raise DataSpecError(
            f"`{name}` gives the model {len(x_flat)} input tensor(s) "
            f"({_describe(x_spec)}). Expected {len(inputs)}, the inputs of "
            f"`{model.name}`: {_describe_inputs(inputs)}. Fix: yield x with "
            "one tensor per model input, in the order of `model.inputs`."
        )
    for i, (spec, expected) in enumerate(zip(x_flat, inputs)):
        if not isinstance(spec, tf.TensorSpec):
            continue
        want_shape = list(expected.shape)
        got_shape = spec.shape.as_list() if spec.shape.rank is not None else None
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
                f"Input {i} of `{name}` does not fit `{model.name}`: it has "
                f"{problem}. Expected {_describe_inputs(inputs)}; received "
                f"{_describe(x_spec)}. Fix: reshape or cast the data in the "
                "input pipeline (or change the model's Input)."
            )


def _declared_inputs(model):
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        return None
    return list(inputs) if inputs else None


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
