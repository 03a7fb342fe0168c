"""Saving and resuming a whole training run: `fit(checkpoint_dir=...)`.

Keras' `BackupAndRestore` restarts an interrupted epoch from its first batch
on top of mid-epoch weights and restores neither the data position, the
random state nor the callbacks. Here a save holds everything the next step
depends on, so a run killed at any moment and restarted continues the
uninterrupted run exactly (the conditions are in the guide, docs/resume.md):

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
it costs the reads and one SaveV2 (`resume.ResumableRun._write_state`).
"""

import concurrent.futures
import errno
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

import numpy as np
import tensorflow as tf

from tapeworks.engine.resume.checkpoint_folder import (FORMAT, PREFIX, RUN, CheckpointError,
                                                CheckpointFolder, structure_difference,
                                                write_json)
from tapeworks.errors import ConfigError, CorrectnessWarning, warn

logger = logging.getLogger("tapeworks")

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


# When to save --------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Every:
    """`checkpoint_every`, parsed: every `steps` steps, every epoch, or every `seconds`."""

    steps: int | None = None
    seconds: float | None = None
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
    publish_seconds: float | None = None  # syncing, checksums, rename, retention (background when async)


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

    def restore(self, read_state, structure=None):
        """Loads the newest complete checkpoint; returns a `ResumePoint`, or None.

        `read_state(prefix)` restores the TensorFlow part. A checkpoint that
        fails its manifest or does not load is reported and the previous one
        tried; when checkpoints exist and none loads, `CheckpointError`.
        `structure`: the running model's (`TrainingState.structure_record`); a
        checkpoint saved with another is refused before anything is read
        (TensorFlow's restore would load a superset model's checkpoint into a
        smaller one silently).
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
                    difference = structure_difference(run.get("structure"), structure)
                    if difference is not None:
                        raise CheckpointError(
                            f"checkpoint_dir {self.folder.path} holds a run of another model: "
                            f"{os.path.basename(folder)} {difference}. Nothing was restored; "
                            "the model is unchanged. Expected the checkpoints of this model. "
                            "Fix: pass another checkpoint_dir, or resume=False, "
                            "overwrite=True to start this model over there (that deletes "
                            "them).")
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
            write_json(os.path.join(folder, RUN), run)

        if not self.chief:
            return self._save_as_worker(step, position, write_files, start)
        try:
            partial, final = self.folder.write(step, write_files)
        except (OSError, tf.errors.OpError) as error:
            # TensorFlow's own message (a ResourceExhaustedError with an
            # out-of-memory hint, 1.5k characters) is not chained: ours says it.
            raise _unwritten(step, self.folder.path, error) from None
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


def _unwritten(step, path, error):
    """The `CheckpointError` of a save whose files could not be written (disk full, permissions)."""
    full = isinstance(error, tf.errors.ResourceExhaustedError) or getattr(
        error, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
    try:
        free = f"{shutil.disk_usage(path).free / 2**20:.1f} MiB free"
    except OSError:
        free = "free space unknown"
    text = str(getattr(error, "message", None) or error).strip().splitlines()
    what = "the disk is full" if full else f"{type(error).__name__}: {text[0][:160] if text else ''}"
    return CheckpointError(
        f"The checkpoint of step {step} could not be written to {path}: {what} ({free} "
        "there). Nothing was lost: the checkpoints before it are intact (its unfinished files "
        "were removed) and the model is as trained. Expected a writable checkpoint_dir with "
        "room for one more checkpoint. Fix: free space there (or keep fewer: `keep=`) or pass "
        "another checkpoint_dir, then run the same command again to resume from the last "
        "complete checkpoint.")


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
