"""`check(dataset)`: reads a built dataset's graph and reports pipeline mistakes.

It looks at what tf.data will run (the serialized dataset graph and the
functions of its maps), not at the Python that built it, so it sees pipelines
built by any code. Each finding has a stable code, the step it is about and
the fix.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from tapeworks.data import utility_pipelines
from tapeworks.data.default_rewrites import DefaultRewrites, keeps_map_sequential
from tapeworks.docs_links import see_docs

SHUFFLES = {"ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3",
            "ShuffleAndRepeatDataset", "ShuffleAndRepeatDatasetV2"}
BATCHES = {"BatchDataset", "BatchDatasetV2", "PaddedBatchDataset", "PaddedBatchDatasetV2",
           "ParallelBatchDataset", "RaggedBatchDataset"}
CACHES = {"CacheDataset", "CacheDatasetV2", "MemoryCacheDataset"}
MAPS = {"MapDataset", "ParallelMapDataset", "ParallelMapDatasetV2"}
PY_FUNCS = {"EagerPyFunc", "PyFunc", "PyFuncStateless"}
# What the sequential map inside `Dataset.ragged_batch` runs (each element
# to a ragged variant, before its batch): tf.data's step, not the user's map.
RAGGED_BATCH_MAP_OPS = {"Identity", "Const", "Cast", "Sub", "RaggedTensorToVariant",
                        "RaggedTensorFromVariant"}
SMALL_SHUFFLE_SHARE = 0.1   # a buffer under a tenth of the examples shuffles only locally


# What each finding is about: "correctness" changes what is learned (the
# order examples are seen in, one example per step); "performance" only costs
# time. Correctness findings are reported first.
CATEGORIES = {"TD001": "performance", "TD002": "correctness", "TD003": "correctness",
              "TD004": "correctness", "TD005": "performance", "TD006": "correctness",
              "TD007": "performance", "TD008": "correctness", "TD009": "correctness"}


@dataclasses.dataclass(frozen=True)
class Finding:
    code: str
    message: str
    step: str
    fix: str

    @property
    def category(self) -> str:
        """"correctness" or "performance" (see `CATEGORIES`)."""
        return CATEGORIES[self.code]

    def __str__(self) -> str:
        return (f"{self.code} {self.message} (at {self.step}). Fix: {self.fix} "
                f"({see_docs(self.code)})")


def dataset_graph(dataset):
    """The GraphDef tf.data runs for `dataset` (its functions in `.library`)."""
    serialized = dataset._as_serialized_graph(  # the one way to read a built pipeline
        external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE)
    return tf.compat.v1.GraphDef.FromString(serialized.numpy())


def check(dataset: tf.data.Dataset, training: bool | None = None) -> list[Finding]:
    """Returns the list of `Finding`s for `dataset` (empty when nothing is wrong).

    Args:
        dataset: a built `tf.data.Dataset`.
        training: True when it feeds training (then a pipeline without any
            batching is reported too).
    """
    return check_graph(dataset_graph(dataset), training)


def check_graph(graph, training=None):
    """`check` on a graph already read with `dataset_graph` (reading one is not free)."""
    nodes = {n.name: n for n in graph.node}
    functions = {f.signature.name: f for f in graph.library.function}
    chain = _chain(nodes)
    ops = [n.op for n in chain]
    findings = []
    # What tf.data fixes by itself (a prefetch at the end, stateless maps in
    # parallel) is no finding: see default_rewrites.
    rewrites = DefaultRewrites.of(nodes, _main_path(nodes))
    generator_prefix = _generator_prefix(chain, functions)

    # The first steps a Keras or TensorFlow utility built: the user cannot edit
    # them, so a finding counts only the user's steps, or says what to pass
    # at the utility's call.
    utility = utility_pipelines.find(chain, lambda node: _called_ops(node, functions))
    labels = {node.name: f"step {i} ({node.op})" for i, node in enumerate(chain)}
    if utility is not None:
        labels.update({node.name: f"step {i} ({node.op}, inside `{utility.name}`)"
                       for i, node in enumerate(chain) if utility.holds(i)})

    def add(code, message, node, fix):
        findings.append(Finding(code, message, labels[node.name], fix))

    def users(index):
        return utility is None or not utility.holds(index)

    def made_by(node):
        """The utility's name when `node` is one of its steps (the fix is at its call)."""
        return None if users(chain.index(node)) else utility.name

    # TD001: prefetch last. (tf.data adds one at the end itself unless the
    # options turn that off: then, and only then, the step waits.)
    prefetches = [i for i, op in enumerate(ops) if op == "PrefetchDataset"]
    off = f" (tf.data adds none itself: {rewrites.prefetch_off})"
    if rewrites.prefetch_injected:
        pass
    elif not prefetches:
        add("TD001", "the pipeline has no prefetch: the step waits while each batch is made"
            + off, chain[-1], "end with `.prefetch(tf.data.AUTOTUNE)`")
    elif prefetches[-1] != len(ops) - 1 and users(prefetches[-1]):
        add("TD001", f"prefetch is not the last step ({ops[-1]} follows it){off}", chain[-1],
            "move `.prefetch(tf.data.AUTOTUNE)` to the end")
    elif prefetches[-1] != len(ops) - 1 and users(len(ops) - 1):
        # Only the utility's own batching may follow its prefetch (its
        # expensive map is prefetched); the user's steps after it are not.
        add("TD001", f"the last prefetch is the one inside `{utility.name}`, and your "
            f"steps after it ({ops[-1]} last) are not prefetched{off}", chain[-1],
            "end your pipeline with `.prefetch(tf.data.AUTOTUNE)`, after your last "
            f"transformation of what `{utility.name}` returns")
    last_batch = None
    random_map = None
    shuffle_seen = None
    for index, node in enumerate(chain):
        op = node.op
        if not users(index):
            # The utility's own step: what it does counts (a batch, a shuffle),
            # not how it is done (its buffer sizes, its maps).
            if op in BATCHES:
                last_batch = node
            elif op in SHUFFLES:
                shuffle_seen = node
            continue
        if op in BATCHES:
            last_batch = node
        elif op == "UnbatchDataset":
            last_batch = None
        elif op in SHUFFLES:
            if last_batch is not None:
                batched_by = made_by(last_batch)
                add("TD002", "shuffle after batch reorders whole batches, not examples", node,
                    f"pass `batch_size=None` to `{batched_by}` and `.batch()` after your "
                    "shuffle" if batched_by else "shuffle before `.batch()`")
            shuffle_seen = node
            if last_batch is None:
                _check_buffer(node, nodes, chain, add)
        elif op in CACHES:
            if random_map is not None:
                add("TD003", f"cache after a random operation ({labels[random_map.name]}): every "
                    "epoch replays the first epoch's random values", node,
                    "cache before the random augmentation (map -> cache -> shuffle -> augment)")
            if shuffle_seen is not None:
                shuffled_by = made_by(shuffle_seen)
                add("TD004", "shuffle before cache: the cache keeps the first epoch's order "
                    "and replays it every epoch", shuffle_seen,
                    f"pass `shuffle=False` to `{shuffled_by}` and shuffle after your cache "
                    "(`.cache().shuffle(n)`)" if shuffled_by else
                    "cache first, then shuffle (map -> cache -> shuffle)")
        if op in MAPS and index not in generator_prefix:
            called = _called_ops(node, functions)
            # (A user's map of only such ops, a cast, costs as little: nothing to tell.)
            ragged_batch = (index + 1 < len(chain) and chain[index + 1].op in BATCHES
                            and called <= RAGGED_BATCH_MAP_OPS)
            sequential = op == "MapDataset" and (
                keeps_map_sequential(node, functions) or (
                    None if rewrites.maps_parallelised else rewrites.maps_off))
            if sequential and not ragged_batch:
                # After a batch it maps whole batches; before a cache, only the first pass.
                unit = "batch" if last_batch is not None else "example"
                cached = any(later.op in CACHES for later in chain[index + 1:])
                add("TD005", f"map without num_parallel_calls runs one {unit} at a time"
                    + (" (in the first epoch: a cache follows it)" if cached else "")
                    + f"; tf.data does not parallelise it itself: {sequential}", node,
                    "`.map(fn, num_parallel_calls=tf.data.AUTOTUNE)`")
            if called & PY_FUNCS:
                add("TD007", "py_function/numpy_function in a map: Python per example, holding "
                    "the GIL, and the pipeline cannot be checkpointed", node,
                    "write the function with TensorFlow ops")
            if any("Random" in c for c in called):
                random_map = node
    if training and not any(op in BATCHES for op in ops):
        add("TD008", "unbatched data fed to training: each step would see one example",
            chain[-1], "add `.batch(batch_size)` (tapeworks.data.pipeline does)")
    sliced = chain and chain[0].op in IN_MEMORY_SOURCES and not any(
        "Interleave" in op or "FlatMap" in op for op in ops)   # file names, then records
    if training and sliced and shuffle_seen is None and utility is not None:
        if utility.shuffle_fix:
            add("TD009", f"`{utility.name}` was called without shuffling: every epoch "
                "sees its examples in their stored order (sorted by class)", chain[0],
                f"pass {utility.shuffle_fix} to `{utility.name}`, or `.shuffle(n)` the "
                "dataset it returns")
    elif training and sliced and shuffle_seen is None:
        # Examples sliced from memory are in the order they were stored in
        # (often sorted by class or time); files are usually shuffled
        # upstream, and are left alone.
        add("TD009", "training examples sliced from memory are never shuffled: every epoch "
            "sees them in their stored order (sorted data gives batches of one class)",
            chain[0], "`.shuffle(len(examples))` before `.batch()` (or "
            "`tf.data.Dataset.from_tensor_slices(...).shuffle(n, reshuffle_each_iteration="
            "True)`)")
    # Correctness first; codes in order within each category.
    return sorted(findings, key=lambda f: (f.category != "correctness", f.code))


