"""The non-finite guard's fast path: check once per call, roll back and replay on a bad call.

The guard (`nonfinite.NonFiniteGuard`) withholds a bad step's update with a
`tf.cond` around the optimizer. On a CPU a step of a small model lasts a
few hundred microseconds, and that branch (every gradient and every
variable the update touches crosses into it) cost about 29% of the step on
the bench's small MLP, the verdict itself another 4% (`tapeworks bench
diagnose`). So where the data can be replayed, a call runs the step with no
guard at all, and the check moves to the call's edges:

1. before the loop, every variable a step changes is copied (`take`);
2. after it, none but the metrics' may have turned non-finite (`intact`).
   A NaN or Inf loss makes the loss tracker's total non-finite, and a
   non-finite gradient reaches the weights or the optimizer's slots through
   the update, so a bad step anywhere in the call shows in this one
   reduction (a metric alone never makes the guarded step withhold one);
3. on a bad call the Trainer puts every variable back (`restore`), replays
   the call's batches from the same data with the guarded step, which stops
   before the bad update or skips it, exactly as it would have the first
   time, and goes on from there.

The copy doubles the memory of what it holds, so the Trainer takes this
path only for small states (`MAX_BYTES`). The branch costs large steps too
(9.6% [8.0, 11.5] of the large bench MLP's tf.function step in
`benchmarks/diagnose.md`), but there the copy costs about as much: one-off,
that 64 MiB state forced onto this path cost 4.9% [1.7, 7.1] at 6 steps per
call against 11.7% [8.7, 15.1] for the branch, still over the 2% target, for
twice the memory.
"""

import logging
import math

import tensorflow as tf

logger = logging.getLogger("tapeworks")

# Calls replayed (`RollbackPath.replay`) before every step is guarded instead.
MAX_REPLAYS = 3

# States up to this size use the fast path. A call costs four passes over
# the state (the variables joined and copied, joined again and checked) and
# the copy doubles its memory; the per-step branch costs a few tens of
# microseconds whatever the size. For the small bench MLP (0.1 MiB, 200 steps
# of 0.2 ms a call) the passes are nothing and the branch was 26%; for the
# large one (64 MiB, a few 40 ms steps a call) the passes cost about what the
# branch does (`tapeworks bench diagnose`).
MAX_BYTES = 16 * 2 ** 20


class CallSnapshot:
    """Copies of `variables`, taken before each call, put back after a bad one.

    The copies are one flat variable per dtype (every variable of that dtype
    reshaped to a vector and joined), plain variables outside every
    checkpoint, created once. One flat copy rather than a copy per variable
    because the graph, not the copying, is what this costs at start-up:
    about 0.7 ms of tracing and first call per node on this project's CPUs
    (a tf.function copying and checking 40 small variables one by one: 325
    nodes, 0.2 s before its second call). Flat, a variable adds two nodes
    to the copy and two to the check, not four and five; the joined vector
    is one extra pass over a state this path keeps under `MAX_BYTES`.
    """

    def __init__(self, variables, unchecked=()):
        # Variables shared by several owners appear once.
        unique = {}
        for variable in variables:
            unique.setdefault(id(variable), variable)
        self.variables = list(unique.values())
        groups = {}
        for variable in self.variables:
            groups.setdefault(tf.as_dtype(variable.dtype), []).append(variable)
        self._groups = []   # (dtype, variables, sizes, flat copy)
        with tf.init_scope():
            for dtype, members in groups.items():
                sizes = [math.prod(int(d) for d in v.shape) for v in members]
                copy = tf.Variable(self._joined(members), trainable=False, name="rollback")
                self._groups.append((dtype, members, sizes, copy))
        # `checked`: what `intact` reads, the floating variables less
        # `unchecked` (the metrics': see `RollbackPath.applies`).
        skip = {id(v) for v in unchecked}
        self.checked = [v for v in self.variables
                         if tf.as_dtype(v.dtype).is_floating and id(v) not in skip]
        self.confirmed = False   # checked against the variables after a first call

    @staticmethod
    def _joined(members):
        if len(members) == 1:
            return tf.reshape(tf.convert_to_tensor(members[0]), [-1])
        flat = tf.constant([-1])
        return tf.concat([tf.reshape(tf.convert_to_tensor(v), flat) for v in members], 0)

    def take(self):
        """Graph ops (in a `tf.function`): the copies take the variables' values."""
        for _, members, _, copy in self._groups:
            copy.assign(self._joined(members))

    def intact(self):
        """Graph ops: a boolean tensor, False when a floating variable is non-finite after the call.

        Only the variables are read here; whether the call is to blame is
        `made_non_finite`'s question, asked on the host when this is False
        (reading the copies here too doubled the check's nodes).
        """
        groups = {}
        for variable in self.checked:
            groups.setdefault(tf.as_dtype(variable.dtype), []).append(variable)
        finite = [tf.reduce_all(tf.math.is_finite(self._joined(members)))
                  for members in groups.values()]
        return tf.reduce_all(tf.stack(finite)) if finite else tf.constant(True)

    def _pairs(self):
        """Eager: (variable, its value in the copy) for every variable."""
        for _, members, sizes, copy in self._groups:
            parts = tf.split(copy.read_value(), sizes) if len(members) > 1 else [copy.read_value()]
            for variable, part in zip(members, parts):
                yield variable, tf.reshape(part, variable.shape)

    def made_non_finite(self):
        """Eager, after `intact` said False: whether the call turned a finite variable non-finite.

        A variable already non-finite when the copy was taken is not the
        call's doing (a loss total after a step "skip" skipped, a value set
        so before training): it does not count against the call.
        """
        checked = {id(v) for v in self.checked}
        return any(id(variable) in checked
                   and not bool(tf.reduce_all(tf.math.is_finite(variable)))
                   and bool(tf.reduce_all(tf.math.is_finite(kept)))
                   for variable, kept in self._pairs())

    def restore(self):
        """Eager: every variable back to its copy."""
        for variable, kept in self._pairs():
            variable.assign(kept)


