"""Per-layer gradient norm, weight norm and update/weight ratio, every k-th step (`monitor_every=k`).

The statistics are computed in the graph, but not in the step every call
runs: the Trainer compiles a second variant of the train step whose updates
are wrapped by `GradientMonitor.record`, and the loop runs that variant on
the monitored steps only, in segments: plain steps up to the next monitored
step, the monitored step, plain steps again (`step.make_loop`), at most
`RECORDS_PER_CALL` monitored steps in a call. So monitoring costs neither a
branch in every step (a `tf.cond` around the optimizer in every step costs
tens of microseconds on CPU: `tapeworks bench diagnose`) nor calls shorter
than "auto" chose (each call costs about 2 ms in TensorFlow itself). The
monitored step is the k-th step (with accumulation: the first step at or
after it that closes a window).

For each update, `record` keeps in variables each trainable variable's
gradient norm (as computed, before clipping), its norm before the update and
the norm of what the update changed, in the next of `RECORDS_PER_CALL` slots;
the host reads the slots a call filled (`layer_stats`) and groups them by
layer: a layer's norm is the root of the sum of its variables' squared
norms, and its update ratio is |delta w| / |w|. `MonitorReport` keeps the
history, writes TensorBoard scalars (and, for a call's last record, gradient
histograms when the TensorBoard callback asks for histograms) and warns when
a layer's gradient norm explodes (over 100x its running median) or vanishes
(under 1/100 of it).
"""

import math
import statistics

import keras
import tensorflow as tf

from tapeworks.engine.checks import gradient_health
from tapeworks.engine.step import replicas, sentinels
from tapeworks.engine.step.step import RECORDS_PER_CALL
from tapeworks.errors import CorrectnessWarning, warn

# A layer's gradient norm this many times its running median (or this many
# times below it) is reported. The median is over the last `WINDOW` records,
# from `MIN_HISTORY` records on.
EXPLODE_FACTOR = 100.0
WINDOW = 20
MIN_HISTORY = 3


class GradientMonitor(tf.Module):
    """The in-graph side for one update: norms per variable, in variables."""

    def __init__(self, variables):
        super().__init__(name="gradient_monitor")
        # The model's variables, not this module's (see `Untracked`).
        self._held = gradient_health.Untracked(variables)
        # Per slot, rows: gradient norm, weight norm (before the update),
        # update norm; one column per variable. One variable: the host reads
        # a call's records at once.
        self.stats = tf.Variable(tf.zeros([RECORDS_PER_CALL, 3, len(self._held.items)]),
                                 trainable=False, name="monitor_stats")
        # Records made so far; record r is in slot r % RECORDS_PER_CALL.
        self.records = tf.Variable(0, dtype=tf.int64, trainable=False, name="records")
        self.gradients = None   # copies of the gradients, for histograms (`keep_gradients`)

    @property
    def watched(self):
        return self._held.items

    def keep_gradients(self):
        """Adds buffers that hold the monitored step's gradients (for TensorBoard histograms).

        Called before the monitored step is first traced; costs one copy of
        the trainable weights' memory.
        """
        if self.gradients is None:
            self.gradients = [tf.Variable(tf.zeros(v.shape, tf.float32), trainable=False,
                                          name=f"monitored_gradient_{i}")
                              for i, v in enumerate(self._held.items)]

    def record(self, grads_and_vars, apply, xla=False):
        """In the graph: runs `apply()` (the update) with the statistics of `grads_and_vars` around it."""
        variables = [v for _, v in grads_and_vars]
        gradients = [g for g, _ in grads_and_vars]
        if replicas.several():
            # The update's gradient is the replicas' sum (each holds its share).
            gradients = replicas.sum_over_replicas([tf.convert_to_tensor(g) for g in gradients])
        grad_norms = sentinels.gradient_norms(gradients, xla=xla)
        # Reads taken before the update: the optimizer's in-place updates
        # copy a buffer another tensor still reads (TensorFlow's
        # copy-on-write), so these keep the old values.
        before = [tf.identity(tf.convert_to_tensor(v)) for v in variables]
        apply()
        after = [tf.convert_to_tensor(v) for v in variables]
        weight_norms = sentinels.gradient_norms(before, xla=xla)
        update_norms = sentinels.gradient_norms(
            [a - b for a, b in zip(after, before)], xla=xla)
        position = {id(v): i for i, v in enumerate(variables)}
        if self._held.items:
            record = tf.stack([
                tf.stack([values[position[id(v)]] if id(v) in position else tf.constant(0.0)
                          for v in self._held.items])
                for values in (grad_norms, weight_norms, update_norms)])
            # A dynamic slot, written as a scatter (XLA takes it; a sliced
            # assign needs constant bounds there).
            slot = tf.math.floormod(self.records, RECORDS_PER_CALL)
            self.stats.assign(tf.tensor_scatter_nd_update(
                self.stats, tf.reshape(slot, [1, 1]), record[tf.newaxis]))
        if self.gradients is not None:
            for buffer, v in zip(self.gradients, self._held.items):
                if id(v) in position:
                    buffer.assign(tf.cast(tf.convert_to_tensor(gradients[position[id(v)]]),
                                          tf.float32))
        self.records.assign_add(1)


