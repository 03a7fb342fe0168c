"""`CompiledSteps`: how a step becomes compiled functions, one per variant, built once.

`step.py` says what one step does; this module decides which variants of it
exist (train or test, the execution mode, monitored or not, with the
non-finite verdict in the step or checked per call by `rollback`) and keeps
each compiled function, keyed by a `StepKey`, so a variant is traced once
(Keras' `make_train_function` does the same for its one variant).
"""

import collections
import typing

import tensorflow as tf

from tapeworks.engine.step import control_flow, data_shapes, model_step, replicas, step, updater
from tapeworks.engine.plan import graph_options
from tapeworks.engine.checks import inference_mode
from tapeworks.engine.step.traced import Traced
from tapeworks.engine.checks.traced_numbers import TracedNumbers


class StepKey(typing.NamedTuple):
    """Which compiled function: `kind`, execution `mode` (False, True or "update"), variant."""

    kind: str                 # train_loop, test_loop, test_call, train_step, test_step, replicated_*, updaters, predict_loop
    mode: object
    monitored: bool = False   # computes the monitor's per-layer statistics
    checks_finite: bool = True   # the non-finite verdict inside the step (not `rollback`'s)
    # The layers' policy when traced: "auto" precision measures float32 against
    # mixed bfloat16 (`plan/precision_trial.py`), each with its own functions.
    precision: str = "float32"