def fits(variables):
    """Whether a snapshot of `variables` is small enough for the fast path."""
    seen, total = set(), 0
    for variable in variables:
        if id(variable) not in seen:
            seen.add(id(variable))
            total += math.prod(int(d) for d in variable.shape) * tf.as_dtype(
                variable.dtype).size
    return total <= MAX_BYTES


class RollbackPath:
    """Whether a call takes the fast path, its snapshot, and the replay of a bad call.

    `disabled_reason` says why the path is off for this trainer (None while
    it may be taken); `snapshot` is the `CallSnapshot`, made at first use.
    """

    def __init__(self, state, config, precision, replicated):
        self.state = state
        self.config = config
        self.precision = precision
        self.replicated = replicated
        self.snapshot = None
        self.disabled_reason = None
        self.replays = 0

    def applies(self, mode, batches):
        """Whether this call takes the fast path (and the snapshot exists once it does).

        Only where the per-step branch is what costs: tf.function steps (in
        an XLA step or update the branch is XLA's, and cheap) on one device,
        with "raise" or "skip", data that can be replayed (arrays; an
        in-memory pipeline without a shuffle), no loss scale (its own
        verdict withholds overflowed steps), no captures, and a state small
        enough to copy once a call.
        """
        state = self.state
        if (self.disabled_reason or mode is not False or self.config.run_eagerly
                or state.guard is None or not state.guard.blocks_update
                or self.replicated or state.capture is not None
                or self.precision.checks_finite or batches is None
                or state.task.own_train_step
                or not batches.replayable):
            return False
        if self.snapshot is None:
            variables = state.mutable_variables()
            if not fits(variables):
                self.disabled_reason = "the state is too large to copy once a call"
                return False
            # `intact` leaves out the metrics' variables (the loss trackers
            # stay in): the guarded step withholds a step for a non-finite
            # loss or gradient, which shows in the loss trackers, the weights
            # and the optimizer's slots, never for a metric alone; a metric's
            # state is still copied and put back with the rest. For a model
            # with many metrics this is most of the check's graph (11 metrics
            # of a two-layer classifier: 24 of its 40 variables).
            trackers = {id(v) for t in state.loss_trackers.values() for v in t.variables}
            metrics = [v for v in state.metric_variables() if id(v) not in trackers]
            self.snapshot = CallSnapshot(variables, unchecked=metrics)
        return True

    def confirm(self):
        """After the first fast call: a variable the first trace created is not in the snapshot.

        The Trainer creates every variable before training; a model that
        makes one during its first step (a layer built lazily in `call`)
        would be left out of the copies, so the path is turned off for it.
        """
        if self.snapshot.confirmed:
            return
        self.snapshot.confirmed = True
        if len(self.state.mutable_variables()) != len(self.snapshot.variables):
            self.disabled_reason = "variables were created during the first step"

    def replay(self, batches, run_guarded):
        """A fast call ended with a non-finite variable: replays it with the guarded step.

        Every variable goes back to the call's start, and the call's batches
        are drawn again from the rebuilt data (`EpochBatches.replay`), which
        then stands in for the pass's iterator. `run_guarded(iterator)` runs
        the call again with the guarded step, which withholds the bad step's
        update: "raise" stops there and localises, "skip" goes on, as if the
        call had been guarded from the start. Returns what it returns.
        """
        self.snapshot.restore()
        self.replays += 1
        if self.replays >= MAX_REPLAYS:
            # Bad steps are not rare here ("skip" over bad data): a call
            # run twice each time costs more than a guard on every step.
            self.disabled_reason = f"{self.replays} calls held non-finite steps"
        iterator = batches.replay()
        batches.adopt(iterator)
        guard = self.state.guard
        bad_before = int(guard.count.numpy())
        result = run_guarded(iterator)
        if int(guard.count.numpy()) == bad_before:
            # No step was bad: something else held a NaN or Inf (a value
            # set before the call, a metric of its own). The check of the
            # whole call cannot tell bad steps here: guard every step.
            self.disabled_reason = ("a call ended with a non-finite variable that no step "
                                    "made non-finite")
            logger.info("tapeworks: the non-finite check goes step by step from here: %s",
                        self.disabled_reason)
        return result
