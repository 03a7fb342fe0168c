"""The training, evaluation and prediction steps, and the loop that runs N of them per call.

Read top to bottom, a training step is: forward under a tape -> loss (float32)
-> scale (precision plugin) -> gradients -> checks -> unscale -> accumulate or
apply; an update is: clip -> hooks -> optimizer, or a skip when a loss-scaled
window overflowed. The compiled function is built in layers, as Keras'
`make_train_function` does:

1. `step_on_data(batch)`: one step, compiled alone so XLA can take it whole
   (the iterator ops around it cannot go through XLA);
2. `strategy.run(step_on_data)`: per replica, reduced across replicas;
3. `loop(iterator, num_steps)`: up to `num_steps` steps inside one graph call,
   stopping early at the end of the data. `num_steps` is a tensor, so changing
   it never retraces (Orbit's rule).

Losses and metrics accumulate in Keras metric variables inside the graph; the
host reads them once per call. Accumulators, the micro-step counter and the
loss scale are variables too (`UpdateState`, the precision plugin), so a
checkpoint taken mid-window restores mid-window.

Per-step checks (numerics, gradient monitors) plug in at `StepHooks`: each hook
sees the loss and the (gradient, variable) pairs of every update, in the graph.
"""

import contextlib
import math

import keras
import tensorflow as tf

from tapeworks.engine.step import control_flow, guards, replicas, sentinels
from tapeworks.engine.step.task import batch_size as task_batch_size
from tapeworks.engine.step.task import layers_of
from tapeworks.engine.step.traced import Traced
from tapeworks.engine.step.updater import StepHooks

# Monitored steps one call can hold (the slots of `checks/monitor.py`'s
# statistics, read after each call); a call that would hold more ends on the
# last of them. The loop indexes the slots, so the number lives with the loop.
RECORDS_PER_CALL = 4

