"""`Trainer`: the compiled training loop for one Keras model, and its public API.

The Trainer is Keras' `fit`/`evaluate`/`predict` surface over parts that
each have one reason to change (see docs/ARCHITECTURE.md): `config` checks
the options, `training_state` owns every variable training creates,
`compiled_steps` builds the step functions (`step.py` says what one step
does), `call_plan` and `autotune` choose XLA and steps per call, `call_loop`
runs an epoch's calls, `resume` saves and restores runs, `evaluation` runs
the test and predict loops, `measuring` runs trial calls that leave no
trace. Keras owns the rest: optimizers, losses, metrics and callbacks are
Keras' own objects, resolved by `model.compile`, so strings, schedules and
multi-output losses behave exactly as in `model.fit`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Union

import keras

from tapeworks import distribute as distribute_lib, xla_cache
from tapeworks.engine import config as config_lib
from tapeworks.engine import evaluation, explanation
from tapeworks.engine.call_loop import CallLoop
from tapeworks.engine.call_plan import CallPlan
from tapeworks.engine.callback_bridge import EpochEndLine
from tapeworks.engine.checks import fit_checks, loss_graph, retracing, rollback as rollback_lib
from tapeworks.engine.compiled_steps import CompiledSteps
from tapeworks.engine.epoch import FitEpochs
from tapeworks.engine.inputs import data_stage as data_stage_lib
from tapeworks.engine.plan import measuring
from tapeworks.engine.progress import announce, resolve_verbose
from tapeworks.engine.resume import resume as resume_lib
from tapeworks.engine.step import model_step, replicas, updater
from tapeworks.engine.step import task as task_lib
from tapeworks.engine.training_state import TrainingState

if TYPE_CHECKING:
    import os

    import tensorflow as tf
    from tapeworks.data.diagnose import InputReport
    from tapeworks.engine.explanation import Explanation
    from tapeworks.prune.pruning import Pruning

# What a parameter accepts, named once for the signatures below.
Mode = Union[bool, Literal["auto", "update"]]
Verbose = Union[int, Literal["auto"]]


logger = logging.getLogger("tapeworks")


# Options read as attributes of the Trainer (`Trainer.__getattr__`).
_OPTIONS = frozenset(f.name for f in dataclasses.fields(config_lib.TrainerConfig)) - {
    "jit_compile", "steps_per_call"}   # the Trainer's properties: the values in use


class Trainer(evaluation.EvaluateAndPredict):
    """Trains a Keras model with a compiled, auto-tuned loop.

    Args:
        model: a built or unbuilt `keras.Model` (Sequential, Functional or
            subclassed).
        optimizer: a Keras optimizer or its name ("adam").
        loss: a Keras loss, its name, a function `loss(y_true, y_pred)`, or a
            list/dict of those for a multi-output model.
        metrics: Keras metrics or their names, as in `model.compile`.
        loss_weights: weights of the losses of a multi-output model.
        jit_compile: True (the whole step through XLA), False (tf.function),
            "update" (tf.function, with only the optimizer update fused by
            XLA) or "auto" (measure them, keep the fastest).
        steps_per_call: steps run inside one graph call, or "auto".
        seed: seed of the shuffle of NumPy inputs, so that runs repeat.
        run_eagerly: run the step as plain Python, for debugging (no
            `tf.function`, no XLA).
        allow_missing_gradients: skip trainable variables that get no
            gradient instead of raising `MissingGradientError`.
        accumulate: apply one update per this many micro-batches, from their
            accumulated gradients (see "Accumulation" below).
        precision: "float32", "mixed_bfloat16", "mixed_float16" (with dynamic
            loss scaling) or "auto" (bfloat16 where the CPU or GPU computes it
            natively, float16 on GPUs with float16 but no bfloat16, float32
            otherwise). Mixed policies put the model's layers on that policy
            (variables stay float32; output layers stay float32) and the loss
            is computed in float32.
        clip_norm: clip the update's gradients to this global norm.
        clip_value: clip each gradient element to [-clip_value, clip_value].
        capture_every: with a Task that calls `self.capture(name, tensor)`,
            copy those tensors out every this many steps (see CaptureCallback).
        check_data: read each tf.data pipeline passed to `fit` once: report
            pipeline mistakes (`tapeworks.data.check`), and when it only slices
            tensors held in memory, train on it with tf.data's autotuning
            model off (nothing to tune; on small CPU machines the model makes
            compute-bound steps flip between two speeds) unless its options
            set that model explicitly. False skips both.
        diagnose_input: after the first epoch, measure whether training waits
            for its input (`diagnose_input`) and report it.
        deterministic: keep "auto" to modes with the numerics of plain
            `tf.function` (no XLA, which fuses and reorders floating-point
            work): a seeded run then repeats a fixed-mode run's losses.
            Steps per call are still measured (they change no numerics).
        plan_cache: where "auto" keeps its choices across runs: None (the
            default folder, `~/.cache/tapeworks/plans` or
            `$TAPEWORKS_CACHE_DIR/plans`, unless `TAPEWORKS_PLAN_CACHE=0`),
            False (off) or a folder.
        on_nonfinite: what a NaN or Inf loss or gradient does: "raise" (the
            default) withholds that update, stops, and raises
            `NonFiniteError` naming the step, the first layer whose output is
            non-finite (or the first non-finite gradient, or NaN/Inf in the
            batch itself) and the file the batch was saved to; "skip"
            withholds those updates and goes on (`nonfinite_steps` in the
            logs); "warn" applies them and warns; None checks nothing. With
            Keras' `TerminateOnNaN` among the callbacks, "raise" stops
            training as that callback does (the message becomes a warning).
            On data that can be drawn again (arrays; an in-memory pipeline
            without a shuffle) and a small model, "raise" and "skip" check
            each call of several steps as a whole, and replay a bad call
            step by step: the same outcome at a fraction of the cost.
        nonfinite_dir: where "raise" saves the offending batch (default: the
            temporary folder's `tapeworks-nonfinite/`).
        fine_tune_in_inference_mode: say that training the variables of a
            sub-model called with `training=False` is meant (otherwise a
            warning names it once: the usual intent is a frozen extractor).
        dead_gradient_steps: warn, naming them and the likely cause, about
            trainable variables whose gradient has been exactly zero for at
            least this many consecutive steps (a dead ReLU, a round/argmax/int
            cast on the path, a helper left trainable): checked once this
            many steps have run since the last check, at the end of a call.
            None turns the check off.
        monitor_every: every this many steps, compute each layer's gradient
            norm, weight norm and update/weight ratio in the graph (on a
            variant of the step run for that one step, inside the same call;
            the other steps are untouched), keep them in
            `trainer.monitor_history`, add them to
            the logs (`gradient_norm/<layer>`, `weight_norm/<layer>`,
            `update_ratio/<layer>`), write them to TensorBoard when a
            `keras.callbacks.TensorBoard` is among the callbacks (with
            gradient histograms when its `histogram_freq` > 0), and warn when
            a layer's gradient norm explodes (100x its running median) or
            vanishes (1/100). The monitored steps are the k-th (with
            accumulation, the first step at or after each that closes a
            window); histograms are of a call's last monitored step.
        strategy: a `tf.distribute` strategy to train under. Default: the
            strategy whose scope the Trainer is created in; with none,
            `tapeworks.distribute.choose()` (TF_CONFIG naming several workers:
            MultiWorkerMirroredStrategy; several GPUs: MirroredStrategy; else
            one device). Models and optimizers must be built in its scope.
            `batch_size` is then the global batch, split across replicas; each
            replica's loss is the mean over its share, the gradients are
            summed over replicas (see the guide, docs/distribute.md).
        sync_batchnorm: make every BatchNormalization layer compute its
            statistics over the global batch (Keras' `synchronized=True`),
            as on one device, instead of per replica.
        split_xla_step_bytes: on a CPU, an XLA train step (jit_compile=True)
            whose gradients reach this many bytes, with a check that reads
            them, runs in three parts: XLA gradients, the checks in
            TensorFlow, the XLA update (`CompiledSteps.splits_xla_step`).
            None (the default): never; see docs/ARCHITECTURE.md for when it
            paid.
        pruning: a `tapeworks.prune.Pruning`: magnitude pruning of the
            kernels it selects, its masks in variables (in
            `trainer.checkpoint`), applied in the compiled step after every
            update; `sparsity` and `sparsity/<layer>` in the epoch logs.

    Accumulation: an update from N micro-batches equals one step on a batch N
    times larger (the mean loss over every sample of the window); the guide's
    precision page says how windows meet an epoch's end, BatchNormalization
    and float16, and that a checkpoint mid-window restores mid-window.

    Example:

    ```python
    trainer = tapeworks.Trainer(model, "adam", "sparse_categorical_crossentropy",
                                metrics=["accuracy"])
    history = trainer.fit((x, y), batch_size=64, epochs=5)
    print(trainer.tuning)   # what "auto" chose, and the measurements
    ```

    Parts (read-only, for tests and advanced use): `config` (the checked
    options), `training_state` (every variable training creates), `compiled`
    (the compiled step functions), `plan` (the mode and steps-per-call
    choice), `rollback` (the non-finite guard's fast path), `data_stage`,
    `replication` (the strategy's host-side decisions).

    Callbacks: Keras callbacks are used unchanged and see `self.model`. Batch
    hooks fire once per call of several steps (as in `model.fit` with
    `steps_per_execution`), with the call's last step and the running logs.
    """

    def __init__(self, model: keras.Model | task_lib.Task, optimizer: Any = None,
                 loss: Any = None, metrics: Any = None, *, loss_weights: Any = None,
                 weighted_metrics: Any = None, jit_compile: Mode = "auto",
                 steps_per_call: int | Literal["auto"] = "auto", seed: int | None = None,
                 run_eagerly: bool | None = None, allow_missing_gradients: bool = False,
                 accumulate: int = 1, precision: str = "float32",
                 clip_norm: float | None = None, clip_value: float | None = None,
                 capture_every: int | None = None, check_data: bool = True,
                 diagnose_input: bool = False, deterministic: bool = False,
                 plan_cache: str | os.PathLike[str] | bool | None = None,
                 on_nonfinite: Literal["raise", "skip", "warn"] | None = "raise",
                 nonfinite_dir: str | os.PathLike[str] | None = None,
                 fine_tune_in_inference_mode: bool = False,
                 dead_gradient_steps: int | None = 50, monitor_every: int | None = None,
                 pruning: Pruning | None = None, strategy: tf.distribute.Strategy | None = None,
                 sync_batchnorm: bool = False, split_xla_step_bytes: int | None = None) -> None:
        strategy, reason = distribute_lib.resolve(strategy, getattr(
            model, "distribute_strategy", None) if isinstance(model, keras.Model) else None)
        self.replication = distribute_lib.Replication(strategy, reason)
        self.config = config = config_lib.from_arguments(
            model, optimizer=optimizer, loss=loss, metrics=metrics, loss_weights=loss_weights,
            weighted_metrics=weighted_metrics, replicated=self.replication.replicated,
            strategy_name=type(strategy).__name__, jit_compile=jit_compile,
            steps_per_call=steps_per_call, seed=seed, run_eagerly=run_eagerly,
            allow_missing_gradients=allow_missing_gradients, accumulate=accumulate,
            clip_norm=clip_norm, clip_value=clip_value, capture_every=capture_every,
            check_data=check_data, diagnose_input=diagnose_input, deterministic=deterministic,
            on_nonfinite=on_nonfinite, nonfinite_dir=nonfinite_dir,
            fine_tune_in_inference_mode=fine_tune_in_inference_mode,
            dead_gradient_steps=dead_gradient_steps, monitor_every=monitor_every,
            pruning=pruning, sync_batchnorm=sync_batchnorm,
            split_xla_step_bytes=split_xla_step_bytes)
        # Everything the Trainer creates (the precision's loss scale, the
        # optimizer of a name, the step's state) lives in the strategy's scope.
        with self.replication.scope(), replicas.state_variables():
            first_model = model if isinstance(model, keras.Model) else model.model
            own = model_step.has_own_train_step(model)   # Keras' way to customise fit
            self.precision = (model_step if own else config_lib).resolve_precision(
                first_model, precision)
            self.task = model if isinstance(model, task_lib.Task) else model_step.task_class(
                model)(model, optimizer, loss, metrics, loss_weights, weighted_metrics)
            for member in self.task.models:
                self.precision.apply_to(member)
            self.model = self.task.model
            self.optimizer = self.task.updates[0].optimizer
            if getattr(self.model, "optimizer", None) is None:
                # Keras callbacks (TensorBoard, ReduceLROnPlateau) read
                # `self.model.optimizer`: for a task, the first update's.
                self.model.optimizer = self.optimizer
            if config.sync_batchnorm:
                distribute_lib.synchronize_batchnorm(self.task.models)
        strategy = self.replication.strategy
        self.hooks = updater.StepHooks()
        self.training_state = TrainingState(self.task, config, self.precision, strategy)
        self.compiled = CompiledSteps(self.task, self.training_state, config, self.precision,
                                      strategy, self.hooks)
        self.plan = CallPlan(config, self.task, self.precision, strategy, plan_cache)
        self.data_stage = data_stage_lib.DataStage(self.task, seed=seed,
                                                   check_pipelines=check_data)
        self.rollback = rollback_lib.RollbackPath(self.training_state, config, self.precision,
                                                  self.replication.replicated)
        self.retraces: list[Any] = []   # the user's tf.functions that retraced in the last fit
        self.input_report = None   # the InputReport of diagnose_input after a first epoch
        self.checkpoint_saves: list[Any] = []  # a SaveRecord per save of the last fit
        self._calls = None         # the CallLoop, made at the first fit (after the build)
        self._setup_checked = False
        self._eager_said = False   # the one line on why the step runs eagerly (config)
        self._lr_watch = fit_checks.LearningRateWatch(self.task.updates)

    def __getattr__(self, name):
        # The checked options, read-only: `trainer.accumulate` is `trainer.config.accumulate`.
        config = self.__dict__.get("config")
        if config is not None and name in _OPTIONS:
            return getattr(config, name)
        raise AttributeError(f"'Trainer' object has no attribute {name!r}")

    def __repr__(self):
        jit = "auto (measuring)" if self.jit_compile is None else self.jit_compile
        steps = "auto (measuring)" if self.steps_per_call is None else self.steps_per_call
        return (f"<tapeworks.Trainer model={self.model.name!r} jit_compile={jit!r} "
                f"steps_per_call={steps!r} precision={self.precision.policy!r} "
                f"accumulate={self.accumulate}>")

    # The training state ---------------------------------------------------------

    @property
    def states(self):
        """One UpdateState (accumulators) per update, once built."""
        return self.training_state.update_states

    @property
    def state(self):
        """The UpdateState of the first update (the only one in the supervised case)."""
        return self.states[0] if self.states else None

    @property
    def counters(self):
        """The step and epoch variables, once built."""
        return self.training_state.counters

    @property
    def traces(self):
        """Traces per compiled step function (a `collections.Counter`)."""
        return self.compiled.traces

    @property
    def per_replica_batch_size(self):
        """Under several replicas, each one's share of the batch, once fit knows it."""
        return self.replication.per_replica_batch_size

    @property
    def checkpoint(self):
        """A `tf.train.Checkpoint` of everything training changes.

        Model, optimizer (iterations, slots), accumulators, loss scale,
        counters and the step's random state (Keras SeedGenerators, the
        Task's `random`): restoring it and training on resumes exactly,
        mid-window included. (`fit(checkpoint_dir=)` saves it with the rest
        of the run: data position, metrics, callbacks.)
        Available once `fit` (or `evaluate`) has built the variables.
        """
        return self.training_state.checkpoint()

    # Public results of "auto" ---------------------------------------------

    @property
    def jit_compile(self) -> bool | str | None:
        """The execution mode in use (True, False or "update"); None before the first `fit`.

        While "auto" is still measuring, the mode of the call about to run.
        """
        return self.plan.mode

    @property
    def steps_per_call(self) -> int | None:
        """Steps per graph call in use; None before the first `fit`."""
        return self.plan.steps

    @property
    def tuning(self) -> dict[str, Any] | None:
        """What "auto" measured and chose (a dict), or None before `fit`.

        Its "input" entry: how the last `tapeworks.data.pipeline` fitted on
        runs (`input_planner.InputPlanner.report`), or None.
        """
        report = self.plan.report()
        if report is not None:
            planner = self.data_stage.input_planner
            report["input"] = planner.report() if planner is not None else None
            # precision="auto" where measured (`plan/precision_trial.py`).
            choice = getattr(self.precision, "choice", None)
            report["precision"] = choice.report() if choice is not None else None
        return report

    @property
    def data_findings(self):
        """What `tapeworks.data.check` said about the last tf.data pipeline read."""
        return self.data_stage.findings

    @property
    def monitor_history(self):
        """What `monitor_every` recorded: `[{"step": s, "layers": {layer: {...}}}]`."""
        return self._calls.monitor.report.history if self._calls is not None else []

    # fit ----------------------------------------------------------------

    def fit(self, x: Any = None, y: Any = None, batch_size: int | None = None, epochs: int = 1,
            verbose: Verbose = "auto", callbacks: Sequence[keras.callbacks.Callback] | None = None,
            validation_split: float = 0.0, validation_data: Any = None,
            shuffle: bool | Literal["batch"] = True,
            class_weight: Mapping[int, float] | None = None, sample_weight: Any = None,
            initial_epoch: int = 0, steps_per_epoch: int | None = None,
            validation_steps: int | None = None, validation_batch_size: int | None = None,
            validation_freq: int | Sequence[int] = 1, *,
            checkpoint_dir: str | os.PathLike[str] | None = None,
            checkpoint_every: int | str = "epoch", keep: int = 3, keep_best: str | None = None,
            resume: bool = True, overwrite: bool = False,
            checkpoint_data: Literal["auto", "skip"] = "auto", checkpoint_async: bool = False,
            global_batch_size: int | None = None) -> keras.callbacks.History:
        """Trains the model; Keras' `Model.fit` signature and semantics, argument for argument.

        Args:
            x: inputs: NumPy arrays or tensors (a list/tuple/dict of them for
                several inputs), a `tf.data.Dataset` of (x, y) or
                (x, y, sample_weight) batches, a `keras.utils.PyDataset`, a
                Python generator, or a function returning a fresh generator
                (re-read every epoch). `fit((x, y))` is accepted too.
            y: targets, with array inputs.
            batch_size: for array inputs (default 32); ignored (with a
                warning) for data that comes batched.
            epochs: index of the last epoch (as in Keras, with `initial_epoch`);
                `epochs <= initial_epoch` trains nothing and returns an empty
                History.
            verbose: 0 silent, 1 progress bar, 2 one line per epoch; "auto" is
                1 on a terminal and 2 otherwise.
            callbacks: Keras callbacks.
            validation_split: the last fraction of the arrays, taken before
                shuffling, becomes validation data.
            validation_data: (x_val, y_val[, sample_weight_val]) or a dataset;
                evaluated after every `validation_freq`-th epoch, logged with
                a `val_` prefix.
            shuffle: reshuffle array inputs every epoch (True, False or "batch").
            class_weight: `{class id: weight}`: per-sample weights from the labels.
            sample_weight: per-sample weights, with array inputs.
            initial_epoch: the epoch to start at (when resuming).
            steps_per_epoch: steps in an epoch; None means "until the data
                ends". When set, the data iterator carries over between
                epochs and restarts when it runs out.
            validation_steps: batches of validation data per evaluation.
            validation_batch_size: batch size of array validation data
                (default: `batch_size`).
            validation_freq: validate every this many epochs, or at the listed
                (1-based) epochs.

        Resuming (keyword-only; tapeworks' own, see the guide, docs/resume.md):
            checkpoint_dir: save the whole training state there, and resume
                from the newest complete checkpoint there when the same
                command runs again (model, optimizer, accumulators, metrics of
                the running epoch, random state, data position, the "auto"
                choice, the callbacks' state). SIGTERM and SIGINT save after
                the running call and exit with status 128 + the signal.
            checkpoint_every: a number of steps, "epoch", or a duration
                ("90s", "10min", "2h").
            keep: the newest checkpoints kept.
            keep_best: also keep the best checkpoint by this logged metric
                (e.g. "val_loss"; accuracy-like names are maximised, as in
                Keras); saves at every epoch end.
            resume: False starts fresh; a non-empty folder is then refused
                unless `overwrite=True` (which deletes its checkpoints).
            checkpoint_data: "auto" (arrays are replayed from the run's seed,
                tf.data pipelines saved with tf.data's iterator checkpointing)
                or "skip" (re-create the data and skip the batches already
                trained this epoch: for generators, PyDatasets and pipelines
                tf.data cannot save; exact only for data in a fixed order).
            checkpoint_async: False (the default) saves while training
                waits. True writes a save's files while training waits, then
                syncs, checksums and renames them into place on a background
                thread while training goes on (fit returns once the last save
                is complete): for disks where syncing is slow. On this
                project's 2-core machine it was no faster (`tapeworks bench
                checkpoint`): the background work takes the same cores.

        Several replicas (keyword-only):
            global_batch_size: the batch of one step over all replicas, the
                same as `batch_size` (which is global too, as in Keras under a
                strategy), named so: it must split evenly over the replicas,
                and each replica computes `global_batch_size / replicas`
                samples (`trainer.per_replica_batch_size`).

        Returns:
            The `keras.callbacks.History` of the run.
        """
        batch_size = self.replication.global_batch(batch_size, global_batch_size)
        verbose = resolve_verbose(verbose)
        self.replication.announce(batch_size, verbose)
        if self.config.run_eagerly_reason and not self._eager_said:
            self._eager_said = True
            announce(self.config.run_eagerly_reason, verbose)
        self.task.check_unchanged()
        data_stage_lib.check_epochs(epochs, initial_epoch, steps_per_epoch)
        data_stage_lib.check_validation_freq(validation_freq)
        if isinstance(callbacks, keras.callbacks.CallbackList):
            callbacks = callbacks.callbacks
        callbacks = list(callbacks or [])
        state, plan = self.training_state, self.plan
        # The user's own tf.functions that retrace while this fit runs are
        # reported with the argument that changed (`retracing.py`).
        with retracing.RetraceWatch() as watch, resume_lib.open_run(
                checkpoint_dir, self.replication, self.training_state, self.plan,
                self.compiled, self.config, callbacks, every=checkpoint_every, keep=keep,
                keep_best=keep_best, resume=resume, overwrite=overwrite,
                checkpoint_data=checkpoint_data, asynchronous=checkpoint_async) as run:
            try:
                self.checkpoint_saves = run.records
                self.data_stage.seed = run.seed(self.data_stage.seed)
                data = self.data_stage.for_fit(
                    x, y, sample_weight, batch_size=batch_size, shuffle=shuffle,
                    class_weight=class_weight, steps_per_epoch=steps_per_epoch,
                    validation_split=validation_split, validation_data=validation_data,
                    validation_batch_size=validation_batch_size,
                    validation_steps=validation_steps, epochs_to_run=epochs - initial_epoch,
                    plan_input=checkpoint_dir is None)
                state.build(data.train.dataset.element_spec, lazy_losses=checkpoint_dir is None)
                self._first_fit_checks()
                fit_checks.check_batch_statistics(self.task, data.train)
                calls = self._call_loop()
                point, data = run.restore(data)
                train = data.train
                if not self.precision.decided:
                    steps = steps_per_epoch or train.steps
                    plan.choose_precision(train, steps and steps * (epochs - initial_epoch),
                                          self._trial, self.compiled, verbose)
                calls.start_fit()
                plan.start_fit()
                plan.use_cache(state.element_spec, train.batch_size)
                if point is not None:
                    initial_epoch = run.resume_from(point, verbose)
                steps_known = train.steps
                if steps_known:
                    plan.planner.limit_steps(max(1, steps_known // 2))
                    fit_checks.check_schedule_horizons(
                        self.task, (epochs - initial_epoch) * steps_known // self.accumulate)
                end_line = EpochEndLine()
                calls.nonfinite.start_fit(callbacks)
                if calls.monitor.keep_gradients_for(callbacks):
                    # A monitored step traced before has no buffers to write.
                    self.compiled.forget_monitored()
                callback_list = keras.callbacks.CallbackList(
                    callbacks + [end_line], add_history=True, add_progbar=False,
                    model=self.model, verbose=verbose, epochs=epochs, steps=steps_known)
                self.model.stop_training = False
                callback_list.on_train_begin()
                run.restore_callbacks(callback_list, point)
                # Keras' BackupAndRestore sets `_initial_epoch` in on_train_begin when it
                # restored a backup; Keras' own loop starts there, and so does this one.
                initial_epoch = getattr(self.model, "_initial_epoch", None) or initial_epoch
                batches = data.batches(steps_per_epoch, self.replication.iterate, point,
                                       run.iterator_reader(point))
                training_logs = FitEpochs(
                    self.model, state, plan, self.compiled, calls, data, callback_list,
                    end_line, run, batches, point, epochs, verbose, steps_per_epoch,
                    validation_freq, steps_known, self._lr_watch, self.pruning,
                    validate=self._evaluate,
                    report_input=self._report_input if self.config.diagnose_input else None,
                ).run(initial_epoch)
                if epochs > initial_epoch:
                    state.finalize()
                run.finish(calls.host_step, batches, max(epochs, initial_epoch))
                plan.end_fit()
                if any(key.mode in (True, "update") for key in self.compiled.keys()):
                    xla_cache.record_checksums()   # of what XLA compiled in this fit
                callback_list.on_train_end(training_logs)
                return self.model.history
            finally:
                self.retraces = watch.reported

    def _call_loop(self):
        """The CallLoop, made once, after the build (its watches read the built state)."""
        if self._calls is None:
            self._calls = CallLoop(self.plan, self.compiled, self.training_state, self.config,
                                   self.replication, self.rollback, self.data_stage.value_findings)
        return self._calls

    def _first_fit_checks(self):
        """Once per trainer: mistakes in how the model and its loss are set up (warnings)."""
        if not self._setup_checked:
            self._setup_checked = True
            fit_checks.check_something_trains(self.task)
            loss_graph.check_task_losses(self.training_state)

    def _report_input(self, dataset, verbose):
        """After the first epoch (`diagnose_input=True`): whether training waits for data."""
        with self._trial() as trial:
            self.input_report = measuring.input_report(trial, dataset)
        if verbose:
            print(self.input_report)
        logger.info("%s", self.input_report)

    def _trial(self):
        return measuring.TrialRun(self.training_state, self.compiled, self.plan,
                                  self.data_stage, self.replication.iterate, self.precision,
                                  self.retraces)

    def diagnose_input(self, data: Any, batches: int = 30,
                       batch_size: int | None = None) -> InputReport:
        """Measures whether training waits for data; returns a `tapeworks.data.InputReport`.

        Trains nothing: every variable is saved before the timed runs and
        restored after (`measuring.TrialRun`). See `tapeworks/data/diagnose.py`.
        """
        with self._trial() as trial:
            prepared = trial.prepare(data, batch_size=batch_size)
            return measuring.input_report(trial, prepared.dataset, batches)

    def explain(self, data: Any, steps: int = 20, batch_size: int | None = None,
                profile_dir: str | os.PathLike[str] | None = None,
                try_xla: bool = True) -> Explanation:
        """Where a training step's time goes, and what would help here: an `Explanation`.

        A short measured training on this trainer's compiled loop: input
        wait, the step's compute, the host's cost per call, tracing and
        compiling, retraces; then the changes that apply (steps per call,
        XLA, prefetch, cache), each measured and ranked. Every variable is
        restored afterwards: nothing is trained. `profile_dir` also writes a
        TensorBoard profiler trace. `print(trainer.explain(data))` shows it;
        see `tapeworks/engine/explanation.py`.
        """
        with self._trial() as trial:
            return explanation.explain(trial, data, steps=steps, batch_size=batch_size,
                                       profile_dir=profile_dir, try_xla=try_xla)

    def build_state(self, x: Any = None, y: Any = None, batch_size: int | None = None,
                    sample_weight: Any = None) -> Trainer:
        """Creates all variables for batches like `x` (and `y`), without training.

        Use it to restore a checkpoint into a fresh trainer before `fit`.
        Takes what `fit` takes (arrays with `y`, a dataset, `(x, y)`).
        """
        self._prepare(x, y, sample_weight, batch_size)
        return self

    def _prepare(self, x, y=None, sample_weight=None, batch_size=None, steps=None):
        """`x` as checked `PreparedData`, with every variable created for its batches."""
        prepared = self.data_stage.prepare(x, y, sample_weight, batch_size=batch_size,
                                           steps=steps, purpose="evaluate")
        self.training_state.build(prepared.dataset.element_spec)
        return prepared
