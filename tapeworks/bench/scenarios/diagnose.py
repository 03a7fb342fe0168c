"""Scenario `diagnose`: what the per-step checks and the gradient monitor cost.

The same MLP trained, alternating, on the `loops` small and large MLPs:

- with no checks (`on_nonfinite=None, dead_gradient_steps=None`);
- with the defaults (`on_nonfinite="raise"`, a bad step's update withheld
  and the loop stopped after it; and the dead-gradient count);
- with `on_nonfinite="raise"` alone (the non-finite check the 2% target is
  for), and with the dead-gradient sums alone;
- with the defaults plus `monitor_every=100` (target: at most 5% more);
- with the defaults and a guard on every step: the data here is in memory
  and replays, so "raise" checks whole calls and rolls back and replays a
  bad one (`engine.rollback`); this row is what data that cannot replay
  (a shuffled or file-reading pipeline) pays: a `tf.cond` around each update;
- with `on_nonfinite="warn"` (the check on every step, nothing withheld);
- for models whose gradients reach the split's 16 MiB (the large MLP), in
  fixed XLA steps: no checks, the defaults inside the whole XLA step, and the
  defaults with the step split around them (`_xla_step_rows`); and, as a
  bound, the checks' reductions alone on tensors of the gradients' shapes
  (TensorFlow's norm, and XLA's largest magnitude), timed in the same
  rounds: the least any check that reads every gradient in a pass of its own
  adds to a step, on this machine's memory bandwidth (each read is a call of
  its own: a call's ~0.1 ms is in it).

Each timed repeat is a short fit (about a quarter of a second: whole epochs,
or whole calls of a longer epoch), and there are many rounds of them: on a
shared machine single rounds disagree by 5-15 points, so a 2% target is
judged by the median of the round-by-round overheads (each repeat against its
baseline's in the same round, close in time) with a distribution-free 95%
confidence interval (`timing.paired_overhead_interval`), and the verdict says
"met" only when the whole interval is under the target, "missed" when it is
all above, "inconclusive" otherwise. The ratio of the two medians is given too.

Twice for the defaults: each trainer with "auto" (what a user gets: the
checks' cost is part of what "auto" measures, so it may pick another mode),
and all in tf.function steps at the steps per call "auto" picked without
them (the cost alone, in the mode where a check costs most: in an XLA step
or update the branch is XLA's, and "auto" picks that mode when it is faster,
as the [auto] rows show).
"""

import math
import os
import time

import keras

from tapeworks.bench.data import in_memory_dataset
from tapeworks.bench.scenarios.loops import QUICK_SIZES, SIZES, build_mlp, mlp_data, mlp_loss
from tapeworks.bench.timing import (
    Approach,
    against_target,
    alternate,
    median_interval,
    paired_overhead_interval,
    settle_trainer,
)
from tapeworks.engine import Trainer

DESCRIPTION = ("overhead of the per-step checks (on_nonfinite=\"raise\", dead gradients) and "
               "of monitor_every=100, bench MLPs")
MONITOR_EVERY = 100
# The least length of one timed repeat. Short, for many rounds in the same
# time: a shared machine's slow stretches last longer than a round, so close
# pairs share them, and the interval narrows with the number of rounds.
REPEAT_SECONDS = 0.25
UNCHECKED = "no checks"
CHECKED = "defaults (raise + dead gradients)"
RAISED = "on_nonfinite=\"raise\" alone"
DEAD = "the dead-gradient sums alone"
MONITORED = "defaults + monitor_every=100"
STEPWISE = "defaults, a guard on every step (data that cannot replay)"
WARNED = "on_nonfinite=\"warn\" alone (every step checked, nothing withheld)"
# The targets (percent of step time), by row kind.
TARGETS = {"raised": 2.0, "monitored": 5.0}
CHECKS = {"none": dict(on_nonfinite=None, dead_gradient_steps=None),
          "defaults": {},
          "raised": dict(dead_gradient_steps=None),
          "dead": dict(on_nonfinite=None),
          "monitored": dict(monitor_every=MONITOR_EVERY),
          "stepwise": {},
          "warned": dict(on_nonfinite="warn", dead_gradient_steps=None)}