def make_train_step(task, trackers, updaters, precision, counters, hooks=None,
                    capture=False, xla_gradients=False):
    """Returns `step(batch) -> batch size`: every update of `task` on one (micro-)batch.

    All losses come from one forward pass under one tape (persistent when
    the task has several updates). Each update differentiates its own loss
    with respect to its own variables; the backward pass reads the values
    recorded in the forward, so an update applied first (the discriminator)
    does not change the gradient of the next (the generator).

    `xla_gradients` (see `CompiledSteps.splits_xla_step`): the forward and backward passes
    run as one XLA-compiled function that returns the gradients; the checks
    read them outside XLA, and the updaters (fused: `jit_compile="update"`)
    apply them in XLA again.
    """
    hooks = hooks or StepHooks()
    updates = task.updates
    # Several updates, or a weighting that needs gradients of its own
    # (GradNorm), differentiate the same recorded forward more than once.
    persistent = len(updates) > 1 or any(hasattr(u.loss, "after_gradients") for u in updates)
    if xla_gradients and not differentiates_once(updates):
        raise ValueError("xla_gradients needs every update on every step and no "
                         "`after_gradients` (see differentiates_once)")

    guard = updaters[0].guard if updaters else None
    # State the forward pass itself updates (BatchNormalization's moving
    # statistics): a withheld step must not keep what its bad batch did to it.
    forward_state = (forward_updated_state(task)
                     if guard is not None and guard.blocks_update else [])

    def forward(batch):
        # Returned to the caller, which deletes it once its gradients are taken.
        with tf.GradientTape(persistent=persistent) as tape:  # noqa: TW105
            losses, outputs = task.run_losses(batch, training=True)
            objectives, unscaled = [], []
            for update in updates:
                objective = hooks.on_loss(guards.check_loss(
                    update.objective(losses, counters),
                    where=f"the loss of update {update.name!r}"))
                unscaled.append(objective)
                objectives.append(precision.scale_loss(replicas.for_gradient(objective)))
        return tape, losses, outputs, objectives, unscaled

    def all_gradients(batch):
        tape, losses, outputs, objectives, unscaled = forward(batch)
        gradients = [precision.unscale(tape.gradient(objective, updater.variables))
                     for objective, updater in zip(objectives, updaters)]
        del tape
        return losses, outputs, unscaled, gradients, dict(task.captures())

    if xla_gradients:
        compiled_gradients = tf.function(Traced(all_gradients), jit_compile=True,
                                         autograph=False)

    def train_step(batch):
        before = [tf.identity(tf.convert_to_tensor(v)) for v in forward_state]
        if xla_gradients:
            losses, outputs, unscaled, gradients, captures = compiled_gradients(batch)
            gradients_of = dict(enumerate(gradients))
            objectives, tape = [None] * len(updates), None
        else:
            tape, losses, outputs, objectives, unscaled = forward(batch)
            gradients_of, captures = {}, task.captures()
        size = task_batch_size(batch)
        norms_of, step_verdict = {}, None
        if len(updates) > 1 and guard is not None and guard.blocks_update:
            # Several updates: every update's verdict before any is applied, so
            # a non-finite generator also withholds the discriminator's update
            # of the same step (nothing of a bad step is applied). Safe: each
            # gradient reads the forward recorded on the tape, whatever was
            # applied before. (An update with `every > 1` computes its
            # gradients in its own branch and is judged alone.)
            verdicts = []
            for index, (update, updater, objective, loss) in enumerate(
                    zip(updates, updaters, objectives, unscaled)):
                if update.every == 1:
                    if index not in gradients_of:
                        gradients_of[index] = precision.unscale(
                            tape.gradient(objective, updater.variables))
                    norms_of[index] = sentinels.gradient_sentinels(
                        gradients_of[index], xla=updater.xla_step)
                    verdicts.append(guard.verdict(
                        loss, norms_of[index], loss_scaled=precision.checks_finite))
            if verdicts:
                step_verdict = tf.reduce_all(tf.stack(verdicts))
        kept = []   # the verdicts that withheld this step's updates
        for index, (update, updater, objective, loss) in enumerate(
                zip(updates, updaters, objectives, unscaled)):
            def run(update=update, updater=updater, objective=objective, loss=loss, tape=tape,
                    index=index):
                variables = updater.variables
                if index in gradients_of:
                    verdict = updater.add(gradients_of[index], variables, size, loss=loss,
                                          verdict=step_verdict, norms=norms_of.get(index))
                else:
                    gradients = precision.unscale(tape.gradient(objective, variables))
                    verdict = updater.add(gradients, variables, size, loss=loss)
                if verdict is not None and update.every == 1:
                    kept.append(verdict)
                after = getattr(update.loss, "after_gradients", None)
                if after is not None:
                    after(tape, losses, counters)

            if update.every == 1:
                run()
            else:
                control_flow.cond(counters.step % update.every == 0, run, lambda: None)
        del tape
        if forward_state and kept:
            good = tf.reduce_all(tf.stack(kept))
            for variable, value in zip(forward_state, before):
                variable.assign(tf.where(good, variable, value))
        counters.step.assign_add(1)
        for name, value in losses.items():
            trackers[name].update_state(value, sample_weight=size)
        task.update_metrics(batch, outputs)
        if capture:
            # Returned, not stored here: the loop copies them on k-th steps
            # only, outside XLA (see capture.py).
            return size, dict(captures)
        return size

    return train_step


# Gradients from this size (bytes) make an XLA step with checks on a CPU run
# split (`CompiledSteps.splits_xla_step`): none, since the checks read each
# gradient's largest magnitude inside XLA, and now its interleaved partial
# sums, one direct read (`sentinels.gradient_sentinels`).
# While they read its sum of squares (XLA's float sums are not vectorised on a
# CPU), the split paid from about 16 MiB (one-off, the defaults' checks over
# no checks, whole against split: 10.5 MB +12% / +14%, the large bench MLP's
# 21 MB +36% / +10%). With the largest magnitude, the large MLP's whole step
# costs 2.0% [0.8, 3.6] against 6.0% [4.5, 8.8] split (`tapeworks bench
# diagnose`, 40 paired rounds), and a 75 MB MLP 2.7% [1.4, 3.4] against
# 1.8% [0.1, 3.9] (one-off, 30 rounds): nothing left for the split to win.
# The split stays, tested, for a size where it may again (set per trainer:
# `Trainer(split_xla_step_bytes=)`).
SPLIT_MIN_GRADIENT_BYTES = math.inf


