"""`CallLoop`: an epoch cut into planned calls, and what runs after each call.

Each call runs the steps the plan asks for in one compiled loop
(`CompiledSteps.train_loop`); after it, in order: the non-finite policy,
the dead-gradient watch, the plan's measurement, the monitor's records, the
plan cache (once the batch is known), the captures, the callbacks and the
progress bar, and the run's save check (Orbit's inner loop and its actions).
"""

import dataclasses
import logging
import time

import tensorflow as tf

from tapeworks.data import sources
from tapeworks.engine import callback_bridge, config as config_lib
from tapeworks.engine.plan import autotune
from tapeworks.engine.step import data_shapes, guards
from tapeworks.engine.step import capture as capture_lib
from tapeworks.engine.checks import gradient_health
from tapeworks.engine.checks import monitor as monitor_lib
from tapeworks.engine.checks import nonfinite as nonfinite_lib
from tapeworks.engine.checks import value_checks
from tapeworks.errors import CorrectnessWarning, DataSpecError, warn

# A fit with at most this many steps left runs each as one call, without the
# loop (`CallLoop.few_steps_left`); evaluation's FEW_BATCHES is its twin.
FEW_STEPS = 8

logger = logging.getLogger("tapeworks")


@dataclasses.dataclass
class EpochResult:
    steps: int
    samples: int
    logs: dict


