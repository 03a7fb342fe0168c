"""The user's own `tf.function`s that trace again during `fit`, named with the argument that changed.

TensorFlow warns after five retraces in a row ("5 out of the last 5 calls to
<function f> triggered tf.function retracing") and names the function, but
not the argument, nor what about it changed. The classic case: a callback
that updates an exponential moving average every batch through a
`tf.function` taking a Python float, a new graph for every new value.

While `fit` runs, `RetraceWatch` wraps `tf.function`'s call (the class's
`__call__`, restored on exit) and, for each call that traced, describes its
arguments (a tensor's shape and dtype, a Python number's value, an object's
type) and compares them with the function's previous trace. A changed Python
value is reported at once (it retraces for every new value); changed shapes
or dtypes from the third trace of a function (a last, smaller batch gives
one harmless extra trace). Each function is reported once per fit, with the
count of its traces. tapeworks' own functions are not watched (they count
their traces in `Trainer.traces`), nor TensorFlow's and Keras' internals.
"""

import dataclasses
import inspect
import numbers
import weakref

import numpy as np
import tensorflow as tf

from tapeworks.errors import PerformanceWarning, warn

try:  # TensorFlow's tf.function class (the watch wraps its __call__); its path has
    # moved between releases.
    from tensorflow.python.eager.polymorphic_function.polymorphic_function import (
        Function as TfFunction)
except ImportError:  # pragma: no cover - an older or newer layout: no watching
    TfFunction = None

_INTERNAL = ("tensorflow.", "keras.", "tapeworks.", "tf_keras.")


@dataclasses.dataclass
class Retrace:
    """One function reported: its name, traces seen in this fit, and the changes."""

    function: str
    where: str
    traces: int
    changes: list


def describe(value):
    """What about an argument decides tracing: ("tensor", shape, dtype), ("python", value), ..."""
    if isinstance(value, tf.Variable):
        return ("variable", tuple(value.shape.as_list()), value.dtype.name)
    if isinstance(value, (tf.Tensor, np.ndarray)):
        return ("tensor", tuple(tf.TensorShape(value.shape).as_list()),
                tf.as_dtype(value.dtype).name)
    if isinstance(value, (bool, numbers.Number, str)) or value is None:
        return ("python", value)
    if isinstance(value, (list, tuple)):
        return ("sequence", tuple(describe(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, describe(v)) for k, v in value.items())))
    return ("object", type(value).__name__)


def _say(described):
    kind = described[0]
    if kind == "python":
        return f"the Python value {described[1]!r}"
    if kind in ("tensor", "variable"):
        shape = "(" + ", ".join("None" if d is None else str(d) for d in described[1]) + ")"
        return f"a {kind} of shape {shape} and dtype {described[2]}"
    if kind == "object":
        return f"a {described[1]} object"
    return f"a {kind}"


def changes(before, after):
    """["argument `x`: <before> -> <after>", ...] for the arguments that differ."""
    found = []
    for name in after:
        old, new = before.get(name), after[name]
        if old is not None and old != new:
            found.append((name, old, new))
    return found


def _is_python_change(change):
    _, old, new = change
    return old[0] == "python" or new[0] == "python"


class RetraceWatch:
    """A context manager: reports the user's tf.functions that retrace while it is open."""

    def __init__(self):
        self.reported = []
        self._seen = weakref.WeakKeyDictionary()   # Function -> {"traces", "last", "reported"}
        self._original = None

    def __enter__(self):
        if TfFunction is None:
            return self
        self._original = original = TfFunction.__call__
        watch = self

        def call(function, *args, **kwargs):
            before = function.experimental_get_tracing_count()
            result = original(function, *args, **kwargs)
            if function.experimental_get_tracing_count() != before:
                watch._traced(function, args, kwargs)
            return result

        TfFunction.__call__ = call
        return self

    def __exit__(self, *exc):
        if self._original is not None:
            TfFunction.__call__ = self._original
            self._original = None
        return False

    def _traced(self, function, args, kwargs):
        python_function = getattr(function, "python_function", None)
        module = getattr(python_function, "__module__", "") or ""
        if python_function is None or module.startswith(_INTERNAL) or not inspect.isroutine(
                python_function):
            return
        arguments = _arguments(python_function, args, kwargs)
        entry = self._seen.get(function)
        if entry is None:
            self._seen[function] = {"traces": 1, "last": arguments, "reported": False}
            return
        entry["traces"] += 1
        found = changes(entry["last"], arguments)
        entry["last"] = arguments
        if entry["reported"] or not found:
            return
        if any(_is_python_change(c) for c in found) or entry["traces"] >= 3:
            entry["reported"] = True
            self._report(function, python_function, entry["traces"], found)

    def _report(self, function, python_function, traces, found):
        name = getattr(python_function, "__qualname__", function.name)
        # A decorated method's python_function wraps the method: its own code
        # is TensorFlow's wrapper, the method's is behind `__wrapped__`.
        code = getattr(inspect.unwrap(python_function), "__code__", None)
        where = f"{code.co_filename}:{code.co_firstlineno}" if code else "?"
        said = "; ".join(f"argument `{arg}` changed from {_say(old)} to {_say(new)}"
                         for arg, old, new in found)
        python = any(_is_python_change(c) for c in found)
        fix = ("pass a tensor (`tf.constant(value)`) or a `tf.Variable` you `.assign()` to: "
               "every new Python value is a new graph" if python else
               "give the function an `input_signature=` with `None` in the dimensions that "
               "vary, or `reduce_retracing=True`")
        self.reported.append(Retrace(name, where, traces, found))
        warn(f"tapeworks: the tf.function `{name}` ({where}) traced again during fit "
             f"({traces} traces so far): {said}. Fix: {fix}.", PerformanceWarning,
             section="retracing")


def _arguments(python_function, args, kwargs):
    try:
        bound = inspect.signature(python_function).bind(*args, **kwargs)
        items = bound.arguments.items()
    except (TypeError, ValueError):
        items = [(f"#{i}", v) for i, v in enumerate(args)] + list(kwargs.items())
    return {name: describe(value) for name, value in items}
