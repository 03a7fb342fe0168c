"""float32 or mixed bfloat16, measured on the first fit's own batches.

Where the CPU computes bfloat16 natively (AVX512_BF16, AMX), `precision="auto"`
starts in float32 (`step/precision.Measured`). At the first fit long enough to
repay the measurement, a trial run (`measuring.TrialRun`: every variable put
back afterwards) trains the same first batches from the same state in each
precision, the two alternated over `ROUNDS` rounds, and keeps mixed bfloat16
only when both hold:

- **faster**: its median seconds per step is at most float32's / `SPEED_MARGIN`;
- **the same training**: over the measured steps, the mean loss of each call
  (`CALLS` calls of `STEPS_PER_CALL` steps, more where a step is short) stays
  within `LOSS_TOLERANCE` of float32's, relative to float32's (bfloat16 keeps
  8 bits of mantissa: a forward pass rounds at about 0.4%; 2% leaves room for
  a few steps of training apart, and still catches a loss that bfloat16 moves
  or breaks).

Otherwise float32, with the reason.

The trial's batches are drawn so that the training does not change: from a
new copy of the data where one can be made (`PreparedData.rebuild`: arrays,
an in-memory pipeline with nothing random), else, for an in-memory pipeline
that shuffles, from the arrays it slices, read out of its graph
(`pipeline_check.source_arrays`: no iterator started, so its shuffle's seeds
do not advance). Where neither applies (a generator, a pipeline that reads
files or maps), or the fit is too short to repay the trial (`MIN_FIT_STEPS`,
counting the steps of the trainer's earlier fits), nothing is measured and
float32 is kept, with that reason. The choice is stored in the plan cache
(keyed like a plan, with the precision "auto"), so a later run of the same
script skips the trial.
"""

import dataclasses
import math
import statistics
import time

import tensorflow as tf

from tapeworks.data import pipeline_check
from tapeworks.engine.step import guards

SPEED_MARGIN = 1.10
LOSS_TOLERANCE = 0.02
STEPS_PER_CALL = 3         # at least; more where a step is short (`_steps_per_call`)
MIN_CALL_SECONDS = 0.05
MAX_STEPS_PER_CALL = 64
CALLS = 3
ROUNDS = 2
# The trial trains at least 2 x ROUNDS x (1 + CALLS x STEPS_PER_CALL) = 40 steps,
# and traces one more loop. It runs once the trainer's steps, with this fit's,
# reach twice that (a fit-per-epoch loop measures at its n-th fit): the choice is
# stored, so a script's later runs pay nothing, and a model whose step bfloat16
# halves repays it within the fit.
TRIAL_STEPS = 2 * ROUNDS * (1 + CALLS * STEPS_PER_CALL)
MIN_FIT_STEPS = 2 * TRIAL_STEPS


@dataclasses.dataclass
class PrecisionChoice:
    """What precision "auto" kept, and the measurements behind it (empty when none ran)."""

    policy: str
    reason: str
    seconds_per_step: dict = dataclasses.field(default_factory=dict)   # policy -> median
    losses: dict = dataclasses.field(default_factory=dict)   # policy -> mean loss per call

    def report(self):
        """A JSON-ready dict, for `trainer.tuning["precision"]` and the plan cache."""
        return {"policy": self.policy, "reason": self.reason,
                "seconds_per_step": dict(self.seconds_per_step),
                "losses": {k: list(v) for k, v in self.losses.items()}}

    @classmethod
    def from_report(cls, report, candidates):
        """The choice a plan-cache record holds, or None where it is not a valid one."""
        if not isinstance(report, dict) or report.get("policy") not in candidates \
                or not isinstance(report.get("reason"), str):
            return None
        seconds = report.get("seconds_per_step") or {}
        losses = report.get("losses") or {}
        if not isinstance(seconds, dict) or not isinstance(losses, dict) or not all(
                isinstance(v, (int, float)) for v in seconds.values()) or not all(
                isinstance(v, list) and all(isinstance(x, (int, float)) for x in v)
                for v in losses.values()):
            return None
        return cls(report["policy"], f"from the plan cache ({report['reason']})",
                   dict(seconds), dict(losses))


def unmeasured(reason):
    return PrecisionChoice("float32", reason)


def decide(seconds, losses, candidates=("float32", "mixed_bfloat16")):
    """The choice from measured seconds per step and per-call losses (pure: tested on figures)."""
    base, low = candidates
    gap = max((abs(b - f) / max(abs(f), 1e-6) for f, b in zip(losses[base], losses[low])),
              default=float("inf"))
    speedup = seconds[base] / max(seconds[low], 1e-12)
    figures = (f"{low} {speedup:.2f}x float32's speed, its losses within {gap:.1%} of "
               f"float32's over {len(losses[base])} calls")
    if any(not _finite(v) for v in losses[low]) or len(losses[low]) < len(losses[base]):
        return PrecisionChoice(base, f"{low}'s loss was not finite in the trial",
                               seconds, losses)
    if gap > LOSS_TOLERANCE:
        return PrecisionChoice(base, f"measured: {figures}; more than the "
                               f"{LOSS_TOLERANCE:.0%} tolerance", seconds, losses)
    if speedup < SPEED_MARGIN:
        return PrecisionChoice(base, f"measured: {figures}; under the {SPEED_MARGIN:.2f}x "
                               "margin that pays for it", seconds, losses)
    return PrecisionChoice(low, f"measured: {figures}", seconds, losses)


