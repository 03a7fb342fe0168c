"""The gradient reductions the step shares with its checks (`engine/step/sentinels.py`)."""

import math

import pytest
import tensorflow as tf

from tapeworks.engine.step.sentinels import (SENTINEL_LANES, SENTINEL_MIN_ELEMENTS,
                                             gradient_sentinels)


@pytest.mark.parametrize("xla", [False, True], ids=["tensorflow", "xla"])
def test_gradient_sentinels_are_non_finite_and_zero_exactly_when_the_gradient_is(xla):
    nan, inf = float("nan"), float("inf")
    lanes, large = SENTINEL_LANES, SENTINEL_MIN_ELEMENTS // SENTINEL_LANES
    gradients = [tf.constant([1.0, -4.0, 2.0]), tf.constant([[1.0, nan], [0.0, 0.0]]),
                 tf.constant([-inf, 1.0]), tf.zeros([2, 3]),
                 tf.constant([1e-20, -1e-20]),   # its squares underflow: read as zero
                 tf.IndexedSlices(tf.constant([[0.0, inf]]), tf.constant([1])),
                 # Values whose total cancels exactly: signs alternating, and
                 # rows of 16 centred on zero; the last element a NaN, then -Inf.
                 # (large enough for the partial sums in XLA).
                 tf.constant([1.0, -1.0] * (lanes * large // 2)),
                 tf.reshape(tf.constant([float(i - 7.5) for i in range(16)] * large), [large, 16]),
                 tf.concat([tf.ones([lanes * large - 1]), [nan]], 0),
                 tf.concat([tf.zeros([lanes * large - 1]), [-inf]], 0),
                 None]
    sentinels = tf.function(lambda: gradient_sentinels(gradients[:-1], xla=xla),
                            jit_compile=xla, autograph=False)() + [None]
    values = [None if s is None else float(s) for s in sentinels]
    # The norm in TensorFlow steps; in XLA a small gradient's magnitudes summed.
    assert values[0] == pytest.approx(math.sqrt(21.0) if not xla else 7.0)
    assert not math.isfinite(values[1]) and not math.isfinite(values[2])
    assert values[3] == 0.0
    # Squares underflow to zero in the norm; magnitudes do not (2e-20).
    assert values[4] == (0.0 if not xla else pytest.approx(2e-20))
    assert not math.isfinite(values[5])
    # Not zero although each total is: the interleaved sums do not cancel
    # (in XLA: 8 lanes of +large, 8 of -large).
    count = lanes * large
    assert values[6] == pytest.approx(math.sqrt(count) if not xla else count)
    assert values[7] > 0.0
    assert not math.isfinite(values[8]) and not math.isfinite(values[9])
    assert values[10] is None
