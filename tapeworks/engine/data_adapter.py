"""Turn what users pass to `fit`/`evaluate`/`predict` into a `tf.data.Dataset`.

Everything downstream (the compiled step, the auto-tuner, the guards) sees one
kind of input: a batched `tf.data.Dataset`. Accepted here:

* a `tf.data.Dataset` (used as is: it is already batched by the user);
* NumPy arrays or tensors: `x`, `(x, y)` or `(x, y, sample_weight)` with
  `batch_size=`;
* a Python generator (or a callable returning a fresh generator, which can be
  re-iterated every epoch) yielding batches.
"""

import inspect
import itertools

import numpy as np
import tensorflow as tf

from tapeworks.errors import ConfigError
from tapeworks.data.pipeline import without_autotuning

DEFAULT_BATCH_SIZE = 32


def as_dataset(data, *, batch_size=None, shuffle=False, seed=None, name="data"):
    """Returns a batched `tf.data.Dataset` for `data`.

    Args:
        data: a Dataset, arrays (or a tuple of them), a generator, or a
            callable returning a generator.
        batch_size: batch size for arrays. Must be None for the other kinds,
            which arrive batched.
        shuffle: reshuffle arrays every epoch (datasets and generators keep
            their own order).
        seed: seed of that shuffle, so that runs repeat exactly.
        name: how error messages call this argument (`data`, `validation_data`).
    """
    if isinstance(data, tf.data.Dataset):
        _reject_batch_size(batch_size, name, "a tf.data.Dataset")
        return data
    if inspect.isgenerator(data) or _is_generator_function(data):
        _reject_batch_size(batch_size, name, "a generator")
        return _from_generator(data, name)
    if _is_array_like(data) or (
        isinstance(data, (tuple, list, dict)) and data and all(
            _is_array_like(v) for v in tf.nest.flatten(data))
    ):
        return _from_arrays(data, batch_size, shuffle, seed, name)
    raise ConfigError(
        f"`{name}` has a type tapeworks cannot read: {type(data).__name__}. "
        "Expected a tf.data.Dataset of (x, y) or (x, y, sample_weight), a "
        "tuple of NumPy arrays with `batch_size=`, or a Python generator "
        "yielding such batches."
    )


def batch_size_of(x):
    """The (dynamic) number of samples in a batch whose inputs are `x`."""
    first = next(t for t in tf.nest.flatten(x) if t is not None)
    return tf.shape(first, out_type=tf.int64)[0]


def _reject_batch_size(batch_size, name, kind):
    if batch_size is not None:
        raise ConfigError(
            f"`batch_size` was given ({batch_size}) but `{name}` is {kind}, "
            "which is batched already. Batch it there, or pass NumPy arrays "
            "with `batch_size=`."
        )


def _is_array_like(value):
    return isinstance(value, (np.ndarray, tf.Tensor)) or (
        hasattr(value, "__array__") and not isinstance(value, (str, bytes))
    )


def _is_generator_function(value):
    return callable(value) and inspect.isgeneratorfunction(value)


def _from_arrays(data, batch_size, shuffle, seed, name):
    if batch_size is None:
        batch_size = DEFAULT_BATCH_SIZE
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(
            f"`batch_size` must be an integer >= 1. Received: "
            f"batch_size={batch_size!r}"
        )
    if isinstance(data, list):
        data = tuple(data)
    lengths = {int(np.shape(v)[0]) for v in tf.nest.flatten(data)}
    if len(lengths) != 1:
        raise ConfigError(
            f"The arrays in `{name}` have different numbers of samples: "
            f"{sorted(lengths)}. Expected x, y (and sample_weight) with the "
            "same first dimension; check that they were sliced alike."
        )
    (num_samples,) = lengths
    dataset = tf.data.Dataset.from_tensor_slices(data)
    if shuffle:
        # Reshuffled every epoch; a fixed seed makes the sequence repeat
        # from run to run.
        dataset = dataset.shuffle(
            num_samples, seed=seed, reshuffle_each_iteration=True
        )
    # In memory: nothing for tf.data's autotuning model to tune, and it
    # slows compute-bound steps on small CPU machines (see the function).
    return without_autotuning(dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE))


def _from_generator(data, name):
    """Wraps a generator; the first batch is read to learn the signature."""
    if _is_generator_function(data):
        make = data
        probe = make()
    else:
        # A generator object can be read once only: later epochs of a
        # dataset built on it see it exhausted (the Trainer reports that).
        probe = data
        consumed = [False]

        def make():
            if consumed[0]:
                return iter(())
            consumed[0] = True
            return itertools.chain([first], probe)

    try:
        first = next(probe)
    except StopIteration:
        raise ConfigError(
            f"`{name}` is a generator that yielded nothing. Expected it to "
            "yield batches: x, (x, y) or (x, y, sample_weight)."
        ) from None
    first = _list_as_tuple(first)
    signature = tf.nest.map_structure(_spec_with_open_batch, first)

    if _is_generator_function(data):
        started = [False]

        def generate():
            if not started[0]:
                started[0] = True
                yield from itertools.chain([first], probe)
            else:
                yield from make()
    else:
        def generate():
            yield from make()

    def batches():
        # Keras accepts [x, y] as well as (x, y); tf.data matches structures
        # exactly, so every batch, not only the first, becomes a tuple.
        return (_list_as_tuple(batch) for batch in generate())

    return tf.data.Dataset.from_generator(batches, output_signature=signature)


def _list_as_tuple(batch):
    return tuple(batch) if isinstance(batch, list) else batch


def _spec_with_open_batch(value):
    value = tf.convert_to_tensor(value)
    shape = [None] + value.shape.as_list()[1:] if value.shape.rank else []
    return tf.TensorSpec(shape, value.dtype)