def built_by(graph):
    """The `utility_pipelines.UtilityPrefix` that built a pipeline's first steps, or None.

    `graph`: from `dataset_graph`.
    """
    functions = {f.signature.name: f for f in graph.library.function}
    return utility_pipelines.find(pipeline_chain(graph),
                                  lambda node: _called_ops(node, functions))


IN_MEMORY_SOURCES = {"TensorSliceDataset", "TensorDataset", "RangeDataset"}
# Steps that reorder, group or repeat elements without computing anything:
# nothing in them for tf.data's autotuning model to tune but a prefetch
# buffer, which tf.data's own prefetch autotuner sizes without the model.
NOTHING_TO_TUNE = ((SHUFFLES | BATCHES | CACHES) - {"ParallelBatchDataset"}) | {
    "PrefetchDataset", "RepeatDataset", "TakeDataset", "SkipDataset", "UnbatchDataset",
    "ShardDataset"}


def in_memory(graph):
    """True when a pipeline (a graph from `dataset_graph`) only slices tensors held in memory.

    Such a pipeline has nothing for tf.data's autotuning model to tune (see
    `tapeworks.data.without_autotuning`); any map, interleave, filter or
    file source makes it False.
    """
    chain = pipeline_chain(graph)
    return bool(chain) and chain[0].op in IN_MEMORY_SOURCES and all(
        node.op in NOTHING_TO_TUNE for node in chain[1:])


