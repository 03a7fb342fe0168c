"""Saving and resuming a whole training run: `fit(checkpoint_dir=...)`.

Keras' `BackupAndRestore` restarts an interrupted epoch from its first batch
on top of mid-epoch weights and restores neither the data position, the
random state nor the callbacks. Here a save holds everything the next step
depends on, so a run killed at any moment and restarted continues the
uninterrupted run exactly (the conditions are in the README's "Resume"):

- `state`: a TensorFlow checkpoint of `trainer.checkpoint` (models,
  optimizers, accumulators, loss scale, counters, weightings) plus every
  variable `Layer.variables` holds beyond the weights (Keras `SeedGenerator`
  states: Dropout and friends), the metric accumulators of the running epoch,
  and the Task's own generator (`Task.random`);
- `data`: for a `tf.data` pipeline, its iterator (position, shuffle buffer,
  random state: tf.data's own iterator checkpointing, symbolic where it
  applies, so buffers of prefetched batches are not written). Array inputs are
  not saved: their order is a function of the run's seed and the epoch, so
  the position (passes started, batches drawn) replays it exactly;
- `run.json`: epoch, step and batches drawn in the epoch, the passes over the
  data started so far, the "auto" planner's choice, the callbacks' state, the
  run's seed and when it was saved; `callbacks.npz`: EarlyStopping's best
  weights;
- `MANIFEST.json`, written last: the size and CRC-32 of every other file.

A save is written into `ckpt-<step>.partial-<pid>` and renamed to
`ckpt-<step>` once complete and synced, so a kill at any moment leaves either
the previous checkpoints alone or a complete new one; leftovers of an
interrupted save are removed at the next start. A checkpoint whose files do
not match its manifest (truncated, corrupt) is reported and the previous one
is used; a folder where none loads is an error, never a silent fresh start.

TensorFlow's `CheckpointManager` keeps the newest N and writes a `checkpoint`
index file, but its save is not atomic across files (the index can name a
checkpoint whose data file a kill truncated) and it neither checksums nor
holds the non-TensorFlow state: hence this folder format, with
`tf.train.Checkpoint.write` for the TensorFlow part.

Saves can be asynchronous (`fit(checkpoint_async=True)`): the files are
written while training waits (they must hold the state of this step), and
the rest (fsync, checksums, manifest, rename, retention) runs on one
background thread. Not the default: on this project's 2-core machine it was
no faster (`tapeworks bench checkpoint`), the background thread taking the
cores training uses; it pays where syncing waits on a slow disk.
TensorFlow's own asynchronous checkpointing
(`CheckpointOptions(experimental_enable_async_checkpoint=True)`) would also
move the write off the training thread, but with Keras 3 variables its second
save fails (Keras' `Variable._copy_trackable_to_cpu` creates a new
`tf.Variable` inside TensorFlow's copy `tf.function`: "tf.function only
supports singleton tf.Variables created on the first call"; TensorFlow 2.21,
Keras 3.15), so the write stays on the training thread, traced once so that
it costs the reads and one SaveV2 (`Trainer._write_run_state`).
"""

import concurrent.futures
import dataclasses
import datetime
import json
import logging
import os
import re
import shutil
import signal
import tempfile
import threading
import time
import zlib

import numpy as np
import tensorflow as tf

from tapeworks.errors import ConfigError, CorrectnessWarning, TapeworksError, warn
from tapeworks.fileio import fsync_folder

logger = logging.getLogger("tapeworks")

FORMAT = 1
PREFIX = "ckpt-"
MANIFEST = "MANIFEST.json"
RUN = "run.json"
SEED = "seed.json"
_COMPLETE = re.compile(r"^ckpt-(\d{12})$")
_PARTIAL = re.compile(r"^ckpt-\d{12}\.partial-\d+$")
_REPLACED = re.compile(r"^(ckpt-\d{12})\.replaced-\d+$")

# The exit status after a save on SIGTERM or SIGINT: 128 + the signal's
# number, what a shell reports for a process the signal ended, so schedulers
# that read it as "preempted" keep doing so.
EXIT_SIGTERM = 128 + signal.SIGTERM
EXIT_SIGINT = 128 + signal.SIGINT

