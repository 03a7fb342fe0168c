"""Non-finite losses and gradients: caught in the step, named where they start.

In the graph (`NonFiniteGuard`): every update checks its loss and its
gradients before applying them, with reductions over values the step holds
anyway and no branch on the normal path. The gradients are checked, not only
the loss: on CPU, oneDNN's fused ops (Dense + ReLU in a graph) can turn a NaN
into 0, so a loss can stay finite while the gradients, and so the weights
after the update, are NaN. With float16 loss scaling the gradients' verdict
belongs to the loss scale (an overflow it handles is not an error), so only
the loss is checked there. What happens to a non-finite step is the policy:

- "raise": its update is not applied, the loop stops after it, and the host
  localises the cause and raises `NonFiniteError` (the weights and optimizer
  state are those after the last good step);
- "skip": its update is not applied (with accumulation, the whole window),
  counted in the logs as `nonfinite_steps`; training goes on;
- "warn": the update is applied as computed, counted, and a warning says so;
- None: no check.

Where the data can be drawn again and the step is small, the Trainer takes a
fast path with the same outcome (`rollback`): no guard in the steps, one
check of the whole call, and a bad call rolled back and replayed with the
guarded step.

On the host (`localise`): the offending batch is re-run eagerly, each layer's
output recorded in call order (a hook on every layer's `call`, so Sequential,
Functional and subclassed models alike), then its gradients; the first
non-finite layer output, or else the first non-finite gradient, is named,
with the batch's own statistics: NaN or Inf in the data itself is the most
common cause, and is reported as bad data. The batch is saved to a file the
message names.
"""

import dataclasses
import os
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

from tapeworks.engine.step import model_step, replicas
from tapeworks.engine.checks.gradient_health import GradientSize
from tapeworks.engine.step.task import layers_of
from tapeworks.errors import ConfigError, CorrectnessWarning, TapeworksError, warn

FLOAT32_MAX = float(np.finfo(np.float32).max)

POLICIES = ("raise", "skip", "warn", None)


class NonFiniteError(TapeworksError, FloatingPointError):
    """A loss or gradient became NaN or Inf; the message names where it starts."""

    def __init__(self, message, report=None):
        super().__init__(message)
        self.report = report


def check_policy(policy):
    if policy not in POLICIES:
        raise ConfigError(
            f"`on_nonfinite` must be \"raise\", \"skip\", \"warn\" or None. Received: "
            f"on_nonfinite={policy!r}. \"raise\" stops at the first NaN/Inf loss or "
            "gradient and names where it starts; \"skip\" skips those updates; \"warn\" "
            "applies them and warns; None checks nothing.")
    return policy


class NonFiniteGuard(tf.Module):
    """The in-graph side: a verdict per update and one counter, in a variable.

    The normal path is kept to a handful of ops per update (measured by
    `tapeworks bench diagnose`): every gradient's norm and the loss are added
    into one scalar, and that scalar's finiteness is the verdict. A NaN or an
    Inf anywhere makes the total non-finite; only finite gradients whose
    squares overflow float32 (values beyond 1e19) would be flagged too, and
    those are no healthier. One counter holds the rest:
    with "raise" the loop goes on while it is 0, and the host knows the bad
    step as the last one that ran.
    """

    def __init__(self, policy):
        super().__init__(name="nonfinite")
        self.policy = check_policy(policy)
        self.count = tf.Variable(0, dtype=tf.int64, trainable=False, name="nonfinite_steps")

    @property
    def blocks_update(self):
        """Whether a non-finite step's update is withheld ("raise", "skip")."""
        return self.policy in ("raise", "skip")

    def verdict(self, loss, norms, *, loss_scaled):
        """True when `loss` (unscaled) and the gradients are finite; counts a false one.

        `norms`: one value per gradient, non-finite exactly when it is
        (`sentinels.gradient_sentinels`): reductions the dead-gradient
        count shares, so the verdict adds an `add_n`.
        """
        if tf.executing_eagerly() and not replicas.several():
            return self._host_verdict(loss, norms, loss_scaled)
        total = tf.cast(loss, tf.float32)
        if not loss_scaled:
            norms = [n for n in norms if n is not None]
            if norms:
                total = total + tf.add_n(norms)
        # Agreed between replicas: all apply or all withhold the same update.
        finite = replicas.agree(tf.math.is_finite(total))
        self.count.assign_add(tf.cast(tf.logical_not(finite), tf.int64))
        return finite

    def _host_verdict(self, loss, norms, loss_scaled):
        """`verdict` run eagerly on one replica: the same float32 sum's verdict, in Python.

        The values are at hand eagerly: reading each to the host costs
        microseconds, where the graph's add_n, add and is_finite (and the
        count's cast) were an eager op each a step, and each op's first use
        about 1 ms of a fresh process (`run_eagerly` scripts).
        """
        norm_sum = 0.0 if loss_scaled else sum(float(n) for n in norms if n is not None)
        # As the graph's float32 sums: one beyond float32's range is non-finite
        # there (and a NaN compares false).
        finite = abs(norm_sum) <= FLOAT32_MAX and abs(float(loss) + norm_sum) <= FLOAT32_MAX
        if not finite:
            self.count.assign_add(1)
        return finite

    def should_continue(self):
        if tf.executing_eagerly():
            # The eager loop asks before every step: a read, not an Equal op.
            return int(self.count.value()) == 0
        return tf.equal(self.count, 0)

    @property
    def halted(self):
        # Read once a call: `value()` is the read alone, where `numpy()` adds an
        # Identity op (its int64 kernel's first use: 3 ms of a fresh fit).
        return self.policy == "raise" and int(self.count.value()) > 0

    def reset(self):
        """At the start of a fit: a new run may follow a raised one (after a fix)."""
        self.count.assign(0)

    def logs(self):
        # Only where training goes on past a non-finite step: a constant key
        # then (CSVLogger writes its header from the first epoch's keys).
        return {"nonfinite_steps": self.count.read_value()} if self.policy in (
            "skip", "warn") else {}


