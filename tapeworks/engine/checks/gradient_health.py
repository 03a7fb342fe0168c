"""Gradients that say something is wrong before the loss does: dead variables.

The step already reduces every gradient to one number for the non-finite
check (`nonfinite.NonFiniteGuard`); that number is each gradient's Euclidean
norm (`step/sentinels.gradient_norms`; in an XLA step a sum of interleaved partial sums:
`sentinels.gradient_sentinels`), so the same reduction also tells which gradients are
identically zero. The gradient monitor computes the norms themselves
(`monitor.GradientMonitor`). `tf.math.reduce_euclidean_norm` is one kernel
and one pass over the gradient, the cost `reduce_sum` had.

`DeadGradients` adds, per trainable variable, its gradient's norm into one
float32 vector variable (a checkpoint holds it): two ops per update per
step, whatever the model's size (a count of consecutive zero steps took six:
12.7% of the small bench MLP's graph step against 5.5%, one-off runs; the kept
`bench diagnose` run puts the sums at 0%). The host reads
the sums once at least `k` steps have run since its last read (at a call
boundary) and resets them: a variable whose sum is still exactly 0 had a
zero gradient on every one of those steps. So a variable that stops
receiving gradient is named within two windows of at least `k` steps. A
variable that never moves is a bug users otherwise find at the end of a run,
if ever.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from tapeworks.engine.step.task import layers_of
from tapeworks.errors import CorrectnessWarning, warn

# Activations after which a layer's gradient is zero for every sample once
# all its pre-activations are negative (a "dead" unit).
_RELU_NAMES = ("relu", "relu6", "hard_sigmoid")


class Untracked:
    """Variables held by a tf.Module without becoming its own.

    tf.Module and checkpoints look into attributes that are lists, tuples,
    dicts or trackables; a plain object is neither, so what it holds stays
    the model's alone (`module.variables` and checkpoints do not repeat it).
    """

    def __init__(self, variables):
        self.items = tuple(variables)


class DeadGradients(tf.Module):
    """Gradient sentinels (`sentinels.gradient_sentinels`) summed since the host last looked, per
    variable of one update."""

    def __init__(self, variables):
        super().__init__(name="dead_gradients")
        # The model's variables, not this module's: held where tf.Module's
        # tracking does not look (checkpoints hold them once, with the model).
        self._held = Untracked(variables)
        self.norm_sum = tf.Variable(tf.zeros([len(self._held.items)], tf.float32),
                                    trainable=False, name="gradient_norm_sum")

    def observe(self, variables, norms):
        """In the graph: adds this step's gradient sentinels to the window's sums.

        `variables` and `norms` are the pairs that had a gradient; a variable
        with no gradient (allowed by `allow_missing_gradients`) adds -1, so
        it is never called dead. A NaN norm makes its sum NaN: not dead
        either (the non-finite check speaks for it).
        """
        if not self._held.items:
            return
        by_id = {id(v): n for v, n in zip(variables, norms) if n is not None}
        if tf.executing_eagerly():
            # run_eagerly: the sentinels read as numbers, added in one op (a
            # stack is one eager op more a step, and its first use ~1 ms).
            self.norm_sum.assign_add(np.array(
                [float(by_id.get(id(v), -1.0)) for v in self._held.items], np.float32))
            return
        self.norm_sum.assign_add(
            tf.stack([by_id.get(id(v), tf.constant(-1.0)) for v in self._held.items]))

    def sums(self):
        """On the host: the sums since the last reset, one per variable (read, not reset)."""
        return self.norm_sum.numpy()

    def dead(self, sums=None):
        """On the host: the variables whose gradient was zero on every step since the last call.

        Resets the sums: the caller (`Trainer`) asks once at least
        `dead_gradient_steps` steps have run. `sums`: as just read by `sums()`.
        """
        sums = self.sums() if sums is None else sums
        self.norm_sum.assign(tf.zeros_like(self.norm_sum))
        return [v for v, total in zip(self._held.items, sums) if total == 0.0]


class DeadGradientWatch:
    """The host side: once `steps` steps have run, one read of the sums, a warning for new dead ones.

    Kept across fits: consecutive steps are consecutive in an epoch-by-epoch
    fit loop too, and each variable is named once.

    The sums it reads also give the gradients' size over time, for the
    non-finite report to say whether they exploded (`history`): each read
    records the mean per step since the one before, and so does a read
    without reset at the first call to pass step 1, 2, 4, 8, ... since the
    watch began (a few reads in a whole run, so the early steps, where an
    explosion often happens, have a history too).
    """

    HISTORY = 64    # the entries kept (the first and the latest)

    def __init__(self, sums, steps, owners_of):
        self.sums = sums              # one DeadGradients per update
        self.steps = steps
        self.owners_of = owners_of    # a function: id(variable) -> its layer
        self.unchecked = 0            # steps run since the host last read the sums
        self.reported = set()
        self.history = []             # GradientSize entries, oldest first
        self._seen = 0                # steps since the watch began
        self._next_peek = 1
        self._recorded = (0, 0.0)     # (steps into the window, its total) at the last entry

    def after_call(self, steps_run, step=None):
        """After a call of `steps_run` steps, the last of them `step - 1` (the counter's value)."""
        if not self.sums:
            return
        self.unchecked += steps_run
        self._seen += steps_run
        peek = self._seen >= self._next_peek
        while self._next_peek <= self._seen:
            self._next_peek *= 2
        if self.unchecked < self.steps:
            if peek:
                self._record([dead.sums() for dead in self.sums], step)
            return
        window, self.unchecked = self.unchecked, 0
        sums = [dead.sums() for dead in self.sums]
        self._record(sums, step, window)
        self._recorded = (0, 0.0)
        found = [v for dead, read in zip(self.sums, sums) for v in dead.dead(read)
                 if id(v) not in self.reported]
        if found:
            self.reported.update(id(v) for v in found)
            warn(dead_message(found, window, self.owners_of()), CorrectnessWarning,
                 section="dead-gradients")

    def _record(self, sums, step, window=None):
        """An entry for the steps since the last one: their mean gradient size."""
        into = self.unchecked if window is None else window
        # Variables without a gradient add -1 a step: only gradients count.
        total = float(sum(s[s > 0].sum() for s in sums))
        steps, before = into - self._recorded[0], self._recorded[1]
        self._recorded = (into, total)
        if steps <= 0 or step is None or not np.isfinite(total):
            return
        self.history.append(GradientSize(step - steps, step - 1, (total - before) / steps))
        if len(self.history) > self.HISTORY:
            del self.history[1]   # the first stays: the size training started from


@dataclasses.dataclass(frozen=True)
class GradientSize:
    """The gradients' mean size over steps `first`..`last`: per step, the sum over variables
    of each gradient's norm (in an XLA step, of its largest magnitude, no larger)."""

    first: int
    last: int
    size: float


def owners(models):
    """`id(variable) -> the innermost layer that holds it`, over every layer of `models`."""
    found = {}
    # layers_of walks parents before their sub-layers: the innermost owner wins.
    for layer in layers_of(models):
        for variable in layer.weights:
            found[id(variable)] = layer
    return found


def dead_message(variables, steps, owner_of):
    """One warning for variables whose gradient stayed zero, grouped by layer, with likely causes."""
    by_layer = {}
    for variable in variables:
        layer = owner_of.get(id(variable))
        name = layer.name if layer is not None else "?"
        by_layer.setdefault(name, (layer, []))[1].append(_name(variable))
    parts, causes = [], []
    for name, (layer, names) in by_layer.items():
        parts.append(f"{name} ({', '.join(names)})")
        activation = getattr(getattr(layer, "activation", None), "__name__", "")
        if activation in _RELU_NAMES:
            causes.append(
                f"layer {name!r} ends in {activation}: if every sample's pre-activation is "
                "negative its units are dead (zero output, zero gradient); lower the "
                "learning rate, check the input scale and initialisation, or use "
                "leaky_relu/gelu")
    causes.append(
        "an op with a zero gradient between them and the loss (tf.sign, a hard threshold "
        "such as tf.where(x > 0, 1.0, 0.0), a clip that always saturates), or their output "
        "multiplied by zero, masked out or given a loss weight of 0")
    causes.append(
        "a helper that should be frozen but is still trainable (set `layer.trainable = "
        "False` or use Task.freeze), or a layer whose output does not reach the loss")
    return (
        f"tapeworks: the gradient of {len(variables)} trainable variable(s) has been exactly "
        f"zero for {steps} consecutive steps, so they do not train: {'; '.join(parts)}. "
        f"Likely causes: {'; '.join(causes)}. To change how many steps count, pass "
        "`dead_gradient_steps=` (None turns this check off).")


def _name(variable):
    return getattr(variable, "path", None) or variable.name