# Ops whose random state lives outside every variable: no checkpoint can
# restore it. (Keras' layers draw through stateless ops and a SeedGenerator
# variable; tf.random.Generator keeps its state in a variable too.)
GLOBAL_RANDOM_OPS = {
    "RandomStandardNormal": "tf.random.normal", "RandomUniform": "tf.random.uniform",
    "RandomUniformInt": "tf.random.uniform (integers)",
    "TruncatedNormal": "tf.random.truncated_normal", "RandomShuffle": "tf.random.shuffle",
    "Multinomial": "tf.random.categorical", "RandomGamma": "tf.random.gamma",
    "RandomPoissonV2": "tf.random.poisson",
    "ParameterizedTruncatedNormal": "tf.random.truncated_normal",
}


class CheckpointError(TapeworksError, RuntimeError):
    """A checkpoint folder holds checkpoints, and none of them can be loaded."""


# When to save --------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Every:
    """`checkpoint_every`, parsed: every `steps` steps, every epoch, or every `seconds`."""

    steps: int = None
    seconds: float = None
    epoch: bool = False

    def describe(self):
        if self.epoch:
            return "every epoch"
        if self.steps:
            return f"every {self.steps} steps"
        return f"every {self.seconds:g} s"


_UNITS = {"s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1, "m": 60, "min": 60,
          "mins": 60, "minute": 60, "minutes": 60, "h": 3600, "hr": 3600, "hour": 3600,
          "hours": 3600}