# Steps that keep only part of the source's elements: its arrays are not what is read.
SUBSETS = {"TakeDataset", "SkipDataset", "ShardDataset", "FilterDataset"}


def source_arrays(graph):
    """The arrays an in-memory pipeline slices (`in_memory`), flat in element order, or None.

    They are constants of the graph already read, so nothing is iterated
    (an iterator would advance a shuffle's seed and change the training
    order). None when a step keeps only part of them (take, skip, shard) or
    a component is not a constant; a component that is not numbers (strings)
    is None in the list.
    """
    if not in_memory(graph):
        return None
    chain = pipeline_chain(graph)
    if chain[0].op != "TensorSliceDataset" or any(node.op in SUBSETS for node in chain):
        return None
    nodes = {n.name: n for n in graph.node}
    arrays = []
    for name in chain[0].input:
        node = nodes.get(_input_name(name))
        if node is None or node.op != "Const":
            return None
        tensor = node.attr["value"].tensor
        dtype = tf.as_dtype(tensor.dtype)
        numbers = dtype.is_floating or dtype.is_integer or dtype.is_bool
        arrays.append(_const_array(tensor, dtype) if numbers else None)
    return arrays


def batch_size(graph):
    """The batch size an in-memory pipeline's one `.batch()` asks for, or None.

    Read from the batch node's constant input, so a last partial batch (no
    `drop_remainder`), which leaves the static batch dimension unknown,
    does not hide it.
    """
    nodes = {n.name: n for n in graph.node}
    batches = [node for node in pipeline_chain(graph) if node.op in BATCHES]
    if len(batches) != 1 or len(batches[0].input) < 2:
        return None
    size = _const_int(nodes.get(_input_name(batches[0].input[1])))
    return size if size and size > 0 else None


