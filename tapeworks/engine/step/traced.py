"""`Traced`: a step or loop wrapped for `tf.function`, its traces counted per Trainer."""

import tensorflow as tf


class Traced:
    """A step or loop for `tf.function`: counts its traces, keyed by this object, not its code.

    TensorFlow warns about retracing ("5 out of the last 5 calls to
    <function ...> triggered tf.function retracing") by counting traces per
    Python code object. Every Trainer builds its functions from the same
    code, so a process that builds a few Trainers (a k-fold loop) would get
    that warning while nothing retraces. `tf.function` keys a callable
    object without `__code__` by the object itself: one count per Trainer.
    """

    def __init__(self, fn, on_trace=None):
        self._fn = fn
        self._on_trace = on_trace

    def __call__(self, *args):
        if self._on_trace is not None and not tf.executing_eagerly():
            self._on_trace()
        return self._fn(*args)
