"""`pipeline()`: a tf.data input pipeline in the order that keeps the step fed.

Without a cache:  shuffle -> map -> augment -> batch -> batch_augment -> prefetch
With a cache:     map -> cache -> shuffle -> augment -> batch -> batch_augment -> prefetch

The deterministic `map` runs before the cache so its work is done once; the
shuffle comes after the cache, because a cache placed after a shuffle replays
the first epoch's order in every epoch; random augmentation comes after the
cache, because a cache after it would replay the first epoch's "random"
images. With `training=False` the same call gives the evaluation pipeline: no
shuffle, no augmentation.

Parallelism is tf.data's AUTOTUNE throughout, and the `Trainer` chooses how
it runs by measurement (`PARALLELISM`, `parallelism_choices`): tf.data's
autotuning model sizes its thread pools as if the pipeline had the machine to
itself, which costs throughput where the training step shares the same CPU
cores (`tapeworks bench input`, benchmarks/input.md).
"""

from __future__ import annotations

import inspect
import weakref
from typing import TYPE_CHECKING, Any

import tensorflow as tf

if TYPE_CHECKING:
    from collections.abc import Callable

from tapeworks.errors import ConfigError

AUTOTUNE = tf.data.AUTOTUNE
DEFAULT_SHUFFLE_BUFFER = 10_000

# How a built pipeline may run, as `tf.data.Options` set on it: the pipeline as
# built first (tf.data's autotuning model on). All run the same stages on the
# same shuffle state (`with_options` copies share it), so each yields the same
# elements in the same order; only the speed differs. Which is fastest depends
# on the machine and on what else runs on its cores: the Trainer measures
# them on epochs that train anyway (`tapeworks.engine.inputs.input_planner`).
PARALLELISM: tuple[tuple[str, dict[str, bool | int]], ...] = (
    ("tf.data autotune", {}),
    # The model off: AUTOTUNE stages run at tf.data's fixed default
    # parallelism, with no modelling thread timing every element.
    ("fixed parallelism", {"autotune.enabled": False}),
    # ... and each op single-threaded, leaving the intra-op pool to the step.
    ("fixed parallelism, single-threaded ops",
     {"autotune.enabled": False, "threading.max_intra_op_parallelism": 1}),
    # The sequential pipeline, overlapped with the step: one thread for all of it.
    ("sequential (one thread)",
     {"autotune.enabled": False, "threading.private_threadpool_size": 1}),
)

# The datasets `pipeline()` returned (weakly held): the ones whose options
# tapeworks may set, since it made them and knows they set none of their own.
_BUILT: weakref.WeakSet[tf.data.Dataset] = weakref.WeakSet()


