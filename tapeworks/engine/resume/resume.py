"""What `fit(checkpoint_dir=)` saves and restores, and when a fit asks.

`ResumableRun` wraps one fit's `run_checkpoint.RunCheckpointer` with what the
Trainer knows: the training state to write (`TrainingState.run_checkpoint()`),
the plan's choice, the data's position, the callbacks' state, the agreement
between workers. `NoResume` has the same methods, doing only what a fit
without a folder needs, so `Trainer.fit` keeps one flow (Orbit's controller
treats a checkpoint save the same way: an action after each inner loop, not a
branch of it).
"""

import dataclasses
import logging
import os
import signal
import sys

import keras
import tensorflow as tf

from tapeworks.engine.inputs import data_position
from tapeworks.engine.resume import run_checkpoint
from tapeworks.engine.step.traced import Traced
from tapeworks.errors import ConfigError, CorrectnessWarning, DataSpecError, warn

logger = logging.getLogger("tapeworks")


def refuse_backup_and_restore(callbacks):
    for callback in callbacks or []:
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            raise ConfigError(
                "keras.callbacks.BackupAndRestore was passed with checkpoint_dir. They "
                "would both restore the run, and BackupAndRestore restarts an interrupted "
                "epoch from its first batch on mid-epoch weights. Expected one of them. "
                "Fix: drop BackupAndRestore; checkpoint_dir saves and resumes everything "
                "it does, and the data position, random state and callbacks' state too.")


def open_run(checkpoint_dir, replication, state, plan, compiled, config, callbacks, **options):
    """The save/resume cycle of one fit: a `ResumableRun`, or `NoResume` without a folder."""
    if checkpoint_dir is None:
        return NoResume(replication)
    return ResumableRun(replication, state, plan, compiled, config, callbacks, checkpoint_dir,
                        **options)


class NoResume:
    """A fit without `checkpoint_dir`: nothing saved, nothing restored."""

    data_position_mode = None
    records = ()

    def __init__(self, replication):
        self.replication = replication

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def seed(self, current):
        """The run's data seed: `current`, or one agreed between workers when there is none.

        Several workers shuffle with the chief's seed, or their shards would overlap.
        """
        if current is not None or self.replication.workers == 1:
            return current
        return self._agreed_seed(lambda make: make())

    def _agreed_seed(self, keep):
        replication = self.replication
        seed = 0
        if replication.is_chief:
            seed = keep(lambda: int.from_bytes(os.urandom(4), "little"))
        if replication.workers > 1:
            seed = replication.agree([seed])[0]
        return seed

    def restore(self, data):
        """The `ResumePoint` to resume from (None) and the `FitData` to train on (`data`)."""
        return None, data

    def iterator_reader(self, point):
        return None

    def resume_from(self, point, verbose):
        return 0

    def restore_callbacks(self, callbacks, point):
        pass

    def start_epoch(self, batches):
        batches.start_epoch()

    def after_call(self, host_step, batches, epoch, steps_done, samples_done, epoch_ends):
        pass

    def after_epoch(self, host_step, batches, epoch, epochs, stop_training, logs):
        pass

    def finish(self, host_step, batches, finished):
        """The end of a fit that trained to its end: the data's iterator is let go."""
        batches.close()


