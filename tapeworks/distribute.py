"""Which `tf.distribute` strategy a Trainer runs under, and the checks that it can.

tapeworks brings no engine of its own for several devices: it runs its step
through TensorFlow's `tf.distribute` (`MirroredStrategy` for the GPUs of one
machine, `MultiWorkerMirroredStrategy` for several machines configured by
`TF_CONFIG`). This module picks the strategy when the user names none, and
checks that the model and optimizer live in its scope, where their variables
are mirrored.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import keras
import tensorflow as tf

from tapeworks.engine.step import replicas
from tapeworks.errors import ConfigError, DataSpecError, PerformanceWarning, warn

logger = logging.getLogger("tapeworks")


def cluster_workers(tf_config=None):
    """The number of workers (chief included) that `TF_CONFIG` names; 0 without one."""
    text = os.environ.get("TF_CONFIG", "") if tf_config is None else tf_config
    if not text.strip():
        return 0
    try:
        cluster = json.loads(text).get("cluster", {})
    except (ValueError, AttributeError):
        raise ConfigError(
            f"TF_CONFIG is not valid JSON: {text[:120]!r}. Expected e.g. "
            '{"cluster": {"worker": ["host1:port", "host2:port"]}, "task": {"type": "worker", '
            '"index": 0}}. Fix: set it as a cluster launcher (Kubeflow TFJob) does, or use '
            "`tapeworks launch --workers N`.") from None
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def choose(*, tf_config=None, gpus=None):
    """(strategy, why): what tapeworks runs on when no strategy is given.

    `TF_CONFIG` with several workers gives `MultiWorkerMirroredStrategy`,
    several visible GPUs give `MirroredStrategy`, otherwise the default
    strategy (one device). Where it creates a strategy, that strategy must
    come first in the program: `tapeworks.distribute.strategy()` at the top
    of the script, models built under its scope.
    """
    workers = cluster_workers(tf_config)
    if workers > 1:
        try:
            chosen = tf.distribute.MultiWorkerMirroredStrategy()
        except (RuntimeError, ValueError) as error:
            raise ConfigError(
                f"TF_CONFIG names a cluster of {workers} workers, but "
                f"MultiWorkerMirroredStrategy could not be created now ({error}). It must "
                "be created before TensorFlow runs anything. Fix: call `strategy = "
                "tapeworks.distribute.strategy()` at the top of the script and build the "
                "model and optimizer under `with strategy.scope():`.") from None
        return chosen, f"TF_CONFIG names a cluster of {workers} workers"
    gpus = len(tf.config.list_logical_devices("GPU")) if gpus is None else gpus
    if gpus > 1:
        return tf.distribute.MirroredStrategy(), f"{gpus} GPUs are visible"
    return tf.distribute.get_strategy(), (
        "one device" + (" (one GPU)" if gpus == 1 else " (no GPU)"))


def strategy() -> tf.distribute.Strategy:
    """The strategy a tapeworks script should run under; call it first, build under its scope.

    Example:

    ```python
    strategy = tapeworks.distribute.strategy()   # reads TF_CONFIG and the GPUs
    with strategy.scope():
        model = build_model()
        trainer = tapeworks.Trainer(model, "adam", "mse")
    trainer.fit(x, y, batch_size=64 * strategy.num_replicas_in_sync)
    ```
    """
    if tf.distribute.has_strategy():
        return tf.distribute.get_strategy()
    chosen, why = choose()
    logger.info("tapeworks: running under %s: %s", type(chosen).__name__, why)
    return chosen


def resolve(given, model_strategy=None):
    """(strategy, why) for a Trainer: the one given, the one in scope, the model's, or `choose()`.

    `model_strategy`: a Keras model's `distribute_strategy`, the strategy in
    whose scope it was created, which Keras' `fit` uses wherever it is called
    (`with strategy.scope(): model = ...` then `model.fit(...)` outside it).
    """
    if given is not None:
        if not isinstance(given, tf.distribute.Strategy):
            raise ConfigError(
                f"`strategy` must be a tf.distribute.Strategy. Received: "
                f"{type(given).__name__}. Fix: e.g. strategy=tf.distribute.MirroredStrategy().")
        _check_supported(given)
        if tf.distribute.has_strategy() and tf.distribute.get_strategy() is not given:
            raise ConfigError(
                f"The Trainer was given {type(given).__name__} but created under the scope of "
                f"another strategy ({type(tf.distribute.get_strategy()).__name__}). Expected "
                "one strategy. Fix: pass the strategy whose scope you are in, or none.")
        return given, "given"
    if tf.distribute.has_strategy():
        _check_supported(tf.distribute.get_strategy())
        return tf.distribute.get_strategy(), "the scope the Trainer was created in"
    if model_strategy is not None and model_strategy is not tf.distribute.get_strategy():
        _check_supported(model_strategy)
        return model_strategy, "the scope the model was created in"
    return choose()


def _check_supported(strategy):
    """ParameterServerStrategy trains through its own coordinator: refused with the reason."""
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        raise ConfigError(
            "ParameterServerStrategy is not supported: its training runs through a "
            "ClusterCoordinator that schedules steps on remote workers, not through a step "
            "every worker runs in lockstep. Expected MirroredStrategy, "
            "MultiWorkerMirroredStrategy, OneDeviceStrategy or the default strategy. Fix: use "
            "MultiWorkerMirroredStrategy for several machines (`tapeworks.distribute.strategy()` "
            "picks it from TF_CONFIG), or Keras' `model.fit` for parameter-server training.")


def check_in_scope(strategy, models, optimizers):
    """Raises `ConfigError` when a model or optimizer was built outside `strategy`'s scope.

    Their variables would then be ordinary ones on one device: the
    replicas would not share them, and updates would be applied once per
    replica.
    """
    if not replicas.is_replicated(strategy):
        return
    name = type(strategy).__name__
    for model in models:
        for weight in model.weights:
            if not strategy.extended.variable_created_in_scope(_tf_variable(weight)):
                raise ConfigError(
                    f"`{model.name}` was built outside the scope of {name}: its weight "
                    f"{weight.path!r} is an ordinary variable, which the replicas would not "
                    "share. Expected every model built under the strategy's scope. Fix: "
                    "create (and build) the model inside `with strategy.scope():`, then "
                    "create the Trainer there too.")
    for optimizer in optimizers:
        if getattr(optimizer, "_distribution_strategy", strategy) is not strategy:
            raise ConfigError(
                f"The optimizer {type(optimizer).__name__} was created outside the scope of "
                f"{name}, so its updates would not be synchronised. Expected it created under "
                "the strategy's scope. Fix: create it inside `with strategy.scope():`, or "
                "pass its name (optimizer=\"adam\") and the Trainer creates it there.")


def worker_count(strategy):
    """How many worker processes `strategy` spans: 1 but under MultiWorkerMirroredStrategy."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return 1
    spec = resolver.cluster_spec()
    return sum(spec.num_tasks(job) for job in spec.jobs if job in ("chief", "worker")) or 1


