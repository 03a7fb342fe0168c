"""One update of a training step: accumulate, clip, hooks, then the optimizer (or a skip).

`Updater` applies one Task update's gradients: with accumulation it adds them
to the window's accumulators (`UpdateState`, variables, so a checkpoint taken
mid-window restores mid-window) and applies their mean when the window
closes; with float16 loss scaling a window that overflowed is skipped. Per-step
checks plug in at `StepHooks`: each hook sees the loss and the
(gradient, variable) pairs of every update, in the graph. `step.py` builds
the step around the updaters.
"""

from __future__ import annotations

import tensorflow as tf

from tapeworks.engine.step import control_flow, guards, replicas, sentinels
from tapeworks.engine.step.precision import all_finite
from tapeworks.engine.step.traced import Traced


class StepHooks:
    """Hooks called inside the compiled train step. The defaults do nothing.

    Subclass and override to add in-graph checks; they run inside
    `tf.function`/XLA, so they must use TensorFlow ops, not Python side effects.
    """

    def on_loss(self, loss: tf.Tensor) -> tf.Tensor:
        """The update's loss, before its gradients; return it (or a changed one)."""
        return loss

    def on_gradients(self, grads_and_vars: list[tuple[tf.Tensor, tf.Variable]]
                     ) -> list[tuple[tf.Tensor, tf.Variable]]:
        """The update's (gradient, variable) pairs before the optimizer; return them."""
        return grads_and_vars

    def after_update(self, variables: list[tf.Variable]) -> None:
        """After the optimizer applied an update to `variables` (not after a skip)."""


class ChainedHooks(StepHooks):
    """Several hooks in order: each sees what the one before returned."""

    def __init__(self, *hooks):
        self.hooks = hooks

    def on_loss(self, loss):
        for hook in self.hooks:
            loss = hook.on_loss(loss)
        return loss

    def on_gradients(self, grads_and_vars):
        for hook in self.hooks:
            grads_and_vars = hook.on_gradients(grads_and_vars)
        return grads_and_vars

    def after_update(self, variables):
        for hook in self.hooks:
            hook.after_update(variables)


class UpdateState(tf.Module):
    """Gradient accumulation state, in variables (optax's `MultiSteps`, as a tf.Module).

    `gradients[i]` holds the sum over the window of each micro-batch's
    gradient times its number of samples; `samples` holds that number, so the
    update `gradients / samples` is the gradient of the mean loss over every
    sample of the window, whatever the sizes of its micro-batches.
    """

    def __init__(self, variables, accumulate):
        super().__init__(name="update_state")
        self.accumulate = accumulate
        self.micro_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="micro_step")
        self.window_finite = tf.Variable(True, trainable=False, name="window_finite")
        # Each replica's own sums (on one device, plain variables): summed
        # across replicas when read outside the step, as a checkpoint does.
        self.samples = replicas.local_variable(0.0, dtype=tf.float32, trainable=False,
                                               name="samples")
        self.gradients = [
            replicas.local_variable(
                tf.zeros(v.shape, tf.float32), trainable=False,
                name="accumulated_" + v.name.replace("/", "_").replace(":", "_"))
            for v in (variables if accumulate > 1 else [])
        ]

    def has_pending(self):
        return self.micro_step > 0