class ResumableRun(NoResume):
    """One fit with `checkpoint_dir`: restores at its start, saves after calls and epochs."""

    def __init__(self, replication, state, plan, compiled, config, callbacks, directory,
                 **options):
        super().__init__(replication)
        refuse_backup_and_restore(callbacks)
        self.checkpointer = run_checkpoint.RunCheckpointer(
            directory, chief=replication.is_chief, **options)
        self.state = state
        self.plan = plan
        self.compiled = compiled
        self.config = config
        self.callbacks = list(callbacks or [])   # saved and restored in this order
        self.records = self.checkpointer.records
        self.data_seed = None
        self.last_checkpoint = None
        self._before_resume = None   # the variables' values before a resume, until it fits
        self._state_writer = None    # (structure, its write as a tf.function)

    @property
    def data_position_mode(self):
        """How the data's position is saved: "replay" (from the seed) or "iterator"."""
        return self.checkpointer.data

    def __enter__(self):
        self.checkpointer.preemption.__enter__()
        return self

    def __exit__(self, kind, error, traceback):
        try:
            # After an error, the save in flight still completes (it holds
            # good state); the error that stopped fit is the one raised.
            self.checkpointer.close(raise_errors=kind is None)
        finally:
            self.checkpointer.preemption.__exit__(kind, error, traceback)
        return False

    def seed(self, current):
        # Array inputs are replayed from the seed on resume: a run without
        # one gets one, kept in the checkpoint folder.
        self.data_seed = (current if current is not None
                          else self._agreed_seed(self.checkpointer.run_seed))
        return self.data_seed

    # Restoring ---------------------------------------------------------------------

    def restore(self, data):
        checkpointer, workers = self.checkpointer, self.replication.workers
        checkpointer.data = data_position.data_mode(data.train, checkpointer.checkpoint_data)
        if checkpointer.data == "iterator" and workers > 1:
            raise ConfigError(
                f"checkpoint_dir with a tf.data pipeline under {workers} workers: tf.data's "
                "iterator checkpoint holds one worker's position in its own shard, which "
                "the chief's checkpoint cannot hold for every worker. Expected arrays "
                "(replayed from the run's seed on any number of workers) or "
                "checkpoint_data=\"skip\". Fix: pass checkpoint_data=\"skip\" (the "
                "pipeline is re-created and the batches already trained are skipped: exact "
                "for a pipeline in a fixed order), or arrays.")
        point = checkpointer.restore(self.read_state, self.state.structure_record())
        if checkpointer.data == "iterator":
            saved = (point.symbolic if point is not None and point.data == "iterator"
                     and point.passes else None)
            train, checkpointer.symbolic_data = data_position.checkpointable(data.train, saved)
            data = dataclasses.replace(data, train=train)
        return point, data

    def read_state(self, prefix):
        """Restores a saved run state; on failure puts every variable back as it was."""
        state = self.state
        before = state.values_of(state.mutable_variables())
        try:
            state.run_checkpoint().read(prefix).assert_existing_objects_matched()
        except Exception:
            state.put_back(before)
            raise
        # Until the data is positioned too (the first epoch's start): a data
        # position that does not fit puts every variable back as well.
        self._before_resume = before

    def resume_from(self, point, verbose):
        """Applies a restored run's choice of mode; says where it resumed. Returns its epoch."""
        saved_seed = point.run.get("seed")
        if point.data == "replay" and saved_seed != self.data_seed:
            warn(f"tapeworks: the checkpoint's run shuffled with seed {saved_seed}, this trainer "
                 f"with {self.data_seed}: the resumed epochs see the data in another order "
                 "than the uninterrupted run would have. Fix: Trainer(seed=...) as in the run "
                 "that saved it.", CorrectnessWarning)
        self.plan.adopt_checkpointed(point.run.get("planner"))
        message = f"tapeworks: {point.describe()}"
        if verbose:
            print(message)
        logger.info("%s", message)
        return point.epoch

    def restore_callbacks(self, callbacks, point):
        """After on_train_begin, which resets EarlyStopping and friends."""
        if point is None:
            return
        restored = run_checkpoint.restore_callbacks_state(
            self.callbacks, *self.checkpointer.read_callbacks(point))
        if restored:
            logger.info("restored the state of %s", ", ".join(restored))

    def iterator_reader(self, point):
        """How the saved tf.data iterator is read back into a new iterator (or None)."""
        if point is None or point.data != "iterator" or not point.passes:
            return None
        prefix = os.path.join(point.folder, "data")
        return lambda iterator: tf.train.Checkpoint(iterator=iterator).read(
            prefix).assert_consumed()

    def start_epoch(self, batches):
        try:
            batches.start_epoch()
        except DataSpecError:
            if self._before_resume is not None:
                # The checkpoint's data position does not fit this data:
                # nothing trained, the model is as it was before fit.
                self.state.put_back(self._before_resume)
            raise
        finally:
            self._before_resume = None

    # Saving ----------------------------------------------------------------------------

    def after_call(self, host_step, batches, epoch, steps_done, samples_done, epoch_ends):
        checkpointer = self.checkpointer
        if not self._agreed(checkpointer.due_after_call(host_step)):
            return
        if epoch_ends and checkpointer.preemption.signal is None:
            # The epoch's last step: saved at the epoch's end, once, after
            # its validation and epoch callbacks.
            checkpointer.save_at_epoch_end = True
        else:
            self._save(host_step, batches, epoch, steps_done, samples_done)
            self._exit_if_preempted()

    def after_epoch(self, host_step, batches, epoch, epochs, stop_training, logs):
        checkpointer = self.checkpointer
        if self._agreed(checkpointer.due_after_epoch() or checkpointer.save_at_epoch_end
                        or checkpointer.preemption.signal is not None):
            # A run a callback stopped is saved as finished: running the
            # command again must not train on past EarlyStopping.
            self._save(host_step, batches, epochs if stop_training else epoch + 1, 0, 0,
                       logs=logs)
            self._exit_if_preempted()

    def finish(self, host_step, batches, finished):
        if self.checkpointer.last_position != (finished, 0):
            # The end of the run is saved too: running the command again
            # finds the run finished instead of repeating its tail (or the
            # end of its last epoch: validation, epoch callbacks).
            self._save(host_step, batches, finished, 0, 0)
        super().finish(host_step, batches, finished)
        self._exit_if_preempted()

    def _save(self, host_step, batches, epoch, steps_in_epoch, samples_in_epoch, logs=None):
        checkpointer = self.checkpointer
        if checkpointer.saves == 0 and not self.config.run_eagerly:
            self._warn_global_random_ops()
        position = {"epoch": epoch, "steps_in_epoch": steps_in_epoch,
                    "samples_in_epoch": samples_in_epoch, "passes": batches.passes,
                    "batches_drawn": batches.drawn, "data": checkpointer.data,
                    "symbolic_data": checkpointer.symbolic_data,
                    "planner": self.plan.saved_choice(), "seed": self.data_seed,
                    "structure": self.state.structure_record()}
        self.last_checkpoint = checkpointer.save(
            host_step, position, self._write_state,
            lambda prefix: tf.train.Checkpoint(iterator=batches.current).write(prefix),
            self.callbacks, logs=logs)

    def _write_state(self, prefix):
        """Writes `run_checkpoint()`: eagerly the first time, then as a traced tf.function.

        An eager `Checkpoint.write` walks the object graph in Python on every
        save (18 ms for the small bench MLP, against 4.6 ms traced: `tapeworks
        bench checkpoint`); traced once, a save is the graph's reads and one
        SaveV2. The trace (about 0.1 s) is paid at the second save, when
        saves are known to repeat, and again only if the state's structure
        changes (a traced write would leave new variables out).
        """
        state = self.state.run_checkpoint()
        structure = self.state.structure()
        if self._state_writer is not None and self._state_writer[0] == structure:
            self._state_writer[1](tf.constant(prefix))
            return
        state.write(prefix)
        # `Traced`: keyed by this trainer, so TensorFlow's retracing
        # warning does not count every trainer's writer as one function.
        self._state_writer = (structure, tf.function(
            Traced(state.write), input_signature=[tf.TensorSpec([], tf.string)],
            autograph=False))

    def _agreed(self, due):
        """Whether to save now: `due`, agreed between workers, with any worker's preemption.

        One worker alone decides from its clock (`checkpoint_every` a
        duration) and its signals; a save reads variables with collectives
        every worker must join, so under several workers the decision is one
        small all-reduce: any worker's due save or SIGTERM makes every worker
        save at the same step (and, after a signal, exit).
        """
        preemption = self.checkpointer.preemption
        if self.replication.workers == 1:
            return due
        signalled, wanted = self.replication.agree(
            [int(preemption.signal is not None), int(due)])
        if signalled and preemption.signal is None:
            # Another worker was signalled: this one saves and exits with it.
            preemption.signal = signal.SIGTERM
        return bool(wanted or signalled)

    def _exit_if_preempted(self):
        number = self.checkpointer.preemption.signal
        if number is None:
            return
        self.checkpointer.close()    # the message names a complete checkpoint
        print(run_checkpoint.preempted_message(number, self.last_checkpoint,
                                               self.checkpointer.folder.path), file=sys.stderr)
        sys.stderr.flush()
        raise SystemExit(128 + number)

    def _warn_global_random_ops(self):
        found = run_checkpoint.global_random_ops(self.compiled.train_concrete_functions())
        if found:
            names = ", ".join(f"{api} (op {op})" for op, api in sorted(found.items()))
            warn(f"tapeworks: the training step calls {names}: a global random op keeps its "
                 "state outside every variable, so no checkpoint can restore it and a resumed "
                 "run draws other numbers than the uninterrupted run. Fix: draw from the "
                 "Task's checkpointed generator, e.g. `self.random.normal(shape)` in "
                 "compute_losses, or a Keras layer (they use a SeedGenerator the checkpoint "
                 "holds).", CorrectnessWarning)