def differentiates_once(updates):
    """Every update runs on every step and none differentiates again after its gradients.

    What `make_train_step(xla_gradients=True)` needs: an update with
    `every > 1` computes its gradients in a branch of its own, and GradNorm's
    `after_gradients` needs the tape.
    """
    return all(u.every == 1 and not hasattr(u.loss, "after_gradients") for u in updates)


def gradient_bytes(task):
    """The size of every update's gradients (its trainable variables), in bytes."""
    return sum(v.shape.num_elements() * tf.as_dtype(v.dtype).size
               for u in task.updates for v in u.variables())


def forward_updated_state(task):
    """The variables a training forward pass assigns: BatchNormalization's moving statistics.

    Of trainable BatchNormalization layers only (a frozen one runs in
    inference mode in Keras 3 and updates nothing). Other layers' state
    (Dropout's seed) is left as it went.
    """
    trained = [item for update in task.updates for item in update.trains
               if hasattr(item, "_flatten_layers")]   # models and layers, not variables
    return [variable for layer in layers_of(trained, include_self=True)
            if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable
            for variable in (layer.moving_mean, layer.moving_variance)]


def make_test_step(task, trackers):
    """Returns `step(batch) -> batch size` that updates losses and metrics only."""

    def test_step(batch):
        losses, outputs = task.run_losses(batch, training=False)
        size = task_batch_size(batch)
        for name, value in losses.items():
            trackers[name].update_state(value, sample_weight=size)
        task.update_metrics(batch, outputs)
        return size

    return test_step


def make_predict_step(task):
    """Returns `step(batch) -> outputs` for inference."""
    return task.predict_step


def compile_step(step, *, jit_compile, run_eagerly, autograph=False):
    """Layer 1: one step on one batch, as a `tf.function` (XLA if asked).

    AutoGraph is off by default: tapeworks' step has no Python control flow
    over tensors, and errors raised while tracing (tapeworks' guards) then
    reach the caller as they were raised. Keras 3 runs a model's own
    `train_step` without it too (`do_not_convert`), so a user's step traces
    the same code under both.
    """
    if run_eagerly:
        return step
    return tf.function(step if isinstance(step, Traced) else Traced(step),
                       jit_compile=bool(jit_compile), reduce_retracing=True,
                       autograph=autograph)


def replicate(step_fn, strategy, *, run_eagerly, finish=None, keras_loss_scaling=False):
    """Layer 2: `run(batch)`, `step_fn` on each replica's part of `batch`.

    On one device, `strategy.run` (the step is compiled by `compile_step`).
    On several replicas (or any strategy that synchronises them), the step is
    traced inside `strategy.run` and that call is a `tf.function` of its own,
    as in Keras' `one_step_on_data`: MirroredStrategy cannot build a
    `strategy.run` traced inside the loop's `tf.cond`, nor a `merge_call`
    (the optimizer's all-reduce) inside a step compiled apart.
    `finish(per_replica_outputs)` turns the replicas' outputs into one value,
    inside that function. `keras_loss_scaling`: leave Keras' losses dividing
    by the replica count (`replicas.losses_per_replica` is for tapeworks'
    own step, which divides itself): a model's own `train_step` is Keras
    code, whose `compute_loss` counts on that division for its gradients.
    """
    def run(batch):
        with (contextlib.nullcontext() if keras_loss_scaling
              else replicas.losses_per_replica()):
            out = strategy.run(step_fn, args=(batch,))
        return finish(out) if finish is not None else out

    if run_eagerly or not replicas.is_replicated(strategy):
        return run
    return tf.function(run, autograph=False, reduce_retracing=True)