def pipeline(source: Any, *, batch_size: int, training: bool,
             map: Callable[..., Any] | None = None, augment: Callable[..., Any] | None = None,
             batch_augment: Callable[..., Any] | None = None, shuffle: bool = True,
             shuffle_buffer: int | None = None, cache: str | None = None,
             drop_remainder: bool | None = None, deterministic: bool | None = None,
             seed: int | None = None) -> tf.data.Dataset:
    """Builds the input pipeline for `source`.

    Args:
        source: a `tf.data.Dataset` of single examples, or arrays / a tuple or
            dict of arrays (sliced along their first axis).
        batch_size: examples per batch.
        training: True for the training pipeline (shuffled, augmented), False
            for evaluation (neither).
        map: a deterministic function applied to every example (decoding,
            resizing, normalising); cached when `cache` is set.
        augment: a random per-example function, applied when training only. If
            it has a `seed` parameter it receives a per-example stateless seed
            (shape [2]) drawn from `seed`, which makes augmentation repeat
            exactly for a given `seed` (use `tf.image.stateless_random_*`).
        batch_augment: a random function applied to whole batches when
            training: cheaper than per-example augmentation, but every example
            of a batch gets the same random draw (less varied).
        shuffle: shuffle examples when training.
        shuffle_buffer: shuffle buffer size; default: the number of examples
            when tf.data knows it (a full shuffle), else 10,000.
        cache: None, "memory", or a file path prefix for an on-disk cache.
        drop_remainder: drop a last, smaller batch; default: `training` (static
            batch shapes in training, every example in evaluation).
        deterministic: passed to the parallel maps (False lets tf.data return
            elements out of order for speed); default: tf.data's (ordered).
        seed: seed of the shuffle and of the augmentation seeds.

    Returns:
        A batched, prefetched `tf.data.Dataset`.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"`batch_size` must be an integer >= 1. Received: batch_size={batch_size!r}")
    if cache not in (None, "memory") and not isinstance(cache, str):
        raise ConfigError(f"`cache` must be None, \"memory\" or a file path. Received: {cache!r}")
    dataset = source if isinstance(source, tf.data.Dataset) else _from_arrays(source)
    if drop_remainder is None:
        drop_remainder = training
    parallel = dict(num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    # Shuffled examples get their augmentation seeds from their index and
    # their position in the pass (see `_augment`): they are numbered first.
    numbered = bool(training and shuffle and augment is not None and _takes_seed(augment))
    if numbered:
        dataset = tf.data.Dataset.zip((dataset, tf.data.Dataset.range(2 ** 62)))
        if map is not None:
            map = _on_element(map)

    def do_shuffle(ds):
        if not (training and shuffle):
            return ds
        buffer = shuffle_buffer or _default_buffer(ds)
        return ds.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)

    if cache is not None:
        if map is not None:
            dataset = dataset.map(map, **parallel)
        dataset = dataset.cache("" if cache == "memory" else cache)
        dataset = do_shuffle(dataset)
    else:
        dataset = do_shuffle(dataset)
        if map is not None:
            dataset = dataset.map(map, **parallel)
    if training and augment is not None:
        dataset = _augment(dataset, augment, seed, parallel, numbered)
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder,
                            num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    if training and batch_augment is not None:
        dataset = dataset.map(batch_augment, **parallel)
    dataset = dataset.prefetch(AUTOTUNE)
    _BUILT.add(dataset)
    return dataset


def is_built(dataset):
    """Whether `pipeline()` returned `dataset` (not a dataset derived from it later).

    Only those get their options chosen: a user's own stages after it (a
    `.take()`, a `.map()`) may rely on options of their own.
    """
    return isinstance(dataset, tf.data.Dataset) and dataset in _BUILT


def parallelism_choices(dataset):
    """[(name, dataset with those options)] for each way in `PARALLELISM`; the first is `dataset`."""
    return [(name, _with_settings(dataset, settings) if settings else dataset)
            for name, settings in PARALLELISM]


def _with_settings(dataset, settings):
    options = tf.data.Options()
    for path, value in settings.items():
        group, name = path.split(".")
        setattr(getattr(options, group), name, value)
    return dataset.with_options(options)


def _from_arrays(source):
    if isinstance(source, list):
        source = tuple(source)
    try:
        return tf.data.Dataset.from_tensor_slices(source)
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"`source` could not be sliced into examples ({error}). Expected a "
            "tf.data.Dataset, or arrays (a tuple or dict of them) with the examples "
            "along their first axis.") from None


def _default_buffer(dataset):
    count = int(dataset.cardinality())
    return count if count > 0 else DEFAULT_SHUFFLE_BUFFER


def _takes_seed(fn):
    try:
        return "seed" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _on_element(fn):
    """`fn` applied to the example of a numbered (example, index) pair."""
    def call(element, index):
        args = element if isinstance(element, tuple) else (element,)
        return fn(*args), index
    return call


def _augment(dataset, augment, seed, parallel, numbered):
    if not _takes_seed(augment):
        return dataset.map(augment, **parallel)
    first = tf.constant(seed if seed is not None else 0, tf.int64)

    def call(element, pair):
        args = element if isinstance(element, tuple) else (element,)
        return augment(*args, seed=pair)

    if numbered:
        # One stateless seed per example from its index and its position in
        # this pass: the shuffle puts each example elsewhere every pass, so
        # each epoch draws other seeds, and the same `seed` repeats them, in
        # any number of threads. Nothing random sits under a zip: tf.data
        # restores a shuffle's reshuffling state with an iterator checkpoint
        # only outside one (a zip re-made the shuffle's iterator after the
        # restore, measured), so a resumed run's later epochs draw what the
        # uninterrupted run drew. The position is a `scan` counter, also
        # held by the iterator checkpoint.
        def seeded(position, pair):
            (element, index) = pair
            return position + 1, (element, tf.stack([first, index * 2 ** 31 + position]))

        positioned = dataset.scan(tf.constant(0, tf.int64), seeded)
        return positioned.map(call, **parallel)
    # Not shuffled: a seeded stream zipped alongside, drawn anew each pass.
    # (tf.data does not restore its per-pass state exactly after a resume:
    # see docs/resume.md, "The guarantee".)
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
    return tf.data.Dataset.zip((dataset, seeds)).map(call, **parallel)


def without_autotuning(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` with tf.data's autotuning model off: for data already in memory.

    The model times every element and re-plans in a background thread.
    Measured here (`tapeworks bench autotune`): on a 2-core machine a
    compute-bound training step fed from an in-memory dataset ran at one of
    two speeds from epoch to epoch with the model on (both cores partly idle
    in the slow one), and at the fast one every time with it off. Arrays
    sliced in memory have nothing for it to tune; a `prefetch(AUTOTUNE)`
    still grows its buffer on demand (tf.data's own prefetch autotuner).
    Keep the model on for pipelines that decode or augment in parallel.
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)
