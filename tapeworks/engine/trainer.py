"""`Trainer`: the compiled training loop for one Keras model.

The Trainer owns the loop (epochs, calls, callbacks, validation, progress) and
the choice of how to run it; `step.py` owns what one step does and
`autotune.py` owns the choice of XLA and steps per call. Keras owns the rest:
optimizers, losses, metrics and callbacks are Keras' own objects, resolved by
`model.compile`, so strings, schedules and multi-output losses behave exactly
as in `model.fit`.
"""

import collections
import logging
import os
import re
import signal
import time
import weakref

import keras
import numpy as np
import tensorflow as tf

from tapeworks.data import diagnose as diagnose_lib
from tapeworks import distribute as distribute_lib
from tapeworks.data import sources
from tapeworks.engine import autotune
from tapeworks.engine import callback_bridge, data_stage, gradient_health, guards, inputs, step
from tapeworks.engine import inference_mode
from tapeworks.engine import monitor as monitor_lib
from tapeworks.engine import input_planner as input_planner_lib
from tapeworks.engine import nonfinite as nonfinite_lib
from tapeworks.engine import capture as capture_lib
from tapeworks.engine import task as task_lib
from tapeworks.engine import plan_cache as plan_cache_lib
from tapeworks.engine import rollback
from tapeworks.engine import replicas, retracing
from tapeworks.engine import run_checkpoint
from tapeworks.engine import precision as precision_lib
from tapeworks.engine.callback_bridge import EpochEndLine
from tapeworks.engine.progress import EpochProgress, resolve_verbose
from tapeworks.errors import ConfigError, CorrectnessWarning, DataSpecError, warn

logger = logging.getLogger("tapeworks")

# Calls replayed (`Trainer._replay_call`) before every step is guarded instead.
MAX_REPLAYS = 3

EVAL_STEPS_PER_CALL = 32


