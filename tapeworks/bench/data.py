"""The scenarios' training data: batches cut once and kept in memory."""

import tensorflow as tf

from tapeworks.data.pipeline import without_autotuning


def cached_batches(arrays, batch_size):
    """Batches of `arrays`, cached, as a user would build them (tf.data's options untouched)."""
    return tf.data.Dataset.from_tensor_slices(arrays).batch(batch_size).cache()


def in_memory_dataset(arrays, batch_size):
    """Batches of `arrays`, cached, with tf.data's autotuning model off.

    There is nothing in such a pipeline to tune, and the model makes
    compute-bound steps on a small CPU machine flip between two speeds
    (`tapeworks bench autotune`): off, for every approach alike.
    """
    return without_autotuning(cached_batches(arrays, batch_size))