def is_chief(strategy):
    """Whether this process writes checkpoints: the chief (worker 0 without a chief)."""
    return bool(strategy.extended.should_checkpoint)


_AGREE: dict[int, tuple[Any, Any]] = {}   # id(strategy) -> its traced agreement function


def agreed_sum(strategy, values):
    """The sum over workers of each worker's `values` (integers < 2**53), on every worker.

    One all-reduce of a few numbers: how workers that each decide something
    locally (a signal arrived, a save is due by the clock, the chief's seed)
    come to one decision. Every worker must call it at the same point.
    (`tf.distribute.ReduceOp` has SUM and MEAN only: a flag's sum says
    whether any worker raised it; a value only the chief adds is the chief's.)
    """
    if worker_count(strategy) == 1:
        return [int(v) for v in values]
    key = id(strategy)
    if key not in _AGREE:
        def agree(local):
            return strategy.run(lambda v: tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, tf.identity(v)), args=(local,))

        _AGREE[key] = (strategy, tf.function(agree, autograph=False))
    local = tf.constant([float(v) for v in values], tf.float64)
    result = strategy.experimental_local_results(_AGREE[key][1](local))[0]
    # Each worker's replicas all add the worker's values: divide them out.
    per_worker = strategy.num_replicas_in_sync // worker_count(strategy)
    return [int(round(v / per_worker)) for v in result.numpy()]


# tf.data's file readers: what FILE sharding splits between workers.
_READERS = {"TFRecordDataset", "TFRecordDatasetV2", "TextLineDataset",
            "FixedLengthRecordDataset", "FixedLengthRecordDatasetV2"}