class Updater:
    """Applies (or skips) optimizer updates: clipping, accumulation windows, loss-scale verdicts."""

    def __init__(self, optimizer, precision, state, variables, *, clip_norm=None,
                 clip_value=None, allow_missing_gradients=False, hooks=None,
                 fuse_update=False, guard=None, dead=None, xla_step=False, monitor=None):
        # What the update trains, in the order of `state.gradients`. Kept here,
        # not on the tf.Module state, so checkpoints do not track them twice.
        self.variables = list(variables)
        self.fuse_update = fuse_update
        self._fused = {}
        self.optimizer = optimizer
        self.precision = precision
        self.state = state
        self.clip_norm = clip_norm
        self.clip_value = clip_value
        self.allow_missing_gradients = allow_missing_gradients
        self.hooks = hooks or StepHooks()
        # The non-finite check (`nonfinite.NonFiniteGuard`), shared by all updates.
        self.guard = guard
        # This update's dead-gradient count (`gradient_health.DeadGradients`).
        self.dead = dead
        # Whether the step this updater is traced in is compiled by XLA.
        self.xla_step = xla_step
        # On the monitored variant of the step: `monitor.GradientMonitor`.
        self.monitor = monitor

    def add(self, gradients, variables, batch_size, loss=None, verdict=None, norms=None):
        """Takes one micro-batch's unscaled gradients; updates when the window is full.

        `loss` (unscaled) is for the non-finite check; `verdict`, when the step
        judged its updates together, is that judgement, and `norms` the
        gradients' norms it used. Returns the verdict that withholds this
        micro-batch (None when nothing is withheld).
        """
        grads_and_vars = guards.check_gradients(
            gradients, variables, allow_missing=self.allow_missing_gradients)
        finite = (replicas.agree(all_finite([g for g, _ in grads_and_vars]))
                  if self.precision.checks_finite else None)
        guarded = self.guard is not None and self.guard.policy is not None
        if norms is None and ((guarded and verdict is None) or self.dead is not None):
            # One reduction per gradient serves the non-finite check and the
            # dead-gradient count alike (None for a missing gradient).
            norms = sentinels.gradient_sentinels(gradients, xla=self.xla_step)
        if self.dead is not None:
            self.dead.observe(variables, norms)
        if guarded:
            if verdict is None:
                verdict = self.guard.verdict(loss, norms,
                                             loss_scaled=self.precision.checks_finite)
            if self.guard.blocks_update:
                # A withheld update goes the way of a loss-scale overflow: not
                # applied; with accumulation, its window is skipped whole.
                finite = verdict if finite is None else tf.logical_and(finite, verdict)
        withheld_unless = verdict if self.guard is not None and self.guard.blocks_update \
            else None
        if self.state.accumulate == 1:
            self._apply_or_skip(grads_and_vars, finite)
            return withheld_unless
        state = self.state
        weight = tf.cast(batch_size, tf.float32)
        slots = {id(v): acc for v, acc in zip(self.variables, state.gradients)}
        for g, v in grads_and_vars:
            g = tf.convert_to_tensor(g)  # sparse (embedding) gradients accumulate densely
            if finite is not None:
                # An overflowed micro-batch adds nothing (inf * 0 would be NaN);
                # its window is marked and skipped as a whole when it closes.
                g = tf.where(finite, g, tf.zeros_like(g))
            slots[id(v)].assign_add(tf.cast(g, tf.float32) * weight)
        state.samples.assign_add(weight)
        state.micro_step.assign_add(1)
        if finite is not None:
            state.window_finite.assign(tf.logical_and(state.window_finite, finite))
        replicas.branch(state.micro_step >= state.accumulate, self.close_window)
        return withheld_unless

    def _checks_window(self):
        return self.precision.checks_finite or (
            self.guard is not None and self.guard.blocks_update)

    def close_window(self):
        """Applies the accumulated window (skips it if it overflowed) and resets it."""
        state = self.state
        # Each replica's sum over its part of the window, over every replica's
        # samples divided by the replica count: the replicas' gradients, which
        # the optimizer sums, add up to the gradient of the window's mean loss
        # (each replica's objective was divided by the replica count:
        # `replicas.for_gradient`). On one device: the window's samples, exactly.
        divisor = replicas.sum_over_replicas(state.samples.read_value()) / tf.cast(
            replicas.num_replicas(), tf.float32)
        grads_and_vars = [(acc / divisor, v)
                          for acc, v in zip(state.gradients, self.variables)]
        finite = state.window_finite.read_value() if self._checks_window() else None
        self._apply_or_skip(grads_and_vars, finite)
        for acc in state.gradients:
            acc.assign(tf.zeros_like(acc))
        state.samples.assign(0.0)
        state.micro_step.assign(0)
        state.window_finite.assign(True)

    def _apply_or_skip(self, grads_and_vars, finite):
        if self.monitor is not None:
            self.monitor.record(grads_and_vars,
                                lambda: self._apply_or_skip_now(grads_and_vars, finite),
                                xla=self.xla_step)
        else:
            self._apply_or_skip_now(grads_and_vars, finite)

    def _apply_or_skip_now(self, grads_and_vars, finite):
        if finite is None:
            self._apply(grads_and_vars)
            return
        if self.fuse_update and grads_and_vars:
            # The verdict goes inside the XLA-compiled update: XLA's
            # conditional is cheap, where a graph `tf.cond` around the
            # optimizer costs tens of microseconds a step on CPU
            # (`tapeworks bench diagnose`).
            self._fused_apply(self._prepared(grads_and_vars), finite)
            return

        def apply(gradients, variables):
            self._apply(list(zip(gradients, variables)))
            self.precision.on_applied()

        gradients = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        if replicas.needs_merge_call():
            # Each replica's gradients travel as arguments, not in a closure.
            replicas.cond_across_replicas(
                finite, apply, self.precision.on_skipped,
                ([tf.convert_to_tensor(g) for g in gradients], variables))
            return
        # A skip lowers a loss scale; for float32 the precision's skip is a no-op.
        control_flow.cond(finite, lambda: apply(gradients, variables), self.precision.on_skipped)

    def _prepared(self, grads_and_vars):
        """Clipping, then the gradient hooks: what the optimizer is given."""
        gradients = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        clips = self.clip_value is not None or self.clip_norm is not None
        shared = clips and replicas.several()
        if shared:
            # Clipping acts on the update's gradient, the sum over replicas
            # (Keras' optimizers clip each replica's part before they sum).
            gradients = replicas.sum_over_replicas(
                [tf.convert_to_tensor(g) for g in gradients])
        # Clipping sees the unscaled, accumulated gradients: what the update uses.
        if self.clip_value is not None:
            gradients = [tf.clip_by_value(tf.convert_to_tensor(g), -self.clip_value,
                                          self.clip_value) for g in gradients]
        if self.clip_norm is not None:
            gradients, _ = tf.clip_by_global_norm(gradients, self.clip_norm)
        if shared:
            # The optimizer sums the replicas' gradients again: each passes its share.
            share = 1.0 / replicas.num_replicas()
            gradients = [g * share for g in gradients]
        return self.hooks.on_gradients(list(zip(gradients, variables)))

    def _apply(self, grads_and_vars):
        if not grads_and_vars:
            # Nothing trainable (every layer frozen): Keras' fit still runs
            # the step for its metrics; so does this one.
            return
        grads_and_vars = self._prepared(grads_and_vars)
        if self.fuse_update:
            self._fused_apply(grads_and_vars)
        else:
            self._optimizer_apply(grads_and_vars)

    def _optimizer_apply(self, grads_and_vars):
        """The optimizer's update, then the hooks that act on the updated weights (pruning)."""
        grads_and_vars = list(grads_and_vars)
        self.optimizer.apply_gradients(grads_and_vars)
        self.hooks.after_update([v for _, v in grads_and_vars])

    def _fused_apply(self, grads_and_vars, finite=None):
        """The optimizer update alone, compiled by XLA (`jit_compile="update"`).

        XLA fuses the optimizer's elementwise passes over each weight (Adam
        makes about ten) into one. The variables are captured, not passed:
        a tf.function cannot take Keras variables as arguments. With `finite`,
        the update is applied only when it is true (else the precision's skip).
        """
        variables = [v for _, v in grads_and_vars]
        key = (tuple(id(v) for v in variables), finite is None)
        if key not in self._fused:
            def update(grads):
                self._optimizer_apply(zip(grads, variables))

            def guarded(grads, ok):
                def apply():
                    update(grads)
                    self.precision.on_applied()

                control_flow.cond(ok, apply, self.precision.on_skipped)

            self._fused[key] = tf.function(Traced(update if finite is None else guarded),
                                           jit_compile=True, autograph=False)
        grads = [g for g, _ in grads_and_vars]
        if finite is None:
            self._fused[key](grads)
        else:
            self._fused[key](grads, finite)