def layer_stats(monitors, owner_of, record):
    """On the host: `{layer: {"gradient_norm", "weight_norm", "update_ratio"}}` of record `record`.

    `record` counts the records made (0-based), at most `RECORDS_PER_CALL`
    back from the last: its slot is `record % RECORDS_PER_CALL`.
    """
    sums = {}
    for monitor in monitors:
        gradient, weight, update = monitor.stats.numpy()[record % RECORDS_PER_CALL]
        for variable, g, w, u in zip(monitor.watched, gradient, weight, update):
            layer = owner_of.get(id(variable))
            name = layer.name if layer is not None else variable.path.rsplit("/", 1)[0]
            total = sums.setdefault(name, [0.0, 0.0, 0.0])
            total[0] += float(g) ** 2
            total[1] += float(w) ** 2
            total[2] += float(u) ** 2
    stats = {}
    for name, (g, w, u) in sums.items():
        weight = math.sqrt(w)
        stats[name] = {"gradient_norm": math.sqrt(g), "weight_norm": weight,
                       "update_ratio": math.sqrt(u) / weight if weight > 0 else float("nan")}
    return stats


class MonitorReport:
    """The host side: history, logs, TensorBoard and warnings."""

    def __init__(self):
        self.history = []          # [{"step": int, "layers": {layer: stats}}]
        self._warned = set()

    def add(self, step, stats):
        self._check(step, stats)
        self.history.append({"step": step, "layers": stats})

    def logs(self):
        """The latest values as flat log entries: `gradient_norm/<layer>`, ..."""
        if not self.history:
            return {}
        return {f"{key}/{layer}": value
                for layer, values in self.history[-1]["layers"].items()
                for key, value in values.items()}

    def write_tensorboard(self, callbacks, monitors, count):
        """The last `count` records' scalars into each TensorBoard callback's train log.

        And the gradient histograms, if kept: the buffers hold the last
        monitored step's gradients, so they go with the last record.
        """
        boards = [c for c in callbacks if isinstance(c, keras.callbacks.TensorBoard)]
        records = self.history[-count:] if count else []
        if not boards or not records:
            return
        for board in boards:
            # Keras' TensorBoard has no public writer; `_train_writer` is the
            # one it writes its own train scalars to, so these land beside them.
            for record in records:
                with board._train_writer.as_default(step=record["step"]):
                    for layer, values in record["layers"].items():
                        for key, value in values.items():
                            tf.summary.scalar(f"monitor/{key}/{layer}", value)
            with board._train_writer.as_default(step=records[-1]["step"]):
                for monitor in monitors:
                    if monitor.gradients is None:
                        continue
                    for variable, buffer in zip(monitor.watched, monitor.gradients):
                        tf.summary.histogram(f"gradients/{variable.path}", buffer)
            board._train_writer.flush()

    def _check(self, step, stats):
        for layer, values in stats.items():
            past = [record["layers"][layer]["gradient_norm"] for record in self.history[-WINDOW:]
                    if layer in record["layers"]]
            if len(past) < MIN_HISTORY:
                continue
            median = statistics.median(past)
            norm = values["gradient_norm"]
            if median <= 0 or not math.isfinite(norm):
                continue
            if norm > EXPLODE_FACTOR * median and (layer, "explode") not in self._warned:
                self._warned.add((layer, "explode"))
                warn(f"tapeworks: the gradient norm of layer {layer!r} exploded at step {step}: "
                     f"{norm:.3g}, {norm / median:.0f}x its running median ({median:.3g}). "
                     "Likely causes: a learning rate too high for this point of training, a "
                     "loss term that grows without bound (log of ~0, division by a small "
                     "number), or bad samples. Fix: clip (`clip_norm=`), lower the learning "
                     "rate or warm it up, and check the batches around this step.",
                     CorrectnessWarning, section="gradient-monitor")
            elif norm < median / EXPLODE_FACTOR and (layer, "vanish") not in self._warned:
                self._warned.add((layer, "vanish"))
                warn(f"tapeworks: the gradient norm of layer {layer!r} vanished at step {step}: "
                     f"{norm:.3g}, 1/{median / max(norm, 1e-45):.0f} of its running median "
                     f"({median:.3g}). Likely causes: saturated activations (sigmoid/tanh), "
                     "units that stopped firing, or a learning-rate schedule that decayed to "
                     "~0. Fix: check the activations' range and the schedule; normalisation "
                     "or residual connections keep gradients flowing.", CorrectnessWarning,
                     section="gradient-monitor")