# The host side ------------------------------------------------------------------

@dataclasses.dataclass
class LayerOutput:
    layer: str
    class_name: str
    finite: bool
    input_range: tuple     # (min, max) of the finite values of its first float input
    output_nonfinite: int  # how many values of its output are NaN or Inf
    output_largest: float = float("nan")   # the largest finite magnitude of its output


@dataclasses.dataclass
class NonFiniteReport:
    """What the localisation found; `NonFiniteError.report`."""

    step: int
    epoch: int
    batch: int
    update: str
    loss_terms: dict           # name -> value of each loss term on the batch (eager)
    bad_data: list             # descriptions of NaN/Inf found in the batch itself
    first_layer: LayerOutput | None = None
    first_gradient: str | None = None
    batch_file: str | None = None
    batch_stats: list = dataclasses.field(default_factory=list)
    loss_term: str | None = None   # a non-finite loss term while every layer output is finite
    largest_output: float = float("nan")   # the largest finite magnitude of any layer output
    # At the kept weights on this batch: the gradients' global norm over their
    # finite values (in Python floats), the variable with the largest, and the sum over
    # variables of their largest finite magnitudes (the history's measure or
    # less: see `gradient_health.GradientSize`).
    gradient_norm: float = float("nan")
    largest_gradient: str | None = None
    gradient_size: float = float("nan")
    growth: tuple | None = None    # (earliest, latest) `GradientSize` when they grew EXPLODED-fold
    batch_largest: float = float("nan")   # the largest finite magnitude in the batch's inputs


# Gradients that grew this many times over the steps before a non-finite one
# exploded: three orders of magnitude, where ordinary training moves their
# size by a few times at most.
EXPLODED = 1e3
# Gradients whose float32 norm overflows (the guard's check sums squares):
# finite values beyond the square root of float32's largest.
NORM_OVERFLOW = float(np.sqrt(np.finfo(np.float32).max))


