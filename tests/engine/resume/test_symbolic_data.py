"""tf.data's symbolic iterator checkpointing under `fit(checkpoint_dir=...)`: where it applies.

With it, a checkpoint of a pipeline's position holds cursors into its sources
instead of the batches in flight (prefetch and parallel-map buffers): a
smaller checkpoint, recomputed on restore. tf.data implements it for some
transformations only (`data_position.SYMBOLIC_OPS`); other pipelines keep the
explicit checkpoint.
"""

import glob
import json
import os
import shutil
import time

import numpy as np
import pytest
import tensorflow as tf

from tapeworks import ConfigError
from tapeworks.engine.inputs import data_position, adapters
from tests.engine.resume.test_resume_api import data, saves, trainer, weights


def _records(tmp_path):
    with tf.io.TFRecordWriter(str(tmp_path / "a.tfr")) as writer:
        for i in range(40):
            writer.write(str(i).encode())
    (tmp_path / "a.txt").write_text("\n".join(map(str, range(40))))
    return str(tmp_path / "a.tfr"), str(tmp_path / "a.txt")


def accepted(tmp_path):
    """Pipelines that, together, run every transformation of `SYMBOLIC_OPS`."""
    r = tf.data.Dataset.range
    records, lines = _records(tmp_path)
    return [
        tf.data.Dataset.from_tensor_slices(np.arange(40.0)).shuffle(20, seed=1)
        .map(lambda v: v * 2, num_parallel_calls=2).batch(4).prefetch(2),
        r(40).repeat(2).batch(3, num_parallel_calls=2).unbatch().filter(lambda v: v % 3 > 0)
        .take(50).skip(2).shard(2, 0),
        r(4).interleave(lambda i: r(10), cycle_length=2),
        r(4).flat_map(lambda v: tf.data.Dataset.from_tensors(v).repeat(3)),
        r(40).map(lambda i: tf.range(i % 5)).padded_batch(4),
        tf.data.Dataset.sample_from_datasets([r(40), r(40)], seed=3),
        tf.data.Dataset.zip((r(20), r(20))).concatenate(tf.data.Dataset.zip((r(20), r(20)))),
        r(40).scan(tf.constant(0, tf.int64), lambda s, v: (s + v, s)),
        tf.data.Dataset.random(seed=4).take(40),
        tf.data.TFRecordDataset([records]).map(tf.strings.to_number),
        tf.data.TextLineDataset([lines]),
        r(40).apply(tf.data.experimental.assert_cardinality(40))
        .with_options(tf.data.Options()),
    ]


def refused(tmp_path):
    """One pipeline for each measured refusal."""
    r = tf.data.Dataset.range
    (tmp_path / "fixed.bin").write_bytes(bytes(range(40)))
    return [
        r(10).cache().batch(2),
        r(10).cache(str(tmp_path / "cache")),
        r(10).window(3).flat_map(lambda window: window.batch(3)),
        r(10).group_by_window(lambda v: v % 2, lambda key, w: w.batch(2), window_size=2),
        r(10).map(lambda v: v % 3).unique(),
        r(10).snapshot(str(tmp_path / "snapshot")),
        r(10).batch(4).rebatch(2),
        tf.data.FixedLengthRecordDataset([str(tmp_path / "fixed.bin")], 4),
        r(4).interleave(lambda i: r(5), cycle_length=2, num_parallel_calls=2,
                        deterministic=False),
    ]


def _symbolic(dataset):
    options = tf.data.Options()
    options.experimental_symbolic_checkpoint = True
    return dataset.with_options(options)


def _prepared(dataset):
    """A user's tf.data pipeline as the data stage hands it on."""
    return adapters.PreparedData(dataset, adapters.DATASET)


def _values(batch):
    return np.asarray(batch).tolist()


def test_every_listed_transformation_is_saved_symbolically_and_resumes_exactly(tmp_path):
    covered = set()
    for index, dataset in enumerate(accepted(tmp_path)):
        assert data_position.symbolic_refusals(dataset) == []
        covered |= _dataset_ops(dataset)
        iterator = iter(_symbolic(dataset))
        for _ in range(3):
            next(iterator)
        prefix = str(tmp_path / f"c{index}" / "data")
        tf.train.Checkpoint(iterator=iterator).write(prefix)
        rest = [_values(b) for b in iterator]
        again = iter(_symbolic(dataset))
        tf.train.Checkpoint(iterator=again).read(prefix).assert_consumed()
        assert [_values(b) for b in again] == rest, index
    assert covered == set(data_position.SYMBOLIC_OPS)   # each one measured here


