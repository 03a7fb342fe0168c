"""The step's reductions of its gradients: one value per gradient, read once.

The non-finite verdict (`checks/nonfinite.py`), the dead-gradient count
(`checks/gradient_health.py`) and the monitor (`checks/monitor.py`) all read
the gradients of an update; the step computes these reductions once and hands
them to each, so a check costs no extra pass over the gradients. They live in
the step's room because the step computes them; what they mean to a user is
the checks' business.
"""

import tensorflow as tf


def gradient_norms(gradients, xla=False):
    """One float32 Euclidean norm per gradient (None stays None).

    A NaN or Inf anywhere makes its norm non-finite; an identically zero
    gradient has norm 0. Squares of values below about 1e-19 underflow, so
    a gradient that small everywhere also reads 0: it has vanished either way.
    Sparse gradients (embeddings) are reduced over their values, not densified.
    `xla`: the step is compiled by XLA, which has no kernel for TensorFlow's
    one-pass `EuclideanNorm` but fuses square-and-sum into one pass itself.
    """
    norms = []
    for g in gradients:
        if g is None:
            norms.append(None)
            continue
        values = tf.cast(g.values if isinstance(g, tf.IndexedSlices) else g, tf.float32)
        if xla:
            norms.append(tf.sqrt(tf.reduce_sum(tf.square(values))))
        else:
            norms.append(tf.math.reduce_euclidean_norm(values))
    return norms


# Interleaved partial sums an XLA sentinel keeps (`gradient_sentinels`).
SENTINEL_LANES = 16


def gradient_sentinels(gradients, xla=False):
    """One float32 value per gradient for the non-finite check and the dead-gradient count.

    Non-finite exactly when the gradient holds a NaN or an Inf, and 0 when
    the gradient is identically zero (None stays None). In TensorFlow steps
    it is the norm (`gradient_norms`). In an XLA step it is the sum of the
    magnitudes of `SENTINEL_LANES` interleaved partial sums (element i goes
    to sum i mod 16): one read of the gradient, straight into a reduction;
    below `SENTINEL_MIN_ELEMENTS` elements, the sum of the magnitudes.

    Why not the norm or the largest magnitude there (see docs/ARCHITECTURE.md,
    "The checks inside an XLA step"): XLA on a CPU fuses no elementwise op
    into a reduction, so `square`, or `abs` with a NaN select, is written out
    whole (the large bench MLP's 21 MB) before the reduction reads it back:
    three passes over the gradients where a plain sum takes one (one-off,
    21 MB: 1.5 ms against 2.6-3.7 ms for the largest magnitude); and XLA's
    max on a CPU drops NaN (a NaN as the last of 4M values gave max -inf).
    NaN and Inf go through sums. A partial sum beyond float32's range
    (elements of about 1e31 and more: a gradient blown up either way) also
    reads non-finite. Zero: every element of a small gradient is; of a large
    one, all 16 partial sums are exactly 0.0, on every step of a
    dead-gradient window (`DeadGradients`), which a gradient that is not zero
    does not do: interleaving breaks the cancellations one sum could meet
    (values that alternate in sign, rows centred on zero), and a small
    gradient, where exact cancellation is likely (the two biases of a
    two-class softmax), sums magnitudes instead.
    """
    if not xla:
        return gradient_norms(gradients)
    sentinels = []
    for g in gradients:
        if g is None:
            sentinels.append(None)
            continue
        values = tf.cast(g.values if isinstance(g, tf.IndexedSlices) else g, tf.float32)
        count = values.shape.num_elements()
        lanes = _sentinel_lanes(count)
        if lanes is None:
            # Small (or of no size with a divisor up to 16): the magnitudes'
            # sum, zero exactly when every element is; writing |g| out costs
            # nothing at this size.
            sentinels.append(tf.reduce_sum(tf.abs(values)))
            continue
        # A reshape is free (a bitcast); the reduction over axis 0 reads
        # the gradient once (XLA: a reduce-window, then a narrow reduce).
        partial = tf.reduce_sum(tf.reshape(values, [-1, lanes]), axis=0)
        sentinels.append(tf.reduce_sum(tf.abs(partial)))
    return sentinels


# Below this many elements an XLA sentinel sums magnitudes instead.
SENTINEL_MIN_ELEMENTS = 65536


def _sentinel_lanes(count):
    """The number of interleaved partial sums for a gradient of `count` elements, or None.

    None (sum the magnitudes) for a small gradient, one of unknown size
    (sparse values) or one no number from 16 down to 2 divides.
    """
    if count is None or count < SENTINEL_MIN_ELEMENTS:
        return None
    return next((lanes for lanes in range(SENTINEL_LANES, 1, -1) if count % lanes == 0), None)