class NonFinitePolicy:
    """The host side of `on_nonfinite` after each call: localise and raise, stop, or warn.

    `stop_training`: Keras' `TerminateOnNaN` is among the callbacks, so
    "raise" stops training as that callback does, with a warning.
    `gradient_history`: a function giving the gradients' sizes so far
    (`gradient_health.GradientSize`, oldest first), or None.
    """

    def __init__(self, policy, guard, task, counters, directory, local_batch,
                 gradient_history=None):
        self.policy = policy
        self.guard = guard
        self.task = task
        self.counters = counters
        self.directory = directory
        self.local_batch = local_batch   # a drawn (replicated) batch as one batch
        self.gradient_history = gradient_history
        self.stop_training = False
        self.warned = 0

    def start_fit(self, callbacks):
        self.guard.reset()
        self.warned = 0
        self.stop_training = any(isinstance(c, keras.callbacks.TerminateOnNaN)
                                 for c in callbacks)

    def after_call(self, last, batch_index):
        """A halted "raise" call localises and raises; "warn" and "skip" report their count.

        `last`: the loop's last batch (an optional), `batch_index`: its index.
        """
        if last and self.guard.halted:
            self.stop(last[0].get_value(), batch_index)
        self.warn()

    def stop(self, batch, batch_index):
        """The "raise" policy after a halted call: localise, then raise (or stop)."""
        # The loop stopped right after the bad step: the last one counted.
        if self.task.own_train_step:
            self._stop_own_step(batch, batch_index)
            return
        report = localise(
            self.task, self.local_batch(batch), self.counters,
            step=int(self.counters.step.numpy()) - 1, epoch=int(self.counters.epoch.numpy()),
            batch_index=batch_index, directory=self.directory,
            history=self.gradient_history() if self.gradient_history else ())
        text = message(report)
        if self.stop_training:
            # Keras' TerminateOnNaN stops training without an error; so does this.
            warn(f"tapeworks: {text} Training stopped (TerminateOnNaN).", CorrectnessWarning,
                 section="NonFiniteError")
            self.task.model.stop_training = True
            return
        raise NonFiniteError(text, report)

    def _stop_own_step(self, batch, batch_index):
        """A model's own `train_step` halted: its update is applied; its loss logs say what."""
        step = int(self.counters.step.numpy()) - 1
        logs = {key: float(np.asarray(value).sum()) for key, value in
                self.task.logs.results("train").items()}
        text = model_step.nonfinite_message(
            logs, step, int(self.counters.epoch.numpy()), batch_index,
            save_batch(_named_tensors(self.local_batch(batch)), step, self.directory))
        if self.stop_training:
            warn(f"tapeworks: {text} Training stopped (TerminateOnNaN).", CorrectnessWarning)
            self.task.model.stop_training = True
            return
        raise NonFiniteError(text)

    def warn(self):
        """The "warn" policy: a warning when more non-finite steps were applied."""
        if self.policy != "warn":
            return
        count = int(self.guard.count.numpy())
        if count > self.warned:
            self.warned = count
            warn(f"tapeworks: {count} non-finite step(s) in this fit so far (by step "
                 f"{int(self.counters.step.numpy()) - 1}); their updates were applied "
                 "(on_nonfinite=\"warn\"). Fix: on_nonfinite=\"raise\" names where the "
                 "values turn non-finite.", CorrectnessWarning, section="NonFiniteError")


def localise(task, batch, counters, *, step, epoch, batch_index, directory=None, history=()):
    """Re-runs `batch` eagerly and says where the first non-finite value appears.

    `history`: the gradients' sizes before this step (`gradient_health.
    GradientSize`), to say whether they exploded.
    """
    flat = _named_tensors(batch)
    bad_data = [f"{name}: {n_nan} NaN, {n_inf} Inf of {size} values"
                for name, (n_nan, n_inf, size) in
                ((name, _count_nonfinite(value)) for name, value in flat)
                if n_nan or n_inf]
    report = NonFiniteReport(step=step, epoch=epoch, batch=batch_index, update="?",
                             loss_terms={}, bad_data=bad_data,
                             batch_stats=[_describe(name, value) for name, value in flat])
    report.batch_file = save_batch(flat, step, directory)
    report.batch_largest = max((max(abs(v) for v in _finite_range(value)) for name, value in flat
                                if name.startswith("x") and np.issubdtype(value.dtype, np.number)
                                and value.size), default=float("nan"))
    records = []
    # The re-run is in training mode (as the failing step was), which moves
    # BatchNormalization's statistics and other non-trainable state: all of
    # the models' variables are put back afterwards.
    variables = [v for model in task.models for v in model.weights]
    saved = [v.numpy() for v in variables]
    try:
        with _LayerRecorder(task.models, records), tf.GradientTape(persistent=True) as tape:
            losses, _ = task.run_losses(batch, training=True)
            objectives = [update.objective(losses, counters) for update in task.updates]
    finally:
        for variable, value in zip(variables, saved):
            variable.assign(value)
    report.loss_terms = {name: float(tf.reduce_mean(tf.cast(value, tf.float32)))
                         for name, value in losses.items()}
    report.first_layer = next((r for r in records if not r.finite), None)
    if report.first_layer is None:
        report.loss_term = next((name for name, value in report.loss_terms.items()
                                 if not np.isfinite(value)), None)
        report.largest_output = max((r.output_largest for r in records
                                     if np.isfinite(r.output_largest)), default=float("nan"))
    gradients = {update.name: tape.gradient(objective, update.variables())
                 for update, objective in zip(task.updates, objectives)}
    _measure_gradients(report, task.updates, gradients, history)
    # The update: the first whose loss is non-finite, else the first with a
    # non-finite gradient (whose variable is named when the forward is finite).
    for update, objective in zip(task.updates, objectives):
        if not bool(tf.math.is_finite(tf.cast(objective, tf.float32))):
            report.update = update.name
            break
    else:
        for update in task.updates:
            variables = update.variables()
            bad = next((v for v, g in zip(variables, gradients[update.name]) if g is not None
                        and not bool(tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(g))))),
                       None)
            if bad is not None:
                report.update = update.name
                if report.first_layer is None:
                    report.first_gradient = getattr(bad, "path", bad.name)
                break
        else:
            if report.gradient_norm >= NORM_OVERFLOW:
                # Finite gradients whose norm overflowed the check's float32.
                report.update = next(u.name for u in task.updates if any(
                    getattr(v, "path", v.name) == report.largest_gradient
                    for v in u.variables()))
    del tape
    return report


