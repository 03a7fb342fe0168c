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


def memory_bandwidth_gbs(megabytes=64, passes=8, repeats=5):
    """GB/s of a streaming elementwise pass: read two float32 arrays, write one.

    An optimizer update over a large model is such a pass (Adam reads the
    weights, the gradient and two moments, and writes three of them), so
    this is what bounds it. Each pass is its own XLA call, so XLA cannot
    fuse the passes into one; the arrays are far larger than the caches.
    """
    n = megabytes * 2 ** 20 // 4
    x = tf.random.stateless_uniform((n,), seed=(3, 4))
    y = tf.random.stateless_uniform((n,), seed=(5, 6))

    @tf.function(jit_compile=True)
    def one_pass(x, y):
        return x * 1.0001 + y

    @tf.function(autograph=False)
    def all_passes(x):
        return tf.while_loop(lambda i, x: i < passes, lambda i, x: (i + 1, one_pass(x, y)),
                             (tf.constant(0), x))[1][0]

    seconds = median_seconds(lambda: all_passes(x).numpy(), repeats)
    return passes * 3 * n * 4 / seconds / 1e9
