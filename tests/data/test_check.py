"""tapeworks.data.check: each finding on a broken pipeline, silence on a good one."""

import numpy as np
import pytest
import tensorflow as tf

from tapeworks import data

X = np.random.default_rng(0).normal(size=(1000, 4)).astype("float32")
Y = np.arange(1000)
AUTOTUNE = tf.data.AUTOTUNE


def source():
    return tf.data.Dataset.from_tensor_slices((X, Y))


def jitter(x, y):
    return x + tf.random.uniform(tf.shape(x)), y


def without_own_prefetch(dataset):
    """The options that stop tf.data adding its own prefetch at the end (TD001 is true then)."""
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return dataset.with_options(options)


def codes(dataset, training=True):
    return [f.code for f in data.check(dataset, training=training)]


BROKEN = {
    "TD001": lambda: without_own_prefetch(source().shuffle(1000).batch(32)),
    "TD002": lambda: source().batch(32).shuffle(10).prefetch(AUTOTUNE),
    "TD003": lambda: source().map(jitter, num_parallel_calls=AUTOTUNE).cache().shuffle(1000)
    .batch(32).prefetch(AUTOTUNE),
    "TD004": lambda: source().shuffle(1000).cache().batch(32).prefetch(AUTOTUNE),
    "TD005": lambda: source().shuffle(1000).map(jitter).batch(32).prefetch(AUTOTUNE),
    "TD006": lambda: source().shuffle(16).batch(32).prefetch(AUTOTUNE),
    "TD007": lambda: source().shuffle(1000).map(
        lambda x, y: (tf.numpy_function(np.tanh, [x], tf.float32), y),
        num_parallel_calls=AUTOTUNE).batch(32).prefetch(AUTOTUNE),
    "TD008": lambda: source().shuffle(1000).prefetch(AUTOTUNE),
    "TD009": lambda: source().batch(32).prefetch(AUTOTUNE),
}


@pytest.mark.parametrize("code", sorted(BROKEN))
def test_each_finding(code):
    found = data.check(BROKEN[code](), training=True)
    assert code in [f.code for f in found]
    finding = next(f for f in found if f.code == code)
    assert finding.fix and finding.step.startswith("step ")
    assert str(finding).startswith(code) and "Fix:" in str(finding)


def test_the_map_inside_ragged_batch_is_not_the_users_and_gets_no_td005():
    # `Dataset.ragged_batch` maps each element to a ragged variant before its
    # batch, sequentially: the user wrote no `.map()` and cannot parallelise it.
    ragged = tf.ragged.constant([[1, 2], [3], [4, 5, 6], [7]], dtype=tf.int32)
    for features in (ragged, tf.constant([[1, 2], [3, 4], [5, 6], [7, 8]])):
        pipeline = tf.data.Dataset.from_tensor_slices((features, [0.0, 1.0, 0.0, 1.0]))
        found = data.check(pipeline.shuffle(4).ragged_batch(2).prefetch(AUTOTUNE),
                           training=True)
        assert "TD005" not in [f.code for f in found]
    # A map the user wrote before it is still named (a stateful one: tf.data
    # parallelises a stateless one itself).
    mapped = tf.data.Dataset.from_tensor_slices((ragged, [0.0, 1.0, 0.0, 1.0])).shuffle(4).map(
        lambda x, y: (x * 2, y + tf.random.uniform([]))).ragged_batch(2).prefetch(AUTOTUNE)
    assert [f.code for f in data.check(mapped, training=True)].count("TD005") == 1


def test_a_map_says_what_it_runs_one_at_a_time_why_and_when_a_cache_limits_it():
    def message(dataset):
        return next(f.message for f in data.check(dataset, training=True) if f.code == "TD005")

    why = "; tf.data does not parallelise it itself: its function runs the stateful op RandomUniform"
    assert message(source().shuffle(1000).map(jitter).batch(32).prefetch(AUTOTUNE)) == (
        "map without num_parallel_calls runs one example at a time" + why)
    assert message(source().shuffle(1000).batch(32).map(jitter).prefetch(AUTOTUNE)) == (
        "map without num_parallel_calls runs one batch at a time" + why)
    assert message(source().map(jitter).cache().shuffle(1000).batch(32).prefetch(AUTOTUNE)) == (
        "map without num_parallel_calls runs one example at a time (in the first epoch: a "
        "cache follows it)" + why)


def test_prefetch_not_last():
    found = data.check(without_own_prefetch(source().batch(32).prefetch(AUTOTUNE).map(
        lambda x, y: (x, y), num_parallel_calls=AUTOTUNE)))
    assert [f.code for f in found] == ["TD001"] and "not the last" in found[0].message
    assert "inject_prefetch=False" in found[0].message


def test_silence_on_the_builders_pipelines():
    for cache in (None, "memory"):
        built = data.pipeline((X, Y), batch_size=32, training=True, cache=cache,
                              map=lambda x, y: (x * 2, y), augment=jitter)
        assert codes(built) == []
    assert codes(data.pipeline((X, Y), batch_size=32, training=False), training=False) == []


def test_unbatched_is_only_a_finding_for_training():
    unbatched = source().shuffle(1000).prefetch(AUTOTUNE)
    assert codes(unbatched, training=False) == []


def test_unshuffled_is_a_finding_for_training_on_slices_only():
    assert codes(source().batch(32).prefetch(AUTOTUNE), training=False) == []
    assert codes(source().shuffle(1000).batch(32).prefetch(AUTOTUNE)) == []
    files = tf.data.TFRecordDataset([]).map(lambda r: r, num_parallel_calls=AUTOTUNE)
    assert "TD009" not in codes(files.batch(32).prefetch(AUTOTUNE))


