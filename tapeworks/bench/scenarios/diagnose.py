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
  defaults with the step split around them (`_xla_step_rows`).

Each timed repeat is a fit of whole epochs lasting about a second, and each
overhead is given twice: as a ratio of the two medians, and round by round
(each repeat against its baseline's in the same round) with its quartiles,
which show how noisy the machine was.

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
from tapeworks.bench.scenarios.loops import QUICK_SIZES, SIZES, _data, _loss, build_mlp
from tapeworks.bench.timing import Approach, alternate, paired_overhead, settle_trainer
from tapeworks.engine import Trainer

DESCRIPTION = ("overhead of the per-step checks (on_nonfinite=\"raise\", dead gradients) and "
               "of monitor_every=100, bench MLPs")
MONITOR_EVERY = 100
REPEAT_SECONDS = 1.0     # the least length of one timed repeat (whole epochs)
UNCHECKED = "no checks"
CHECKED = "defaults (raise + dead gradients)"
RAISED = "on_nonfinite=\"raise\" alone"
DEAD = "the dead-gradient sums alone"
MONITORED = "defaults + monitor_every=100"
STEPWISE = "defaults, a guard on every step (data that cannot replay)"
WARNED = "on_nonfinite=\"warn\" alone (every step checked, nothing withheld)"
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
    rows, repeat_epochs = [], {}
    repeat_seconds = 0.1 if quick else REPEAT_SECONDS
    # Quick (the tests' smoke run): the small MLP alone, ten trainers.
    for size in (QUICK_SIZES[:1] if quick else SIZES):
        if "checks" not in groups and size.name not in _xla_models():
            continue
        x, y = _data(size, size.steps)
        dataset = in_memory_dataset((x, y), size.batch)
        # The mode "auto" settles on without the check, then fixed for both.
        probe = Trainer(build_mlp(size.widths), keras.optimizers.Adam(1e-3), _loss(),
                        plan_cache=False, **CHECKS["none"])
        # A shorter settling fit for the quick (test) run.
        settle_seconds = 1.0 if quick else 20.0
        settle_trainer(probe, dataset, long_fit_seconds=settle_seconds)
        # A repeat of about REPEAT_SECONDS: one epoch of the small MLP lasts
        # under 0.1 s, where a shared machine's hiccups are a 2% target's size.
        start = time.perf_counter()
        probe.fit(dataset, verbose=0)
        epochs = max(1, math.ceil(repeat_seconds / (time.perf_counter() - start)))
        samples = size.steps * size.batch * epochs
        repeat_epochs[size.name] = epochs
        # tf.function steps: the mode where the checks cost most (auto's
        # choice between tf.function and the XLA update flips on this
        # machine for the small MLP; the [auto] rows show what a user gets).
        mode = dict(jit_compile=False, steps_per_call=probe.steps_per_call)

        def trained(checks, name, fixed):
            fixed_mode = dict(mode) if fixed else {}
            trainer = Trainer(build_mlp(size.widths), keras.optimizers.Adam(1e-3), _loss(),
                              plan_cache=False, **CHECKS[checks], **fixed_mode)
            if checks == "stepwise":
                # As for a pipeline that cannot replay its batches.
                trainer._fast_guard_off = "a guard on every step (bench)"
            return Approach(name, lambda: (trainer.fit(dataset, epochs=epochs, verbose=0),
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
                rows.extend(_xla_step_rows(size, dataset, epochs, samples, repeats,
                                           settle_seconds, probe.steps_per_call))
            continue
        results = alternate([trained("none", names["base"], False),
                             trained("defaults", names["checked"], False),
                             *(trained(checks, name, True) for checks, name in fixed_rows.items())],
                            repeats)
        # The monitor against the defaults it adds to; every other check against none.
        baseline = {name: names["base_fixed"] for name in fixed_rows.values()}
        baseline.update({names["base"]: names["base"], names["checked"]: names["base"],
                         fixed_rows["monitored"]: names["checked_fixed"]})
        for name, result in results.items():
            base = results[baseline[name]]["samples_per_s"]
            median, q1, q3 = paired_overhead(result["runs"], results[baseline[name]]["runs"])
            rows.append({"model": size.name, "approach": name,
                         "samples_per_s": result["samples_per_s"],
                         "baseline": baseline[name],
                         "vs_baseline": result["samples_per_s"] / base,
                         "overhead_percent": 100 * (base / result["samples_per_s"] - 1),
                         "paired_median": median, "paired_q1": q1, "paired_q3": q3,
                         "paired": ("" if name == baseline[name]
                                    else f"{median:.1f} [{q1:.1f}, {q3:.1f}]"),
                         "repeats": result["runs"], "notes": result["notes"],
                         "group": size.name})
        if not quick and "xla" in groups and size.name in _xla_models():
            rows.extend(_xla_step_rows(size, dataset, epochs, samples, repeats, settle_seconds,
                                       probe.steps_per_call))
    return {
        "columns": [("model", "model"), ("approach", "approach"),
                    ("samples_per_s", "samples/s"), ("baseline", "compared with"),
                    ("vs_baseline", "x baseline"), ("overhead_percent", "overhead %"),
                    ("paired", "overhead %, round by round: median [quartiles]")],
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
                  "repeats": "each timed repeat is one fit of whole epochs lasting about "
                             f"{repeat_seconds:g} s or more: " + ", ".join(
                                 f"{name}: {n} epoch(s)" for name, n in repeat_epochs.items()),
                  "overhead": "'overhead %' compares the two medians; the round-by-round "
                              "column pairs each repeat with its baseline's in the same round "
                              "(close in time) and gives the median and quartiles of those "
                              "pairs: how far one round can be trusted on this shared machine",
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


def _xla_models():
    """The models whose whole-XLA step is also timed: DIAGNOSE_XLA_MODELS, or those
    whose gradients reach the split's threshold (the large MLP)."""
    from tapeworks.engine import step

    if os.environ.get("DIAGNOSE_XLA_MODELS") is not None:
        return [m for m in os.environ["DIAGNOSE_XLA_MODELS"].split(",") if m]
    return [size.name for size in SIZES
            if sum(4 * (a * b + b) for a, b in zip(size.widths, size.widths[1:]))
            >= step.SPLIT_MIN_GRADIENT_BYTES]


def _xla_step_rows(size, dataset, epochs, samples, repeats, settle_seconds, steps_per_call):
    """The checks in an XLA step on a CPU: inside it, and split around them.

    With gradients of 16 MiB or more and a check that reads them, an XLA step
    on a CPU runs as three parts (`Trainer._splits_xla_step`): forward and
    backward in XLA, the checks' norms in TensorFlow, the XLA-fused update.
    These rows time it against the whole step with the checks inside XLA
    (the split's threshold raised past this model), each against no checks.
    """
    names = {kind: name.format(n=steps_per_call) for kind, name in
             (("none", XLA_NONE), ("whole", XLA_WHOLE), ("split", XLA_SPLIT))}

    def trained(kind):
        trainer = Trainer(build_mlp(size.widths), keras.optimizers.Adam(1e-3), _loss(),
                          plan_cache=False, jit_compile=True, steps_per_call=steps_per_call,
                          **CHECKS["none" if kind == "none" else "defaults"])
        if kind == "whole":
            trainer._split_min_bytes = float("inf")
        return Approach(names[kind], lambda: (trainer.fit(dataset, epochs=epochs, verbose=0),
                                              samples)[1],
                        setup=lambda: settle_trainer(trainer, dataset,
                                                     long_fit_seconds=settle_seconds))

    results = alternate([trained(kind) for kind in names], repeats)
    base = results[names["none"]]
    rows = []
    for name, result in results.items():
        median, q1, q3 = paired_overhead(result["runs"], base["runs"])
        rows.append({"model": size.name, "approach": name,
                     "samples_per_s": result["samples_per_s"], "baseline": names["none"],
                     "vs_baseline": result["samples_per_s"] / base["samples_per_s"],
                     "overhead_percent": 100 * (base["samples_per_s"]
                                                / result["samples_per_s"] - 1),
                     "paired_median": median, "paired_q1": q1, "paired_q3": q3,
                     "paired": ("" if name == names["none"]
                                else f"{median:.1f} [{q1:.1f}, {q3:.1f}]"),
                     "repeats": result["runs"], "notes": result["notes"],
                     "group": size.name + " (XLA)"})
    return rows