def shardable(dataset, workers):
    """`dataset`, able to be split between `workers` workers, or a `DataSpecError` saying why not.

    tf.data's auto-shard policy (AUTO, the default) gives each worker whole
    files when the pipeline reads files, and fails at the first batch, deep
    in the graph, when there are fewer files than workers. Found here first:
    under AUTO, such a pipeline is sharded by data instead (each worker reads
    every file and keeps its share, which works at the cost of reading
    everything everywhere: a `PerformanceWarning` says so); a policy set to
    FILE explicitly is an error with the fix. In-memory data is sharded by
    data already.
    """
    from tapeworks.data.pipeline_check import dataset_graph
    from tapeworks.data.sources import tfrecord_files_in

    policy = dataset.options().experimental_distribute.auto_shard_policy
    by = tf.data.experimental.AutoShardPolicy
    if workers < 2 or policy not in (by.AUTO, by.FILE) or _holds_tensors(dataset):
        return dataset
    graph = dataset_graph(dataset)
    ops = {node.op for node in graph.node} | {
        node.op for function in graph.library.function for node in function.node_def}
    if not ops & _READERS or "MatchingFiles" in ops:
        # No files, or files listed when the pipeline runs (`list_files`): tf.data decides.
        return dataset
    files = tfrecord_files_in(dataset)
    if len(files) >= workers:
        return dataset
    if policy == by.FILE:
        raise DataSpecError(
            f"The training pipeline reads {len(files)} file(s) and asks for FILE sharding "
            f"between {workers} workers: some workers would get no file. Expected at least "
            f"{workers} files. Fix: split the data into {workers} or more files, or shard by "
            "data: `options = tf.data.Options(); options.experimental_distribute."
            "auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA; dataset = "
            "dataset.with_options(options)`.")
    warn(f"tapeworks: the training pipeline reads {len(files)} file(s) for {workers} "
         "workers, too few to give each worker files of its own: it is sharded by data "
         "instead (every worker reads every file and keeps its share). Fix: write the data "
         f"into at least {workers} files (better: many more) for sharding by file.",
         PerformanceWarning)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = by.DATA
    return dataset.with_options(options)


def _holds_tensors(dataset):
    """Whether the pipeline starts from tensors in memory (arrays), and reads no file.

    Walked in Python, not through the graph, which would copy those tensors.
    A file reader's own inputs (its list of names) are not looked into.
    """
    stack, seen, tensors = [dataset], set(), False
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        name = type(current).__name__.lstrip("_")
        if any(name.startswith(reader.replace("V2", "")) for reader in _READERS):
            return False
        inputs = current._inputs() if hasattr(current, "_inputs") else []
        tensors = tensors or (not inputs and name in ("TensorSliceDataset", "TensorDataset"))
        stack.extend(inputs)
    return tensors


def _tf_variable(weight):
    return weight.value if isinstance(weight, keras.Variable) else weight


def per_replica_batch_size(global_batch_size, strategy=None):
    """The batch each replica computes for a global batch, checked to split evenly.

    tapeworks' `batch_size` is the global batch, as in Keras' `fit` under a
    strategy: the dataset's batches are split across the replicas. An uneven
    split weighs the samples of the smaller shares more (each replica's loss
    is the mean over its share), so the global batch must be a multiple of
    the replica count.
    """
    strategy = strategy or tf.distribute.get_strategy()
    count = strategy.num_replicas_in_sync
    if not isinstance(global_batch_size, int) or isinstance(global_batch_size, bool) \
            or global_batch_size < 1:
        raise ConfigError(
            f"`global_batch_size` must be an integer >= 1. Received: {global_batch_size!r}.")
    if global_batch_size % count:
        raise ConfigError(
            f"The global batch of {global_batch_size} (fit's batch_size or "
            f"global_batch_size, the batch over all replicas) does not split evenly over "
            f"{count} replicas. Expected a multiple of {count}. Fix: use "
            f"{max(count, global_batch_size // count * count)} or "
            f"{(global_batch_size // count + 1) * count}.")
    return global_batch_size // count


def linear_scaling(
        base_learning_rate: float, base_batch_size: int, global_batch_size: int,
        warmup_steps: int = 0) -> float | keras.optimizers.schedules.LearningRateSchedule:
    """The linear scaling rule with warm-up (Goyal et al., 2017), as a Keras schedule.

    A learning rate tuned at `base_batch_size` is multiplied by
    `global_batch_size / base_batch_size`; over the first `warmup_steps`
    updates it rises linearly from the base rate to the scaled one (large
    scaled rates diverge early otherwise), then stays there. Pass the result
    as the optimizer's learning rate; it is opt-in: the rule is a starting
    point that works for SGD-like optimizers, not a law (Adam often needs
    less, e.g. the square root).

    Keras' `CosineDecay` already has this warm-up; with `alpha=1` its decay
    phase is flat, which is the rule exactly.
    """
    for name, value in (("base_batch_size", base_batch_size),
                        ("global_batch_size", global_batch_size)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"`{name}` must be an integer >= 1. Received: {value!r}.")
    if not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ConfigError(f"`warmup_steps` must be an integer >= 0. Received: {warmup_steps!r}.")
    scaled = float(base_learning_rate) * global_batch_size / base_batch_size
    if warmup_steps == 0:
        return scaled
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=float(base_learning_rate), decay_steps=1, alpha=1.0,
        warmup_target=scaled, warmup_steps=warmup_steps)