def reduce_step_outputs(strategy, *, with_extra):
    """`finish` for `replicate`: a step's batch size summed over the replicas.

    With `with_extra`, the step returns (batch size, captured tensors); the
    captures kept are the first replica's (on one device, the only one).
    """
    def finish(per_replica):
        extra = None
        if with_extra:
            per_replica, extra = per_replica
            extra = tf.nest.map_structure(
                lambda t: strategy.experimental_local_results(t)[0], extra)
        batch = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return (batch, extra) if with_extra else batch

    return finish


def make_loop(one_step, results, *, run_eagerly, replicated=False, on_outputs=None,
              should_continue=None, monitored_step=None, rollback=None):
    """Layer 3: `loop(iterator, num_steps[, monitored_at]) -> (steps, samples, logs[, last batch])`.

    `one_step(batch)` is layer 2 (`replicate`): the step on every replica,
    returning the batch size summed over them (with `on_outputs`: and the
    step's extra outputs). `replicated`: the strategy synchronises replicas
    (the loop then has another shape: `replicated_steps`).

    Runs up to `num_steps` steps, fewer when the data ends. `results()`
    returns the dict of metric tensors read once at the end of the call: the
    call's only host sync. With `on_outputs`, a step returns (batch size,
    extra) and `on_outputs(extra)` runs in the loop, after the step. With
    `should_continue` (a function returning a boolean tensor, read before
    each step), the loop also stops when it turns false, and returns the last
    batch it drew as a `tf.experimental.Optional` (carried through the loop
    as a loop variable: no copy, no branch), for the host to look at. With
    `monitored_step` (the monitored variant of the step: `monitor_every`),
    the loop takes `monitored_at`, an int64 vector of
    `monitor.RECORDS_PER_CALL` step indices within the call, ascending (an
    index from `num_steps` on marks an unused entry), and runs that step
    function at those steps instead of `one_step`: the call runs in
    segments, plain steps in a loop up to the next monitored step, then the
    monitored step, so no step pays a branch for it. With `rollback`
    (`rollback.CallSnapshot`, one device only), the call first copies the
    variables a step changes and returns, last, whether none of them turned
    non-finite (the non-finite guard's fast path).
    """
    keep_last = should_continue is not None
    if rollback is not None and replicated:
        raise ValueError("rollback is for one device")

    def draw_and_run(step_fn, iterator, steps, samples):
        """Draws a batch; runs `step_fn` on it if there was one."""
        optional = iterator.get_next_as_optional()
        kept = (optional,) if keep_last else ()

        def run():
            batch = step_fn(optional.get_value())
            if on_outputs is not None:
                batch, extra = batch
                on_outputs(extra)
            return steps + 1, samples + batch, tf.constant(False)

        done = control_flow.cond(optional.has_value(), run,
                                 lambda: (steps, samples, tf.constant(True)))
        return (*done, *kept)

    def going_on(steps, exhausted, limit):
        """Another step: fewer than `limit` so far, data left, and (with a halt) no halt."""
        going = tf.logical_and(steps < limit, tf.logical_not(exhausted))
        return tf.logical_and(going, should_continue()) if keep_last else going

    def plain_steps(iterator, limit, carried):
        """`one_step` while under `limit` steps, data is left and (with a halt) no halt."""
        def body(steps, samples, exhausted, *last):
            return draw_and_run(one_step, iterator, steps, samples)

        def go_on(steps, samples, exhausted, *last):
            return going_on(steps, exhausted, limit)

        return control_flow.while_loop(go_on, body, carried)

    def loop(iterator, num_steps, monitored_at=None):
        carried = (tf.constant(0, tf.int64), tf.constant(0, tf.int64), tf.constant(False))
        if keep_last:
            carried += (tf.experimental.Optional.empty(iterator.element_spec),)
        if rollback is not None:
            # Ordered before the loop's first read of the same variables by
            # tf.function's automatic control dependencies.
            rollback.take()
        if monitored_step is not None:
            for index in range(RECORDS_PER_CALL):
                at = monitored_at[index]
                carried = plain_steps(iterator, tf.minimum(at, num_steps), carried)
                steps, samples, exhausted, *last = carried
                carried = control_flow.cond(
                    tf.logical_and(at < num_steps, going_on(steps, exhausted, at + 1)),
                    lambda steps=steps, samples=samples: draw_and_run(
                        monitored_step, iterator, steps, samples),
                    lambda carried=carried: tuple(carried))
        steps, samples, _, *last = plain_steps(iterator, num_steps, carried)
        if rollback is not None:
            return (steps, samples, results(), rollback.intact())
        return (steps, samples, results(), *last)

    def eager_loop(iterator, num_steps, monitored_at=None):
        """`loop` run eagerly (`run_eagerly=True`, one device): the same steps, counted in Python.

        `loop` called eagerly runs its bookkeeping as one eager op each (the
        optional's three, the count's comparison and sums, the loop test's
        logical ops): about ten ops a step a Python count does not pay, and
        their kernels' first use, some milliseconds in a fresh process. The
        counts come back as Python ints (callers take `int()` of them).
        """
        limit = int(num_steps)
        monitored = (set() if monitored_at is None
                     else {int(at) for at in monitored_at.numpy() if at < limit})
        if rollback is not None:
            rollback.take()
        steps = samples = 0
        last = None   # the last batch drawn; None once the data ended
        while steps < limit and (not keep_last or bool(should_continue())):
            try:
                last = next(iterator)
            except StopIteration:
                last = None
                break
            batch = (monitored_step if steps in monitored else one_step)(last)
            if on_outputs is not None:
                batch, extra = batch
                on_outputs(extra)
            steps += 1
            samples += int(batch)
        if rollback is not None:
            return (steps, samples, results(), rollback.intact())
        if not keep_last:
            return (steps, samples, results())
        drawn = (tf.experimental.Optional.empty(iterator.element_spec) if last is None
                 else tf.experimental.Optional.from_value(last))
        return (steps, samples, results(), drawn)

    def replicated_steps(step_fn, iterator, limit, steps, samples, last):
        """Runs `step_fn` while under `limit` steps, data is left and (with a halt) no halt.

        The shape of loop for replicated strategies: the next batch's optional
        is carried as a loop variable and the loop's condition asks whether it
        holds a batch, so no `tf.cond` surrounds the step. MirroredStrategy
        cannot run the optimizer's `merge_call` inside a `tf.cond` inside a
        `tf.while_loop` ("You must feed a value for placeholder tensor"; Keras'
        own `fit` fails the same way with `steps_per_execution` > 1 here). A
        batch is drawn only when a step is due, so nothing is drawn and lost.
        """
        spec = iterator.element_spec

        def draw_if(due):
            return control_flow.cond(due, iterator.get_next_as_optional,
                                     lambda: tf.experimental.Optional.empty(spec))

        def due(steps):
            going = steps < limit
            return tf.logical_and(going, should_continue()) if keep_last else going

        def go_on(steps, samples, current, last):
            return tf.logical_and(steps < limit, current.has_value())

        def body(steps, samples, current, last):
            batch = step_fn(current.get_value())
            if on_outputs is not None:
                batch, extra = batch
                on_outputs(extra)
            steps = steps + 1
            return steps, samples + batch, draw_if(due(steps)), current

        steps, samples, _, last = control_flow.while_loop(
            go_on, body, (steps, samples, draw_if(due(steps)), last))
        return steps, samples, last

    def replicated_loop(iterator, num_steps, monitored_at=None):
        last = tf.experimental.Optional.empty(iterator.element_spec)
        carried = (tf.constant(0, tf.int64), tf.constant(0, tf.int64), last)
        if monitored_step is not None:
            for index in range(RECORDS_PER_CALL):
                at = tf.minimum(monitored_at[index], num_steps)
                carried = replicated_steps(one_step, iterator, at, *carried)
                # At most one step, as a loop too: no branch around the step.
                carried = replicated_steps(monitored_step, iterator,
                                           tf.minimum(at + 1, num_steps), *carried)
        carried = replicated_steps(one_step, iterator, num_steps, *carried)
        steps, samples, last = carried
        return (steps, samples, results(), *((last,) if keep_last else ()))

    if run_eagerly:
        return replicated_loop if replicated else eager_loop
    chosen = replicated_loop if replicated else loop
    # Explicit control flow instead of AutoGraph: see `compile_step`.
    return tf.function(Traced(chosen), autograph=False)


