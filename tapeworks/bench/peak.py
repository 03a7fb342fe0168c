"""The machine's matmul peak, measured in the same run as the scenario it scales."""

import tensorflow as tf

from tapeworks.bench.timing import median_seconds


def matmul_peak_gflops(size=2048, dtype=tf.float32, chain=8, repeats=5):
    """GFLOP/s of a chain of square matmuls in one compiled call.

    The chain keeps the call long enough that dispatch overhead does not
    count; its median is what "peak" means in the benchmark reports.
    """
    a = tf.random.stateless_normal((size, size), seed=(1, 2), dtype=tf.float32)
    a = tf.cast(a / size ** 0.5, dtype)

    @tf.function
    def chained(m):
        for _ in range(chain):
            m = tf.matmul(m, a)
        return m

    seconds = median_seconds(lambda: chained(a).numpy(), repeats)
    return chain * 2 * size ** 3 / seconds / 1e9