def run(quick=False, repeats=5):
    # A part alone: DIAGNOSE_GROUPS="xla" (the XLA step rows) or "checks".
    groups = os.environ.get("DIAGNOSE_GROUPS", "checks,xla").split(",")
    rows, repeat_lengths = [], {}
    repeat_seconds = 0.1 if quick else REPEAT_SECONDS
    # Quick (the tests' smoke run): the small MLP alone, ten trainers.
    for size in (QUICK_SIZES[:1] if quick else SIZES):
        if "checks" not in groups and size.name not in _xla_models():
            continue
        x, y = mlp_data(size, size.steps)
        dataset = in_memory_dataset((x, y), size.batch)
        # The mode "auto" settles on without the check, then fixed for both.
        probe = Trainer(build_mlp(size.widths), keras.optimizers.Adam(1e-3), mlp_loss(),
                        plan_cache=False, **CHECKS["none"])
        # A shorter settling fit for the quick (test) run.
        settle_seconds = 1.0 if quick else 20.0
        settle_trainer(probe, dataset, long_fit_seconds=settle_seconds)
        # Its choice, not `probe.steps_per_call`: that is the mode in use,
        # which is a measuring call's while "auto" has measuring reopened
        # (one run read 1 there, where "auto" chose 200); fits until chosen.
        for _ in range(20):
            if probe.tuning["steps_per_call"] is not None:
                break
            probe.fit(dataset, verbose=0)
        steps_per_call = probe.tuning["steps_per_call"] or probe.steps_per_call
        # tf.function steps: the mode where the checks cost most (auto's
        # choice between tf.function and the XLA update flips on this
        # machine for the small MLP; the [auto] rows show what a user gets).
        mode = dict(jit_compile=False, steps_per_call=steps_per_call)
        # A repeat of about `repeat_seconds`: whole epochs, or whole calls of
        # an epoch that lasts longer (the large MLP's), timed in that mode.
        timer = Trainer(build_mlp(size.widths), keras.optimizers.Adam(1e-3), mlp_loss(),
                        plan_cache=False, **CHECKS["none"], **mode)
        timer.fit(dataset, verbose=0)
        start = time.perf_counter()
        timer.fit(dataset, verbose=0)
        epoch_seconds = time.perf_counter() - start
        if epoch_seconds > 2 * repeat_seconds:
            call_seconds = epoch_seconds * steps_per_call / size.steps
            steps = steps_per_call * max(1, math.ceil(repeat_seconds / call_seconds))
            fit_args = dict(epochs=1, steps_per_epoch=min(steps, size.steps))
            repeat_lengths[size.name] = f"{fit_args['steps_per_epoch']} steps"
            samples = fit_args["steps_per_epoch"] * size.batch
        else:
            fit_args = dict(epochs=max(1, math.ceil(repeat_seconds / epoch_seconds)))
            repeat_lengths[size.name] = f"{fit_args['epochs']} epoch(s)"
            samples = size.steps * size.batch * fit_args["epochs"]

        def trained(checks, name, fixed):
            fixed_mode = dict(mode) if fixed else {}
            trainer = Trainer(build_mlp(size.widths), keras.optimizers.Adam(1e-3), mlp_loss(),
                              plan_cache=False, **CHECKS[checks], **fixed_mode)
            if checks == "stepwise":
                # As for a pipeline that cannot replay its batches.
                trainer.rollback.disabled_reason = "a guard on every step (bench)"
            return Approach(name, lambda: (trainer.fit(dataset, verbose=0, **fit_args),
                                           samples)[1],
                            setup=lambda: settle_trainer(trainer, dataset,
                                                         long_fit_seconds=settle_seconds))

        fixed = f" [fixed {mode['jit_compile']}/{mode['steps_per_call']}]"
        # The fixed mode's approaches: CHECKS key -> row name.
        fixed_rows = {"none": UNCHECKED, "defaults": CHECKED, "raised": RAISED, "dead": DEAD,
                      "monitored": MONITORED, "stepwise": STEPWISE, "warned": WARNED}
        fixed_rows = {checks: name + fixed for checks, name in fixed_rows.items()}
        names = {"base": UNCHECKED + " [auto]", "checked": CHECKED + " [auto]",
                 "base_fixed": fixed_rows["none"], "checked_fixed": fixed_rows["defaults"]}
        if "checks" not in groups:
            if "xla" in groups and size.name in _xla_models():
                rows.extend(_xla_step_rows(size, dataset, fit_args, samples, repeats,
                                           settle_seconds, steps_per_call))
            continue
        results = alternate([trained("none", names["base"], False),
                             trained("defaults", names["checked"], False),
                             *(trained(checks, name, True) for checks, name in fixed_rows.items())],
                            repeats)
        # The monitor against the defaults it adds to; every other check against none.
        baseline = {name: names["base_fixed"] for name in fixed_rows.values()}
        baseline.update({names["base"]: names["base"], names["checked"]: names["base"],
                         fixed_rows["monitored"]: names["checked_fixed"]})
        kind_of = {name: checks for checks, name in fixed_rows.items()}
        for name, result in results.items():
            rows.append(_row(size.name, name, result, baseline[name], results[baseline[name]],
                             TARGETS.get(kind_of.get(name)), size.name))
        if not quick and "xla" in groups and size.name in _xla_models():
            rows.extend(_xla_step_rows(size, dataset, fit_args, samples, repeats, settle_seconds,
                                       steps_per_call))
    return {
        "columns": [("model", "model"), ("approach", "approach"),
                    ("samples_per_s", "samples/s"), ("baseline", "compared with"),
                    ("vs_baseline", "x baseline"), ("overhead_percent", "overhead %"),
                    ("paired", "overhead %, round by round: median [95% interval]"),
                    ("target", "target %"), ("verdict", "verdict")],
        "rows": rows,
        "facts": {"target": "the non-finite check (on_nonfinite=\"raise\") costs at most 2% "
                            "of step time; monitor_every=100 at most 5% more than the "
                            "defaults. The defaults also count dead gradients (their own "
                            "row), for which the issue sets no target",
                  "fast path": "the data here is in memory and replays, so the defaults "
                               "check whole calls in tf.function steps of a small state "
                               "(a copy of the state before each call, one check after it; "
                               "a bad call is rolled back and replayed with a guard on every "
                               "step); '" + STEPWISE + "' is the defaults with that path off, "
                               "what data that cannot replay pays (a tf.cond around each "
                               "update). XLA steps keep their guard inside XLA, and states "
                               "over 16 MiB (the large MLP) the per-step guard",
                  "groups": ", ".join(groups),
                  "repeats": "each timed repeat is one fit lasting about "
                             f"{repeat_seconds:g} s or more: " + ", ".join(
                                 f"{name}: {n}" for name, n in repeat_lengths.items()),
                  "overhead": "'overhead %' compares the two medians; the round-by-round "
                              "column pairs each repeat with its baseline's in the same round "
                              "(close in time) and gives the median of those pairs with a "
                              "distribution-free 95% confidence interval (order statistics); "
                              "the verdict is 'met' when the whole interval is at or under the "
                              "target, 'missed' when it is all above, else 'inconclusive'",
                  "modes": "[auto]: each trainer settles by itself (the checks' cost is part of "
                           "what auto measures); [fixed False/N]: all in tf.function steps "
                           "(where a check costs most) at the steps per call auto settled "
                           "on without the checks"},
        "chart": {"group": "group", "bar": "approach", "value": "vs_baseline",
                  "label": "throughput relative to its baseline"},
    }