def make_single_call(one_step, results):
    """`call(iterator) -> (1, samples, logs)`: one step a call, no loop, for data of few batches.

    The loop's `tf.while_loop` and `tf.cond` are start-up a few batches never
    repay: for a trivial step, 0.1 s more tracing and 0.05 s more first call
    than a call of one step, against 0.4 ms less per later step (one-off,
    AVX-512 Xeon). The caller knows how many batches the data holds
    (`inputs.cardinality`) and calls this that many times, so the call
    needs no end-of-data branch. One device, compiled (not for run_eagerly).
    """
    def call(iterator):
        samples = one_step(next(iterator))
        return tf.constant(1, tf.int64), samples, results()

    return tf.function(Traced(call), autograph=False)


def make_predict_loop(one_step, output_spec, *, run_eagerly, strategy=None):
    """`loop(iterator, num_steps) -> (steps, outputs)`: up to N batches' outputs, concatenated in the graph.

    `output_spec` is the structure of `TensorSpec`s one step returns; it
    sizes the TensorArrays so that a call that finds no data returns empty
    arrays of the right shape instead of failing.
    """
    strategy = strategy or tf.distribute.get_strategy()
    on_replicas = replicate(
        one_step, strategy, run_eagerly=run_eagerly,
        finish=(lambda out: replicas.concat_outputs(out, strategy))
        if replicas.is_replicated(strategy) else None)

    def loop(iterator, num_steps):
        arrays = tf.nest.map_structure(
            lambda s: tf.TensorArray(
                s.dtype, size=0, dynamic_size=True, infer_shape=False,
                element_shape=tf.TensorShape([None]).concatenate(s.shape[1:]),
            ),
            output_spec,
        )

        def body(steps, exhausted, arrays):
            optional = iterator.get_next_as_optional()

            def run():
                out = on_replicas(optional.get_value())
                index = tf.cast(steps, tf.int32)
                written = tf.nest.map_structure(lambda a, t: a.write(index, t), arrays, out)
                return steps + 1, tf.constant(False), written

            return control_flow.cond(optional.has_value(), run,
                                     lambda: (steps, tf.constant(True), arrays))

        steps, _, arrays = control_flow.while_loop(
            lambda steps, exhausted, arrays: tf.logical_and(
                steps < num_steps, tf.logical_not(exhausted)),
            body,
            (tf.constant(0, tf.int64), tf.constant(False), arrays),
        )
        return steps, tf.nest.map_structure(lambda a: a.concat(), arrays)

    if run_eagerly:
        return loop
    return tf.function(Traced(loop), autograph=False)


def collect_logs(trackers, task, precision):
    """Every log value of a step, as tensors.

    Each loss (but those the task hides), the task's metrics (a metric
    named as a loss replaces it), the precision plugin's values (loss
    scale, skipped steps) and each weighting's current weights.
    """
    hidden = task.hidden_losses()
    logs = {name: tracker.result() for name, tracker in trackers.items() if name not in hidden}
    logs.update(task.metric_results())
    logs.update(precision.logs())
    for update in task.updates:
        logs.update(getattr(update.loss, "logs", dict)())
    return logs


def concrete_functions(fn):
    """Every concrete function traced for `fn` (a `tf.function`); none for plain Python."""
    listed = getattr(fn, "_list_all_concrete_functions", None)
    return list(listed()) if listed is not None else []
