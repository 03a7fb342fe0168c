"""TD001 and TD005 only where tf.data's own rewrites leave the mistake in place.

tf.data parallelises a stateless `.map(fn)` and adds a prefetch at the end by
itself (unless the options turn that off). Each case below is checked against
what tf.data really did, read with `assert_next` (TensorFlow's own way of
testing its rewrites): the check reports TD005 exactly where the map stayed
sequential and TD001 exactly where no prefetch was added.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.data.experimental.ops import testing

from tapeworks import data

X = np.arange(24, dtype="float32").reshape(12, 2)
IMAGES = np.arange(12 * 8, dtype="float32").reshape(12, 2, 2, 2)
VARIABLE = tf.Variable(2.0)


@tf.function
def helper(x):
    return x * 3.0


def options(**settings):
    """tf.data.Options with `section__field=value` settings."""
    made = tf.data.Options()
    for name, value in settings.items():
        section, field = name.split("__")
        setattr(getattr(made, section), field, value)
    return made


MAPS = {
    "arithmetic": lambda x: x * 2.0,
    "stateless random": lambda x: x + tf.random.stateless_uniform([2], seed=[1, 2]),
    "stateful random": lambda x: x + tf.random.uniform([2]),
    "captured variable": lambda x: x * VARIABLE,
    "cond, stateless branches": lambda x: tf.cond(x[0] > 3.0, lambda: x, lambda: -x),
    "cond, a random branch": lambda x: tf.cond(x[0] > 3.0, lambda: x,
                                               lambda: x + tf.random.uniform([2])),
    "while loop": lambda x: tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * 2.0),
                                          (0, x))[1],
    "py_function": lambda x: tf.py_function(lambda v: v, [x], tf.float32),
    "assert": lambda x: tf.identity(x) if tf.debugging.Assert(True, [x]) is None else x,
    "tf.function call": lambda x: helper(x),
    "keras Rescaling": keras.layers.Rescaling(0.5),
    "keras RandomFlip": keras.layers.RandomFlip(seed=1),   # a SeedGenerator's variable
}
MAP_OPTIONS = {
    "defaults": None,
    "map_parallelization off": options(experimental_optimization__map_parallelization=False),
    "autotune off": options(autotune__enabled=False),
    "default rewrites off": options(experimental_optimization__apply_default_optimizations=False),
    "default rewrites off, map_parallelization on": options(
        experimental_optimization__apply_default_optimizations=False,
        experimental_optimization__map_parallelization=True),
    "inject_prefetch off": options(experimental_optimization__inject_prefetch=False),
}


def runs(dataset):
    """True when an iterator of `dataset` starts (its `assert_next` held)."""
    try:
        next(iter(dataset))
        return True
    except tf.errors.InvalidArgumentError as error:
        assert "Asserted transformation" in str(error)
        return False


def with_options(dataset, settings):
    return dataset if settings is None else dataset.with_options(settings)


@pytest.mark.parametrize("option_name", sorted(MAP_OPTIONS))
@pytest.mark.parametrize("map_name", sorted(MAPS))
def test_td005_exactly_where_tf_data_leaves_the_map_sequential(map_name, option_name):
    fn, settings = MAPS[map_name], MAP_OPTIONS[option_name]
    source = tf.data.Dataset.from_tensor_slices(IMAGES if "Random" in map_name else X)
    parallel = runs(with_options(source.apply(testing.assert_next(["ParallelMap"])).map(fn),
                                 settings))
    found = data.check(with_options(source.map(fn).prefetch(1), settings), training=False)
    td005 = [f for f in found if f.code == "TD005"]
    assert (not td005) == parallel, (map_name, option_name, found)
    if td005:   # the reason is named: the op, or the option
        assert "tf.data does not parallelise it itself: " in td005[0].message


PREFETCH_OPTIONS = {
    "defaults": None,
    "inject_prefetch off": options(experimental_optimization__inject_prefetch=False),
    "autotune off": options(autotune__enabled=False),
    "default rewrites off": options(experimental_optimization__apply_default_optimizations=False),
    "map_parallelization off": options(experimental_optimization__map_parallelization=False),
}
ENDINGS = {
    "batch": lambda ds: ds.batch(4),
    "shuffle after a prefetch": lambda ds: ds.batch(4).prefetch(1).shuffle(3),
    "stateful map after a prefetch": lambda ds: ds.batch(4).prefetch(1).map(
        lambda x: x + tf.random.uniform([2])),
}


@pytest.mark.parametrize("option_name", sorted(PREFETCH_OPTIONS))
@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_td001_exactly_where_tf_data_adds_no_prefetch(ending, option_name):
    settings = PREFETCH_OPTIONS[option_name]
    source = tf.data.Dataset.from_tensor_slices(X).shuffle(12)
    built = ENDINGS[ending](source)
    injected = runs(with_options(built.apply(testing.assert_next(["Prefetch"])), settings))
    found = data.check(with_options(built, settings), training=True)
    td001 = [f for f in found if f.code == "TD001"]
    assert (not td001) == injected, (ending, option_name, found)
    if td001:
        assert "tf.data adds none itself: options." in td001[0].message


def test_a_user_pipeline_without_prefetch_or_parallel_maps_has_no_performance_finding():
    # The most common pipeline in tutorials: nothing to tell on TensorFlow >= 2.9.
    pipeline = tf.data.Dataset.from_tensor_slices((X, X[:, 0])).shuffle(12).map(
        lambda x, y: (x / 255.0, y)).batch(4)
    assert data.check(pipeline, training=True) == []


def test_each_finding_names_the_option_that_turned_its_own_rewrite_off():
    both_off = options(experimental_optimization__inject_prefetch=False,
                       experimental_optimization__map_parallelization=False)
    pipeline = tf.data.Dataset.from_tensor_slices(X).shuffle(12).map(lambda x: x * 2.0).batch(4)
    found = {f.code: f.message for f in data.check(pipeline.with_options(both_off),
                                                   training=True)}
    assert found["TD001"].endswith("(tf.data adds none itself: "
                                   "options.experimental_optimization.inject_prefetch=False)")
    assert found["TD005"].endswith("itself: options.experimental_optimization."
                                   "map_parallelization=False")


def test_options_set_on_any_input_count_as_in_dataset_options():
    # A zip's second input carries the option: tf.data merges the options of
    # every input (`Dataset.options()`), so no prefetch is added.
    no_injection = options(experimental_optimization__inject_prefetch=False)
    zipped = tf.data.Dataset.zip((tf.data.Dataset.from_tensor_slices(X),
                                  tf.data.Dataset.from_tensor_slices(X).with_options(
                                      no_injection))).batch(4)
    assert not runs(zipped.apply(testing.assert_next(["Prefetch"])))
    assert [f.code for f in data.check(zipped, training=False)] == ["TD001"]