class CallLoop:
    """Runs the planned calls of one Trainer's epochs."""

    def __init__(self, plan, compiled, state, config, replication, rollback, findings=None):
        self.plan = plan
        self.compiled = compiled
        self.state = state
        self.few_steps = None   # this fit runs each step as one call (`few_steps_left`)
        self.every_batch = None  # a user's batch hooks see every batch (`needs_every_train_batch`)
        self.said_ran_out = False  # this fit warned that its data ran out (`_ran_out`)
        self.fits = 0
        self.config = config
        self.replication = replication
        self.rollback = rollback      # rollback.RollbackPath
        # The watches after each call, over the built state.
        self.dead = gradient_health.DeadGradientWatch(
            state.dead_gradients, config.dead_gradient_steps, state.layer_owners)
        self.nonfinite = nonfinite_lib.NonFinitePolicy(
            config.on_nonfinite, state.guard, state.task, state.counters,
            config.nonfinite_dir, replication.local_batch,
            gradient_history=lambda: self.dead.history)
        self.monitor = monitor_lib.MonitorSchedule(state.monitors, config.monitor_every,
                                                   config.accumulate, state.update_states[0])
        self.captures = capture_lib.CaptureDelivery(state.capture)
        # Its finding joins the data stage's (`findings`), which `explain` lists.
        self.cross_entropy = value_checks.NegativeCrossEntropyWatch(state.task, findings)
        self.host_step = 0            # the step counter as the host last knew it

    def start_fit(self):
        self.few_steps = None
        self.every_batch = None
        self.said_ran_out = False
        self.fits += 1
        # `value()`: the read alone (`numpy()` adds an Identity op, whose int64
        # kernel's first use cost 3 ms of a fresh process' fit, AMD EPYC).
        self.host_step = int(self.state.counters.step.value())
        self.monitor.start_fit()

    def run_epoch(self, batches, callbacks, progress, epoch, run, *, later_epochs=0,
                  known_steps=None, start=(0, 0)):
        """Trains one epoch (from `start`: steps and samples done, when resumed mid-epoch)."""
        planner = self.plan.planner
        steps_per_epoch = batches.steps_per_epoch
        epoch_steps = steps_per_epoch or batches.prepared.steps
        # Data of unknown length: its length is known after the first epoch.
        length = epoch_steps or known_steps
        steps_done, samples_done = start
        logs = {}
        run.start_epoch(batches)
        restarted = False
        while steps_per_epoch is None or steps_done < steps_per_epoch:
            if steps_per_epoch is None and epoch_steps and steps_done >= epoch_steps:
                break
            if length:
                # What measuring can still win back: the rest of this fit.
                planner.remaining_steps = (later_epochs * length
                                           + max(length - steps_done, 0))
            planner.reconsider()
            planned = planner.next_call()
            num_steps = planned.steps
            if self.few_steps is None:
                # Decided at the fit's first call, for the whole fit.
                self.few_steps = self.few_steps_left(length, planner.remaining_steps)
            if self.every_batch is None:
                # With steps per call left to "auto", a callback of the user's
                # own with batch hooks sees every batch, as in Keras' fit: each
                # step one call, as a few-step fit runs them (nothing measured,
                # so no plan of one-step calls is stored for runs without it).
                self.every_batch = (self.config.steps_per_call == "auto"
                                    and callback_bridge.needs_every_train_batch(callbacks))
            few = self.few_steps or self.every_batch
            if epoch_steps:
                # Never ask past the end of the epoch: a call that fits is
                # measured whole.
                num_steps = max(1, min(num_steps, epoch_steps - steps_done))
            if few:
                num_steps = 1
            if steps_per_epoch is not None and steps_done and batches.used_up():
                # Data of known length used up mid-epoch: as when a call finds none.
                self._ran_out(batches, epoch, steps_done, steps_per_epoch)
                break
            monitored, num_steps = self.monitor.steps_of_call(self.host_step, num_steps)
            iterator = batches.iterator()
            # The planner times each call with the host's work for it (the
            # callbacks, progress, the run's bookkeeping): what fit runs at.
            iteration_start = time.perf_counter()
            callbacks.on_train_batch_begin(steps_done)
            try:
                if few:
                    ran, samples, call_logs, seconds = self.first_step(
                        self.few_steps_mode(planned), iterator, steps_done, bool(monitored))
                else:
                    ran, samples, call_logs, seconds = self.run_call(
                        planned, iterator, num_steps, steps_done, monitored, batches)
            except tf.errors.DataLossError as error:
                # tf.data names neither the file nor the record: find them.
                raise sources.corruption_error(batches.prepared.dataset, error) from error
            batches.consumed(ran)
            if ran:
                self.host_step += ran
                self.dead.after_call(ran, self.host_step)
                if monitored:
                    call_logs.update(self.monitor.deliver(
                        callbacks.callbacks, monitored, self.host_step - ran,
                        self.state.layer_owners()))
                # The batch size was not known before the first call: now it is.
                self.plan.use_cache(self.state.element_spec, samples // ran)
                self.captures.after_call(callbacks.callbacks)
                steps_done += ran
                samples_done += samples
                logs = call_logs
                restarted = False
                callbacks.on_train_batch_end(steps_done - 1, logs)
                progress.update(steps_done, samples_done, logs,
                                None if few else planner.status())
                run.after_call(self.host_step, batches, epoch, steps_done, samples_done,
                               epoch_ends=bool(epoch_steps) and steps_done >= epoch_steps)
                # A monitored call is measured too: one monitored step in a
                # call is part of what training with the monitor costs. The
                # host's share: this iteration's time outside the call.
                host_seconds = time.perf_counter() - iteration_start - seconds
                if not few:
                    planner.record(planned, num_steps, ran, samples,
                                   seconds + (host_seconds if seconds else 0.0))
                if self.state.task.model.stop_training:
                    break
            if ran < num_steps:
                # The data ran out.
                if steps_per_epoch is None:
                    break
                if steps_done == 0:
                    # Used up where the last epoch stopped: start it again.
                    if restarted or not batches.prepared.reusable:
                        raise DataSpecError(batches.prepared.empty_message(
                            epoch, steps_done, steps_per_epoch))
                    batches.restart()
                    restarted = True
                    continue
                self._ran_out(batches, epoch, steps_done, steps_per_epoch)
                break
        if steps_done == 0:
            raise DataSpecError(batches.prepared.empty_message(epoch, 0, steps_per_epoch))
        self.cross_entropy.after_epoch(epoch, logs, batches.prepared.name)
        return EpochResult(steps_done, samples_done, logs)

    def _ran_out(self, batches, epoch, steps_done, steps_per_epoch):
        """The data ran out mid-epoch under `steps_per_epoch`: the epoch ends short, as in Keras.

        Keras' fit warns, ends that epoch and starts the data again at the
        next one. A generator object cannot start again: training stops there,
        with what it trained (Keras goes on with what its adapter kept).
        """
        reusable = batches.prepared.reusable
        if not self.said_ran_out:
            self.said_ran_out = True
            then = ("the next epoch starts the data again" if reusable else
                    "a generator object cannot start again, so training stops here")
            warn(f"The training data ran out in epoch {epoch + 1} after {steps_done} of "
                 f"steps_per_epoch={steps_per_epoch} steps: the epoch ended short, as in "
                 f"Keras' fit, and {then}. Fix: make steps_per_epoch the data's batches per "
                 "epoch, leave it None, or `.repeat()` the dataset (an endless generator "
                 "for a generator).", CorrectnessWarning)
        if reusable:
            batches.restart()
        else:
            self.state.task.model.stop_training = True

    def few_steps_left(self, length, remaining):
        """Whether a fit of `remaining` steps is short enough to run each step as one call.

        Asked at the fit's first call; known only for data of known length.
        The loop's `tf.while_loop` and `tf.cond` cost tracing and a first
        call that a few steps never repay (a GAN's one-step fit traced 0.6 s
        longer in the loop than Keras' one step, profiled, AMD EPYC): such a
        fit runs each step as Keras runs it at `steps_per_execution=1`, the
        batch drawn on the host and the compiled step called on it
        (`first_step`), and measures nothing. A
        longer fit never switches at its end: that would trace a second
        function for its last steps. Only a trainer's first fit, from step
        0: a script that calls `fit` again and again (one epoch each) is
        measured from its second fit on, as before, and its loop reuses the
        step traced here. Not with steps per call fixed (the Trainer's, or the
        model's `steps_per_execution`): its callbacks' batch hooks fire as asked.
        """
        return (bool(length) and remaining is not None and remaining <= FEW_STEPS
                and self.fits == 1 and self.host_step == 0 and not self.config.run_eagerly
                and self.config.steps_per_call == "auto")

    def few_steps_mode(self, planned):
        """The mode of a few-step fit's calls: the one fixed, else tf.function (Keras' default)."""
        return False if self.config.jit_compile == "auto" else planned.jit

    def run_call(self, planned, iterator, num_steps, steps_done=0, monitored=None,
                 batches=None):
        """One call of the train loop; `monitored`: the indices of its monitored steps.

        Returns (steps run, samples, logs, seconds).
        """
        if planned.first:
            return self.first_step(planned.jit, iterator, steps_done, bool(monitored))
        fast = self.rollback.applies(planned.jit, batches)
        loop = self.compiled.train_loop(planned.jit, monitored=bool(monitored),
                                        rollback=self.rollback.snapshot if fast else None)
        start = time.perf_counter()
        with guards.inside_step():
            ran, samples, logs, *last = loop(iterator, tf.constant(num_steps, tf.int64),
                                             *monitor_lib.monitored_at(monitored, num_steps))
        # Reading the results is the call's one host sync.
        ran, samples = int(ran), int(samples)
        seconds = time.perf_counter() - start
        if not fast:
            self.nonfinite.after_call(last, steps_done + ran - 1)
        else:
            self.rollback.confirm()
            if not bool(last[0]) and self.rollback.snapshot.made_non_finite():
                ran, samples, logs = self._replay(planned.jit, batches, ran, steps_done,
                                                  monitored)
                seconds = time.perf_counter() - start
        return ran, samples, callback_bridge.python_logs(logs), seconds

    def _replay(self, mode, batches, ran, steps_done, monitored):
        """The bad fast call again, step by step with the guarded step (`RollbackPath.replay`)."""
        def run_guarded(iterator):
            self.monitor.rewind()
            loop = self.compiled.train_loop(mode, monitored=bool(monitored))
            with guards.inside_step():
                return loop(iterator, tf.constant(ran, tf.int64),
                            *monitor_lib.monitored_at(monitored, ran))

        replayed, samples, logs, *last = self.rollback.replay(batches, run_guarded)
        replayed, samples = int(replayed), int(samples)
        self.nonfinite.after_call(last, steps_done + replayed - 1)
        return replayed, samples, logs

    def first_step(self, mode, iterator, steps_done=0, monitored=False):
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

        def one_step(step_mode):
            outputs = self.compiled.replicated_step("train", step_mode, monitored=monitored)(
                batch)
            if self.state.capture is None:
                return outputs
            size, extra = outputs
            self.compiled.record_capture(extra)
            return size

        with guards.inside_step(), data_shapes.drawn_from(
                getattr(iterator, "element_spec", None)):
            try:
                samples = one_step(mode)
            except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as error:
                if not mode or self.config.jit_compile != "auto":
                    raise
                logger.warning("XLA cannot compile the %s step (%s); "
                               "not using that mode", autotune.describe(mode),
                               config_lib.describe_xla_failure(error))
                self.plan.planner.drop_xla(error, mode)
                samples = one_step(False)
            logs = callback_bridge.python_logs(self.state.train_results())
        seconds = time.perf_counter() - start
        if self.state.guard.halted:
            self.nonfinite.stop(batch, steps_done)
        self.nonfinite.warn()
        return 1, int(samples), logs, seconds
