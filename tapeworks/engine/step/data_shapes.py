"""A compiled step called on a batch drawn on the host is traced for its data's shapes.

`CallLoop.first_step` draws a batch on the host and calls the compiled step
on it: every step of a fit of a few steps, the first call of a mode being
measured, and every step when a callback of the user's wants every batch. A
`tf.function` called on a tensor is traced for that tensor's shape, so the
next batch of another shape (a `padded_batch` of longer sequences, an
epoch's last, smaller batch) traced the step again, and a loop built later,
whose step gets the iterator's batches (shaped as the dataset's
`element_spec`, `None` where batches differ), traced it once more. Keras'
fit never calls its step on a concrete batch: its function takes the
iterator. Here the step is traced once for the data's `element_spec`, and
every batch of that data calls that trace, as does a loop's graph built
later. On the CTC speech corpus script (two `padded_batch` batches of
different lengths, two steps) the step was traced twice before, 2.8 s and
3.3 s, each trace's first call 4.9 s and 4.7 s (timeline, one process,
AMD EPYC: a diagnosis, not a bench figure).

A step whose code needs the batch's own shapes (a Python `int` read from
`x.shape[0]`, which is None in the data's shape) fails that trace; it is
then traced for each batch's shapes as before, so nothing Keras' few-step
calls ran stops running.
"""

import contextlib
import threading

import tensorflow as tf

_drawn = threading.local()


@contextlib.contextmanager
def drawn_from(element_spec):
    """Inside: the batches this thread gives compiled steps come from data of `element_spec`."""
    before = getattr(_drawn, "spec", None)
    _drawn.spec = element_spec
    try:
        yield
    finally:
        _drawn.spec = before


def fits(spec, batch):
    """Whether `batch` is an element of data whose `element_spec` is `spec`."""
    try:
        tf.nest.assert_same_structure(spec, batch)
    except (TypeError, ValueError):
        return False
    return all(isinstance(s, tf.TypeSpec) and s.is_compatible_with(b)
               for s, b in zip(tf.nest.flatten(spec), tf.nest.flatten(batch)))


class DataShapedCalls:
    """A compiled step; called eagerly inside `drawn_from(spec)`, traced for `spec` first.

    Other attributes are the function's own (`get_concrete_function`, ...).
    """

    def __init__(self, function):
        self._function = function
        self._specs_tried = []   # traced for, or failed to trace for (compared with ==)

    def __call__(self, batch):
        spec = getattr(_drawn, "spec", None)
        if (spec is not None and tf.executing_eagerly() and not self._tried(spec)
                and fits(spec, batch)):
            self._specs_tried.append(spec)
            try:
                self._function.get_concrete_function(spec)
            except Exception:   # noqa: BLE001 (traced for the batch's own shapes: see above)
                pass
        return self._function(batch)

    def _tried(self, spec):
        return any(tried is spec or tried == spec for tried in self._specs_tried)

    def __getattr__(self, name):
        return getattr(self._function, name)