class CompiledSteps:
    """The compiled train, test and predict functions of one Trainer."""

    def __init__(self, task, state, config, precision, strategy, hooks):
        self.task = task
        self.state = state
        self.config = config
        self.precision = precision
        self.strategy = strategy
        self.hooks = hooks
        self.traces = collections.Counter()   # traces per step function, by name
        self._functions = {}
        self._inference_checked = False
        self._frozen_checked = False
        # The Task's number attributes the train steps were traced with (read at
        # epoch ends: `TracedNumbers.after_epoch`).
        self.traced_numbers = TracedNumbers(task)

    @property
    def replicated(self):
        return replicas.is_replicated(self.strategy)

    def keys(self):
        """The `StepKey`s of every function built so far."""
        return list(self._functions)

    def forget_precision(self, policy):
        """Drops the functions traced under `policy` (a precision "auto" measured and left)."""
        for key in [k for k in self._functions if k.precision == policy]:
            del self._functions[key]

    def _cached(self, key, build):
        key = key._replace(precision=self.precision.policy)
        if key not in self._functions:
            # Instantiated with grappler's CPU-idle passes left out: a
            # shorter first call, the same graph (`graph_options`).
            function = graph_options.lean_calls(build())
            if key.kind in ("train_step", "test_step") and isinstance(
                    function, graph_options.LeanCalls):
                # A step, called on batches drawn on the host too: traced
                # for the data's shapes, not each batch's (`data_shapes`).
                function = data_shapes.DataShapedCalls(function)
            self._functions[key] = function
        return self._functions[key]

    # Loops: several steps per call -------------------------------------------

    def train_loop(self, mode, *, monitored=False, rollback=None):
        """N train steps per call over an iterator.

        `rollback`: a `rollback.CallSnapshot`: steps without the non-finite
        verdict, between the snapshot and a check of the whole call.
        """
        fast = rollback is not None
        state, config = self.state, self.config

        def build():
            halts = config.on_nonfinite == "raise" and not fast
            return step.make_loop(
                self.replicated_step("train", mode, checks_finite=not fast),
                state.train_results,
                run_eagerly=config.run_eagerly,
                replicated=self.replicated,
                on_outputs=self.record_capture if state.capture is not None else None,
                should_continue=state.guard.should_continue if halts else None,
                rollback=rollback,
                monitored_step=(self.replicated_step("train", mode, monitored=True,
                                                     checks_finite=not fast)
                                if monitored else None))

        return self._cached(StepKey("train_loop", mode, monitored, not fast), build)

    def test_loop(self, mode):
        """N test steps per call over an iterator."""
        return self._cached(StepKey("test_loop", mode), lambda: step.make_loop(
            self.replicated_step("test", mode), self.state.results,
            run_eagerly=self.config.run_eagerly, replicated=self.replicated))

    def test_call(self, mode):
        """One test step per call, without a loop (`step.make_single_call`): for few batches."""
        return self._cached(StepKey("test_call", mode), lambda: step.make_single_call(
            self.replicated_step("test", mode), self.state.results))

    def predict_loop(self, element_spec, mode):
        """The predict loop; `mode`: `inference_mode(...)` of the training mode."""

        def build():
            one = self._count_traces(step.make_predict_step(self.task), "predict_step")
            spec = tf.function(one).get_concrete_function(element_spec).structured_outputs
            spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), spec)
            self.traces["predict_step"] -= 1  # that trace only read the output spec
            compiled = step.compile_step(
                one, jit_compile=mode, run_eagerly=self.config.run_eagerly or self.replicated)
            return step.make_predict_loop(compiled, spec, run_eagerly=self.config.run_eagerly,
                                          strategy=self.strategy)

        return self._cached(StepKey("predict_loop", mode), build)

    def inference_mode(self, mode):
        """The mode of test and predict steps: whole-step XLA when training uses it.

        Inference has no optimizer update: only whole-step XLA applies.
        """
        return not self.config.run_eagerly and mode is True

    # Steps -----------------------------------------------------------------------

    def _runs_own_step(self, kind):
        """Whether the `kind` ("train", "test") step is the model's own (`model_step`)."""
        return self.task.own_train_step if kind == "train" else self.task.own_test_step

    def step(self, kind, mode, *, monitored=False, checks_finite=True):
        """One compiled step ("train" or "test") on one batch."""
        if self._runs_own_step(kind):
            return self._cached(StepKey(kind + "_step", mode, monitored, checks_finite),
                                lambda: self._own_step(kind, mode, checks_finite))

        def build():
            split = kind == "train" and self.splits_xla_step(mode, monitored, checks_finite)
            if kind == "train":
                one = self._watch_first_trace(self.traced_numbers.watch(step.make_train_step(
                    self.task, self.state.loss_trackers,
                    self.updaters("update" if split else mode, monitored=monitored,
                                  checks_finite=checks_finite),
                    self.precision, self.state.counters, hooks=self.hooks,
                    capture=self.state.capture is not None, xla_gradients=split)))
            else:
                one = step.make_test_step(self.task, self.state.loss_trackers)
            one = self._count_traces(one, f"{kind}_step" + ("_monitored" if monitored else ""))
            # Replicated, the step is traced inside `strategy.run`'s own
            # function (`step.replicate`), not compiled apart.
            return step.compile_step(
                one, jit_compile=mode is True and not split,
                run_eagerly=self.config.run_eagerly or self.replicated)

        return self._cached(StepKey(kind + "_step", mode, monitored, checks_finite), build)

    def _own_step(self, kind, mode, checks_finite):
        """The model's own `train_step` or `test_step`, compiled as Keras compiles it.

        Without AutoGraph, as Keras 3 runs it (`one_step_on_data` is marked
        `do_not_convert`): a `print` in it prints once, at the trace, and an
        `if` over a tensor fails as it fails in Keras. Converting it cost a
        second of tracing on a GAN's step, and changed what the code does.
        """
        guard = self.state.guard
        if kind == "train":
            one = model_step.make_train_step(
                self.task, self.state.counters,
                guard=guard if checks_finite and guard.policy is not None else None)
        else:
            one = model_step.make_test_step(self.task)
        return step.compile_step(self._count_traces(one, f"{kind}_step"),
                                 jit_compile=mode is True,
                                 run_eagerly=self.config.run_eagerly or self.replicated)

    def replicated_step(self, kind, mode, *, monitored=False, checks_finite=True):
        """A step on one batch, run on every replica, the batch size summed (`step.replicate`).

        One per mode: the first step of a tuning call and the loops share it,
        so a replicated step is traced once.
        """
        def build():
            finish = step.reduce_step_outputs(
                self.strategy, with_extra=kind == "train" and self.state.capture is not None)
            return step.replicate(
                self.step(kind, mode, monitored=monitored, checks_finite=checks_finite),
                self.strategy, run_eagerly=self.config.run_eagerly, finish=finish,
                keras_loss_scaling=self._runs_own_step(kind))

        return self._cached(StepKey("replicated_" + kind, mode, monitored, checks_finite), build)

    def splits_xla_step(self, mode, monitored, checks_finite):
        """Whether an XLA train step runs split: XLA gradients, checks in TensorFlow, XLA update.

        Split, the checks' reductions run in TensorFlow between two XLA
        functions: the forward and backward passes, and the fused update
        (`jit_compile="update"`'s). It paid on a CPU while the checks read
        each gradient's sum of squares inside XLA (unvectorised there: a
        third of the large bench MLP's step); since they read it less
        dearly inside XLA (`sentinels.gradient_sentinels`: the largest
        magnitude, now one direct read) the whole step costs less, so it is off unless `Trainer(split_xla_step_bytes=)` asks for it
        (see `step.SPLIT_MIN_GRADIENT_BYTES`). Only when some check reads the
        gradients, on one device, and never on a GPU.
        """
        config = self.config
        if mode is not True or config.run_eagerly or self.replicated:
            return False
        if tf.config.list_logical_devices("GPU") or not step.differentiates_once(
                self.task.updates):
            return False
        if step.gradient_bytes(self.task) < config.split_xla_step_bytes:
            return False
        reads_gradients = (monitored or bool(self.state.dead_gradients)
                           or (checks_finite and config.on_nonfinite is not None))
        return bool(reads_gradients)

    def updaters(self, mode, *, monitored=False, checks_finite=True):
        """One Updater per update for an execution mode; modes share state and precision.

        `monitored`: the updaters of the monitored step (`monitor_every`).
        `checks_finite=False`: without the non-finite guard (the fast path
        checks whole calls instead: `rollback`).
        """
        state, config = self.state, self.config

        def build():
            hooks = (self.hooks if config.pruning is None
                     else updater.ChainedHooks(self.hooks, config.pruning))
            return [
                updater.Updater(update.optimizer, self.precision, update_state, update.variables(),
                                clip_norm=config.clip_norm, clip_value=config.clip_value,
                                allow_missing_gradients=config.allow_missing_gradients,
                                hooks=hooks,
                                fuse_update=mode == "update" and not config.run_eagerly,
                                guard=state.guard if checks_finite else None,
                                dead=state.dead_gradients[index] if state.dead_gradients else None,
                                xla_step=mode is True and not config.run_eagerly,
                                monitor=state.monitors[index] if monitored else None)
                for index, (update, update_state) in enumerate(
                    zip(self.task.updates, state.update_states))]

        return self._cached(StepKey("updaters", mode, monitored, checks_finite), build)

    # After a call -----------------------------------------------------------------

    def close_partial_windows(self, mode):
        """Applies a window left with fewer than `accumulate` micro-batches at an epoch's end."""
        states = self.state.update_states
        if self.config.accumulate == 1 or not any(bool(s.has_pending()) for s in states):
            return

        def build():
            updaters = self.updaters(mode)

            def close_all():
                for one in updaters:
                    control_flow.cond(one.state.has_pending(), one.close_window, lambda: None)

            return (close_all if self.config.run_eagerly
                    else tf.function(Traced(close_all), autograph=False))

        # One per trainer, built with the mode in use when first needed.
        self._cached(StepKey("close_window", None), build)()

    def record_capture(self, extra):
        """In the loop, after each step: the capture buffers take that step's tensors when due."""
        self.state.capture.maybe_record(self.state.counters.step - 1, extra)

    def forget_monitored(self):
        """Drops the monitored variants: traced again, they write the gradients' buffers too."""
        for key in [k for k in self._functions if k.monitored]:
            del self._functions[key]

    def kinds(self):
        """The kinds of function built so far ("train_step", "train_loop", ...), in order."""
        return [key.kind for key in self._functions]

    def train_concrete_functions(self):
        """Every concrete function traced for training (for a graph walk).

        The loops, and the steps: a first fit of a few steps calls the step
        alone (`CallLoop.few_steps_left`).
        """
        functions = []
        for key, fn in self._functions.items():
            if key.kind in ("train_loop", "train_step"):
                functions.extend(step.concrete_functions(fn))
        return functions

    # Tracing -----------------------------------------------------------------------

    def _count_traces(self, fn, name):
        return Traced(fn, lambda: self.traces.update([name]))

    def _watch_first_trace(self, train_step):
        """The step, which on its first run (a trace) reports how its models run.

        Trainable sub-models in inference mode (unless fine-tuning in it is
        meant) and frozen BatchNormalization layers with statistics never
        computed: checked once, when the step is first traced (the weights
        are final by then: a checkpoint read after `build_state` included).
        """
        task, config = self.task, self.config

        def watched(batch):
            if self._inference_checked:
                return train_step(batch)
            if not self._frozen_checked:
                # Once, even where this trace fails and the step is traced
                # again (`data_shapes`: for each batch's shapes).
                self._frozen_checked = True
                inference_mode.check_frozen_batchnorm(task.models)
            if config.fine_tune_in_inference_mode:
                self._inference_checked = True
                return train_step(batch)
            with inference_mode.InferenceCalls(task.models) as calls:
                result = train_step(batch)
            # Done once a trace got through: a trace that failed saw no calls.
            self._inference_checked = True
            inference_mode.check(calls.found, task.updates)
            inference_mode.check_built(task.models, task.updates)
            return result

        return watched
