"""tapeworks.data.pipeline: order of operations, training vs evaluation, determinism."""

import numpy as np
import pytest
import tensorflow as tf

from tapeworks import ConfigError, data
from tapeworks.data.pipeline_check import dataset_graph, pipeline_chain


def ops(dataset):
    return [n.op for n in pipeline_chain(dataset_graph(dataset))]


def arrays(n=64):
    x = np.arange(n * 2, dtype="float32").reshape(n, 2)
    return x, np.arange(n, dtype="int64")


def double(x, y):
    return x * 2, y


def shift(x, y):
    return x + 1000.0, y


def test_order_without_cache():
    built = data.pipeline(arrays(), batch_size=8, training=True, map=double, augment=shift)
    assert ops(built) == ["TensorSliceDataset", "ShuffleDatasetV3", "ParallelMapDatasetV2",
                          "ParallelMapDatasetV2", "ParallelBatchDataset", "PrefetchDataset"]


def test_order_with_cache_maps_then_caches_then_shuffles():
    built = data.pipeline(arrays(), batch_size=8, training=True, map=double, augment=shift,
                          cache="memory")
    assert ops(built) == ["TensorSliceDataset", "ParallelMapDatasetV2", "CacheDatasetV2",
                          "ShuffleDatasetV3", "ParallelMapDatasetV2", "ParallelBatchDataset",
                          "PrefetchDataset"]


def test_evaluation_pipeline_has_no_shuffle_and_no_augmentation():
    built = data.pipeline(arrays(), batch_size=8, training=False, map=double, augment=shift,
                          batch_augment=shift)
    assert ops(built) == ["TensorSliceDataset", "ParallelMapDatasetV2", "ParallelBatchDataset",
                          "PrefetchDataset"]
    x = np.concatenate([b[0].numpy() for b in built])
    np.testing.assert_array_equal(x, arrays()[0] * 2)  # in order, every example, not shifted


def test_augmentation_only_when_training():
    train = data.pipeline(arrays(), batch_size=8, training=True, augment=shift, seed=0)
    x = np.concatenate([b[0].numpy() for b in train])
    assert x.min() >= 1000.0
    batch_shifted = data.pipeline(arrays(), batch_size=8, training=True, batch_augment=shift,
                                  seed=0)
    assert np.concatenate([b[0].numpy() for b in batch_shifted]).min() >= 1000.0


def test_drop_remainder_follows_training():
    x, y = arrays(30)
    assert [b[0].shape[0] for b in data.pipeline((x, y), batch_size=8, training=True)] == [8] * 3
    assert [b[0].shape[0] for b in data.pipeline((x, y), batch_size=8, training=False)] == \
        [8, 8, 8, 6]


def noisy(x, y, seed):
    return x + tf.random.stateless_uniform(tf.shape(x), seed=seed), y


def test_a_seed_repeats_shuffle_and_augmentation():
    def batches(seed):
        built = data.pipeline(arrays(), batch_size=8, training=True, augment=noisy, seed=seed)
        return np.concatenate([b[0].numpy() for b in built])

    np.testing.assert_array_equal(batches(3), batches(3))
    assert not np.array_equal(batches(3), batches(4))


def test_bad_arguments():
    with pytest.raises(ConfigError, match="batch_size"):
        data.pipeline(arrays(), batch_size=0, training=True)
    with pytest.raises(ConfigError, match="cache"):
        data.pipeline(arrays(), batch_size=2, training=True, cache=3)


def test_without_autotuning_turns_the_model_off_and_keeps_the_elements():
    dataset = tf.data.Dataset.range(10).batch(4).prefetch(tf.data.AUTOTUNE)
    untuned = data.without_autotuning(dataset)
    assert dataset.options().autotune.enabled is not False
    assert untuned.options().autotune.enabled is False
    assert [b.tolist() for b in untuned.as_numpy_iterator()] == [[0, 1, 2, 3], [4, 5, 6, 7],
                                                                 [8, 9]]


def test_arrays_given_to_fit_are_sliced_without_the_autotuning_model():
    from tapeworks.engine.inputs import adapters

    x = np.arange(12, dtype="float32").reshape(6, 2)
    dataset = adapters.prepare(x, x[:, :1], batch_size=4, shuffle=False).dataset
    assert dataset.options().autotune.enabled is False
    assert [b[0].shape[0] for b in dataset] == [4, 2]