def _const_array(tensor, dtype):
    """A constant's value; a read-only view of its bytes where it has them (no copy to parse)."""
    content = tensor.tensor_content   # each read of the field copies its bytes
    if not content:
        return tf.make_ndarray(tensor)
    shape = [d.size for d in tensor.tensor_shape.dim]
    return np.frombuffer(content, dtype.as_numpy_dtype).reshape(shape)


def replays_identically(graph):
    """True when every new iterator of the pipeline yields the same batches in the same order.

    A pipeline in memory (`in_memory`) without a shuffle: nothing in it is
    random, so the batches a call drew can be drawn again from a new
    iterator (the non-finite guard's replay, `engine.rollback`).
    """
    chain = pipeline_chain(graph)
    return in_memory(graph) and not any(node.op in SHUFFLES for node in chain)


# Datasets that only carry options or bookkeeping: not steps of the pipeline.
BOOKKEEPING = {"OptionsDataset", "ModelDataset", "MaxIntraOpParallelismDataset",
               "PrivateThreadPoolDataset", "AssertCardinalityDataset", "ThreadPoolDataset"}


def pipeline_chain(graph):
    """The pipeline's dataset nodes (a graph from `dataset_graph`), source first.

    Follows each dataset's first input from the final one; datasets that only
    carry options or bookkeeping (`BOOKKEEPING`) are left out. For
    `range(8).map(f).batch(2)`: the RangeDataset, MapDataset and BatchDatasetV2 nodes.
    """
    return _chain({n.name: n for n in graph.node})


def _chain(nodes):
    """Dataset nodes from the source to the final one, following first inputs."""
    return [node for node in reversed(_main_path(nodes)) if node.op not in BOOKKEEPING]


def _main_path(nodes):
    """Every dataset node from the final one back to the source, following first inputs."""
    sink = next(n for n in nodes.values() if n.op == "_Retval")
    path = []
    node = nodes.get(_input_name(sink.input[0]))
    while node is not None and "Dataset" in node.op:
        path.append(node)
        inputs = [i for i in node.input if not i.startswith("^")]
        node = nodes.get(_input_name(inputs[0])) if inputs else None
    return path


def _input_name(name):
    return name.split(":")[0].lstrip("^")


def _called_ops(node, functions, seen=None):
    """Every op type run by the functions a dataset node calls, nested calls included."""
    seen = seen if seen is not None else set()
    ops = set()
    for attr in node.attr.values():
        names = [attr.func.name] if attr.func.name else []
        names += [f.name for f in attr.list.func]
        for name in names:
            ops |= _function_ops(name, functions, seen)
    return ops


def _function_ops(name, functions, seen):
    if name in seen or name not in functions:
        return set()
    seen.add(name)
    ops = set()
    for inner in functions[name].node_def:
        ops.add(inner.op)
        if inner.op in functions:
            ops |= _function_ops(inner.op, functions, seen)
        ops |= _called_ops(inner, functions, seen)
    return ops


def _generator_prefix(chain, functions):
    """Indices of the map that `Dataset.from_generator` builds for itself (not the user's)."""
    for index, node in enumerate(chain):
        if node.op == "FlatMapDataset" and _called_ops(node, functions) & PY_FUNCS:
            return set(range(index))
    return set()


def _check_buffer(node, nodes, chain, add):
    buffer = _const_int(nodes.get(_input_name(node.input[1]))) if len(node.input) > 1 else None
    examples = _source_examples(chain, nodes)
    if buffer is not None and examples and buffer < SMALL_SHUFFLE_SHARE * examples:
        add("TD006", f"shuffle buffer of {buffer} for {examples} examples: only neighbours "
            "are mixed", node,
            f"a buffer near the number of examples (`.shuffle({examples})`) when it fits "
            "in memory, or shuffle the files too (interleave)")


def _const_int(node):
    if node is None or node.op != "Const":
        return None
    tensor = node.attr["value"].tensor
    values = list(tensor.int64_val) or list(tensor.int_val)
    return int(values[0]) if values else None


def _source_examples(chain, nodes):
    """The number of examples of a from_tensor_slices source, when the graph says it."""
    if not chain or chain[0].op != "TensorSliceDataset":
        return None
    for name in chain[0].input:
        const = nodes.get(_input_name(name))
        if const is not None and const.op == "Const":
            dims = const.attr["value"].tensor.tensor_shape.dim
            if dims:
                return int(dims[0].size)
    return None