def parse_every(value):
    """An `Every` for `checkpoint_every`; a `ConfigError` for anything else."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return Every(steps=value)
    if value == "epoch":
        return Every(epoch=True)
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]+)\s*", value.lower())
        if match and match.group(2) in _UNITS and float(match.group(1)) > 0:
            return Every(seconds=float(match.group(1)) * _UNITS[match.group(2)])
    raise ConfigError(
        f"`checkpoint_every` must be a number of steps (an integer >= 1), \"epoch\", or a "
        f"duration with its unit such as \"90s\", \"10min\" or \"2h\". Received: "
        f"checkpoint_every={value!r}. Fix: e.g. checkpoint_every=1000 or "
        "checkpoint_every=\"10min\".")


# The folder ------------------------------------------------------------------------

def _crc32(path):
    """The file's CRC-32 (zlib).

    A checksum against truncation and corruption, not tampering: what
    TensorFlow's own checkpoints keep per tensor (CRC-32C). SHA-256 was
    tried first: 0.21 s of a 0.30 s save of the 60 MiB large-MLP checkpoint
    on this project's 2-core machine, against 0.06 s for CRC-32 (one-off
    measurement).
    """
    crc = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def _write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1, default=_json_default)
        f.flush()
        os.fsync(f.fileno())


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot store {type(value).__name__} in run.json")


class CheckpointFolder:
    """The checkpoints of one run: complete ones, interrupted ones, retention."""

    def __init__(self, path, keep=3):
        self.path = os.path.abspath(os.fspath(path))
        self.keep = keep

    def complete(self):
        """[(global step, folder)] of complete saves, oldest first."""
        if not os.path.isdir(self.path):
            return []
        found = []
        for name in os.listdir(self.path):
            match = _COMPLETE.match(name)
            if match and os.path.isdir(os.path.join(self.path, name)):
                found.append((int(match.group(1)), os.path.join(self.path, name)))
        return sorted(found)

    def partials(self):
        if not os.path.isdir(self.path):
            return []
        return [os.path.join(self.path, n) for n in os.listdir(self.path) if _PARTIAL.match(n)]

    def is_empty(self):
        return not os.path.isdir(self.path) or not os.listdir(self.path)

    def remove_partials(self):
        """Removes what interrupted saves left; returns how many.

        A checkpoint being replaced by a save of the same step is put back
        when the kill came between the two renames.
        """
        partials = self.partials()
        for path in partials:
            shutil.rmtree(path, ignore_errors=True)
        for name in os.listdir(self.path) if os.path.isdir(self.path) else []:
            match = _REPLACED.match(name)
            if match:
                original = os.path.join(self.path, match.group(1))
                if os.path.exists(original):
                    shutil.rmtree(os.path.join(self.path, name), ignore_errors=True)
                else:
                    os.rename(os.path.join(self.path, name), original)
        return len(partials)

    def clear(self):
        for step, path in self.complete():
            shutil.rmtree(path, ignore_errors=True)
        self.remove_partials()
        for name in (SEED,):
            if os.path.exists(os.path.join(self.path, name)):
                os.remove(os.path.join(self.path, name))

    def save(self, step, write_files):
        """Writes a checkpoint atomically; returns its folder (`write`, then `publish`)."""
        return self.publish(*self.write(step, write_files))

    def write(self, step, write_files):
        """The part of a save that must see the state as it is now: the files.

        `write_files(folder)` writes the content into a partial folder; returns
        (partial, final) for `publish`. Until it is published, a kill leaves a
        partial folder that the next start removes.
        """
        os.makedirs(self.path, exist_ok=True)
        final = os.path.join(self.path, f"{PREFIX}{step:012d}")
        partial = f"{final}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
        write_files(partial)
        return partial, final

    def publish(self, partial, final):
        """Makes a written checkpoint durable and complete; returns its folder.

        Syncs every file, writes the manifest (sizes and CRC-32) last, and
        renames the folder into place. Reads only files that are complete
        already, so it may run while training goes on (`RunCheckpointer`'s
        asynchronous saves).
        """
        files = {}
        for root, _, names in os.walk(partial):
            for name in names:
                full = os.path.join(root, name)
                with open(full, "rb+") as f:
                    os.fsync(f.fileno())
                files[os.path.relpath(full, partial)] = {
                    "bytes": os.path.getsize(full), "crc32": _crc32(full)}
        _write_json(os.path.join(partial, MANIFEST), {"format": FORMAT, "files": files})
        fsync_folder(partial)
        replaced = None
        if os.path.exists(final):
            # The same step saved again (the end of the run after a
            # step-count save caught its last step): the newer one replaces
            # it, the old one set aside until the new one is in place.
            replaced = f"{final}.replaced-{os.getpid()}"
            os.rename(final, replaced)
        os.rename(partial, final)
        fsync_folder(self.path)
        if replaced:
            shutil.rmtree(replaced, ignore_errors=True)
        return final

    def verify(self, folder):
        """None when `folder`'s files match its manifest, else what is wrong."""
        manifest_path = os.path.join(folder, MANIFEST)
        try:
            with open(manifest_path, encoding="utf-8") as f:
                manifest = json.load(f)
            files = manifest["files"]
        except FileNotFoundError:
            return "its MANIFEST.json is missing (the save did not finish)"
        except (OSError, ValueError, KeyError, TypeError) as error:
            return f"its MANIFEST.json cannot be read ({error})"
        for name, expected in files.items():
            path = os.path.join(folder, name)
            if not os.path.exists(path):
                return f"{name} is missing"
            size = os.path.getsize(path)
            if size != expected["bytes"]:
                return f"{name} has {size} bytes, {expected['bytes']} were written (truncated or changed)"
            if _crc32(path) != expected["crc32"]:
                return f"{name} does not match its checksum (corrupt)"
        return None

    def retain(self, best=None):
        """Removes all but the newest `keep` saves and the `best` folder."""
        saves = self.complete()
        keep = {path for _, path in saves[-self.keep:]} if self.keep else set()
        if best is not None:
            keep.add(best)
        for _, path in saves:
            if path not in keep:
                shutil.rmtree(path, ignore_errors=True)

    def seed(self, make):
        """The run's seed: stored at the first start, the same after every restart."""
        path = os.path.join(self.path, SEED)
        try:
            with open(path, encoding="utf-8") as f:
                return int(json.load(f)["seed"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        seed = make()
        os.makedirs(self.path, exist_ok=True)
        temporary = f"{path}.{os.getpid()}.tmp"
        _write_json(temporary, {"seed": seed})
        os.replace(temporary, path)
        return seed


# Callbacks' state --------------------------------------------------------------------

# What each stateful Keras callback keeps between epochs (read in their
# sources, keras/src/callbacks/*.py): numbers, restored as they were.
_CALLBACK_FIELDS = {
    "EarlyStopping": ("wait", "stopped_epoch", "best", "best_epoch"),
    "ReduceLROnPlateau": ("wait", "best", "cooldown_counter"),
    "ModelCheckpoint": ("best", "_last_batch_seen", "_batches_seen_since_last_saving"),
    "TensorBoard": ("_global_train_batch", "_previous_epoch_iterations"),
}


def callbacks_state(callbacks):
    """[{class, fields}] for `callbacks`, in order; and {name: array} of best weights."""
    states, arrays = [], {}
    for index, callback in enumerate(callbacks):
        name = type(callback).__name__
        fields = {}
        for field in _CALLBACK_FIELDS.get(name, ()):
            if hasattr(callback, field):
                value = getattr(callback, field)
                if isinstance(value, (int, float, np.generic)) and not isinstance(value, bool):
                    fields[field] = float(value) if isinstance(value, float) else value
        weights = getattr(callback, "best_weights", None) if name == "EarlyStopping" else None
        if weights is not None:
            for i, w in enumerate(weights):
                # A copy: written on the background thread while training goes on.
                arrays[f"{index}/{i}"] = np.array(w)
            fields["best_weights"] = len(weights)
        states.append({"class": name, "fields": fields})
    return states, arrays


def restore_callbacks_state(callbacks, states, arrays):
    """Puts the saved state back into the callbacks of the same classes, in order."""
    restored = []
    for index, (callback, saved) in enumerate(zip(callbacks, states)):
        if type(callback).__name__ != saved["class"]:
            continue
        for field, value in saved["fields"].items():
            if field == "best_weights":
                callback.best_weights = [arrays[f"{index}/{i}"] for i in range(value)]
            else:
                setattr(callback, field, value)
        if saved["fields"]:
            restored.append(saved["class"])
    return restored


# The data ----------------------------------------------------------------------------

def data_mode(prepared, checkpoint_data):
    """How the data position is saved: "replay" (arrays, or "skip") or "iterator".

    Raises `ConfigError` for data whose position cannot be saved.
    """
    from tapeworks.engine import inputs

    if checkpoint_data not in ("auto", "skip"):
        raise ConfigError(
            f"`checkpoint_data` must be \"auto\" or \"skip\". Received: "
            f"checkpoint_data={checkpoint_data!r}")
    if checkpoint_data == "skip" or prepared.kind == inputs.ARRAYS:
        return "replay"
    if prepared.kind != inputs.DATASET:
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
# measured to accept (TF 2.21; tests/resume/test_symbolic_data.py draws and
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


def global_random_ops(concrete_functions):
    """{op type: API name} of global stateful random ops in these traced functions."""
    found = {}
    for concrete in concrete_functions:
        graph = concrete.graph.as_graph_def()
        nodes = list(graph.node)
        for function in graph.library.function:
            nodes.extend(function.node_def)
        for node in nodes:
            if node.op in GLOBAL_RANDOM_OPS:
                found[node.op] = GLOBAL_RANDOM_OPS[node.op]
    return found


# What a resumed run starts from ----------------------------------------------------------

@dataclasses.dataclass
class ResumePoint:
    folder: str
    step: int              # the global step counter
    epoch: int             # the epoch to continue (0-based)
    steps_in_epoch: int    # steps of that epoch already trained
    samples_in_epoch: int
    passes: int            # iterators started over the training data before this one
    batches_drawn: int     # batches drawn from the current pass
    data: str              # "replay" or "iterator"
    run: dict              # the rest of run.json
    symbolic: bool = False  # the iterator was saved with tf.data's symbolic checkpointing

    def describe(self):
        saved = self.run.get("saved_at", "?")
        where = (f"epoch {self.epoch + 1}, step {self.steps_in_epoch} of the epoch"
                 if self.steps_in_epoch else f"the start of epoch {self.epoch + 1}")
        return (f"resumed from {self.folder} ({where}, global step {self.step}, saved "
                f"{saved})")


class PreemptionHandler:
    """SIGTERM/SIGINT during fit: note it; the loop saves after the running call and exits.

    A second SIGINT exits at once (KeyboardInterrupt), as a user pressing
    Ctrl-C twice expects. Installed only from the main thread (Python's
    rule); the previous handlers are put back when fit ends.
    """

    def __init__(self):
        self.signal = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGTERM, signal.SIGINT):
                self._previous[number] = signal.getsignal(number)
                signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc):
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}

    def _handle(self, number, frame):
        if self.signal is not None and number == signal.SIGINT:
            raise KeyboardInterrupt   # the second Ctrl-C: stop now
        self.signal = number
        logger.warning("tapeworks: %s received: saving after the running call, then exiting",
                       signal.Signals(number).name)