def _measure_gradients(report, updates, gradients, history):
    """The gradients' size at the kept weights, and whether they grew before.

    Over each gradient's finite values; its norm is taken as largest magnitude
    x the norm of the values divided by it, which float32 holds where the
    plain sum of squares overflows (the guard's reason to stop, here).
    """
    squares, size, largest = 0.0, 0.0, (0.0, None)
    for update in updates:
        for variable, gradient in zip(update.variables(), gradients[update.name]):
            if gradient is None:
                continue
            values = gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient
            values = tf.cast(values, tf.float32)
            values = tf.abs(tf.where(tf.math.is_finite(values), values, tf.zeros_like(values)))
            peak = float(tf.reduce_max(values)) if tf.size(values) > 0 else 0.0
            if peak == 0.0:
                continue
            norm = peak * float(tf.math.reduce_euclidean_norm(values / peak))
            squares += norm * norm
            size += peak
            if norm > largest[0]:
                largest = (norm, getattr(variable, "path", variable.name))
    if largest[1] is not None:
        report.gradient_norm, report.largest_gradient = float(np.sqrt(squares)), largest[1]
        report.gradient_size = size
    measure_gradient_growth(report, history)


def measure_gradient_growth(report, history):
    """Sets `report.growth` when the gradients grew EXPLODED-fold: from their typical size in
    `history` (`GradientSize`, oldest first; the entry of median size) to the latest, or to
    this step's own.

    The median, not the smallest: gradients that had all but vanished near a
    perfect fit make any later batch look like a jump from the smallest.
    """
    sizes = [entry for entry in history if entry.size > 0]
    if np.isfinite(report.gradient_size) and report.gradient_size > 0:
        # This step's own gradients, measured as the history's are or smaller.
        sizes.append(GradientSize(report.step, report.step, report.gradient_size))
    if len(sizes) >= 2:
        before = sorted(sizes[:-1], key=lambda entry: entry.size)
        typical = before[len(before) // 2]
        if sizes[-1].size >= EXPLODED * typical.size:
            report.growth = (typical, sizes[-1])


def _exploded(report):
    """The cause when the gradients exploded, or None."""
    overflowed = report.gradient_norm >= NORM_OVERFLOW and report.first_gradient is None \
        and report.first_layer is None and report.loss_term is None
    layer = report.first_layer
    reached = max((abs(v) for v in layer.input_range), default=0.0) if layer else 0.0
    # A layer fed values a million times the batch's own has weights that grew (not raw data).
    grown = layer is not None and np.isfinite(report.batch_largest) and reached >= max(
        1e15, 1e6 * report.batch_largest)
    if report.growth is None and not overflowed and not grown:
        return None
    parts = []
    if report.growth is not None:
        earliest, latest = report.growth
        late = (f"at least {latest.size:.3g} on this step's batch" if latest.first == report.step
                else f"{latest.size:.3g} a step over steps {latest.first}-{latest.last}")
        parts.append(
            f"the gradients grew at least {latest.size / earliest.size:.3g}-fold up to this "
            f"step: their size (the sum of each variable's gradient norm) was "
            f"{earliest.size:.3g} a step over steps {earliest.first}-{earliest.last}, {late}")
    if overflowed:
        parts.append(
            f"on this batch, at the weights of the last good step, the gradients are finite "
            f"but their norm, {report.gradient_norm:.3g} (largest: {report.largest_gradient!r}),"
            " overflows float32")
    elif layer is not None:
        parts.append(f"the first non-finite output is layer {layer.layer!r} ({layer.class_name}),"
                     f" whose inputs reach {reached:.3g}"
                     + (f" from a batch whose inputs stay within {report.batch_largest:.3g}: "
                        "the weights before it have grown" if grown else ""))
    if not parts:
        return None
    return ("Exploding gradients: " + "; ".join(parts) + ". Each update made the next "
            "gradient larger, until the values overflowed (a learning rate too high for "
            "the scale of the inputs or targets, or a deep or recurrent network trained "
            "without clipping). Fix: clip the gradients on the optimizer, e.g. "
            "`keras.optimizers.SGD(learning_rate, global_clipnorm=1.0)` (or `clipnorm=` per "
            "variable, or `Trainer(..., clip_norm=1.0)`); lower the learning rate; "
            "normalise the inputs and targets.")


def message(report):
    """The one message a user can act on."""
    where = (f"Non-finite loss or gradient at step {report.step} (epoch {report.epoch + 1}, "
             f"batch {report.batch}) in update {report.update!r}.")
    kept = ("The update was not applied: the weights and optimizer state are those after "
            "the last good step.")
    saved = f"The batch is saved in {report.batch_file}." if report.batch_file else ""
    # A loss that turns non-finite while every layer's output is finite and
    # small is the loss function's own doing (a log of 0): not an explosion.
    loss_made = report.first_layer is None and report.loss_term is not None and not (
        report.loss_terms[report.loss_term] in (float("inf"), float("-inf"))
        and report.largest_output > 1e15)
    exploded = None if report.bad_data or loss_made else _exploded(report)
    if report.bad_data:
        cause = ("The batch itself holds non-finite values (bad data): "
                 + "; ".join(report.bad_data) + ". Fix: clean or filter the data, e.g. "
                 "`dataset.filter(lambda x, y: tf.reduce_all(tf.math.is_finite(x)))`, or "
                 "impute the missing values.")
    elif exploded is not None:
        cause = exploded
    elif report.first_layer is not None:
        layer = report.first_layer
        low, high = layer.input_range
        cause = (f"The first non-finite output is layer {layer.layer!r} ({layer.class_name}): "
                 f"{layer.output_nonfinite} NaN/Inf values, from inputs in "
                 f"[{low:.4g}, {high:.4g}]. Fix: look at what that layer computes (a log or "
                 "sqrt of values <= 0, a division by zero, an exp that overflows); lower the "
                 "learning rate or clip gradients (`clip_norm=`) if the weights grew "
                 "too large.")
    elif report.loss_term is not None and report.loss_terms[report.loss_term] in (
            float("inf"), float("-inf")) and report.largest_output > 1e15:
        cause = (f"Every layer's output is finite, but they reach {report.largest_output:.3g} "
                 f"and the loss term {report.loss_term!r} overflows float32 ({_terms(report)}): "
                 "the weights have grown until the outputs explode, usually a learning rate "
                 "too high for the scale of the data (inputs or targets not normalised). Fix: "
                 "lower the learning rate, normalise the inputs and targets (e.g. "
                 "`keras.layers.Normalization`), or clip gradients (`clip_norm=`).")
    elif report.loss_term is not None:
        cause = (f"Every layer's output is finite, and the loss term {report.loss_term!r} is "
                 f"non-finite on this batch ({_terms(report)}): the loss function itself "
                 "makes it (a log of 0, 0/0, a sqrt of a negative value). Fix: add an epsilon "
                 "or clip its input, e.g. `tf.math.log(tf.clip_by_value(p, 1e-7, 1.0))`, or "
                 "use Keras' loss for it (on logits: `from_logits=True`).")
    elif report.first_gradient is not None:
        cause = (f"The forward pass is finite ({_terms(report)}); the first non-finite "
                 f"gradient is that of {report.first_gradient!r}. Fix: a function whose "
                 "derivative is infinite at the values reached (sqrt at 0, log near 0, "
                 "pow with a fractional exponent); add an epsilon, or clip gradients "
                 "(`clip_norm=`).")
    else:
        cause = (f"Re-run eagerly, the batch gives finite outputs and gradients "
                 f"({_terms(report)}): the compiled step computed the non-finite value "
                 "(fused kernels can differ from eager ones) or a random op (dropout) drew "
                 "differently. Fix: run with `run_eagerly=True` to see it in Python, or "
                 "lower the learning rate.")
    stats = " Batch: " + "; ".join(report.batch_stats) + "." if report.batch_stats else ""
    return " ".join(part for part in (where, cause, kept, saved) if part) + stats


def _terms(report):
    return ", ".join(f"{name}={value:.4g}" for name, value in report.loss_terms.items()) \
        or "no loss terms"


class _LayerRecorder:
    """Records each layer's output, in call order, by wrapping every layer's `call`.

    Keras' `Layer.__call__` calls `self.call`; an attribute on the instance
    takes precedence over the method, and is removed on exit. Nested layers
    (inside sub-models) record before the model that holds them, so the first
    non-finite record is the innermost layer where the values went bad.
    """

    def __init__(self, models, records):
        self._layers = layers_of(models)
        self._records = records

    def __enter__(self):
        for layer in self._layers:
            original = layer.call

            def call(*args, __layer=layer, __original=original, **kwargs):
                outputs = __original(*args, **kwargs)
                self._record(__layer, args, outputs)
                return outputs

            layer.__dict__["call"] = call
        return self

    def __exit__(self, *exc):
        for layer in self._layers:
            layer.__dict__.pop("call", None)
        return False

    def _record(self, layer, args, outputs):
        values = [t for t in tf.nest.flatten(outputs)
                  if isinstance(t, (tf.Tensor, tf.Variable)) and t.dtype.is_floating]
        bad = sum(int(tf.reduce_sum(tf.cast(~tf.math.is_finite(t), tf.int64))) for t in values)
        inputs = [t for t in tf.nest.flatten(args)
                  if isinstance(t, (tf.Tensor, tf.Variable, np.ndarray))
                  and tf.as_dtype(t.dtype).is_floating]
        largest = max((abs(v) for t in values for v in _finite_range(t)), default=float("nan"))
        self._records.append(LayerOutput(
            layer=layer.name, class_name=type(layer).__name__, finite=bad == 0,
            input_range=_finite_range(inputs[0]) if inputs else (float("nan"),) * 2,
            output_nonfinite=bad, output_largest=largest))


def _named_tensors(batch):
    names = ("x", "y", "sample_weight")
    parts = batch if isinstance(batch, tuple) else (batch,)
    named = []
    for part_name, part in zip(names, parts):
        flat = tf.nest.flatten(part)
        for i, value in enumerate(flat):
            if value is None:
                continue
            named.append((part_name if len(flat) == 1 else f"{part_name}[{i}]",
                          np.asarray(value)))
    return named


def _count_nonfinite(value):
    if not np.issubdtype(value.dtype, np.floating):
        return 0, 0, value.size
    return int(np.isnan(value).sum()), int(np.isinf(value).sum()), value.size


def _finite_range(value):
    array = np.asarray(value, dtype=np.float64)
    finite = array[np.isfinite(array)]
    return (float(finite.min()), float(finite.max())) if finite.size else (float("nan"),) * 2


def _describe(name, value):
    if not np.issubdtype(value.dtype, np.number) or value.size == 0:
        return f"{name} {value.dtype} {value.shape}"
    low, high = _finite_range(value)
    return f"{name} {value.dtype}{list(value.shape)} in [{low:.4g}, {high:.4g}]"


# Not "tapeworks": that folder in the temp directory shadowed the installed
# package for `python -m tapeworks.cli` run there (a namespace package).
NONFINITE_FOLDER = "tapeworks-nonfinite"


def save_batch(flat, step, directory):
    """Saves a non-finite step's named arrays as one .npz (None: in NONFINITE_FOLDER).

    Returns its path, or None where the folder cannot be written."""
    directory = directory or os.path.join(tempfile.gettempdir(), NONFINITE_FOLDER)
    try:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"nonfinite-step{step}-{int(time.time())}.npz")
        np.savez(path, **{name.replace("[", "_").replace("]", ""): value
                          for name, value in flat})
        return path
    except OSError:
        return None