def synchronize_batchnorm(models):
    """Makes every BatchNormalization layer of `models` use the global batch's statistics.

    Keras' own `synchronized=True`, set on each layer (it is read when the
    layer is called): the mean and variance are all-reduced across replicas,
    so the statistics are those of the global batch, as on one device.
    Returns the layers changed.
    """
    from tapeworks.engine.step.task import layers_of

    changed = []
    for layer in layers_of(list(models), include_self=True):
        if isinstance(layer, keras.layers.BatchNormalization) and not layer.synchronized:
            layer.synchronized = True
            changed.append(layer)
    return changed


class Replication:
    """The host-side decisions of one Trainer's strategy (Lightning Fabric's `Strategy`).

    How batches are split between replicas and workers (`iterate`,
    `local_batch`, `global_batch`), how workers agree (`agree`), which
    worker writes (`is_chief`), and the one line that says so (`announce`).
    """

    def __init__(self, strategy, reason):
        self.strategy = strategy
        self.reason = reason                  # why this strategy (`resolve`)
        self.replicated = replicas.is_replicated(strategy)
        self.per_replica_batch_size = None    # once a fit knows the batch
        self._shardable = {}                  # id(dataset) -> (dataset, as sharded)
        self._announced = False

    def scope(self):
        return self.strategy.scope()

    @property
    def workers(self):
        return worker_count(self.strategy)

    @property
    def is_chief(self):
        return is_chief(self.strategy)

    def agree(self, values):
        """`agreed_sum`: each of `values` summed over workers, on every worker."""
        return agreed_sum(self.strategy, values)

    def global_batch(self, batch_size, global_batch_size):
        """`batch_size` for fit, checked to split evenly over the replicas."""
        if global_batch_size is not None:
            if batch_size is not None and batch_size != global_batch_size:
                raise ConfigError(
                    f"batch_size={batch_size} and global_batch_size={global_batch_size} "
                    "disagree. Both are the batch over all replicas. Fix: pass one of them.")
            batch_size = global_batch_size
        if batch_size is not None and self.replicated:
            self.per_replica_batch_size = per_replica_batch_size(batch_size, self.strategy)
        return batch_size

    def announce(self, batch_size, verbose):
        """Under a replicated strategy: how many replicas, why, each one's batch (printed once)."""
        if not self.replicated:
            return
        count = self.strategy.num_replicas_in_sync
        batch = (f"global batch {batch_size}, {batch_size // count} per replica"
                 if batch_size else "each of the dataset's batches split across them")
        line = (f"tapeworks: training on {count} replica{'s' if count != 1 else ''} under "
                f"{type(self.strategy).__name__} ({self.reason}); {batch}")
        logger.info("%s", line)
        if verbose and not self._announced:
            self._announced = True
            print(line)

    def iterate(self, dataset):
        """An iterator over `dataset`: each batch split across the replicas under a strategy.

        The dataset yields global batches; `experimental_distribute_dataset`
        gives each replica its share, and under MultiWorkerMirroredStrategy
        each worker its shard (tf.data's auto-shard policy: by file where the
        pipeline reads files, else by data).
        """
        if not self.replicated:
            return iter(dataset)
        workers = self.workers
        if workers == 1 and self.strategy.num_replicas_in_sync == 1:
            # One replica takes the whole batch: nothing to split. The
            # distributed iterator is not free even then: with it, whole
            # fits of the large bench MLP under MirroredStrategy(["/cpu:0"])
            # ran at either 40 or 65 ms a step, from fit to fit, where the
            # plain iterator ran each at 39-44 ms, as without a strategy
            # (one process, the two alternated; the same with
            # `experimental_fetch_to_device=False`).
            return iter(dataset)
        if workers > 1:
            # Checked once per dataset: it walks the pipeline's graph.
            checked = self._shardable.get(id(dataset))
            if checked is None or checked[0] is not dataset:
                checked = (dataset, shardable(dataset, workers))
                self._shardable = {id(dataset): checked}
            dataset = checked[1]
        return iter(self.strategy.experimental_distribute_dataset(dataset))

    def local_batch(self, batch):
        """A batch as drawn from `iterate`, as one batch: this worker's replicas' shares joined."""
        if not self.replicated:
            return batch
        return tf.nest.map_structure(
            lambda t: tf.concat(self.strategy.experimental_local_results(t), axis=0), batch)
