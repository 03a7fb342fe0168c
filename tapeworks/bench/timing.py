"""Alternating, repeated timing: the one way tapeworks measures throughput.

All approaches of a scenario run in the same process on the same data. Each
is warmed up first (tracing, compiling, auto-tuning), then the timed repeats
go round-robin, the order rotating every round, so that a noisy neighbour
or a thermal drift hits every approach alike. Medians, not means.
"""

import dataclasses
import math
import statistics
import time


@dataclasses.dataclass
class Approach:
    """One way of doing the same work.

    `run()` does one repeat's worth of work and returns the number of samples
    it processed. `setup()`, if given, runs once before the warm-up and may
    return notes (a dict) to keep with the results.
    """

    name: str
    run: callable
    setup: callable = None
    warmups: int = 1


def alternate(approaches, repeats):
    """Returns {name: {"samples_per_s": median, "runs": [...], "notes": {...}, ...}}.

    Also "cpu_seconds_per_sample": the median of the process CPU time (all
    threads) per sample, the cost a bound of shared cores is made of.
    """
    results = {}
    for approach in approaches:
        notes = approach.setup() if approach.setup else None
        for _ in range(approach.warmups):
            approach.run()
        results[approach.name] = {"runs": [], "cpu": [], "notes": notes or {}}
    for round_index in range(repeats):
        shift = round_index % len(approaches)
        for approach in approaches[shift:] + approaches[:shift]:
            start, cpu_start = time.perf_counter(), time.process_time()
            samples = approach.run()
            seconds = time.perf_counter() - start
            results[approach.name]["runs"].append(samples / seconds)
            results[approach.name]["cpu"].append((time.process_time() - cpu_start) / samples)
    for result in results.values():
        result["samples_per_s"] = statistics.median(result["runs"])
        result["cpu_seconds_per_sample"] = statistics.median(result.pop("cpu"))
    return results


def quartiles(values):
    """(median, first quartile, third quartile) of `values` (all three equal for one value)."""
    values = list(values)
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return median, q1, q3


def median_interval(values, confidence=0.95):
    """(median, low, high): the median of `values` and a confidence interval for it.

    The interval is distribution-free (order statistics: scipy's
    `quantile_test`), so one slow round of a shared machine widens it only as
    far as its rank allows, where a mean's interval would follow the outlier.
    With too few values for `confidence` its ends are -inf and +inf.
    """
    from scipy.stats import quantile_test

    values = sorted(float(v) for v in values)
    median = statistics.median(values)
    if len(values) < 2:
        return median, -math.inf, math.inf
    interval = quantile_test(values, q=median, p=0.5).confidence_interval(confidence)
    low, high = float(interval.low), float(interval.high)
    return (median, -math.inf if math.isnan(low) else low,
            math.inf if math.isnan(high) else high)


def paired_overhead_interval(runs, base_runs, confidence=0.95):
    """Percent overhead of `runs` over `base_runs`, paired round by round.

    Both are samples/s from the same `alternate` call, one per round; the
    two runs of a round ran close in time, so a slow stretch of a shared
    machine mostly hits both. Returns (median, low, high) of the rounds'
    overheads, with the median's confidence interval (`median_interval`):
    many short rounds give an interval narrow enough to tell a 2% cost from
    nothing on a machine whose single rounds disagree by 10 points.
    """
    return median_interval((100.0 * (base / run - 1.0) for run, base in zip(runs, base_runs)),
                           confidence)


def against_target(low, high, target):
    """"met" when the whole interval is at or under `target`, "missed" when above, else
    "inconclusive" (the interval straddles it: more rounds, or a quieter machine)."""
    if high <= target:
        return "met"
    if low > target:
        return "missed"
    return "inconclusive"


def median_seconds(fn, repeats, warmups=1):
    """Median wall time of `fn()` over `repeats` calls after `warmups` calls."""
    for _ in range(warmups):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# Settling in a quick run (the tests' smoke runs): a long fit of a second, at
# most 5 epochs ("auto" may then still be waiting to try XLA; the figures of a
# quick run are not kept).
QUICK_SETTLING = {"long_fit_seconds": 1.0, "max_epochs": 5}


def settle_trainer(trainer, dataset, long_fit_seconds=20.0, max_epochs=60):
    """Warm-up of a tapeworks approach: fit until "auto" has chosen (it measures real calls).

    "Chosen" includes how a `tapeworks.data.pipeline` runs (`input_planner`).

    One epoch first, then one long fit of about `long_fit_seconds`: "auto"
    weighs what measuring can win against the work left in a fit, as in a
    user's long run. Then epoch-long fits until it has chosen and has no XLA
    mode left waiting to be tried (it reopens measuring as training
    accumulates). Returns notes for the report: the choice and the epochs.
    """
    start = time.perf_counter()
    trainer.fit(dataset, verbose=0)
    first = time.perf_counter() - start
    long_fit = int(max(1, min(max_epochs // 2, long_fit_seconds / max(first, 1e-3))))
    trainer.fit(dataset, epochs=long_fit, verbose=0)
    epochs = 1 + long_fit
    while (trainer.tuning["jit_compile"] is None or trainer.tuning["waiting_to_try"]
           or (trainer.tuning["input"] or {}).get("tuning")) and epochs < max_epochs:
        trainer.fit(dataset, verbose=0)
        epochs += 1
    notes = {"jit_compile": trainer.jit_compile, "steps_per_call": trainer.steps_per_call,
             "tuning_epochs": epochs,
             "expected_samples_per_s": trainer.tuning.get("expected_samples_per_s")}
    if trainer.tuning["input"]:
        notes["input"] = trainer.tuning["input"]["in_use"]
    return notes