XLA_NONE = "no checks [fixed XLA/{n}]"
XLA_WHOLE = "defaults [fixed XLA/{n}], checks inside the XLA step"
XLA_SPLIT = "defaults [fixed XLA/{n}], the step split around the checks"
BOUND = "bound: one read of the gradients alone ({how}), per step"


# Models with gradients from this size (the large MLP) also get the XLA rows:
# where the split once paid (`step.SPLIT_MIN_GRADIENT_BYTES`).
XLA_ROWS_MIN_GRADIENT_BYTES = 16 * 2 ** 20


def _xla_models():
    """The models whose XLA steps are also timed: DIAGNOSE_XLA_MODELS (names joined
    by ";"), or those with gradients of XLA_ROWS_MIN_GRADIENT_BYTES or more."""
    if os.environ.get("DIAGNOSE_XLA_MODELS") is not None:
        return [m for m in os.environ["DIAGNOSE_XLA_MODELS"].split(";") if m]
    return [size.name for size in SIZES
            if sum(4 * (a * b + b) for a, b in zip(size.widths, size.widths[1:]))
            >= XLA_ROWS_MIN_GRADIENT_BYTES]


def _row(model, name, result, baseline_name, baseline, target, group, share=False):
    """One table row: `result` against `baseline` (both from the same `alternate` call).

    `share`: a bound's row, whose "overhead" is its time per step as a percent
    of the baseline's step, round by round: what any check that reads every
    gradient in a pass of its own adds at least.
    """
    base = baseline["samples_per_s"]
    if share:
        median, low, high = median_interval(
            100.0 * b / r for r, b in zip(result["runs"], baseline["runs"]))
        overhead = 100 * base / result["samples_per_s"]
    else:
        median, low, high = paired_overhead_interval(result["runs"], baseline["runs"])
        overhead = 100 * (base / result["samples_per_s"] - 1)
    own = name == baseline_name
    return {"model": model, "approach": name, "samples_per_s": result["samples_per_s"],
            "baseline": baseline_name,
            "vs_baseline": None if share else result["samples_per_s"] / base,
            "overhead_percent": overhead,
            "paired_median": median, "paired_low": low, "paired_high": high,
            "paired": "" if own else f"{median:.1f} [{low:.1f}, {high:.1f}]",
            "target": "" if target is None else f"{target:g}",
            "verdict": "" if target is None or own else against_target(low, high, target),
            "repeats": result["runs"], "notes": result["notes"], "group": group}


