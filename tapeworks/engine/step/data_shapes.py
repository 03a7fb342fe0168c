"""A compiled step called on host-drawn batches of many shapes is traced once, for the data's.

`CallLoop.first_step` draws a batch on the host and calls the compiled step
on it: every step of a fit of a few steps, the first call of a mode being
measured, and every step when a callback of the user's wants every batch. A
`tf.function` called on a tensor is traced for that tensor's shape, so the
next batch of another shape (a `padded_batch` of longer sequences) traced
the step again (`reduce_retracing` relaxes the shape on that second trace),
and a loop built later, whose step gets the iterator's batches (shaped as
the dataset's `element_spec`, `None` where batches differ), traced it once
more. Keras' fit never calls its step on a concrete batch: its function
takes the iterator. Data whose `element_spec` leaves a dimension other than
the batch's unknown (padded or ragged sequences, images of several sizes)
has the step traced once for that `element_spec`, and every batch of it
calls that trace, as does a loop's graph built later. On the CTC speech
corpus script (two `padded_batch` batches of different lengths) the step
was traced twice before, 2.8 s and 3.3 s, each trace's first call 4.9 s and
4.7 s; after, one trace of 3.1 s and a first call of 4.7 s (timeline, one
process each, AMD EPYC: a diagnosis; the bench figures are in
benchmarks/examples.md, fourteenth and fifteenth runs: 1.11x Keras' fit
before, 1.80x after).

Data whose batches differ at most in their size keeps the first batch's
shapes: a graph of known shapes ran the SimCLR corpus script's steps faster
(three alternated fresh processes, AMD EPYC: fit 8.05 s, 8.77 s, 7.36 s
traced for the batch against 9.59 s, 9.90 s, 7.65 s for the data's shapes,
whose only unknown dimension is the batch's), and most such data has one
batch size throughout; a smaller last batch traces the step once more, as
before.

A step whose code needs the batch's own shapes (a Python `int` read from a
dimension the data leaves unknown) fails that trace; it is then traced for
each batch's shapes as before, so nothing that ran before stops running.
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


def varies(spec):
    """Whether data of `element_spec` `spec` leaves a dimension other than the batch's unknown."""
    for leaf in tf.nest.flatten(spec):
        shape = getattr(leaf, "shape", None)
        if shape is None or shape.rank is None or None in shape.as_list()[1:]:
            return True
    return False


def fits(spec, batch):
    """Whether `batch` is an element of data whose `element_spec` is `spec`."""
    try:
        tf.nest.assert_same_structure(spec, batch)
    except (TypeError, ValueError):
        return False
    return all(isinstance(s, tf.TypeSpec) and s.is_compatible_with(b)
               for s, b in zip(tf.nest.flatten(spec), tf.nest.flatten(batch)))


class DataShapedCalls:
    """A compiled step; called eagerly in `drawn_from(spec)`, traced for `spec` if it `varies`.

    Other attributes are the function's own (`get_concrete_function`, ...).
    """

    def __init__(self, function):
        self._function = function
        # Every spec met, decided once (so a step a call pays one lookup):
        # traced for, failed to trace for, or left to each batch's shapes.
        self._specs_seen = []

    def __call__(self, batch):
        spec = getattr(_drawn, "spec", None)
        if spec is not None and tf.executing_eagerly() and not self._seen(spec):
            self._specs_seen.append(spec)
            if varies(spec) and fits(spec, batch):
                try:
                    self._function.get_concrete_function(spec)
                except Exception:   # noqa: BLE001 (traced for the batch's own shapes: see above)
                    pass
        return self._function(batch)

    def _seen(self, spec):
        return any(seen is spec or seen == spec for seen in self._specs_seen)

    def __getattr__(self, name):
        return getattr(self._function, name)
