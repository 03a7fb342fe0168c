"""What the step needs to run on several replicas (tf.distribute), in one place.

Three rules, each the same on one device (where every helper here is the identity):

- State variables (counters, verdicts, accumulated window sizes, loss scales,
  pruning masks) are created with `ONLY_FIRST_REPLICA` aggregation
  (`state_variables`): each replica computes the same value (from agreed
  verdicts and mirrored weights), and a mirrored variable can only be assigned
  in a replica's context with an aggregation. The accumulated gradients are
  each replica's own (`local_variable`: sync-on-read, summed when read).
- One rule for losses (`losses_per_replica`): the loss a step computes is the
  mean over its replica's share of the batch, whatever computes it (a Keras
  loss object, `model.compute_loss`, or a Task's own `tf.reduce_mean`). Keras'
  loss objects divide by the replica count inside their reduction
  (`keras.src.losses.loss.scale_loss_for_distribution`) and a plain
  `tf.reduce_mean` does not, so a Task that mixes both would weigh its terms
  differently on two replicas than on one. While a tapeworks step runs, that
  Keras division is off, and the step divides each objective by the replica
  count itself before differentiating (`for_gradient`); the optimizer sums the
  replicas' gradients (Keras' all-reduce), which makes the update the gradient
  of the global batch's mean when the replicas' shares are equal (as Keras
  does; a last, smaller batch split unevenly weighs its samples by share).
- Verdicts (a non-finite gradient, a loss-scale overflow) are agreed between
  replicas (`agree`) before anything acts on them, so all replicas apply or
  all skip the same update.
"""

import contextlib
import threading

import tensorflow as tf

from tapeworks.engine.step import control_flow

_patch_lock = threading.Lock()
_unscaled_depth = 0   # process-wide: MirroredStrategy traces its replicas in threads


def is_replicated(strategy):
    """Whether `strategy` synchronises replicas (not the default one, not OneDeviceStrategy)."""
    return not (isinstance(strategy, tf.distribute.OneDeviceStrategy)
                or type(strategy).__name__ == "_DefaultDistributionStrategy")


def concat_outputs(per_replica, strategy):
    """The replicas' outputs joined along the batch, in the order the batch was split.

    Keras' own `reduce_per_replica(..., "concat")`, which also gathers
    across workers under MultiWorkerMirroredStrategy.
    """
    from keras.src.backend.tensorflow.trainer import reduce_per_replica

    return reduce_per_replica(per_replica, strategy, reduction="concat")


def num_replicas():
    """The replica count of the strategy in whose scope or replica context this runs."""
    return tf.distribute.get_strategy().num_replicas_in_sync


def several():
    return num_replicas() > 1


@contextlib.contextmanager
def state_variables():
    """Variables created inside get `ONLY_FIRST_REPLICA` aggregation unless they set one."""
    def creator(next_creator, **kwargs):
        if kwargs.get("aggregation") in (None, tf.VariableAggregation.NONE):
            kwargs["aggregation"] = tf.VariableAggregation.ONLY_FIRST_REPLICA
        return next_creator(**kwargs)

    with tf.variable_creator_scope(creator):
        yield


def local_variable(initial_value, **kwargs):
    """A variable of which each replica holds its own copy (sync on read, summed when read)."""
    if not several():
        return tf.Variable(initial_value, **kwargs)
    return tf.Variable(initial_value, synchronization=tf.VariableSynchronization.ON_READ,
                       aggregation=tf.VariableAggregation.SUM, **kwargs)


def sum_over_replicas(value):
    """`value` (a tensor or a list of them) summed over the replicas, in a replica's context."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)


def agree(finite):
    """`finite` of every replica, and-ed: a verdict all replicas share (identity on one)."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return finite
    return tf.equal(sum_over_replicas(tf.cast(tf.logical_not(finite), tf.int32)), 0)


def needs_merge_call():
    """Whether a branch around the optimizer must be taken in cross-replica context.

    Keras' optimizer all-reduces the gradients through `merge_call`, which
    MirroredStrategy refuses inside a `tf.cond` in a replica's context (even
    with one replica), unless the strategy supports no merge call.
    """
    return (tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context() is False
            and tf.distribute.get_replica_context() is not None
            and not tf.__internal__.distribute.strategy_supports_no_merge_call())


def cond_across_replicas(verdict, apply, skip, args):
    """`apply(*args)` on every replica if the agreed `verdict` holds, else `skip()`.

    The shape of Keras' `LossScaleOptimizer._tf_apply`: into cross-replica
    context, the branch there, each replica's work through
    `call_for_each_replica`. `args` travel per replica (a closure would see
    one replica's tensors); `verdict` is agreed (`agree`), so any replica's
    value is every replica's.
    """
    def cross(distribution, verdict, args):
        decided = distribution.experimental_local_results(verdict)[0]

        def run_apply():
            distribution.extended.call_for_each_replica(apply, args=args)

        def run_skip():
            distribution.extended.call_for_each_replica(skip)

        control_flow.cond(decided, run_apply, run_skip)

    tf.distribute.get_replica_context().merge_call(cross, args=(verdict, args))


def branch(predicate, true_fn):
    """`tf.cond(predicate, true_fn, no-op)` where `true_fn` may apply an optimizer update.

    `true_fn` takes no arguments and reads only variables (no replica's
    tensors), and `predicate` is the same on every replica (a counter).
    """
    if needs_merge_call():
        cond_across_replicas(predicate, true_fn, lambda: None, ())
    else:
        control_flow.cond(predicate, true_fn, lambda: None)


def for_gradient(objective):
    """The objective a replica differentiates: its loss over the replica count."""
    replicas = num_replicas()
    if replicas == 1:
        return objective
    return objective * tf.cast(1.0 / replicas, objective.dtype)


@contextlib.contextmanager
def losses_per_replica():
    """While a step is traced (or runs eagerly): Keras' losses do not divide by the replicas.

    See the module's docstring. A process-wide switch, not a thread-local
    one: MirroredStrategy traces each replica's step in a thread of its own.
    """
    global _unscaled_depth
    _install_patch()
    with _patch_lock:
        _unscaled_depth += 1
    try:
        yield
    finally:
        with _patch_lock:
            _unscaled_depth -= 1


_patched = False


def _install_patch():
    """Wraps Keras' two replica-scaling helpers, where Keras' losses and trainer look them up."""
    global _patched
    if _patched:
        return
    from keras.src.losses import loss as keras_loss

    with _patch_lock:
        if _patched:
            return
        for name in ("scale_loss_for_distribution", "unscale_loss_for_distribution"):
            original = getattr(keras_loss, name)

            def wrapper(value, _original=original):
                if _unscaled_depth > 0:
                    return value
                return _original(value)

            wrapper.__wrapped__ = original
            setattr(keras_loss, name, wrapper)
        _patched = True