def test_every_other_pipeline_keeps_the_explicit_checkpoint(tmp_path):
    for dataset in refused(tmp_path):
        assert data_position.symbolic_refusals(dataset), dataset
        kept, symbolic = data_position.symbolic_checkpointing(dataset)
        assert symbolic is False and kept is dataset
        # tf.data refuses it once the iterator has drawn (when a TensorFlow
        # release accepts one, this fails: add it to SYMBOLIC_OPS).
        iterator = iter(_symbolic(dataset))
        next(iterator)
        with pytest.raises(tf.errors.UnimplementedError, match="symbolic checkpointing"):
            tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "probe" / "data"))
    # Accepted by tf.data, left out: a restored parallel interleave hung.
    parallel = tf.data.Dataset.range(4).interleave(
        lambda i: tf.data.Dataset.range(5), cycle_length=2, num_parallel_calls=2)
    assert data_position.symbolic_refusals(parallel) == ["ParallelInterleaveDatasetV4"]


def _dataset_ops(dataset):
    graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return {n.op for n in nodes if n.op.endswith("Dataset") or "DatasetV" in n.op}


def test_a_resumed_run_reads_the_checkpoint_the_way_it_was_written():
    parallel = tf.data.Dataset.range(10).map(lambda v: v + 1, num_parallel_calls=2)
    kept, symbolic = data_position.symbolic_checkpointing(parallel, saved=False)
    assert symbolic is False and kept is parallel   # an explicit save stays explicit
    dataset, symbolic = data_position.symbolic_checkpointing(parallel)
    assert symbolic is True and dataset.options().experimental_symbolic_checkpoint


def test_a_stateful_random_op_is_refused_even_when_the_user_asked_for_symbolic():
    # A symbolic save skips tf.data's external-state check; the refusal must
    # not depend on it (that pipeline would resume with other noise).
    noisy = tf.data.Dataset.range(10).map(lambda v: tf.random.uniform([]))
    with pytest.raises(ConfigError, match="cannot be checkpointed: it runs RandomUniform"):
        data_position.data_mode(_prepared(_symbolic(noisy)), "auto")


def test_checking_a_pipeline_does_not_change_its_order():
    # Every iterator started over a dataset advances its reshuffling seeds:
    # the checks at the start of fit start none.
    def shuffled():
        return tf.data.Dataset.range(12).shuffle(12, seed=3).batch(4)

    expected = [_values(b) for b in shuffled()]
    checked = shuffled()
    assert data_position.data_mode(_prepared(checked), "auto") == "iterator"
    data_position.symbolic_checkpointing(checked)
    assert [_values(b) for b in checked] == expected


def _pipeline(x, y, kind):
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    if kind == "cache":
        dataset = dataset.cache()
    return (dataset.shuffle(96, seed=3).map(lambda a, b: (a * 2.0, b), num_parallel_calls=2)
            .batch(16).prefetch(4))


def _size(pattern):
    return sum(os.path.getsize(p) for p in glob.glob(pattern))


def test_a_symbolic_checkpoint_holds_no_prefetched_batches(tmp_path):
    def pipeline():
        features = np.arange(64 * 256, dtype=np.float32).reshape(64, 256)
        return (tf.data.Dataset.from_tensor_slices(features)
                .map(lambda v: v * 2.0, num_parallel_calls=2).batch(8).prefetch(4))

    sizes = {}
    for name, dataset in [("explicit", pipeline()),
                          ("symbolic", data_position.symbolic_checkpointing(pipeline())[0])]:
        iterator = iter(dataset)
        next(iterator)
        time.sleep(0.5)   # the prefetch thread fills its buffer meanwhile
        tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / name / "data"))
        sizes[name] = _size(str(tmp_path / name / "data.*"))
    # Explicit: the 4 prefetched batches and the map's results, 8 KiB a batch.
    assert sizes["explicit"] > 4 * 8 * 256 * 4
    assert sizes["symbolic"] < 2 * 1024   # cursors only


@pytest.mark.parametrize("kind, symbolic", [("prefetch", True), ("cache", False)])
def test_a_pipeline_resumes_exactly_with_the_checkpoint_that_applies(tmp_path, kind, symbolic):
    x, y = data(96)
    trainer().fit(_pipeline(x, y, kind), epochs=1, verbose=0, checkpoint_dir=str(tmp_path),
                  checkpoint_every=4)
    for name in saves(tmp_path):   # as if killed after the mid-epoch save
        if name != "ckpt-000000000004":
            shutil.rmtree(tmp_path / name)
    folder = tmp_path / "ckpt-000000000004"
    run = json.load(open(folder / "run.json"))
    assert (run["data"], run["symbolic_data"], run["batches_drawn"]) == ("iterator", symbolic, 4)

    resumed = trainer()
    resumed.fit(_pipeline(x, y, kind), epochs=2, verbose=0, checkpoint_dir=str(tmp_path))
    straight = trainer()
    straight.fit(_pipeline(x, y, kind), epochs=2, verbose=0)
    assert int(resumed.counters.step) == int(straight.counters.step) == 12
    for a, b in zip(weights(resumed), weights(straight)):
        np.testing.assert_array_equal(a, b)