def _finite(value):
    return value == value and abs(value) != float("inf")


def trial_batches(prepared, count):
    """`count` batches like the training's, drawn without changing the training; or None."""
    if prepared.rebuild is not None:
        return prepared.rebuild().take(count)
    if not isinstance(prepared.dataset, tf.data.Dataset):
        return None
    # An in-memory pipeline that shuffles: its arrays, read from its graph.
    try:
        graph = pipeline_check.dataset_graph(prepared.dataset)
        flat = pipeline_check.source_arrays(graph)
    except (ValueError, TypeError, tf.errors.OpError):
        return None
    batch = pipeline_check.batch_size(graph) if flat else None
    spec = prepared.dataset.element_spec
    if not batch or any(a is None or len(a) < count * batch for a in flat) or \
            len(tf.nest.flatten(spec)) != len(flat):
        return None
    elements = tf.nest.pack_sequence_as(spec, [a[:count * batch] for a in flat])
    return tf.data.Dataset.from_tensor_slices(elements).batch(batch)


def _steps_per_call(trial, batches, precision, mode):
    """Steps per timed call: `STEPS_PER_CALL`, or more where a step is short.

    Each call should last about `MIN_CALL_SECONDS`: calls of a few short steps
    time the host's cost of a call and the clock's noise, not the precision
    (the digits CNN's 3-step calls measured bfloat16 at 1.20x float32's speed
    where whole fits ran it at 0.88x). Probed once, in float32 (its loop is
    traced here, and reused by the rounds).
    """
    precision.switch(precision.candidates[0])
    loop = trial.loop(mode)
    iterator = trial.iterate(batches)
    int(loop(iterator, tf.constant(1, tf.int64))[0])   # traced, warm
    start = time.perf_counter()
    int(loop(iterator, tf.constant(STEPS_PER_CALL, tf.int64))[0])
    per_step = (time.perf_counter() - start) / STEPS_PER_CALL
    trial.restore()
    return int(min(MAX_STEPS_PER_CALL, max(STEPS_PER_CALL,
                                           math.ceil(MIN_CALL_SECONDS / max(per_step, 1e-9)))))


def why_not_measured(prepared, fit_steps, run_eagerly, steps_before=0):
    """Why the trial cannot run for this fit, or None where it can.

    `fit_steps`: the steps this fit trains (None: unknown); `steps_before`:
    the steps the trainer trained in earlier fits.
    """
    if run_eagerly:
        return "run_eagerly=True: nothing compiled to measure"
    if prepared.rebuild is None and trial_batches(prepared, 1) is None:
        return (f"the training data ({prepared.kind}) cannot be drawn again without "
                "changing the training order (a generator, or a pipeline that reads files, "
                "maps or shuffles outside memory)")
    if fit_steps is not None and fit_steps + steps_before < MIN_FIT_STEPS:
        return (f"{fit_steps + steps_before} steps so far are too few to repay measuring "
                f"(at least {MIN_FIT_STEPS}, this fit's and the earlier ones')")
    return None


def measure(trial, prepared, precision, mode=False):
    """Times `precision.candidates` on `prepared`'s first batches; returns the `PrecisionChoice`.

    `trial`: a `measuring.TrialRun` (every variable is put back after each
    run); `precision`: the trainer's `precision.Measured` plugin, switched
    between the candidates and left on float32 (the caller decides).
    """
    needed = 1 + CALLS * STEPS_PER_CALL
    batches = trial_batches(prepared, needed)
    if batches is None:
        return unmeasured("too few batches in memory for a trial")
    batches = batches.cache()
    count = sum(1 for _ in batches)   # fills the cache
    if count < needed:
        return unmeasured(f"the training data has {count} batches, fewer than the "
                          f"{needed} a trial needs")
    batches = batches.repeat()   # calls longer than the batches held: the same ones again
    trial.use(batches)
    seconds = {p: [] for p in precision.candidates}
    losses = {}
    with guards.inside_step():
        steps_per_call = _steps_per_call(trial, batches, precision, mode)
        for _ in range(ROUNDS):
            for policy in precision.candidates:
                precision.switch(policy)
                loop = trial.loop(mode)
                trial.restore()
                trial.state.reset_metrics()
                iterator = trial.iterate(batches)
                int(loop(iterator, tf.constant(1, tf.int64))[0])   # traced, warm
                trial.state.reset_metrics()
                call_losses, elapsed, ran = [], 0.0, 0
                for _ in range(CALLS):
                    start = time.perf_counter()
                    steps, _, logs, *_ = loop(iterator, tf.constant(steps_per_call, tf.int64))
                    steps = int(steps)
                    elapsed += time.perf_counter() - start
                    ran += steps
                    if steps < steps_per_call or "loss" not in logs:
                        break
                    call_losses.append(float(logs["loss"]))
                    trial.state.reset_metrics()
                seconds[policy].append(elapsed / max(ran, 1))
                losses[policy] = call_losses   # the same every round: the last kept
        trial.restore()
    precision.switch(precision.candidates[0])
    if not losses[precision.candidates[0]]:
        return unmeasured("the step's logs have no loss to compare")
    return decide({p: statistics.median(v) for p, v in seconds.items()}, losses,
                  precision.candidates)