class Trainer:
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
            temporary folder's `tapeworks/`).
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
            summed over replicas (see the README's "Several devices").
        sync_batchnorm: make every BatchNormalization layer compute its
            statistics over the global batch (Keras' `synchronized=True`),
            as on one device, instead of per replica.
        pruning: a `tapeworks.prune.Pruning`: magnitude pruning of the
            kernels it selects, its masks in variables (in
            `trainer.checkpoint`), applied in the compiled step after every
            update; `sparsity` and `sparsity/<layer>` in the epoch logs.

    Accumulation: the update is the gradient of the mean loss over every
    sample of the window (micro-batches weighted by their size), which equals
    one step on a batch N times larger. The optimizer, its learning-rate
    schedule, weight decay and clipping act once per update. A window never
    spans two epochs: when an epoch ends with fewer than N micro-batches
    pending, they are applied then, as the mean over their own samples.
    BatchNormalization updates its moving statistics on every micro-batch
    (its batch statistics are those of the micro-batch). Under
    mixed_float16, one non-finite micro-batch skips its whole window.
    Accumulators, the loss scale and the counters are variables in
    `trainer.state` (and `trainer.checkpoint`), so a checkpoint taken
    mid-window restores mid-window.

    Example:

    ```python
    trainer = tapeworks.Trainer(model, "adam", "sparse_categorical_crossentropy",
                                metrics=["accuracy"])
    history = trainer.fit((x, y), batch_size=64, epochs=5)
    print(trainer.tuning)   # what "auto" chose, and the measurements
    ```

    Callbacks: Keras callbacks are used unchanged and see `self.model`. With
    several steps per call, `on_train_batch_begin`/`on_train_batch_end` fire
    once per call (as in `model.fit` with `steps_per_execution`): `batch` is
    the index of the last step of the call and the logs are the epoch's running
    values at that point.
    """

    def __init__(self, model, optimizer=None, loss=None, metrics=None, *, loss_weights=None,
                 weighted_metrics=None, jit_compile="auto", steps_per_call="auto", seed=None,
                 run_eagerly=None, allow_missing_gradients=False, accumulate=1,
                 precision="float32", clip_norm=None, clip_value=None, capture_every=None,
                 check_data=True, diagnose_input=False, deterministic=False, plan_cache=None,
                 on_nonfinite="raise", nonfinite_dir=None, fine_tune_in_inference_mode=False,
                 dead_gradient_steps=50, monitor_every=None, pruning=None, strategy=None,
                 sync_batchnorm=False):
        # Everything the Trainer creates (the precision's loss scale, the
        # optimizer of a name, the step's state) lives in the strategy's scope.
        self._strategy, self._strategy_reason = distribute_lib.resolve(strategy)
        with self._strategy.scope(), replicas.state_variables():
            self._setup(model, optimizer, loss, metrics, loss_weights, weighted_metrics,
                        jit_compile, steps_per_call, seed, run_eagerly,
                        allow_missing_gradients, accumulate, precision, clip_norm,
                        clip_value, capture_every, check_data, diagnose_input,
                        deterministic, plan_cache, on_nonfinite, nonfinite_dir,
                        fine_tune_in_inference_mode, dead_gradient_steps, monitor_every,
                        pruning)
            if not isinstance(sync_batchnorm, bool):
                raise ConfigError(f"`sync_batchnorm` must be True or False. Received: "
                                  f"sync_batchnorm={sync_batchnorm!r}")
            if sync_batchnorm:
                distribute_lib.synchronize_batchnorm(self.task.models)
            self._replicas_announced = False

    def _setup(self, model, optimizer, loss, metrics, loss_weights, weighted_metrics,
               jit_compile, steps_per_call, seed, run_eagerly, allow_missing_gradients,
               accumulate, precision, clip_norm, clip_value, capture_every, check_data,
               diagnose_input, deterministic, plan_cache, on_nonfinite, nonfinite_dir,
               fine_tune_in_inference_mode, dead_gradient_steps, monitor_every, pruning):
        if isinstance(model, task_lib.Task):
            given = [n for n, v in (("optimizer", optimizer), ("loss", loss),
                                    ("metrics", metrics), ("loss_weights", loss_weights),
                                    ("weighted_metrics", weighted_metrics))
                     if v is not None]
            if given:
                raise ConfigError(
                    f"{', '.join(f'`{n}`' for n in given)} given with a Task. A Task declares "
                    "its own losses and optimizers (`add_update`). Fix: pass them there.")
        elif not isinstance(model, keras.Model):
            raise ConfigError(
                f"`model` must be a keras.Model or a tapeworks.Task. Received: "
                f"{type(model).__name__}. Fix: wrap layers in keras.Sequential or a "
                "Functional model."
            )
        if run_eagerly is None:
            # A model compiled with run_eagerly=True is debugged eagerly here too.
            run_eagerly = bool(isinstance(model, keras.Model)
                               and getattr(model, "compiled", False) and model.run_eagerly)
        if jit_compile not in (True, False, "update", "auto"):
            raise ConfigError(
                "`jit_compile` must be True, False, \"update\" or \"auto\". Received: "
                f"jit_compile={jit_compile!r}"
            )
        if steps_per_call != "auto" and not (
                isinstance(steps_per_call, int) and steps_per_call >= 1):
            raise ConfigError(
                "`steps_per_call` must be an integer >= 1 or \"auto\". "
                f"Received: steps_per_call={steps_per_call!r}"
            )
        if run_eagerly and jit_compile in (True, "update"):
            raise ConfigError(
                "`run_eagerly=True` runs plain Python, which XLA cannot compile. "
                "Fix: pass jit_compile=False (or \"auto\") with run_eagerly=True."
            )
        if not isinstance(accumulate, int) or isinstance(accumulate, bool) or accumulate < 1:
            raise ConfigError(
                f"`accumulate` must be an integer >= 1. Received: accumulate={accumulate!r}")
        _check_count("capture_every", capture_every,
                     "Every this many steps, the task's captured tensors are copied out.",
                     steps_per_call, "a call would hold several captures and keep only the last")
        for name, value in (("clip_norm", clip_norm), ("clip_value", clip_value)):
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise ConfigError(
                    f"`{name}` must be None or a number > 0. Received: {name}={value!r}")
        first_model = model if isinstance(model, keras.Model) else model.model
        self.precision = self._resolve_precision(first_model, precision)
        self.task = model if isinstance(model, task_lib.Task) else task_lib.SupervisedTask(
            model, optimizer, loss, metrics, loss_weights, weighted_metrics)
        for member in self.task.models:
            self.precision.apply_to(member)
        self.model = self.task.model
        self.optimizer = self.task.updates[0].optimizer
        if getattr(self.model, "optimizer", None) is None:
            # Keras callbacks (TensorBoard, ReduceLROnPlateau) read
            # `self.model.optimizer`: for a task, the first update's.
            self.model.optimizer = self.optimizer
        self.seed = seed
        self.on_nonfinite = nonfinite_lib.check_policy(on_nonfinite)
        self.nonfinite_dir = nonfinite_dir
        self._guard = None            # the NonFiniteGuard, created in _build
        # The guard's fast path (`rollback`): the snapshot, made at its first
        # use, and why the path is off for this trainer (None while it is on).
        self._snapshot = None
        self._fast_guard_off = None
        self._replays = 0
        self._stop_on_nonfinite = False  # TerminateOnNaN given: stop instead of raising
        self._nonfinite_warned = 0
        self.retraces = []   # the user's tf.functions that retraced in the last fit
        self.fine_tune_in_inference_mode = bool(fine_tune_in_inference_mode)
        self._setup_checked = False   # _first_fit_checks ran
        self._decayed_warned = set()  # updates whose decayed learning rate was reported
        _check_count("dead_gradient_steps", dead_gradient_steps,
                     "It is how many consecutive steps of exactly zero gradient make a "
                     "variable reported as not training.")
        self.dead_gradient_steps = dead_gradient_steps
        _check_count("monitor_every", monitor_every,
                     "Fix: e.g. monitor_every=100 computes the per-layer gradient statistics "
                     "on every 100th step.")
        self.monitor_every = monitor_every
        self._monitors = []           # one GradientMonitor per update, created in _build
        self._monitor_report = monitor_lib.MonitorReport()
        self._host_step = 0           # the step counter as the host last knew it
        self._monitor_next = None     # the k-th step due to be monitored next
        self._monitor_records = 0     # the first monitor's records, as last read
        self._owners = None           # id(variable) -> its layer (`_layer_owners`)
        self._dead = []               # one DeadGradients per update, created in _build
        # From this size of gradients an XLA step with checks runs split on a CPU.
        self._split_min_bytes = step.SPLIT_MIN_GRADIENT_BYTES
        # Kept across fits: consecutive steps are consecutive in an
        # epoch-by-epoch fit loop too, and each variable is named once.
        self._dead_unchecked = 0      # steps run since the host last read the sums
        self._dead_reported = set()
        self._inference_calls_checked = False
        self.accumulate = accumulate
        self.clip_norm = clip_norm
        self.clip_value = clip_value
        self.capture_every = capture_every
        self.check_data = check_data
        self.diagnose_input_after_first_epoch = diagnose_input
        self._data = data_stage.DataStage(self.task, seed=seed, check_pipelines=check_data)
        self.input_report = None  # the InputReport of diagnose_input
        self._capture = None    # Capture buffers, created in _build
        self._delivered_capture = -1
        self.states = []        # one UpdateState per update, created in _build
        self.counters = None    # step and epoch variables, created in _build
        self.run_eagerly = run_eagerly
        self.allow_missing_gradients = allow_missing_gradients
        self._jit_setting = jit_compile
        self._steps_setting = steps_per_call
        self._trackers = {}
        self._planner = None
        self._loops = {}
        self.traces = collections.Counter()
        self.hooks = step.StepHooks()
        from tapeworks.prune import Pruning

        if pruning is not None and not isinstance(pruning, Pruning):
            raise ConfigError(
                f"`pruning` must be None or a tapeworks.prune.Pruning. Received: "
                f"{type(pruning).__name__}. Fix: pruning=tapeworks.prune.Pruning(schedule).")
        self.pruning = pruning
        self._built = False
        self.per_replica_batch_size = None   # under several replicas, once fit knows the batch
        self._shardable = {}    # id(dataset) -> (dataset, as sharded between workers)
        self._announced = None    # the choice last announced (and stored)
        if not isinstance(deterministic, bool):
            raise ConfigError(f"`deterministic` must be True or False. Received: "
                              f"deterministic={deterministic!r}")
        if jit_compile in (True, "update") and replicas.is_replicated(self._strategy):
            raise ConfigError(
                f"jit_compile={jit_compile!r} under {type(self._strategy).__name__}: tapeworks "
                "compiles a replicated step with tf.function only (the optimizer's all-reduce "
                "runs through merge_call, which XLA cannot take inside the step). Fix: pass "
                "jit_compile=False or \"auto\" (which then measures steps per call only).")
        if deterministic and jit_compile in (True, "update"):
            raise ConfigError(
                f"`deterministic=True` keeps to tf.function's numerics, which "
                f"jit_compile={jit_compile!r} (XLA) changes. Fix: pass jit_compile=False "
                "or \"auto\" with deterministic=True.")
        self.deterministic = deterministic
        if plan_cache is False or (plan_cache is None
                                   and not plan_cache_lib.enabled_by_environment()):
            self._plan_cache = None
        else:
            self._plan_cache = plan_cache_lib.PlanCache(
                plan_cache if isinstance(plan_cache, (str, os.PathLike)) else None)
        self._plan_key = None       # fingerprint of this trainer's plan, once known
        self._resumer = None        # the save/resume cycle of a fit with checkpoint_dir
        self._last_checkpoint = None
        self._user_callbacks = []   # the callbacks of the running fit, as passed
        self._run_state_object = None   # _run_state's checkpoint, made once
        self._state_writer = None       # (structure, its write as a tf.function)
        self._before_resume = None      # the variables' values before a resume, until it fits
        # A `run_checkpoint.SaveRecord` (step, folder, seconds) per save of
        # the last fit with checkpoint_dir.
        self.checkpoint_saves = []
        self._plan_reason = None    # why that plan was chosen (the run that measured it)
        self._element_spec = None
        # The input planner of the last built pipeline fitted on (a weak reference
        # to that pipeline, the planner): measuring goes on across fit calls.
        self._input_planning = (None, None)

    def __repr__(self):
        jit = "auto (measuring)" if self.jit_compile is None else self.jit_compile
        steps = "auto (measuring)" if self.steps_per_call is None else self.steps_per_call
        return (f"<tapeworks.Trainer model={self.model.name!r} jit_compile={jit!r} "
                f"steps_per_call={steps!r} precision={self.precision.policy!r} "
                f"accumulate={self.accumulate}>")

    @property
    def state(self):
        """The UpdateState of the first update (the only one in the supervised case)."""
        return self.states[0] if self.states else None

    # Public results of "auto" ---------------------------------------------

    @property
    def jit_compile(self):
        """The execution mode in use (True, False or "update"); None before the first `fit`.

        While "auto" is still measuring, the mode of the call about to run.
        """
        if self._planner is not None:
            return self._planner.mode
        return self._jit_setting if self._jit_setting != "auto" else None

    @property
    def steps_per_call(self):
        """Steps per graph call in use; None before the first `fit`."""
        if self._planner is not None:
            return self._planner.next_call().steps
        return self._steps_setting if self._steps_setting != "auto" else None

    @property
    def tuning(self):
        """What "auto" measured and chose (a dict), or None before `fit`.

        Its "input" entry: how the last `tapeworks.data.pipeline` fitted on
        runs (`input_planner.InputPlanner.report`), or None.
        """
        if self._planner is None:
            return None
        report = self._planner.report()
        planner = self._input_planning[1]
        report["input"] = planner.report() if planner is not None else None
        return report

    @property
    def data_findings(self):
        """What `tapeworks.data.check` said about the last tf.data pipeline read."""
        return self._data.findings

    # fit ----------------------------------------------------------------

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None,
            validation_split=0.0, validation_data=None, shuffle=True, class_weight=None,
            sample_weight=None, initial_epoch=0, steps_per_epoch=None, validation_steps=None,
            validation_batch_size=None, validation_freq=1, *, checkpoint_dir=None,
            checkpoint_every="epoch", keep=3, keep_best=None, resume=True, overwrite=False,
            checkpoint_data="auto", checkpoint_async=False, global_batch_size=None):
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

        Resuming (keyword-only; tapeworks' own, see the README's "Resume"):
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
        batch_size = self._global_batch(batch_size, global_batch_size)
        # The user's own tf.functions that retrace while this fit runs are
        # reported with the argument that changed (`retracing.py`).
        with retracing.RetraceWatch() as watch:
            try:
                resumer = None
                if checkpoint_dir is not None:
                    self._refuse_backup_and_restore(callbacks)
                    resumer = run_checkpoint.RunCheckpointer(
                        checkpoint_dir, every=checkpoint_every, keep=keep,
                        keep_best=keep_best, resume=resume, overwrite=overwrite,
                        checkpoint_data=checkpoint_data, asynchronous=checkpoint_async,
                        chief=distribute_lib.is_chief(self._strategy))
                    with resumer.preemption:
                        try:
                            history = self._fit(x, y, batch_size, epochs, verbose, callbacks,
                                                validation_split, validation_data, shuffle,
                                                class_weight, sample_weight, initial_epoch,
                                                steps_per_epoch, validation_steps,
                                                validation_batch_size, validation_freq, resumer)
                        except BaseException:
                            # The save in flight still completes (it holds good
                            # state); the error that stopped fit is the one raised.
                            resumer.close(raise_errors=False)
                            raise
                        resumer.close()
                        return history
                return self._fit(x, y, batch_size, epochs, verbose, callbacks,
                                 validation_split, validation_data, shuffle, class_weight,
                                 sample_weight, initial_epoch, steps_per_epoch,
                                 validation_steps, validation_batch_size, validation_freq)
            finally:
                self.retraces = watch.reported

    def _announce_replicas(self, batch_size, verbose):
        """Under a replicated strategy: how many replicas, why, each one's batch (printed once)."""
        if not replicas.is_replicated(self._strategy):
            return
        count = self._strategy.num_replicas_in_sync
        batch = (f"global batch {batch_size}, {batch_size // count} per replica"
                 if batch_size else "each of the dataset's batches split across them")
        line = (f"tapeworks: training on {count} replica{'s' if count != 1 else ''} under "
                f"{type(self._strategy).__name__} ({self._strategy_reason}); {batch}")
        logger.info("%s", line)
        if verbose and not self._replicas_announced:
            self._replicas_announced = True
            print(line)

    def _global_batch(self, batch_size, global_batch_size):
        """`batch_size` for fit, checked to split evenly over the replicas."""
        if global_batch_size is not None:
            if batch_size is not None and batch_size != global_batch_size:
                raise ConfigError(
                    f"batch_size={batch_size} and global_batch_size={global_batch_size} "
                    "disagree. Both are the batch over all replicas. Fix: pass one of them.")
            batch_size = global_batch_size
        if batch_size is not None and replicas.is_replicated(self._strategy):
            self.per_replica_batch_size = distribute_lib.per_replica_batch_size(
                batch_size, self._strategy)
        return batch_size

    def _fit(self, x, y, batch_size, epochs, verbose, callbacks, validation_split,
             validation_data, shuffle, class_weight, sample_weight, initial_epoch,
             steps_per_epoch, validation_steps, validation_batch_size, validation_freq,
             resumer=None):
        verbose = resolve_verbose(verbose)
        self._announce_replicas(batch_size, verbose)
        self._resumer = resumer
        self._before_resume = None   # not left over from a fit an error stopped
        self.checkpoint_saves = resumer.records if resumer is not None else []
        self.task.check_unchanged()
        data_stage.check_epochs(epochs, initial_epoch, steps_per_epoch)
        data_stage.check_validation_freq(validation_freq)
        workers = distribute_lib.worker_count(self._strategy)
        if self._data.seed is None and (resumer is not None or workers > 1):
            # Array inputs are replayed from the seed on resume: a run
            # without one gets one, kept in the checkpoint folder. Several
            # workers shuffle with the chief's, or their shards would overlap.
            chief = distribute_lib.is_chief(self._strategy)
            seed = 0
            if chief:
                def make():
                    return int.from_bytes(os.urandom(4), "little")

                seed = resumer.run_seed(make) if resumer is not None else make()
            if workers > 1:
                seed = distribute_lib.agreed_sum(self._strategy, [seed])[0]
            self._data.seed = seed
        train, validation = self._data.for_fit(
            x, y, sample_weight, batch_size=batch_size, shuffle=shuffle,
            class_weight=class_weight, steps_per_epoch=steps_per_epoch,
            validation_split=validation_split, validation_data=validation_data,
            validation_batch_size=validation_batch_size, validation_steps=validation_steps)
        if not train.reusable and steps_per_epoch is None and epochs - initial_epoch > 1:
            raise DataSpecError(
                f"`x` is a generator object, which can be read only once, and fit was asked "
                f"for {epochs - initial_epoch} epochs. Expected data that can be read again "
                "each epoch. Fix: pass the generator *function* (tapeworks calls it every "
                "epoch), a keras.utils.PyDataset or a tf.data.Dataset; or make the "
                "generator endless and set `steps_per_epoch`.")
        self._build(train.dataset.element_spec)
        self._first_fit_checks()
        resume_point = None
        if resumer is not None:
            resumer.data = run_checkpoint.data_mode(train, resumer.checkpoint_data)
            if resumer.data == "iterator" and workers > 1:
                raise ConfigError(
                    f"checkpoint_dir with a tf.data pipeline under {workers} workers: tf.data's "
                    "iterator checkpoint holds one worker's position in its own shard, which "
                    "the chief's checkpoint cannot hold for every worker. Expected arrays "
                    "(replayed from the run's seed on any number of workers) or "
                    "checkpoint_data=\"skip\". Fix: pass checkpoint_data=\"skip\" (the "
                    "pipeline is re-created and the batches already trained are skipped: exact "
                    "for a pipeline in a fixed order), or arrays.")
            resume_point = resumer.restore(self._read_run_state)
            if resumer.data == "iterator":
                saved = (resume_point.symbolic if resume_point is not None
                         and resume_point.data == "iterator" and resume_point.passes else None)
                train.dataset, resumer.symbolic_data = run_checkpoint.symbolic_checkpointing(
                    train.dataset, saved)
        self._guard.reset()
        self._nonfinite_warned = 0
        self._host_step, self._monitor_next = int(self.counters.step.numpy()), None
        self._ensure_planner()
        if train.batch_size and self._plan_key is None:
            self._use_plan_cache(train.batch_size)
        if resume_point is not None:
            initial_epoch = self._resume_from(resume_point, verbose)
        steps_known = train.steps
        if steps_known:
            self._planner.limit_steps(max(1, steps_known // 2))
        end_line = EpochEndLine()
        if isinstance(callbacks, keras.callbacks.CallbackList):
            callbacks = callbacks.callbacks
        self._stop_on_nonfinite = any(isinstance(c, keras.callbacks.TerminateOnNaN)
                                      for c in callbacks or [])
        self._keep_gradients_for(callbacks or [])
        callback_list = keras.callbacks.CallbackList(
            list(callbacks or []) + [end_line], add_history=True, add_progbar=False,
            model=self.model, verbose=verbose, epochs=epochs, steps=steps_known,
        )
        self.model.stop_training = False
        callback_list.on_train_begin()
        self._user_callbacks = list(callbacks or [])   # saved and restored in this order
        if resume_point is not None:
            # After on_train_begin, which resets EarlyStopping and friends.
            restored = run_checkpoint.restore_callbacks_state(
                self._user_callbacks, *resumer.read_callbacks(resume_point))
            if restored:
                logger.info("restored the state of %s", ", ".join(restored))
        # Keras' BackupAndRestore sets `_initial_epoch` in on_train_begin when it
        # restored a backup; Keras' own loop starts there, and so does this one.
        initial_epoch = getattr(self.model, "_initial_epoch", None) or initial_epoch
        input_planner = (None if resumer is not None
                         else self._input_planner_for(x, train, steps_per_epoch))
        batches = inputs.EpochBatches(train, steps_per_epoch, input_planner,
                                      make_iterator=self._iterate)
        if resume_point is not None:
            batches.resume(resume_point.passes, resume_point.batches_drawn,
                           mid_pass=resume_point.steps_in_epoch > 0
                           or steps_per_epoch is not None,
                           restore_iterator=self._iterator_reader(resume_point))
        training_logs = None
        for epoch in range(initial_epoch, epochs):
            resuming_mid_epoch = (resume_point is not None and epoch == resume_point.epoch
                                  and resume_point.steps_in_epoch > 0)
            if not resuming_mid_epoch:
                self._reset_metrics()   # a resumed epoch keeps its restored running metrics
            self.counters.epoch.assign(epoch)
            train.on_epoch_begin()
            callback_list.on_epoch_begin(epoch)
            progress = EpochProgress(epoch, epochs, steps_known, verbose)
            if input_planner is not None:
                settled = not self._planner.tuning
                input_planner.start_epoch(epochs - epoch, settled)
                traces, epoch_start = sum(self.traces.values()), time.perf_counter()
            steps_done, samples_done, logs = self._train_epoch(
                batches, callback_list, progress, epoch, later_epochs=epochs - epoch - 1,
                known_steps=steps_known,
                start=((resume_point.steps_in_epoch, resume_point.samples_in_epoch)
                       if resuming_mid_epoch else (0, 0)))
            if input_planner is not None:
                input_planner.end_epoch(
                    samples_done, time.perf_counter() - epoch_start,
                    comparable=settled and not self._planner.tuning
                    and sum(self.traces.values()) == traces)
            train.on_epoch_end()
            self._close_partial_window()
            self._check_learning_rates(epochs - epoch - 1)
            if steps_known is None and steps_per_epoch is None:
                steps_known = steps_done
            if steps_known:
                self._planner.limit_steps(max(1, steps_known // 2))
            epoch_logs = dict(logs)
            epoch_logs.update(self._monitor_report.logs())
            if self.pruning is not None:
                epoch_logs.update(self.pruning.sparsity())
            if self.diagnose_input_after_first_epoch and epoch == initial_epoch:
                self.input_report = self.diagnose_input(train.dataset)
                if verbose:
                    print(self.input_report)
                logger.info("%s", self.input_report)
            # As in Keras: validated even when a callback stopped training
            # during the epoch, so History and CSVLogger rows keep their val_*.
            if validation is not None and data_stage.should_validate(epoch, validation_freq):
                val_logs = self._evaluate_dataset(validation, callback_list)
                epoch_logs.update({"val_" + k: v for k, v in val_logs.items()})
            # The epoch's last line is written by `end_line`, after the other
            # callbacks, so what they add (ReduceLROnPlateau's learning_rate) shows.
            end_line.progress, end_line.steps, end_line.samples = (
                progress, steps_done, samples_done)
            callback_list.on_epoch_end(epoch, epoch_logs)
            self._announce_choice_once(verbose)
            self._announce_input_choice_once(input_planner, verbose)
            training_logs = epoch_logs
            if resumer is not None and self._agreed_save(
                    resumer.due_after_epoch() or resumer.save_at_epoch_end
                    or resumer.preemption.signal is not None):
                # A run a callback stopped is saved as finished: running the
                # command again must not train on past EarlyStopping.
                self._save_run(batches, epochs if self.model.stop_training else epoch + 1, 0, 0,
                               logs=epoch_logs)
                self._exit_if_preempted()
            if self.model.stop_training:
                break
        if epochs > initial_epoch:
            # EMA optimizers (use_ema=True) copy their averages into the
            # weights here, as Keras' fit does.
            for update in self.task.updates:
                update.optimizer.finalize_variable_values(update.variables())
            if self.pruning is not None:
                self.pruning.apply_masks()   # the averages of pruned weights are not zero
        finished = max(epochs, initial_epoch)
        if resumer is not None and resumer.last_position != (finished, 0):
            # The end of the run is saved too: running the command again
            # finds the run finished instead of repeating its tail (or the
            # end of its last epoch: validation, epoch callbacks).
            self._save_run(batches, finished, 0, 0)
        if resumer is not None:
            self._exit_if_preempted()
        self._remember_steps_for_later_runs()
        if self._planner.tuning:
            # Measuring goes on in the next fit (epoch-by-epoch fit loops are
            # common): choosing now would rest on a partial schedule.
            logger.info("still measuring the execution mode and steps per call; "
                        "it continues in the next fit (see `trainer.tuning`)")
        callback_list.on_train_end(training_logs)
        return self.model.history

    def _input_planner_for(self, x, train, steps_per_epoch):
        """The input planner for a built pipeline (kept across fits on it), else None.

        Only whole passes are measured: with `steps_per_epoch` the iterator
        carries over between epochs, so an epoch has no way of its own.
        """
        if train.parallelism is None or steps_per_epoch is not None:
            return None
        reference, planner = self._input_planning
        if planner is None or reference() is not x:
            planner = input_planner_lib.InputPlanner(train.parallelism)
            self._input_planning = (weakref.ref(x), planner)
        elif planner.dataset_of_first_way is not train.dataset:
            # The same ways on this fit's own prepared dataset (a class-weight
            # map, a take); the rates stay. Otherwise the ways are kept: a new
            # copy would pay its first iterator's set-up again.
            planner.use(train.parallelism)
        return planner

    def _announce_input_choice_once(self, planner, verbose):
        if planner is None or planner.choice is None or planner.announced:
            return
        planner.announced = True
        if verbose:
            print(planner.summary())
        logger.info("%s", planner.summary())

    def _ensure_planner(self):
        if self._planner is None:
            self._planner = autotune.CallPlanner(
                self._jit_setting, self._steps_setting,
                # Captures are copied on every k-th step into one buffer,
                # read after the call: calls of at most k steps.
                max_steps=self.capture_every,
                xla_available=not self.run_eagerly and not self.deterministic
                and not replicas.is_replicated(self._strategy) and all(
                    _model_supports_xla(m) for m in self.task.models),
                # Mixed precision gained most from XLA on the update alone (the
                # forward and backward ran faster outside XLA); float32 from XLA
                # on the whole step. The likelier winner is tried first.
                xla_order=(("update", True) if self.precision.policy != "float32"
                           else (True, "update")),
            )

    def _train_epoch(self, batches, callback_list, progress, epoch, later_epochs=0,
                     known_steps=None, start=(0, 0)):
        steps_per_epoch = batches.steps_per_epoch
        epoch_steps = steps_per_epoch or batches.prepared.steps
        # Data of unknown length: its length is known after the first epoch.
        length = epoch_steps or known_steps
        steps_done, samples_done = start   # a resumed epoch starts where it was saved
        logs = {}
        try:
            batches.start_epoch()
        except DataSpecError:
            if self._before_resume is not None:
                # The checkpoint's data position does not fit this data:
                # nothing trained, the model is as it was before fit.
                self._put_back(self._before_resume)
            raise
        finally:
            self._before_resume = None
        restarted = False
        while steps_per_epoch is None or steps_done < steps_per_epoch:
            if steps_per_epoch is None and epoch_steps and steps_done >= epoch_steps:
                break
            if length:
                # What measuring can still win back: the rest of this fit.
                self._planner.remaining_steps = (later_epochs * length
                                                 + max(length - steps_done, 0))
            self._planner.reconsider()
            probe = self._planner.next_call()
            num_steps = probe.steps
            if epoch_steps:
                # Never ask past the end of the epoch: a call that fits is
                # measured whole.
                num_steps = max(1, min(num_steps, epoch_steps - steps_done))
            monitored, num_steps = self._monitored_steps(probe, num_steps)
            iterator = batches.iterator()
            callback_list.on_train_batch_begin(steps_done)
            try:
                ran, samples, call_logs, seconds = self._run_train_call(
                    probe, iterator, num_steps, steps_done, monitored=monitored,
                    batches=batches)
            except tf.errors.DataLossError as error:
                # tf.data names neither the file nor the record: find them.
                raise sources.corruption_error(batches.prepared.dataset, error) from error
            batches.consumed(ran)
            if ran:
                self._host_step += ran
                self._check_dead_gradients(ran)
                # A monitored call is measured too: one monitored step in a
                # call is part of what training with the monitor costs.
                self._planner.record(probe, num_steps, ran, samples, seconds)
                if monitored:
                    call_logs.update(self._deliver_monitor(callback_list, monitored,
                                                           self._host_step - ran))
                if self._plan_cache is not None and self._plan_key is None:
                    # The batch size was not known before: now it is.
                    self._use_plan_cache(samples // ran)
                self._deliver_capture(callback_list)
                steps_done += ran
                samples_done += samples
                logs = call_logs
                restarted = False
                callback_list.on_train_batch_end(steps_done - 1, logs)
                progress.update(steps_done, samples_done, logs, self._planner.status())
                if self._resumer is not None and self._agreed_save(
                        self._resumer.due_after_call(self._host_step)):
                    if (epoch_steps and steps_done >= epoch_steps
                            and self._resumer.preemption.signal is None):
                        # The epoch's last step: saved at the epoch's end, once,
                        # after its validation and epoch callbacks.
                        self._resumer.save_at_epoch_end = True
                    else:
                        self._save_run(batches, epoch, steps_done, samples_done)
                        self._exit_if_preempted()
                if self.model.stop_training:
                    break
            if ran < num_steps:
                # The data ran out.
                if steps_per_epoch is None:
                    break
                if restarted or not batches.prepared.reusable:
                    raise DataSpecError(batches.prepared.empty_message(
                        epoch, steps_done, steps_per_epoch))
                batches.restart()
                restarted = True
        if steps_done == 0:
            raise DataSpecError(batches.prepared.empty_message(epoch, 0, steps_per_epoch))
        return steps_done, samples_done, logs

    def _run_train_call(self, probe, iterator, num_steps, steps_done=0, monitored=None,
                        batches=None):
        """One call of the train loop; `monitored`: the indices of its monitored steps."""
        if probe.first:
            return self._run_first_step(probe.jit, iterator, steps_done, bool(monitored))
        fast = self._fast_guard(probe.jit, batches)
        loop = self._loop("train", probe.jit, bool(monitored), fast)
        start = time.perf_counter()
        with guards.inside_step():
            ran, samples, logs, *last = loop(iterator, tf.constant(num_steps, tf.int64),
                                             *_monitored_at(monitored, num_steps))
        # Reading the results is the call's one host sync.
        ran, samples = int(ran), int(samples)
        seconds = time.perf_counter() - start
        if not fast:
            self._after_guarded_call(last, steps_done, ran)
        else:
            if not self._snapshot.confirmed:
                self._check_snapshot_complete()
            if not bool(last[0]):
                ran, samples, logs = self._replay_call(probe.jit, batches, ran, steps_done,
                                                       monitored)
                seconds = time.perf_counter() - start
        return ran, samples, callback_bridge.python_logs(logs), seconds

    def _after_guarded_call(self, last, steps_done, ran):
        """A halted "raise" call localises and raises; "warn" and "skip" report their count."""
        if last and self._guard.halted:
            self._nonfinite_stop(self._local_batch(last[0].get_value()),
                                 steps_done + ran - 1)
        self._warn_nonfinite()

    def _fast_guard(self, jit, batches):
        """Whether this call takes the non-finite guard's fast path (`rollback`).

        Only where the per-step branch is what costs: tf.function steps (in
        an XLA step or update the branch is XLA's, and cheap) on one device,
        with "raise" or "skip", data that can be replayed (arrays; an
        in-memory pipeline without a shuffle), no loss scale (its own
        verdict withholds overflowed steps), no captures, and a state small
        enough to copy once a call.
        """
        if (self._fast_guard_off or jit is not False or self.run_eagerly
                or self._guard is None or not self._guard.blocks_update
                or replicas.is_replicated(self._strategy) or self._capture is not None
                or self.precision.checks_finite or batches is None
                or not batches.replayable):
            return False
        if self._snapshot is None:
            variables = self._mutable_variables()
            if not rollback.fits(variables):
                self._fast_guard_off = "the state is too large to copy once a call"
                return False
            self._snapshot = rollback.CallSnapshot(variables)
        return True

    def _check_snapshot_complete(self):
        """After a fast call: a variable the first trace created is not in the snapshot.

        `_setup` creates every variable before training; a model that makes
        one during its first step (a layer built lazily in `call`) would be
        left out of the copies, so the path is turned off for it.
        """
        self._snapshot.confirmed = True
        if len(self._mutable_variables()) != len(self._snapshot.variables):
            self._fast_guard_off = "variables were created during the first step"

    def _replay_call(self, jit, batches, ran, steps_done, monitored=None):
        """A fast call ended with a non-finite variable: replays it with the guarded step.

        Every variable goes back to the call's start, and the call's batches
        are drawn again from the rebuilt data (`EpochBatches.replay`), which
        then stands in for the pass's iterator. The guarded step withholds
        the bad step's update: "raise" stops there and localises, "skip"
        goes on, as if the call had been guarded from the start.
        """
        self._snapshot.restore()
        self._replays += 1
        if self._replays >= MAX_REPLAYS:
            # Bad steps are not rare here ("skip" over bad data): a call
            # run twice each time costs more than a guard on every step.
            self._fast_guard_off = f"{self._replays} calls held non-finite steps"
        iterator = batches.replay()
        batches.adopt(iterator)
        bad_before = int(self._guard.count.numpy())
        for monitor in self._monitors:
            # The replay makes the call's records again, into the same slots.
            monitor.records.assign(self._monitor_records)
        loop = self._loop("train", jit, bool(monitored))
        with guards.inside_step():
            ran, samples, logs, *last = loop(iterator, tf.constant(ran, tf.int64),
                                             *_monitored_at(monitored, ran))
        ran, samples = int(ran), int(samples)
        if int(self._guard.count.numpy()) == bad_before:
            # No step was bad: something else held a NaN or Inf (a value
            # set before the call, a metric of its own). The check of the
            # whole call cannot tell bad steps here: guard every step.
            self._fast_guard_off = ("a call ended with a non-finite variable that no step "
                                    "made non-finite")
            logger.info("tapeworks: the non-finite check goes step by step from here: %s",
                        self._fast_guard_off)
        self._after_guarded_call(last, steps_done, ran)
        return ran, samples, logs

    def _mutable_variables(self):
        """Every variable a training step can change.

        What the fast path's snapshot copies, and what a failed checkpoint
        read puts back.
        """
        found = {}

        def add(variables):
            for variable in variables:
                found.setdefault(id(variable), variable)

        for model in self.task.models:
            add(model.variables)           # weights, and SeedGenerator states
            add(model.metrics_variables)
        for update in self.task.updates:
            add(update.optimizer.variables)
            if isinstance(update.loss, tf.Module):
                add(update.loss.variables)  # a weighting's own state
        parts = [self.counters, self.precision, *self.states, self._guard, *self._dead,
                 *self._monitors]
        if self.pruning is not None:
            parts.append(self.pruning)
        for part in parts:
            add(part.variables)
        for tracker in self._trackers.values():
            add(tracker.variables)
        for value in vars(self.task).values():
            if isinstance(value, keras.metrics.Metric):
                add(value.variables)
        add([self.task.random.state])
        return list(found.values())

    def _local_batch(self, batch):
        """A batch as drawn from `_iterate`, as one batch: this worker's replicas' shares joined."""
        if not replicas.is_replicated(self._strategy):
            return batch
        return tf.nest.map_structure(
            lambda t: tf.concat(self._strategy.experimental_local_results(t), axis=0), batch)

    def _nonfinite_stop(self, batch, batch_index):
        """The "raise" policy after a halted call: localise, then raise (or stop)."""
        # The loop stopped right after the bad step: the last one counted.
        report = nonfinite_lib.localise(
            self.task, batch, self.counters, step=int(self.counters.step.numpy()) - 1,
            epoch=int(self.counters.epoch.numpy()), batch_index=batch_index,
            directory=self.nonfinite_dir)
        text = nonfinite_lib.message(report)
        if self._stop_on_nonfinite:
            # Keras' TerminateOnNaN stops training without an error; so does this.
            warn(f"tapeworks: {text} Training stopped (TerminateOnNaN).", CorrectnessWarning)
            self.model.stop_training = True
            return
        raise nonfinite_lib.NonFiniteError(text, report)

    def _first_fit_checks(self):
        """Once per trainer: mistakes in how the model and its loss are set up (warnings)."""
        if self._setup_checked:
            return
        self._setup_checked = True
        if not any(update.variables() for update in self.task.updates):
            names = ", ".join(f"`{m.name}`" for m in self.task.models)
            warn(f"tapeworks: nothing is trainable: every weight of {names} is frozen "
                 "(trainable=False), so fit changes no weight, only the metrics. Fix: set "
                 "`model.trainable = True` (or on the layers to fine-tune) before creating "
                 "the Trainer.", CorrectnessWarning)
        if isinstance(self.task, task_lib.SupervisedTask):
            guards.check_output_matches_loss(self.model)

    def _check_learning_rates(self, epochs_left):
        """At an epoch's end: a schedule that has decayed the learning rate to about nothing.

        A Keras schedule counts optimizer steps, so a `decay_steps` meant in
        epochs decays hundreds of times too fast; training then stops moving
        with no error. One read per optimizer per epoch; warned once.
        """
        if epochs_left <= 0:
            return
        for update in self.task.updates:
            optimizer = update.optimizer
            schedule = getattr(optimizer, "_learning_rate", None)
            if (not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule)
                    or update.name in self._decayed_warned):
                continue
            start = float(schedule(0))
            now = float(optimizer.learning_rate)
            if start > 0 and now < 1e-3 * start:
                self._decayed_warned.add(update.name)
                warn(f"tapeworks: the learning rate of update {update.name!r} has decayed to "
                     f"{now:.3g} from {start:.3g} after {int(optimizer.iterations)} optimizer "
                     f"steps, with {epochs_left} epoch(s) still to run: training has all but "
                     f"stopped. Keras' schedules count optimizer steps (batches), not epochs. "
                     f"Fix: check `decay_steps` of the {type(schedule).__name__} (e.g. "
                     "epochs x steps per epoch).", CorrectnessWarning)

    def _monitored_steps(self, probe, num_steps):
        """The indices of the next call's monitored steps (`monitor_every`), and its length.

        A monitored step is the k-th step, or with accumulation the first
        step at or after it that closes a window; the next is the first such
        step after it. A call holds at most `monitor.RECORDS_PER_CALL` of
        them and then ends on the last (a mode's first call while tuning is
        one step, monitored when due). The next k-th step
        due is worked out from the step counter when unknown (at a fit's
        start) and moves on only with the records made, so a step the data
        did not reach stays due.
        """
        if not self._monitors:
            return None, num_steps
        every = self.monitor_every
        if self._monitor_next is None:
            self._monitor_next = (self._host_step // every + 1) * every - 1
        due, positions = self._monitor_next, []
        if self._host_step + num_steps <= due:
            return None, num_steps   # the call ends before the due step: no device read
        pending = int(self.states[0].micro_step.numpy()) if self.accumulate > 1 else 0
        for index in range(max(0, due - self._host_step), num_steps):
            step = self._host_step + index
            if step >= due and (pending + index + 1) % self.accumulate == 0:
                positions.append(index)
                due = _next_kth_step(step, every)
                if len(positions) == monitor_lib.RECORDS_PER_CALL:
                    return positions, index + 1
        return positions or None, num_steps

    def _deliver_monitor(self, callback_list, positions, call_start):
        """After a monitored call: its records per layer into the history, logs and TensorBoard."""
        records = int(self._monitors[0].records.numpy())
        made = records - self._monitor_records
        if not made:
            return {}   # the data ended before the monitored step: it stays due
        owners = self._layer_owners()
        for index in range(made):
            step = call_start + positions[index]
            stats = monitor_lib.layer_stats(self._monitors, owners, self._monitor_records + index)
            self._monitor_report.add(step, stats)
        self._monitor_records = records
        self._monitor_next = _next_kth_step(step, self.monitor_every)
        self._monitor_report.write_tensorboard(callback_list.callbacks, self._monitors, made)
        return self._monitor_report.logs()

    def _layer_owners(self):
        """`id(variable) -> its layer`, for the monitor's and the dead-gradient reports (cached)."""
        if self._owners is None:
            self._owners = gradient_health.owners(self.task.models)
        return self._owners

    def _keep_gradients_for(self, callbacks):
        """Gradient histograms for a TensorBoard callback that asks for histograms."""
        wanted = any(isinstance(c, keras.callbacks.TensorBoard) and c.histogram_freq
                     for c in callbacks)
        if not self._monitors or not wanted or self._monitors[0].gradients is not None:
            return
        for monitor in self._monitors:
            monitor.keep_gradients()
        # A monitored step traced before has no buffers to write: trace it again.
        # Their keys: (kind, mode, monitored, ...).
        for key in [k for k in self._loops if isinstance(k, tuple) and k[2:3] == (True,)
                    and k[0] in ("train", "train_step", "train_step_replicated", "updaters")]:
            del self._loops[key]

    @property
    def monitor_history(self):
        """What `monitor_every` recorded: `[{"step": s, "layers": {layer: {...}}}]`."""
        return self._monitor_report.history

    def _check_dead_gradients(self, steps_run):
        """Once `dead_gradient_steps` steps have run: one read of the sums, a warning for new dead ones."""
        if not self._dead:
            return
        self._dead_unchecked += steps_run
        if self._dead_unchecked < self.dead_gradient_steps:
            return
        window, self._dead_unchecked = self._dead_unchecked, 0
        found = [v for dead in self._dead for v in dead.dead()
                 if id(v) not in self._dead_reported]
        if found:
            self._dead_reported.update(id(v) for v in found)
            warn(gradient_health.dead_message(found, window, self._layer_owners()),
                 CorrectnessWarning)

    def _warn_nonfinite(self):
        """The "warn" policy: a warning when more non-finite steps were applied."""
        if self.on_nonfinite != "warn":
            return
        count = int(self._guard.count.numpy())
        if count > self._nonfinite_warned:
            self._nonfinite_warned = count
            warn(f"tapeworks: {count} non-finite step(s) in this fit so far (by step "
                 f"{int(self.counters.step.numpy()) - 1}); their updates were applied "
                 "(on_nonfinite=\"warn\"). Fix: on_nonfinite=\"raise\" names where the "
                 "values turn non-finite.", CorrectnessWarning)

    def _run_first_step(self, jit, iterator, steps_done=0, monitored=False):
        """A mode's first (untimed) call while tuning: one step on a batch drawn here.

        Drawing the batch outside the compiled loop means that when XLA
        cannot compile the step (an op without an XLA kernel, found only when
        the step first runs), the same batch is trained on without XLA:
        measuring never loses data. `monitored`: the step is a monitored one.
        """
        optional = iterator.get_next_as_optional()
        if not optional.has_value():
            return 0, 0, {}, 0.0
        batch = optional.get_value()
        start = time.perf_counter()

        def one_step(mode):
            return self._split_capture(
                self._replicated_step("train", mode, monitored=monitored)(batch))

        with guards.inside_step():
            try:
                samples = one_step(jit)
            except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as error:
                if not jit or self._jit_setting != "auto":
                    raise
                logger.warning("XLA cannot compile the %s step (%s); "
                               "not using that mode", autotune.describe(jit),
                               _xla_failure(error))
                self._planner.drop_xla(error, jit)
                samples = one_step(False)
            logs = callback_bridge.python_logs(self._train_results())
        seconds = time.perf_counter() - start
        if self._guard.halted:
            self._nonfinite_stop(self._local_batch(batch), steps_done)
        self._warn_nonfinite()
        return 1, int(samples), logs, seconds

    def diagnose_input(self, data, batches=30, batch_size=None):
        """Measures whether training waits for data; returns a `tapeworks.data.InputReport`.

        Trains nothing: the state is saved before the timed runs and restored
        after. See `tapeworks/data/diagnose.py`.
        """
        import tempfile

        dataset = self._built_data(data, batch_size=batch_size).dataset
        mode = self.jit_compile or False
        loop = self._loop("train", mode)
        pipeline = diagnose_lib.pipeline_rate(dataset, batches)
        in_memory = dataset.take(batches).cache()
        for _ in in_memory:  # fill the cache
            pass

        def rate(source):
            iterator = self._iterate(source)
            with guards.inside_step():
                int(loop(iterator, tf.constant(1, tf.int64))[0])   # traced and warm
                start = time.perf_counter()
                ran = int(loop(iterator, tf.constant(batches - 1, tf.int64))[0])
            return ran / max(time.perf_counter() - start, 1e-9)

        with tempfile.TemporaryDirectory() as folder:
            saved = self.checkpoint.write(os.path.join(folder, "state"))
            try:
                compute = rate(in_memory)
                self.checkpoint.read(saved).assert_existing_objects_matched()
                training = rate(dataset)
            finally:
                self.checkpoint.read(saved).assert_existing_objects_matched()
        self._reset_metrics()
        return diagnose_lib.report(dataset, pipeline, compute, training)

    def explain(self, data, steps=20, batch_size=None, profile_dir=None, try_xla=True):
        """Where a training step's time goes, and what would help here: an `Explanation`.

        A short measured training on this trainer's compiled loop: input
        wait, the step's compute, the host's cost per call, tracing and
        compiling, retraces; then the changes that apply (steps per call,
        XLA, prefetch, cache), each measured and ranked. Every variable is
        restored afterwards: nothing is trained. `profile_dir` also writes a
        TensorBoard profiler trace. `print(trainer.explain(data))` shows it;
        see `tapeworks/explain.py`.
        """
        from tapeworks import explain as explain_lib

        return explain_lib.explain(self, data, steps=steps, batch_size=batch_size,
                                   profile_dir=profile_dir, try_xla=try_xla)

    def _split_capture(self, outputs):
        """A first step's outputs: records its captures, returns its batch size."""
        if self._capture is None:
            return outputs
        size, extra = outputs
        self._record_capture(extra)
        return size

    def _record_capture(self, extra):
        self._capture.maybe_record(self.counters.step - 1, extra)

    def _deliver_capture(self, callback_list):
        """Hands newly captured tensors to callbacks with `on_capture` (one read per capture)."""
        if self._capture is None:
            return
        if int(self._capture.step.numpy()) == self._delivered_capture:
            return
        step_index, tensors = self._capture.read()
        self._delivered_capture = step_index
        for callback in callback_list.callbacks:
            if hasattr(callback, "on_capture"):
                callback.on_capture(step_index, tensors)

    def _use_plan_cache(self, batch_size):
        """After the first step: adopt the plan a previous run stored for this fingerprint."""
        if self._plan_cache is None or not self._planner.tuning:
            return
        self._plan_key, self._plan_description = plan_cache_lib.fingerprint(self, batch_size)
        plan = self._plan_cache.get(self._plan_key)
        if plan is not None:
            self._planner.adopt(autotune.Choice(
                plan["jit_compile"], plan["steps_per_call"],
                f"from the plan cache ({plan['reason']})"), memory=plan.get("memory"))
            self._plan_reason = plan["reason"]

    def _announce_choice_once(self, verbose):
        """Says what "auto" chose, once per choice (printed at verbose >= 1, logged); stores it."""
        choice = self._planner.choice
        if choice is None or choice is self._announced:
            return
        self._announced = choice
        if self._jit_setting == "auto" or self._steps_setting == "auto":
            line = (f"jit_compile={choice.jit_compile}, "
                    f"steps_per_call={choice.steps_per_call} ({choice.reason})")
            if verbose:
                print(f"tapeworks: {line}")
            logger.info("%s", line)
        if self._plan_key is not None and not self._planner.from_cache:
            self._plan_reason = choice.reason
            self._store_plan()

    def _store_plan(self):
        """Writes this trainer's plan, with what a later run needs to go on deciding."""
        choice = self._planner.choice
        self._plan_cache.put(self._plan_key, choice.jit_compile, choice.steps_per_call,
                             self._plan_reason, self._plan_description,
                             memory=self._planner.memory())

    def _remember_steps_for_later_runs(self):
        """At the end of a fit: the steps trained count toward trying a waiting XLA mode.

        Only plans with a mode still waiting are rewritten (see
        `CallPlanner.memory`); the others stay as they were stored.
        """
        if self._plan_key is not None and self._planner.choice is not None \
                and self._planner.memory() is not None:
            self._store_plan()

    # Resuming (run_checkpoint.py) ---------------------------------------------

    @staticmethod
    def _refuse_backup_and_restore(callbacks):
        for callback in callbacks or []:
            if isinstance(callback, keras.callbacks.BackupAndRestore):
                raise ConfigError(
                    "keras.callbacks.BackupAndRestore was passed with checkpoint_dir. They "
                    "would both restore the run, and BackupAndRestore restarts an interrupted "
                    "epoch from its first batch on mid-epoch weights. Expected one of them. "
                    "Fix: drop BackupAndRestore; checkpoint_dir saves and resumes everything "
                    "it does, and the data position, random state and callbacks' state too.")

    def _run_state(self):
        """`trainer.checkpoint` plus what a resumed step also depends on.

        `Layer.variables` beyond the weights (Keras SeedGenerator states:
        Dropout's draws), the metric accumulators of the running epoch, and
        the Task's generator.
        """
        if self._run_state_object is not None:
            # One object for every save of this trainer: TensorFlow keeps
            # its save function on it (the first write of an object traces).
            return self._run_state_object
        state = self.checkpoint
        metrics = [v for t in self._trackers.values() for v in t.variables]
        for model in self.task.models:
            metrics.extend(model.metrics_variables)
        for value in vars(self.task).values():
            if isinstance(value, keras.metrics.Metric):
                metrics.extend(value.variables)
        state.metrics = metrics
        self._run_state_object = state
        return state

    def _read_run_state(self, prefix):
        """Restores a saved run state; on failure puts every variable back as it was."""
        state = self._run_state()
        before = [(v, v.numpy()) for v in self._mutable_variables()]
        try:
            state.read(prefix).assert_existing_objects_matched()
        except Exception:
            self._put_back(before)
            raise
        # Until the data is positioned too (the first epoch's start): a data
        # position that does not fit puts every variable back as well.
        self._before_resume = before

    @staticmethod
    def _put_back(values):
        for variable, value in values:
            variable.assign(value)

    def _iterator_reader(self, point):
        if point.data != "iterator" or not point.passes:
            return None
        prefix = os.path.join(point.folder, "data")
        return lambda iterator: tf.train.Checkpoint(iterator=iterator).read(
            prefix).assert_consumed()

    def _resume_from(self, point, verbose):
        """Applies a restored run's choice of mode; says where it resumed. Returns its epoch."""
        self._host_step = int(self.counters.step.numpy())
        saved_seed = point.run.get("seed")
        if point.data == "replay" and saved_seed != self._data.seed:
            warn(f"tapeworks: the checkpoint's run shuffled with seed {saved_seed}, this trainer "
                 f"with {self._data.seed}: the resumed epochs see the data in another order "
                 "than the uninterrupted run would have. Fix: Trainer(seed=...) as in the run "
                 "that saved it.", CorrectnessWarning)
        planner = point.run.get("planner")
        if planner and (self._jit_setting == "auto" or self._steps_setting == "auto"):
            # Over a plan-cache choice too: the checkpoint's is what the run was
            # running. A setting the caller fixed stays as given.
            self._planner.adopt(autotune.Choice(
                planner[0] if self._jit_setting == "auto" else self._jit_setting,
                planner[1] if self._steps_setting == "auto" else self._steps_setting,
                "kept by the checkpoint, so the resumed run runs the same compiled step"))
        message = f"tapeworks: {point.describe()}"
        if verbose:
            print(message)
        logger.info("%s", message)
        return point.epoch

    def _save_run(self, batches, epoch, steps_in_epoch, samples_in_epoch, logs=None):
        resumer = self._resumer
        if resumer.saves == 0 and not self.run_eagerly:
            self._warn_global_random_ops()
        choice = self._planner.choice
        position = {"epoch": epoch, "steps_in_epoch": steps_in_epoch,
                    "samples_in_epoch": samples_in_epoch, "passes": batches.passes,
                    "batches_drawn": batches.drawn, "data": resumer.data,
                    "symbolic_data": resumer.symbolic_data,
                    "planner": [choice.jit_compile, choice.steps_per_call] if choice else None,
                    "seed": self._data.seed}
        folder = resumer.save(
            self._host_step, position, self._write_run_state,
            lambda prefix: tf.train.Checkpoint(iterator=batches.current).write(prefix),
            self._user_callbacks, logs=logs)
        self._last_checkpoint = folder
        return folder

    def _write_run_state(self, prefix):
        """Writes `_run_state()`: eagerly the first time, then as a traced tf.function.

        An eager `Checkpoint.write` walks the object graph in Python on every
        save (18 ms for the small bench MLP, against 4.6 ms traced: `tapeworks
        bench checkpoint`); traced once, a save is the graph's reads and one
        SaveV2. The trace (about 0.1 s) is paid at the second save, when
        saves are known to repeat, and again only if the state's structure
        changes (a traced write would leave new variables out).
        """
        state = self._run_state()
        structure = (tuple(len(part.variables) for part in (
            *self.task.models, *(u.optimizer for u in self.task.updates), self.counters,
            self.precision, *self.states)), len(state.metrics), len(state.random_states))
        if self._state_writer is not None and self._state_writer[0] == structure:
            self._state_writer[1](tf.constant(prefix))
            return
        state.write(prefix)
        # `step.Traced`: keyed by this trainer, so TensorFlow's retracing
        # warning does not count every trainer's writer as one function.
        self._state_writer = (structure, tf.function(
            step.Traced(state.write), input_signature=[tf.TensorSpec([], tf.string)],
            autograph=False))

    def _agreed_save(self, due):
        """Whether to save now: `due`, agreed between workers, with any worker's preemption.

        One worker alone decides from its clock (`checkpoint_every` a
        duration) and its signals; a save reads variables with collectives
        every worker must join, so under several workers the decision is one
        small all-reduce: any worker's due save or SIGTERM makes every worker
        save at the same step (and, after a signal, exit).
        """
        resumer = self._resumer
        if distribute_lib.worker_count(self._strategy) == 1:
            return due
        signalled, wanted = distribute_lib.agreed_sum(
            self._strategy, [int(resumer.preemption.signal is not None), int(due)])
        if signalled and resumer.preemption.signal is None:
            # Another worker was signalled: this one saves and exits with it.
            resumer.preemption.signal = signal.SIGTERM
        return bool(wanted or signalled)

    def _exit_if_preempted(self):
        number = self._resumer.preemption.signal
        if number is None:
            return
        self._resumer.close()    # the message names a complete checkpoint
        import sys
        print(run_checkpoint.preempted_message(number, self._last_checkpoint,
                                               self._resumer.folder.path), file=sys.stderr)
        sys.stderr.flush()
        raise SystemExit(128 + number)

    def _warn_global_random_ops(self):
        functions = []
        for key, fn in self._loops.items():
            if isinstance(key, tuple) and key[0] == "train" and hasattr(
                    fn, "_list_all_concrete_functions"):
                functions.extend(fn._list_all_concrete_functions())
        found = run_checkpoint.global_random_ops(functions)
        if found:
            names = ", ".join(f"{api} (op {op})" for op, api in sorted(found.items()))
            warn(f"tapeworks: the training step calls {names}: a global random op keeps its "
                 "state outside every variable, so no checkpoint can restore it and a resumed "
                 "run draws other numbers than the uninterrupted run. Fix: draw from the "
                 "Task's checkpointed generator, e.g. `self.random.normal(shape)` in "
                 "compute_losses, or a Keras layer (they use a SeedGenerator the checkpoint "
                 "holds).", CorrectnessWarning)

    def _close_partial_window(self):
        """Applies a window left with fewer than `accumulate` micro-batches at epoch end."""
        if self.accumulate == 1 or not any(bool(s.has_pending()) for s in self.states):
            return
        if "close_window" not in self._loops:
            updaters = self._updaters(self.jit_compile or False)

            def close_all():
                for updater in updaters:
                    tf.cond(updater.state.has_pending(), updater.close_window, lambda: None)

            self._loops["close_window"] = (close_all if self.run_eagerly
                                           else tf.function(step.Traced(close_all),
                                                            autograph=False))
        self._loops["close_window"]()

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
        if not self._built:
            raise ConfigError(
                "The trainer has not created its variables yet. Expected a call to "
                "`fit` first (or to `build_state(data)`), then `checkpoint`.")
        parts = {f"model_{i}": m for i, m in enumerate(self.task.models)}
        parts.update({f"optimizer_{i}": u.optimizer for i, u in enumerate(self.task.updates)})
        parts.update({f"update_state_{i}": s for i, s in enumerate(self.states)})
        for i, update in enumerate(self.task.updates):
            if isinstance(update.loss, tf.Module):
                parts[f"weighting_{i}"] = update.loss
        # The random state of the step: Keras SeedGenerator states (Dropout's
        # draws; `Layer.variables` lists them, a checkpoint of the model
        # object does not) and the Task's generator.
        weights = {id(v) for m in self.task.models for v in m.weights}
        parts["random_states"] = [v for m in self.task.models for v in m.variables
                                  if id(v) not in weights]
        parts["task_random"] = self.task.random
        if self.pruning is not None:
            parts["pruning"] = self.pruning
        return tf.train.Checkpoint(precision=self.precision, counters=self.counters, **parts)

    def build_state(self, x=None, y=None, batch_size=None, sample_weight=None):
        """Creates all variables for batches like `x` (and `y`), without training.

        Use it to restore a checkpoint into a fresh trainer before `fit`.
        Takes what `fit` takes (arrays with `y`, a dataset, `(x, y)`).
        """
        self._built_data(x, y, sample_weight, batch_size)
        return self

    def _built_data(self, x, y=None, sample_weight=None, batch_size=None, steps=None):
        """`x` as checked `PreparedData`, with every variable created for its batches."""
        prepared = self._data.prepare(x, y, sample_weight, batch_size=batch_size, steps=steps,
                                      purpose="evaluate")
        self._build(prepared.dataset.element_spec)
        return prepared

    @staticmethod
    def _resolve_precision(model, precision):
        plugin = precision_lib.resolve(precision)
        policy = model.dtype_policy.name
        if policy == "mixed_float16" and plugin.policy != "mixed_float16":
            # A model built under mixed_float16 needs loss scaling to train
            # correctly, whatever was asked.
            return precision_lib.MixedFloat16("the model was built with mixed_float16")
        return plugin

    # evaluate / predict ---------------------------------------------------

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None,
                 steps=None, callbacks=None, return_dict=False, **kwargs):
        """The loss and metrics over `x`; Keras' `Model.evaluate` signature.

        Returns:
            With `return_dict=True` a dict `{"loss": ..., <metric>: ...}`;
            otherwise, as Keras, the loss alone when it is the only value, or
            the list of values in the order of `model.metrics_names`.
        """
        if kwargs:
            raise ConfigError(f"Arguments not recognized by evaluate: {sorted(kwargs)}. "
                              "Expected Keras' evaluate arguments.")
        self.task.check_unchanged()
        prepared = self._built_data(x, y, sample_weight, batch_size, steps)
        verbose = resolve_verbose(verbose)
        callback_list = keras.callbacks.CallbackList(
            callbacks, add_progbar=verbose != 0, verbose=verbose, epochs=1,
            steps=prepared.steps, model=self.model)
        logs = self._evaluate_dataset(prepared, callback_list)
        return logs if return_dict else self._flatten_logs(logs)

    def _flatten_logs(self, logs):
        if isinstance(self.task, task_lib.SupervisedTask):
            # Keras' own ordering (loss, then compiled metrics, then the rest).
            return self.model._flatten_metrics_in_order(logs)
        values = list(logs.values())
        return values[0] if len(values) == 1 else values

    def _evaluate_dataset(self, prepared, callback_list):
        """Runs the test loop over `prepared`; batch hooks as described in the README.

        Keras' test batch hooks fire once per `steps_per_execution` batches.
        Here a call runs 32 batches unless a callback implements a test batch
        hook: then one batch per call, so each hook sees every batch, as in
        `model.evaluate` with its default of one step per execution.
        """
        self._reset_metrics()
        hooks = callback_bridge.wants_batch_hooks(callback_list, "test")
        per_call = 1 if hooks else EVAL_STEPS_PER_CALL
        loop = self._loop("test", self._inference_jit())
        callback_list.on_test_begin()
        prepared.on_epoch_begin()
        iterator = self._iterate(prepared.dataset)
        steps = 0
        logs = {}
        while True:
            with guards.inside_step():
                ran, _, call_logs = loop(iterator, tf.constant(per_call, tf.int64))
            ran = int(ran)
            if ran:
                callback_list.on_test_batch_begin(steps)
                steps += ran
                logs = callback_bridge.python_logs(call_logs)
                callback_list.on_test_batch_end(steps - 1, logs)
            if ran < per_call:
                break
        prepared.on_epoch_end()
        callback_list.on_test_end(logs)
        return logs

    def predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None):
        """The model's outputs on `x` as NumPy (a dict/list for several outputs).

        Keras' `Model.predict` signature; `on_predict_batch_end` gets
        `{"outputs": ...}` as in Keras.
        """
        prepared = self._data.prepare(x, batch_size=batch_size, steps=steps, purpose="predict")
        self._build(prepared.dataset.element_spec, targets=False)
        verbose = resolve_verbose(verbose)
        callback_list = keras.callbacks.CallbackList(
            callbacks, add_progbar=verbose != 0, verbose=verbose, epochs=1,
            steps=prepared.steps, model=self.model)
        hooks = callback_bridge.wants_batch_hooks(callback_list, "predict")
        per_call = 1 if hooks else EVAL_STEPS_PER_CALL
        loop = self._predict_loop(prepared.dataset.element_spec)
        callback_list.on_predict_begin()
        prepared.on_epoch_begin()
        iterator = self._iterate(prepared.dataset)
        chunks = []
        done = 0
        while True:
            with guards.inside_step():
                ran, outputs = loop(iterator, tf.constant(per_call, tf.int64))
            ran = int(ran)
            if ran:
                outputs = tf.nest.map_structure(lambda t: t.numpy(), outputs)
                chunks.append(outputs)
                callback_list.on_predict_batch_begin(done)
                done += ran
                callback_list.on_predict_batch_end(done - 1, {"outputs": outputs})
            if ran < per_call:
                break
        prepared.on_epoch_end()
        callback_list.on_predict_end()
        if not chunks:
            raise DataSpecError(
                f"`x` gave no batch to predict on (a {prepared.kind} that is empty). Expected "
                "at least one sample. Fix: check the data (and `steps`).")
        return tf.nest.map_structure(lambda *parts: np.concatenate(parts), *chunks)

    # Building -------------------------------------------------------------

    def _build(self, element_spec, targets=True):
        """Creates every variable (models, optimizers, metrics, state) before compiling.

        A `tf.function` that creates variables is traced twice; creating them
        up front keeps the training loop at one trace, which also makes
        retracing visible in `self.traces`. With `run_eagerly` the model is
        built by an eager call on a batch of zeros shaped like the data, so a
        model whose `call` reads `.numpy()` builds as it runs.
        """
        if self._built:
            return
        with self._strategy.scope(), replicas.state_variables():
            self._build_in_scope(element_spec, targets)

    def _build_in_scope(self, element_spec, targets):
        if targets:
            self._element_spec = element_spec
        x_spec = element_spec[0] if isinstance(element_spec, tuple) else element_spec
        self.task._seed_random(self.seed)
        # Under a replicated strategy the variables are created eagerly too:
        # a mirrored variable's initial value cannot be lifted out of a
        # function being traced (Keras builds there eagerly, symbolically).
        eagerly = self.run_eagerly or replicas.is_replicated(self._strategy)
        with guards.inside_step():
            if isinstance(self.task, task_lib.SupervisedTask) and not self.model.built:
                if eagerly:
                    self.model(_zeros_like(x_spec), training=False)
                else:
                    tf.function(lambda x: self.model(x, training=False)).get_concrete_function(
                        x_spec)
            if not targets:
                return

            def probe(batch):
                losses, outputs = self.task.run_losses(batch, training=False)
                self.task.update_metrics(batch, outputs)
                return losses

            if eagerly:
                loss_names = list(probe(_zeros_like(element_spec)))
                self.task.reset_metrics()
                if not self.run_eagerly and self.task._captures:
                    # The captures' shapes as the compiled step sees them (an
                    # unknown batch size, not the probe's 1): traced now that
                    # every variable exists, so the trace creates none.
                    tf.function(probe, autograph=False).get_concrete_function(element_spec)
                    self.task.reset_metrics()
            else:
                loss_names = list(tf.function(probe, autograph=False).get_concrete_function(
                    element_spec).structured_outputs)
            self.task._capture_specs = {
                name: tf.TensorSpec(t.shape, t.dtype)
                for name, t in self.task._captures.items()}
            self._trackers = {name: keras.metrics.Mean(name=name) for name in loss_names}
            self.states = []
            for update in self.task.updates:
                variables = update.variables()
                update.optimizer.build(variables)
                self.states.append(step.UpdateState(variables, self.accumulate))
            self.counters = task_lib.Counters()
            if self.pruning is not None:
                self.pruning.build(self.task.models,
                                   {id(v) for u in self.task.updates for v in u.variables()})
            self._guard = nonfinite_lib.NonFiniteGuard(self.on_nonfinite)
            if self.monitor_every:
                self._monitors = [monitor_lib.GradientMonitor(u.variables())
                                  for u in self.task.updates]
            if self.dead_gradient_steps:
                self._dead = [gradient_health.DeadGradients(u.variables())
                              for u in self.task.updates]
            if self.capture_every:
                if not self.task._capture_specs:
                    raise ConfigError(
                        "`capture_every` was given but the task captures nothing. Expected "
                        "`self.capture(name, tensor)` calls in `compute_losses`. Fix: add "
                        "them, or drop capture_every.")
                self._capture = capture_lib.Capture(self.task._capture_specs,
                                                    self.capture_every)
            if not isinstance(self.task, task_lib.SupervisedTask):
                self.task.check_helpers()
            distribute_lib.check_in_scope(self._strategy, self.task.models,
                                          [u.optimizer for u in self.task.updates])
            self._built = True

    def _step(self, kind, jit, monitored=False, guarded=True):
        """One compiled step ("train" or "test"), cached per execution mode."""
        key = (kind + "_step", jit, monitored, guarded)
        if key not in self._loops:
            split = kind == "train" and self._splits_xla_step(jit, monitored, guarded)
            if kind == "train":
                one = self._watch_inference_calls(step.make_train_step(
                    self.task, self._trackers,
                    self._updaters("update" if split else jit, monitored, guarded),
                    self.precision,
                    self.counters, hooks=self.hooks, capture=self._capture is not None,
                    xla_gradients=split))
            else:
                one = step.make_test_step(self.task, self._trackers)
            one = self._count_traces(one, f"{kind}_step" + ("_monitored" if monitored else ""))
            # Replicated, the step is traced inside `strategy.run`'s own
            # function (`step.replicate`), not compiled apart.
            self._loops[key] = step.compile_step(
                one, jit_compile=jit is True and not split,
                run_eagerly=self.run_eagerly or replicas.is_replicated(self._strategy))
        return self._loops[key]

    def _splits_xla_step(self, jit, monitored, guarded):
        """Whether an XLA train step runs split: XLA gradients, checks in TensorFlow, XLA update.

        Split, the checks' reductions run in TensorFlow between two XLA
        functions: the forward and backward passes, and the fused update
        (`jit_compile="update"`'s). It paid on a CPU while the checks read
        each gradient's sum of squares inside XLA (unvectorised there: a
        third of the large bench MLP's step); since they read its largest
        magnitude (`gradient_health.gradient_sentinels`) the whole step costs
        less, and `step.SPLIT_MIN_GRADIENT_BYTES` (the gradients' size from
        which to split) is infinite: see its comment. Only when some check
        reads the gradients, on one device, and never on a GPU.
        """
        if jit is not True or self.run_eagerly or replicas.is_replicated(self._strategy):
            return False
        if tf.config.list_logical_devices("GPU") or not step.differentiates_once(
                self.task.updates):
            return False
        if step.gradient_bytes(self.task) < self._split_min_bytes:
            return False
        reads_gradients = (monitored or bool(self._dead)
                           or (guarded and self.on_nonfinite is not None))
        return bool(reads_gradients)

    def _replicated_step(self, kind, jit, monitored=False, guarded=True):
        """A step on one batch, run on every replica, the batch size summed (`step.replicate`).

        One per mode: the first step of a tuning call and the loops share it,
        so a replicated step is traced once.
        """
        key = (kind + "_step_replicated", jit, monitored, guarded)
        if key not in self._loops:
            finish = step.reduce_step_outputs(
                self._strategy, with_extra=kind == "train" and self._capture is not None)
            self._loops[key] = step.replicate(self._step(kind, jit, monitored, guarded),
                                              self._strategy,
                                              run_eagerly=self.run_eagerly, finish=finish)
        return self._loops[key]

    def _watch_inference_calls(self, train_step):
        """The step, which on its first run (a trace) reports how its models run.

        Trainable sub-models in inference mode (unless fine-tuning in it is
        meant) and frozen BatchNormalization layers with statistics never
        computed: checked once, when the step is first traced (the weights
        are final by then: a checkpoint read after `build_state` included).
        """
        def watched(batch):
            if self._inference_calls_checked:
                return train_step(batch)
            self._inference_calls_checked = True
            inference_mode.check_frozen_batchnorm(self.task.models)
            if self.fine_tune_in_inference_mode:
                return train_step(batch)
            with inference_mode.InferenceCalls(self.task.models) as calls:
                result = train_step(batch)
            inference_mode.check(calls.found, self.task.updates)
            inference_mode.check_built(self.task.models, self.task.updates)
            return result

        return watched

    def _updaters(self, mode, monitored=False, guarded=True):
        """One Updater per update for an execution mode; modes share state and precision.

        `monitored`: the updaters of the monitored step (`monitor_every`).
        `guarded=False`: without the non-finite guard (the fast path checks
        whole calls instead: `rollback`).
        """
        key = ("updaters", mode, monitored, guarded)
        if key not in self._loops:
            self._loops[key] = [
                step.Updater(update.optimizer, self.precision, state, update.variables(),
                             clip_norm=self.clip_norm, clip_value=self.clip_value,
                             allow_missing_gradients=self.allow_missing_gradients,
                             hooks=(self.hooks if self.pruning is None
                                    else step.ChainedHooks(self.hooks, self.pruning)),
                             fuse_update=mode == "update" and not self.run_eagerly,
                             guard=self._guard if guarded else None,
                             dead=self._dead[index] if self._dead else None,
                             xla_step=mode is True and not self.run_eagerly,
                             monitor=self._monitors[index] if monitored else None)
                for index, (update, state) in enumerate(zip(self.task.updates, self.states))]
        return self._loops[key]

    def _loop(self, kind, jit, monitored=False, fast=False):
        """N steps per call over an iterator, cached per execution mode.

        `fast`: the non-finite guard's fast path (`rollback`): unguarded
        steps between a snapshot and a check of the whole call.
        """
        key = (kind, jit, monitored, fast)
        if key not in self._loops:
            capture = kind == "train" and self._capture is not None
            halts = kind == "train" and self.on_nonfinite == "raise" and not fast
            self._loops[key] = step.make_loop(
                self._replicated_step(kind, jit, guarded=not fast),
                self._train_results if kind == "train" else self._results,
                run_eagerly=self.run_eagerly,
                replicated=replicas.is_replicated(self._strategy),
                on_outputs=self._record_capture if capture else None,
                should_continue=self._guard.should_continue if halts else None,
                rollback=self._snapshot if fast else None,
                monitored_step=(self._replicated_step(kind, jit, monitored=True,
                                                      guarded=not fast)
                                if monitored
                                else None))
        return self._loops[key]

    def _iterate(self, dataset):
        """An iterator over `dataset`: each batch split across the replicas under a strategy.

        The dataset yields global batches; `experimental_distribute_dataset`
        gives each replica its share, and under MultiWorkerMirroredStrategy
        each worker its shard (tf.data's auto-shard policy: by file where the
        pipeline reads files, else by data).
        """
        if not replicas.is_replicated(self._strategy):
            return iter(dataset)
        workers = distribute_lib.worker_count(self._strategy)
        if workers == 1 and self._strategy.num_replicas_in_sync == 1:
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
                checked = (dataset, distribute_lib.shardable(dataset, workers))
                self._shardable = {id(dataset): checked}
            dataset = checked[1]
        return iter(self._strategy.experimental_distribute_dataset(dataset))

    def _predict_loop(self, element_spec):
        key = ("predict", self._inference_jit())
        if key not in self._loops:
            one = self._count_traces(step.make_predict_step(self.task), "predict_step")
            spec = tf.function(one).get_concrete_function(element_spec).structured_outputs
            spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), spec)
            self.traces["predict_step"] -= 1  # that trace only read the output spec
            compiled = step.compile_step(
                one, jit_compile=key[1],
                run_eagerly=self.run_eagerly or replicas.is_replicated(self._strategy))
            self._loops[key] = step.make_predict_loop(compiled, spec,
                                                      run_eagerly=self.run_eagerly,
                                                      strategy=self._strategy)
        return self._loops[key]

    def _count_traces(self, fn, name):
        return step.Traced(fn, lambda: self.traces.update([name]))

    def _inference_jit(self):
        # Inference has no optimizer update: only whole-step XLA applies.
        return not self.run_eagerly and self.jit_compile is True

    def _reset_metrics(self):
        for tracker in self._trackers.values():
            tracker.reset_state()
        self.task.reset_metrics()

    def _results(self):
        return step.collect_logs(self._trackers, self.task, self.precision)

    def _train_results(self):
        logs = self._results()
        logs.update(self._guard.logs())
        return logs


def _next_kth_step(step, every):
    """The first step after `step` (0-based) that is a multiple of `every` when counted from 1."""
    return ((step + 1) // every + 1) * every - 1


def _monitored_at(positions, num_steps):
    """The monitored loop's `monitored_at` argument: `positions`, padded to its fixed length.

    An entry at `num_steps` or beyond is unused. No argument when the call
    monitors nothing (the plain loop).
    """
    if not positions:
        return ()
    padded = list(positions) + [num_steps] * (monitor_lib.RECORDS_PER_CALL - len(positions))
    return (tf.constant(padded, tf.int64),)


def _check_count(name, value, meaning, steps_per_call=None, too_many=None):
    """Raises `ConfigError` unless `value` is None or an integer >= 1 (not a bool).

    With `too_many`, a fixed `steps_per_call` above `value` is refused too
    (`too_many` says what would go wrong).
    """
    if value is not None and not (
            isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise ConfigError(f"`{name}` must be None or an integer >= 1. Received: "
                          f"{name}={value!r}. " + meaning)
    if too_many and value and isinstance(steps_per_call, int) and steps_per_call > value:
        raise ConfigError(
            f"`steps_per_call` ({steps_per_call}) is larger than `{name}` ({value}): "
            f"{too_many}. Expected steps_per_call <= {name}. Fix: lower steps_per_call or "
            "use \"auto\".")


def _check_one_replica(strategy):
    """Refuses strategies the step does not support yet, before anything is touched.

    The step already runs through `strategy.run`, but other strategies than
    the default one and OneDeviceStrategy synchronise replicas inside it
    (Keras' optimizer all-reduces gradients through `merge_call`, which a
    step compiled in its own `tf.function` cannot do, even with one
    replica), and several replicas also need the dataset distributed,
    accumulators and counters updated once across replicas, loss-scale
    verdicts agreed between them, and a rule for how a Task's own losses
    are reduced: not built yet. Without this check, fit fails inside the
    graph with an error that names none of it.
    """
    if not tf.distribute.has_strategy() or isinstance(strategy, tf.distribute.OneDeviceStrategy):
        return
    replicas = strategy.num_replicas_in_sync
    raise ConfigError(
        f"tapeworks.Trainer was created under {type(strategy).__name__} ({replicas} "
        f"replica{'s' if replicas != 1 else ''}): distributed training is not supported yet. "
        "Expected the default strategy or a single device (tf.distribute.OneDeviceStrategy). "
        "Fix: create the Trainer outside `strategy.scope()` (or under OneDeviceStrategy), or "
        "train this model with Keras' `model.fit` for multi-device runs for now.")


def _model_supports_xla(model):
    return all(getattr(layer, "supports_jit", True) for layer in model._flatten_layers())


def _xla_failure(error):
    """A one-line reason from XLA's long compile error."""
    ops = re.findall(r"JIT: ([\w, ]+?) \(No registered", str(error))
    if ops:
        return f"no XLA kernel for {ops[0]}"
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0][:160] if lines else type(error).__name__


def _zeros_like(spec):
    """A batch of one sample of zeros (empty strings) shaped like `spec`."""
    def zeros(s):
        shape = [1 if d is None else d for d in s.shape.as_list()]
        if s.dtype == tf.string:
            return tf.fill(shape, "")
        return tf.zeros(shape, s.dtype)

    return tf.nest.map_structure(zeros, spec)
