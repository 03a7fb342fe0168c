"""One epoch of `fit`, in Keras' order: begin, the batches, end.

`Trainer.fit` prepares the data, builds the state, restores a resumed run and
opens the callbacks; then `FitEpochs.run` walks the epochs, each one the three
methods below read top to bottom: its start (metrics, the epoch counter,
callbacks, the input planner), its batches (`CallLoop.run_epoch`: the planned
calls, with the resumable run's save check after each), and its end (logs,
validation, callbacks, the run's save at the epoch's end). The resumable run
(`resume/resume.py`) is visited in the batches (`start_epoch`, `after_call`,
both inside `run_epoch`) and at the end (`after_epoch`), nowhere else.
"""

import dataclasses
import functools
from typing import Any, Callable, Optional

import keras

from tapeworks.engine.inputs import data_stage as data_stage_lib
from tapeworks.engine.progress import EpochProgress


@dataclasses.dataclass
class FitEpochs:
    """The epochs of one fit, and what they share.

    `validate(prepared, callbacks) -> logs` runs the validation data;
    `report_input(dataset, verbose)`, where given, measures after the first
    epoch whether training waits for its data (`diagnose_input=True`).
    `steps_known` is the steps of an epoch once known (from the data, or
    counted in the first epoch).
    """

    model: Any
    state: Any              # training_state.TrainingState
    plan: Any               # call_plan.CallPlan
    compiled: Any           # compiled_steps.CompiledSteps
    calls: Any              # call_loop.CallLoop
    data: Any               # data_stage.FitData
    callbacks: Any          # keras.callbacks.CallbackList, end_line last
    end_line: Any           # callback_bridge.EpochEndLine
    resumable: Any          # resume.ResumableRun, or NoResume without checkpoint_dir
    batches: Any            # adapters.EpochBatches
    point: Any              # the ResumePoint resumed from, or None
    epochs: int
    verbose: int
    steps_per_epoch: Optional[int]
    validation_freq: Any
    steps_known: Optional[int]
    lr_watch: Any           # fit_checks.LearningRateWatch
    pruning: Any
    validate: Callable
    report_input: Optional[Callable] = None

    @property
    def bar_verbose(self):
        """`verbose` for tapeworks' own bar: 0 where the user passed a ProgbarLogger.

        Keras' CallbackList adds its bar only when the callbacks hold none, so
        the user's logger is the one bar (it prints at the fit's `verbose`).
        """
        mine = any(isinstance(callback, keras.callbacks.ProgbarLogger)
                   for callback in self.callbacks.callbacks)
        return 0 if mine else self.verbose

    @functools.cached_property
    def evaluations(self):
        """How many times the whole fit validates, counted once.

        Of the whole fit, so that every evaluation makes the same choice of
        compiled function (`EvaluateAndPredict._evaluate`).
        """
        return sum(data_stage_lib.should_validate(epoch, self.validation_freq)
                   for epoch in range(self.epochs))

    def run(self, initial_epoch):
        """Trains epochs `initial_epoch` .. `epochs - 1`; returns the last epoch's logs."""
        logs = None
        # Keras' fit resets its epoch iterator before the first epoch, which
        # ends an epoch of a PyDataset: its `on_epoch_end` (a reshuffle) runs
        # once more than the epochs, first of all.
        self.data.train.on_epoch_end()
        for epoch in range(initial_epoch, self.epochs):
            progress, start = self.begin(epoch)
            result = self.run_batches(epoch, progress, start)
            logs = self.end(epoch, progress, result, first=epoch == initial_epoch)
            if self.model.stop_training:
                break
        return logs

    def begin(self, epoch):
        """The epoch's start; returns its progress line and the (steps, samples) it starts at."""
        point = self.point
        resuming = point is not None and epoch == point.epoch and point.steps_in_epoch > 0
        if not resuming:
            self.state.reset_metrics()   # a resumed epoch keeps its restored metrics
        self.state.counters.epoch.assign(epoch)
        self.data.train.on_epoch_begin()
        self.callbacks.on_epoch_begin(epoch)
        progress = EpochProgress(epoch, self.epochs, self.steps_known, self.bar_verbose)
        self.data.start_epoch(self.epochs - epoch, not self.plan.planner.tuning,
                              self.compiled.traces)
        start = (point.steps_in_epoch, point.samples_in_epoch) if resuming else (0, 0)
        return progress, start

    def run_batches(self, epoch, progress, start):
        """The epoch's planned calls (`CallLoop.run_epoch`); returns its `EpochResult`."""
        return self.calls.run_epoch(
            self.batches, self.callbacks, progress, epoch, self.resumable,
            later_epochs=self.epochs - epoch - 1, known_steps=self.steps_known, start=start)

    def end(self, epoch, progress, result, first=False):
        """The epoch's end: logs, validation, callbacks, the run's save. Returns the logs."""
        self.data.end_epoch(result.samples, not self.plan.planner.tuning, self.compiled.traces)
        self.data.train.on_epoch_end()
        self.compiled.close_partial_windows(self.plan.mode or False)
        self.lr_watch.after_epoch(self.epochs - epoch - 1)
        if self.steps_known is None and self.steps_per_epoch is None:
            self.steps_known = result.steps
        if self.steps_known:
            self.plan.planner.limit_steps(max(1, self.steps_known // 2))
        logs = dict(result.logs)
        logs.update(self.calls.monitor.report.logs())
        if self.pruning is not None:
            logs.update(self.pruning.sparsity())
        if first and self.report_input is not None:
            self.report_input(self.data.train.dataset, self.verbose)
        # As in Keras: validated even when a callback stopped training during
        # the epoch, so History and CSVLogger rows keep their val_*.
        if self.data.validation is not None and data_stage_lib.should_validate(
                epoch, self.validation_freq):
            val_logs = self.validate(self.data.validation, self.callbacks, self.evaluations)
            logs.update({"val_" + k: v for k, v in val_logs.items()})
        # The epoch's last line is written by `end_line`, after the other
        # callbacks, so what they add (ReduceLROnPlateau's learning_rate) shows.
        self.end_line.progress, self.end_line.steps, self.end_line.samples = (
            progress, result.steps, result.samples)
        self.callbacks.on_epoch_end(epoch, logs)
        self.compiled.traced_numbers.after_epoch()   # what callbacks changed
        self.plan.announce_once(self.verbose)
        self.data.announce_input_choice_once(self.verbose)
        self.resumable.after_epoch(self.calls.host_step, self.batches, epoch, self.epochs,
                                   self.model.stop_training, logs)
        return logs