def test_trainer_reports_findings_at_the_start_of_fit_as_warnings_once_per_dataset():
    import warnings

    import keras

    import tapeworks

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    trainer = tapeworks.Trainer(model, "sgd", "mse", jit_compile=False)
    bad = without_own_prefetch(source().map(
        lambda x, y: (jitter(x, y)[0], tf.cast(y, tf.float32))).shuffle(50).batch(100))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(bad, verbose=0)
        trainer.fit(bad, verbose=0)   # the same dataset: not reported again
    codes_seen = [str(w.message).split()[3] for w in caught
                  if issubclass(w.category, tapeworks.TapeworksWarning)]
    # Correctness first (TD006: a buffer of 50 for 1,000 examples), then performance.
    assert codes_seen == ["TD006", "TD001", "TD005"]
    categories = [w.category for w in caught if issubclass(w.category, tapeworks.TapeworksWarning)]
    assert categories == [tapeworks.CorrectnessWarning, tapeworks.PerformanceWarning,
                          tapeworks.PerformanceWarning]
    assert [f.code for f in trainer.data_findings] == ["TD006", "TD001", "TD005"]
    # Attributed to the user's line (the fit call here), not to tapeworks' code.
    assert {w.filename for w in caught
            if issubclass(w.category, tapeworks.TapeworksWarning)} == {__file__}
    quiet = tapeworks.Trainer(model, "sgd", "mse", jit_compile=False, check_data=False)
    quiet.fit(bad, verbose=0)
    assert quiet.data_findings == []


def test_performance_hints_are_skipped_for_data_sliced_from_memory():
    import warnings

    import keras

    import tapeworks

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    trainer = tapeworks.Trainer(model, "sgd", "mse", jit_compile=False)
    no_prefetch = source().map(lambda x, y: (x, tf.cast(y, tf.float32)))
    in_memory_no_prefetch = without_own_prefetch(tf.data.Dataset.from_tensor_slices(
        (X, Y.astype("float32"))).shuffle(1000).batch(100))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(in_memory_no_prefetch, verbose=0)
    assert not [w for w in caught if issubclass(w.category, tapeworks.TapeworksWarning)]
    assert [f.code for f in trainer.data_findings] == ["TD001"]   # found, not shown
    with warnings.catch_warnings():
        warnings.simplefilter("error", tapeworks.PerformanceWarning)
        with pytest.raises(tapeworks.PerformanceWarning, match="TD001"):
            trainer.fit(without_own_prefetch(no_prefetch.batch(100)), verbose=0)


def in_memory(dataset):
    from tapeworks.data.pipeline_check import dataset_graph, in_memory as graph_in_memory

    return graph_in_memory(dataset_graph(dataset))


def test_in_memory_means_sliced_tensors_and_nothing_computed():
    assert in_memory(source().shuffle(100).batch(10).cache().prefetch(AUTOTUNE).repeat())
    assert in_memory(tf.data.Dataset.range(10).batch(2).take(3))
    assert not in_memory(source().map(lambda x, y: (x * 2, y)).batch(10))
    assert not in_memory(source().filter(lambda x, y: y > 0).batch(10))
    assert not in_memory(tf.data.Dataset.from_generator(
        lambda: iter([1, 2]), output_signature=tf.TensorSpec((), tf.int32)).batch(2))


def test_trainer_turns_the_autotuning_model_off_only_for_in_memory_data():
    import keras

    import tapeworks

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    trainer = tapeworks.Trainer(model, "sgd", "mse", jit_compile=False)

    def autotune(dataset):
        prepared = trainer.data_stage.prepare(dataset, purpose="fit", training=True)
        return prepared.dataset.options().autotune.enabled

    sliced = source().batch(10)
    assert autotune(sliced) is False
    mapped = source().map(lambda x, y: (x, y), num_parallel_calls=AUTOTUNE).batch(10)
    assert autotune(mapped) is None
    options = tf.data.Options()
    options.autotune.enabled = True  # the user's explicit choice wins
    assert autotune(sliced.with_options(options)) is True


def test_turning_the_autotuning_model_off_changes_no_result():
    import keras

    import tapeworks

    weights = []
    for check_data in (True, False):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        trainer = tapeworks.Trainer(model, "sgd", "mse", jit_compile=False,
                                    check_data=check_data)
        trainer.fit(source().shuffle(100, seed=1).batch(10), epochs=2, verbose=0)
        weights.append(model.get_weights())
    for inspected, untouched in zip(*weights):
        np.testing.assert_array_equal(inspected, untouched)


def test_unshuffled_slices_are_warned_about_for_several_epochs_not_for_one():
    import warnings

    import keras

    import tapeworks

    def fitted(epochs):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        trainer = tapeworks.Trainer(model, "sgd", "mse", jit_compile=False)
        unshuffled = tf.data.Dataset.from_tensor_slices((X, Y.astype("float32"))).batch(100)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(unshuffled, epochs=epochs, verbose=0)
        shown = [str(w.message) for w in caught
                 if issubclass(w.category, tapeworks.TapeworksWarning)]
        return shown, [f.code for f in trainer.data_findings]

    shown, found = fitted(2)
    assert len(shown) == 1 and "TD009" in shown[0] and found == ["TD009"]
    # One epoch: "every epoch sees them in their stored order" says nothing there.
    shown, found = fitted(1)
    assert shown == [] and found == ["TD009"]