class MonitorSchedule:
    """Which steps of the next call are monitored, and the delivery of their records.

    A monitored step is the k-th step, or with accumulation the first step
    at or after it that closes a window; the next is the first such step
    after it. The next step due is worked out from the step counter when
    unknown (at a fit's start) and moves on only with the records made, so a
    step the data did not reach stays due.
    """

    def __init__(self, monitors, every, accumulate, update_state):
        self.monitors = monitors          # one GradientMonitor per update
        self.every = every
        self.accumulate = accumulate
        self.update_state = update_state  # the first update's accumulators (its micro-step)
        self.report = MonitorReport()
        self.next_due = None              # the k-th step due to be monitored next
        self.records = 0                  # the first monitor's records, as last read

    def start_fit(self):
        self.next_due = None

    def steps_of_call(self, host_step, num_steps):
        """The indices of the next call's monitored steps, and the call's length.

        A call holds at most `RECORDS_PER_CALL` monitored steps and then ends
        on the last (a mode's first call while tuning is one step, monitored
        when due). `(None, num_steps)` when the call monitors nothing.
        """
        if not self.monitors:
            return None, num_steps
        every = self.every
        if self.next_due is None:
            self.next_due = (host_step // every + 1) * every - 1
        due, positions = self.next_due, []
        if host_step + num_steps <= due:
            return None, num_steps   # the call ends before the due step: no device read
        pending = int(self.update_state.micro_step.numpy()) if self.accumulate > 1 else 0
        for index in range(max(0, due - host_step), num_steps):
            step = host_step + index
            if step >= due and (pending + index + 1) % self.accumulate == 0:
                positions.append(index)
                due = next_kth_step(step, every)
                if len(positions) == RECORDS_PER_CALL:
                    return positions, index + 1
        return positions or None, num_steps

    def rewind(self):
        """Before a call is replayed: its records are made again, into the same slots."""
        for monitor in self.monitors:
            monitor.records.assign(self.records)

    def deliver(self, callbacks, positions, call_start, owners):
        """After a monitored call: its records per layer into the history, logs and TensorBoard."""
        records = int(self.monitors[0].records.numpy())
        made = records - self.records
        if not made:
            return {}   # the data ended before the monitored step: it stays due
        for index in range(made):
            step = call_start + positions[index]
            stats = layer_stats(self.monitors, owners, self.records + index)
            self.report.add(step, stats)
        self.records = records
        self.next_due = next_kth_step(step, self.every)
        self.report.write_tensorboard(callbacks, self.monitors, made)
        return self.report.logs()

    def keep_gradients_for(self, callbacks):
        """Whether gradient histograms were just turned on for a TensorBoard that asks for them.

        When True, the monitored step variants traced before must be traced
        again, to write the gradients' buffers.
        """
        wanted = any(isinstance(c, keras.callbacks.TensorBoard) and c.histogram_freq
                     for c in callbacks)
        if not self.monitors or not wanted or self.monitors[0].gradients is not None:
            return False
        for monitor in self.monitors:
            monitor.keep_gradients()
        return True


def next_kth_step(step, every):
    """The first step after `step` (0-based) that is a multiple of `every` when counted from 1."""
    return ((step + 1) // every + 1) * every - 1


def monitored_at(positions, num_steps):
    """The monitored loop's `monitored_at` argument: `positions`, padded to its fixed length.

    An entry at `num_steps` or beyond is unused. No argument when the call
    monitors nothing (the plain loop).
    """
    if not positions:
        return ()
    padded = list(positions) + [num_steps] * (RECORDS_PER_CALL - len(positions))
    return (tf.constant(padded, tf.int64),)
