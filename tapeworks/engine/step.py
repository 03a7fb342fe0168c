"""The training, evaluation and prediction steps, and the loop that runs N of them per call.

Read top to bottom, a training step is: forward under a tape -> loss ->
gradients -> checks -> apply -> metrics. The compiled function is built in
layers, as Keras' `make_train_function` does:

1. `step_on_data(batch)`: one step, compiled alone so XLA can take it whole
   (the iterator ops around it cannot go through XLA);
2. `strategy.run(step_on_data)`: per replica, reduced across replicas;
3. `loop(iterator, num_steps)`: up to `num_steps` steps inside one graph call,
   stopping early at the end of the data. `num_steps` is a tensor, so changing
   it never retraces (Orbit's rule).

Losses and metrics accumulate in Keras metric variables inside the graph; the
host reads them once per call.

Per-step checks (numerics, gradient monitors) plug in at `StepHooks`: each hook
sees the loss and the (gradient, variable) pairs of every step, in the graph.
"""

import keras
import tensorflow as tf

from tapeworks.engine import guards
from tapeworks.engine.data_adapter import batch_size_of


class StepHooks:
    """Hooks called inside the compiled train step. The defaults do nothing.

    Subclass and override to add in-graph checks; they run inside
    `tf.function`/XLA, so they must use TensorFlow ops, not Python side effects.
    """

    def on_loss(self, loss):
        return loss

    def on_gradients(self, grads_and_vars):
        return grads_and_vars


def make_train_step(model, optimizer, loss_tracker, *, allow_missing_gradients=False,
                    hooks=None):
    """Returns `step(batch) -> batch size` that trains `model` on one batch."""
    hooks = hooks or StepHooks()

    def train_step(batch):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            # Keras' losses already divide by the number of replicas, so the
            # sum of per-replica gradients is the gradient of the global-batch
            # mean (the reduction tf.distribute expects).
            loss = model.compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
            )
            loss = guards.check_loss(loss)
            loss = hooks.on_loss(loss)
        variables = model.trainable_variables
        gradients = tape.gradient(loss, variables)
        grads_and_vars = guards.check_gradients(
            gradients, variables, allow_missing=allow_missing_gradients
        )
        grads_and_vars = hooks.on_gradients(grads_and_vars)
        optimizer.apply_gradients(grads_and_vars)
        batch_size = batch_size_of(x)
        loss_tracker.update_state(_unscale_for_replicas(loss), sample_weight=batch_size)
        model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        return batch_size

    return train_step


def make_test_step(model, loss_tracker):
    """Returns `step(batch) -> batch size` that updates loss and metrics only."""

    def test_step(batch):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
        y_pred = model(x, training=False)
        loss = model.compute_loss(
            x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False
        )
        batch_size = batch_size_of(x)
        loss_tracker.update_state(_unscale_for_replicas(loss), sample_weight=batch_size)
        model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        return batch_size

    return test_step


def make_predict_step(model):
    """Returns `step(batch) -> outputs` for inference."""

    def predict_step(batch):
        x, _, _ = keras.utils.unpack_x_y_sample_weight(batch)
        return model(x, training=False)

    return predict_step


def compile_step(step, *, jit_compile, run_eagerly):
    """Layer 1: one step on one batch, as a `tf.function` (XLA if asked).

    AutoGraph is off here, as in Keras' own `one_step_on_data`: the step has
    no Python control flow over tensors, and errors raised while tracing
    (tapeworks' guards) then reach the caller as they were raised.
    """
    if run_eagerly:
        return step
    return tf.function(step, jit_compile=bool(jit_compile), reduce_retracing=True,
                       autograph=False)


def make_loop(one_step, results, *, run_eagerly, strategy=None):
    """Layers 2 and 3: `loop(iterator, num_steps) -> (steps, samples, logs)`.

    Runs up to `num_steps` steps, fewer when the data ends. `results()`
    returns the dict of metric tensors read once at the end of the call: the
    call's only host sync.
    """
    strategy = strategy or tf.distribute.get_strategy()

    def loop(iterator, num_steps):
        def body(steps, samples, exhausted):
            optional = iterator.get_next_as_optional()

            def run():
                per_replica = strategy.run(one_step, args=(optional.get_value(),))
                batch = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
                return steps + 1, samples + batch, tf.constant(False)

            return tf.cond(optional.has_value(), run,
                           lambda: (steps, samples, tf.constant(True)))

        steps, samples, _ = tf.while_loop(
            lambda steps, samples, exhausted: tf.logical_and(
                steps < num_steps, tf.logical_not(exhausted)),
            body,
            (tf.constant(0, tf.int64), tf.constant(0, tf.int64), tf.constant(False)),
        )
        return steps, samples, results()

    if run_eagerly:
        return loop
    # Explicit control flow instead of AutoGraph: see `compile_step`.
    return tf.function(loop, autograph=False)


def make_predict_loop(one_step, output_spec, *, run_eagerly, strategy=None):
    """`loop(iterator, num_steps) -> (steps, outputs)`: up to N batches' outputs, concatenated in the graph.

    `output_spec` is the structure of `TensorSpec`s one step returns; it
    sizes the TensorArrays so that a call that finds no data returns empty
    arrays of the right shape instead of failing.
    """
    strategy = strategy or tf.distribute.get_strategy()

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
                out = strategy.run(one_step, args=(optional.get_value(),))
                index = tf.cast(steps, tf.int32)
                written = tf.nest.map_structure(lambda a, t: a.write(index, t), arrays, out)
                return steps + 1, tf.constant(False), written

            return tf.cond(optional.has_value(), run,
                           lambda: (steps, tf.constant(True), arrays))

        steps, _, arrays = tf.while_loop(
            lambda steps, exhausted, arrays: tf.logical_and(
                steps < num_steps, tf.logical_not(exhausted)),
            body,
            (tf.constant(0, tf.int64), tf.constant(False), arrays),
        )
        return steps, tf.nest.map_structure(lambda a: a.concat(), arrays)

    if run_eagerly:
        return loop
    return tf.function(loop, autograph=False)


def metric_results(loss_tracker, model):
    """Returns a function giving `{"loss": ..., <metric>: ...}` as tensors."""

    def results():
        logs = {"loss": loss_tracker.result()}
        for name, value in model.get_metrics_result().items():
            # The model's own (unused) loss tracker is also called "loss":
            # tapeworks tracks the loss itself, so its value wins.
            if name != "loss":
                logs[name] = value
        return logs

    return results


def _unscale_for_replicas(loss):
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if replicas > 1:
        loss = loss * tf.cast(replicas, loss.dtype)
    return loss
