"""How the data's position is saved: replayed from the run's seed, or tf.data's iterator.

Array inputs are not saved: their order is a function of the run's seed and
the epoch, so the position (passes started, batches drawn) replays it
exactly. A `tf.data` pipeline's iterator is saved with tf.data's own iterator
checkpointing, symbolic where it applies, so buffers of prefetched batches
are not written.
"""

import dataclasses
import re

import tensorflow as tf

from tapeworks.errors import ConfigError


def data_mode(prepared, checkpoint_data):
    """How the data position is saved: "replay" (arrays, or "skip") or "iterator".

    Raises `ConfigError` for data whose position cannot be saved.
    """
    from tapeworks.engine.inputs import adapters

    if checkpoint_data not in ("auto", "skip"):
        raise ConfigError(
            f"`checkpoint_data` must be \"auto\" or \"skip\". Received: "
            f"checkpoint_data={checkpoint_data!r}")
    if checkpoint_data == "skip" or prepared.kind == adapters.ARRAYS:
        return "replay"
    if prepared.kind != adapters.DATASET:
        raise ConfigError(
            f"The training data is a {prepared.kind}, whose position a checkpoint cannot hold "
            "(Python code runs outside the graph). Expected a tf.data.Dataset or arrays with "
            "checkpoint_dir. Fix: pass arrays or a tf.data pipeline, or "
            "fit(..., checkpoint_data=\"skip\"): a resumed run then re-creates the data and "
            "skips the batches already trained this epoch (exact when the data comes in the "
            "same order every time).")
    unsaveable = _unsaveable_op(prepared.dataset)
    if unsaveable:
        raise ConfigError(
            f"The training pipeline cannot be checkpointed: it runs {unsaveable}, whose state "
            "tf.data cannot save (Python code, or a random op outside tf.data's seeds). "
            "Expected a pipeline of tf.data and TensorFlow ops. Fix: rewrite that step with "
            "TensorFlow ops (for randomness: a `seed` argument or tf.random.stateless_*), or "
            "fit(..., checkpoint_data=\"skip\"): a resumed run then re-creates the pipeline and "
            "skips the batches already trained this epoch (exact only when the pipeline gives "
            "the same batches in the same order every time).")
    return "iterator"


def _unsaveable_op(dataset):
    """The first op whose state tf.data refuses to save ('PyFunc in map'), or None.

    Asked of tf.data itself, by serializing the pipeline's graph with the
    "fail" external-state policy. Not by starting an iterator: every
    iterator started over a dataset advances its reshuffling seeds, so a
    probe iterator would give the run another order of examples than the
    same run without `checkpoint_dir`.
    """
    try:
        dataset._as_serialized_graph(
            external_state_policy=tf.data.experimental.ExternalStatePolicy.FAIL)
    except (tf.errors.FailedPreconditionError, tf.errors.UnimplementedError,
            tf.errors.InvalidArgumentError) as error:
        message = str(error).splitlines()[0].split("}} ")[-1]
        op = re.search(r"\b(PyFunc\w*|EagerPyFunc|Generator\w*|Random\w+|\w+Dataset)\b", message)
        return f"{op.group(1)} ({message[:200]})" if op else message[:240]
    return None


# tf.data's symbolic iterator checkpointing is implemented by some
# transformations only; saving an iterator that has drawn through any other
# fails ("FixedLengthRecordDatasetV2 does not support symbolic
# checkpointing"), and tf.data cannot be asked beforehand without starting an
# iterator (see `_unsaveable_op` for why not). So: the transformations it was
# measured to accept (TF 2.21; tests/engine/resume/test_symbolic_data.py draws and
# saves each one symbolically); a pipeline with any other keeps the explicit
# checkpoint. Measured refusals: cache, window, group_by_window and
# bucket_by_sequence_length, unique, snapshot, rebatch, fixed-length records,
# a parallel interleave with deterministic=False. Left out although tf.data
# accepts it: a parallel interleave (its restored iterator hung, one-off run
# with cycle_length=2 on TF 2.21), and any transformation with
# deterministic=False (its order is not reproducible anyway).
SYMBOLIC_OPS = frozenset({
    "AssertCardinalityDataset", "BatchDatasetV2", "ConcatenateDataset",
    "DirectedInterleaveDataset", "FilterDataset", "FlatMapDataset", "InterleaveDataset",
    "MapDataset", "OptionsDataset", "PaddedBatchDatasetV2", "ParallelBatchDataset",
    "ParallelMapDatasetV2", "PrefetchDataset",
    "RandomDataset", "RangeDataset", "RepeatDataset", "ScanDataset", "ShardDataset",
    "ShuffleDatasetV3", "SkipDataset", "TFRecordDataset", "TakeDataset", "TensorDataset",
    "TensorSliceDataset", "TextLineDataset", "UnbatchDataset", "ZipDataset",
})


def symbolic_checkpointing(dataset, saved=None):
    """`dataset` with tf.data's symbolic iterator checkpointing where it applies; and whether.

    With `tf.data.Options().experimental_symbolic_checkpoint`, an iterator
    checkpoint keeps cursors into the sources instead of the elements in
    flight: the batches a prefetch or parallel map holds are not written
    into every checkpoint, they are recomputed on restore (12,768 bytes
    against 732 for a small map -> batch -> prefetch pipeline; a shuffle
    buffer is kept either way). `saved` is what the checkpoint being resumed
    used (None for a fresh run): a checkpoint is read the way it was
    written. Otherwise it applies when every transformation of the pipeline
    is one of `SYMBOLIC_OPS`. Call after `data_mode` has refused unsaveable
    pipelines: a symbolic save skips tf.data's external-state check.
    """
    if saved is False or (saved is None and symbolic_refusals(dataset)):
        return dataset, False
    options = tf.data.Options()
    options.experimental_symbolic_checkpoint = True
    return dataset.with_options(options), True


def checkpointable(prepared, saved=None):
    """`prepared` with its dataset as `symbolic_checkpointing` makes it, and whether symbolic.

    A new `PreparedData`: the data stage's own is not changed.
    """
    dataset, symbolic = symbolic_checkpointing(prepared.dataset, saved)
    return dataclasses.replace(prepared, dataset=dataset), symbolic


def symbolic_refusals(dataset):
    """The transformations of `dataset` outside `SYMBOLIC_OPS` (nested pipelines included)."""
    graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    nodes = list(graph.node)
    for function in graph.library.function:   # interleave's and flat_map's pipelines
        nodes.extend(function.node_def)
    refused = set()
    for node in nodes:
        if re.search(r"Dataset(V\d+)?$", node.op) and (
                node.op not in SYMBOLIC_OPS or node.attr["deterministic"].s == b"false"):
            refused.add(node.op)
    return sorted(refused)