@dataclasses.dataclass
class SaveRecord:
    """One save of a fit (`Trainer.checkpoint_saves`)."""

    step: int
    folder: str
    seconds: float                 # how long the training waited for it
    publish_seconds: float = None  # syncing, checksums, rename, retention (background when async)


class RunCheckpointer:
    """The save/restore cycle of one `fit(checkpoint_dir=...)`.

    The Trainer asks it after every call (`due_after_call`) and every epoch
    (`due_after_epoch`) whether to save, and hands it what to write
    (`save`); it writes atomically and keeps the newest `keep` (and the best
    by `keep_best`). `restore` finds and loads the newest good checkpoint.
    """

    def __init__(self, directory, every="epoch", keep=3, keep_best=None, resume=True,
                 overwrite=False, checkpoint_data="auto", asynchronous=False, chief=True):
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ConfigError(f"`keep` must be an integer >= 1 (the newest checkpoints kept). "
                              f"Received: keep={keep!r}")
        if keep_best is not None and not isinstance(keep_best, str):
            raise ConfigError("`keep_best` must be None or the name of a logged metric, e.g. "
                              f"\"val_loss\". Received: keep_best={keep_best!r}")
        self.every = parse_every(every)
        self.folder = CheckpointFolder(directory, keep)
        # Under several workers only the chief writes into the folder (the
        # others write their state, whose reads are collective, to a
        # temporary folder they delete) and only it removes anything there;
        # every worker restores from it (a folder all of them can read).
        self.chief = bool(chief)
        self.keep_best = keep_best
        self.resume = bool(resume)
        self.checkpoint_data = checkpoint_data
        self.data = None             # "replay" or "iterator": `data_mode`
        self.symbolic_data = False   # iterator saved symbolically: `symbolic_checkpointing`
        self.preemption = PreemptionHandler()
        self._last_save_step = None
        self._last_save_time = time.monotonic()
        self._best = None            # (value, folder)
        self.last_position = None    # (epoch, steps into it) of the last save or restore
        self.save_at_epoch_end = False   # a save due on an epoch's last step, made at its end
        self._told_missing = False
        # Asynchronous saves: the files are written while the training
        # waits (they must hold the state as it is now); syncing, checksums,
        # the manifest, the rename and retention run on one background
        # thread while training goes on. One save in flight at a time: the
        # next save, the end of fit and a preemption exit wait for it.
        self.asynchronous = bool(asynchronous)
        self._publisher = None
        self._pending = None          # (SaveRecord, Future) of the save being published
        self.records = []             # a SaveRecord per save of this fit (`saves` counts them)
        if not self.resume and not self.folder.is_empty():
            if not overwrite:
                raise ConfigError(
                    f"checkpoint_dir {self.folder.path} is not empty and resume=False: starting "
                    "fresh would mix this run's checkpoints with another's. Expected an empty "
                    "or new folder. Fix: pass resume=True to continue that run, overwrite=True "
                    "to delete its checkpoints, or another checkpoint_dir.")
            if self.chief:
                self.folder.clear()

    # Restoring ------------------------------------------------------------------

    def run_seed(self, make):
        return self.folder.seed(make)

    def restore(self, read_state):
        """Loads the newest complete checkpoint; returns a `ResumePoint`, or None.

        `read_state(prefix)` restores the TensorFlow part. A checkpoint that
        fails its manifest or does not load is reported and the previous one
        tried; when checkpoints exist and none loads, `CheckpointError`.
        """
        removed = self.folder.remove_partials() if self.chief else 0
        if removed:
            logger.info("removed %d unfinished save(s) in %s", removed, self.folder.path)
        if not self.resume:
            return None
        saves = self.folder.complete()
        problems = []
        for step, folder in reversed(saves):
            problem = self.folder.verify(folder)
            if problem is None:
                try:
                    with open(os.path.join(folder, RUN), encoding="utf-8") as f:
                        run = json.load(f)
                    if run.get("format") != FORMAT:
                        raise ValueError(f"format {run.get('format')!r}, expected {FORMAT}")
                    read_state(os.path.join(folder, "state"))
                except (OSError, ValueError, KeyError, tf.errors.OpError, AssertionError) as error:
                    problem = f"it does not load ({type(error).__name__}: {str(error)[:300]})"
            if problem is not None:
                problems.append(f"{os.path.basename(folder)}: {problem}")
                warn(f"tapeworks: checkpoint {folder} is unusable: {problem}. Trying the one "
                     "before it.", CorrectnessWarning)
                continue
            self._last_save_step = step
            self.last_position = (run["epoch"], run["steps_in_epoch"])
            self._best = self._find_best(saves)
            return ResumePoint(folder=folder, step=step, epoch=run["epoch"],
                               steps_in_epoch=run["steps_in_epoch"],
                               samples_in_epoch=run["samples_in_epoch"],
                               passes=run["passes"], batches_drawn=run["batches_drawn"],
                               data=run["data"], run=run,
                               symbolic=run.get("symbolic_data", False))
        if saves:
            raise CheckpointError(
                f"No checkpoint in {self.folder.path} can be loaded: " + "; ".join(problems)
                + ". Expected at least one complete checkpoint (nothing was restored; the "
                "model is unchanged). Fix: restore a copy of the folder, or start over with "
                "resume=False, overwrite=True (this deletes them).")
        return None

    def _find_best(self, saves):
        """(value, folder) of the best kept save by `keep_best`, or None."""
        best = None
        for _, folder in saves:
            try:
                with open(os.path.join(folder, RUN), encoding="utf-8") as f:
                    value = json.load(f).get("monitored", {}).get(self.keep_best)
            except (OSError, ValueError, AttributeError):
                continue
            if value is not None and (best is None or _better(self.keep_best, value, best[0])):
                best = (value, folder)
        return best

    # Saving ---------------------------------------------------------------------

    def due_after_call(self, step):
        """Whether a save is due after a call that brought the global step to `step`."""
        if self.preemption.signal is not None:
            return True
        if self.every.steps:
            last = self._last_save_step or 0
            return step // self.every.steps > last // self.every.steps
        if self.every.seconds:
            return time.monotonic() - self._last_save_time >= self.every.seconds
        return False

    def due_after_epoch(self):
        return self.every.epoch or self.keep_best is not None

    def save(self, step, position, write_state, write_data, callbacks, logs=None):
        """Writes one checkpoint at global step `step`; returns its folder.

        With `asynchronous`, the folder is complete (published) once `wait`
        returns; until then a kill leaves the previous checkpoints as they were.
        """
        self.wait()
        start = time.perf_counter()
        states, arrays = callbacks_state(callbacks)
        best_value = None
        if logs is not None and self.keep_best is not None:
            if self.keep_best in logs:
                best_value = float(logs[self.keep_best])
            elif not self._told_missing:
                self._told_missing = True
                warn(f"tapeworks: keep_best={self.keep_best!r} is not among the logged values "
                     f"({', '.join(sorted(logs))}): no checkpoint is kept as the best. Fix: "
                     "one of those names (validation values appear after the first "
                     "validation).", CorrectnessWarning)

        run = dict(position, format=FORMAT, step=step, callbacks=states,
                   saved_at=datetime.datetime.now().isoformat(timespec="seconds"))
        if best_value is not None:
            run["monitored"] = {self.keep_best: best_value}

        def write_files(folder):
            # What changes as training goes on: written now.
            write_state(os.path.join(folder, "state"))
            if position["data"] == "iterator":
                write_data(os.path.join(folder, "data"))

        def write_rest(folder):
            # Held in memory already (the callbacks' arrays are copies).
            if arrays:
                np.savez(os.path.join(folder, "callbacks.npz"), **arrays)
            _write_json(os.path.join(folder, RUN), run)

        if not self.chief:
            return self._save_as_worker(step, position, write_files, start)
        partial, final = self.folder.write(step, write_files)
        if best_value is not None and (self._best is None or _better(
                self.keep_best, best_value, self._best[0])):
            self._best = (best_value, final)
        best = self._best[1] if self._best else None
        record = SaveRecord(step, final, 0.0)

        def publish():
            published = time.perf_counter()
            write_rest(partial)
            self.folder.publish(partial, final)
            self.folder.retain(best=best)
            record.publish_seconds = time.perf_counter() - published
            logger.info("saved %s", final)

        if self.asynchronous:
            if self._publisher is None:
                self._publisher = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="tapeworks-checkpoint")
            self._pending = (record, self._publisher.submit(publish))
        else:
            try:
                publish()
            except OSError as error:
                raise _unfinished(record, error) from error
        record.seconds = time.perf_counter() - start
        self.records.append(record)
        self._last_save_step = step
        self.save_at_epoch_end = False
        self.last_position = (position["epoch"], position["steps_in_epoch"])
        self._last_save_time = time.monotonic()
        return final

    def _save_as_worker(self, step, position, write_files, start):
        """A save on a worker that is not the chief: the same writes, into a folder deleted after.

        Writing reads every variable, and a variable summed across replicas
        (a metric's total) is read with a collective all workers must join.
        Returns the folder the chief publishes.
        """
        with tempfile.TemporaryDirectory(prefix="tapeworks-worker-save-") as scratch:
            write_files(scratch)
        final = os.path.join(self.folder.path, f"{PREFIX}{step:012d}")
        self.records.append(SaveRecord(step, final, time.perf_counter() - start))
        self._last_save_step = step
        self.save_at_epoch_end = False
        self.last_position = (position["epoch"], position["steps_in_epoch"])
        self._last_save_time = time.monotonic()
        return final

    @property
    def saves(self):
        """How many saves this fit has made."""
        return len(self.records)

    def wait(self):
        """Waits until the save in flight is complete; raises `CheckpointError` if it failed."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        record, future = pending
        try:
            future.result()
        except Exception as error:
            raise _unfinished(record, error) from error

    def close(self, raise_errors=True):
        """At the end of fit: the last save is complete; the background thread ends."""
        try:
            self.wait()
        except CheckpointError as error:
            if raise_errors:
                raise
            logger.error("%s", error)
        finally:
            if self._publisher is not None:
                self._publisher.shutdown(wait=True)
                self._publisher = None

    def read_callbacks(self, point):
        path = os.path.join(point.folder, "callbacks.npz")
        arrays = dict(np.load(path)) if os.path.exists(path) else {}
        return point.run.get("callbacks", []), arrays


def _unfinished(record, error):
    return CheckpointError(
        f"The checkpoint of step {record.step} ({record.folder}) could not be completed "
        f"({type(error).__name__}: {error}). Expected a writable checkpoint_dir with free "
        "space. The checkpoints before it are intact and the model is as trained. Fix: free "
        "space or fix the folder's permissions, then run the same command again to resume "
        "from the last complete checkpoint.")


def _better(name, new, old):
    """Keras' "auto" mode of ModelCheckpoint/EarlyStopping: accuracy-like rises, others fall."""
    rising = "acc" in name or name.startswith("fmeasure") or name.endswith("auc")
    return new > old if rising else new < old


def preempted_message(signal_number, folder, path):
    name = signal.Signals(signal_number).name
    return (f"tapeworks: {name}: saved {folder}. Run the same command again (same "
            f"checkpoint_dir={path!r}) to resume from there. Exiting with status "
            f"{128 + signal_number}.")