def _xla_step_rows(size, dataset, fit_args, samples, repeats, settle_seconds, steps_per_call):
    """The checks in an XLA step on a CPU: inside it, and split around them.

    With gradients of 16 MiB or more and a check that reads them, an XLA step
    on a CPU runs as three parts (`CompiledSteps.splits_xla_step`): forward and
    backward in XLA, the checks' norms in TensorFlow, the XLA-fused update.
    These rows time it against the whole step with the checks inside XLA
    (the split's threshold raised past this model), each against no checks.
    """
    names = {kind: name.format(n=steps_per_call) for kind, name in
             (("none", XLA_NONE), ("whole", XLA_WHOLE), ("split", XLA_SPLIT))}
    bounds = {BOUND.format(how="TensorFlow's reduction, as the split step does"): False,
              BOUND.format(how="XLA's reduction, as the whole XLA step does"): True}

    def trained(kind):
        # Whatever the default: the whole step, or the step split.
        trainer = Trainer(build_mlp(size.widths), keras.optimizers.Adam(1e-3), mlp_loss(),
                          plan_cache=False, jit_compile=True, steps_per_call=steps_per_call,
                          split_xla_step_bytes=float("inf") if kind == "whole" else 0,
                          **CHECKS["none" if kind == "none" else "defaults"])
        return Approach(names[kind], lambda: (trainer.fit(dataset, verbose=0, **fit_args),
                                              samples)[1],
                        setup=lambda: settle_trainer(trainer, dataset,
                                                     long_fit_seconds=settle_seconds))

    steps = samples // size.batch
    results = alternate([trained(kind) for kind in names]
                        + [_gradient_read(name, size, steps, samples, xla)
                           for name, xla in bounds.items()], repeats)
    return [_row(size.name, name, result, names["none"], results[names["none"]], None,
                 size.name + " (XLA)", share=name in bounds)
            for name, result in results.items()]


def _gradient_read(name, size, steps, samples, xla):
    """The bound's approach: the checks' reductions alone, `steps` times, on tensors of
    the gradients' shapes (`sentinels.gradient_sentinels`, as the checks compute them)."""
    import tensorflow as tf

    from tapeworks.engine.step.sentinels import gradient_sentinels

    shapes = [s for a, b in zip(size.widths, size.widths[1:]) for s in ((a, b), (b,))]
    gradients = [tf.Variable(tf.random.normal(shape), trainable=False) for shape in shapes]

    @tf.function(jit_compile=xla, autograph=False)
    def norms_once():
        # A variable's value read in the function, as a step reads its gradients.
        return tf.reduce_all(tf.math.is_finite(tf.stack(gradient_sentinels(
            [tf.convert_to_tensor(g) for g in gradients], xla=xla))))

    def run():
        for _ in range(steps):
            ok = norms_once()
        bool(ok)
        return samples

    return Approach(name, run)
