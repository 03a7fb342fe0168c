"""Where a training step's time goes, and what would help on this machine: `Trainer.explain`.

`trainer.explain(data, steps=20)` runs a short measured training on the
trainer's own compiled loop and restores every variable afterwards (weights,
optimizer, counters, accumulators): nothing is trained. It measures, in the
mode the trainer uses (or would start in), each on the same batches:

- the input pipeline alone (batches per second);
- the step fed from batches held in memory, at one step per call and at many:
  from the two, the step's own compute and the host's cost per call (the
  time per step is `compute + per_call / steps_per_call`);
- the step fed by the pipeline, as `fit` runs it: what it adds over the
  in-memory step is time spent waiting for input;
- the first call of each mode it runs: tracing and compilation.

Then it measures the changes that apply (more steps per call, each XLA
mode, `prefetch`, `cache`) and ranks them by their effect on the time per
training step, estimated from the measured parts (`step + wait`: a faster
step keeps the measured wait; a faster pipeline shortens the wait by what it
gains). Changes it cannot measure without another model (bfloat16) are
listed with what decides them and no number.

The command line (`python -m tapeworks.explain`, `tapeworks explain`) is
`tapeworks/explain.py`, above the Trainer; this module sits below it and
talks only to a `measuring.TrialRun`.
"""

import dataclasses
import os
import statistics
import time

import tensorflow as tf

from tapeworks.data import diagnose as diagnose_lib
from tapeworks.data import pipeline_check
from tapeworks.engine import config as config_lib
from tapeworks.engine.plan import autotune
from tapeworks.engine.step import guards
from tapeworks.engine.checks import loss_graph, retracing
from tapeworks.engine.step import precision as precision_lib
from tapeworks.errors import ConfigError

# Changes whose estimated effect is smaller than this are "tried, no gain".
WORTHWHILE = 1.05


@dataclasses.dataclass
class Change:
    """One thing to change, with its effect on training time per step."""

    what: str                # e.g. "steps_per_call=32"
    how: str                 # the code to write
    speedup: float = None    # estimated x on training time per step; None: not measured
    note: str = ""           # what was measured, and what it costs

    def line(self):
        effect = f"{self.speedup:.2f}x" if self.speedup is not None else "not measured"
        how = f" ({self.how})" if self.how else ""
        return f"{self.what}: {effect}. {self.note}{how}".strip()


@dataclasses.dataclass
class Explanation:
    batch_size: int
    steps: int
    mode: object               # False, True or "update"
    steps_per_call: int
    precision: str
    seconds_per_step: float    # training from the pipeline, as fit runs it
    input_wait: float          # seconds per step spent waiting for input
    compute: float             # seconds per step of the step itself
    host: float                # seconds per step between calls (per call / steps per call)
    per_call: float            # the host's cost of one call
    pipeline_seconds_per_batch: float
    compile_seconds: dict      # mode -> seconds of its first call (tracing, compiling)
    retraces: list             # "name: what changed" of functions that traced again
    verdict: str               # "input-bound", "host overhead" or "compute-bound"
    changes: list              # [Change], helpful first
    tried: list                # [Change] measured without a gain
    findings: list             # the input pipeline checker's findings, as text
    profile_dir: str = None
    # What changes what is learned (the CorrectnessWarnings fit gives), as text: found in
    # the task's losses' graph, in the Python numbers its step was traced with, and in the
    # data's values (a majority class behind accuracy, validation inputs on another scale:
    # `DataStage.value_findings`).
    correctness: list = dataclasses.field(default_factory=list)
    # Why this precision: "asked for", or what precision="auto" measured
    # (`plan/precision_trial.py`: each precision's seconds per step and losses).
    precision_reason: str = None

    def to_dict(self):
        out = dataclasses.asdict(self)
        out["mode"] = _describe(self.mode)
        out["compile_seconds"] = {_describe(m): s for m, s in self.compile_seconds.items()}
        return out

    def __str__(self):
        total = self.seconds_per_step
        rows = [("waiting for input", self.input_wait), ("the step's compute", self.compute),
                ("host, between calls", self.host)]
        lines = [f"tapeworks explain: {self.steps} steps of batch {self.batch_size}, "
                 f"{_describe(self.mode)}, {self.steps_per_call} step(s) per call, "
                 f"precision {self.precision}"
                 + (f" ({self.precision_reason})" if self.precision_reason
                    and self.precision_reason != "asked for" else ""),
                 f"Verdict: {self.verdict.upper()}. Where a training step's "
                 f"{_ms(total)} goes:"]
        for name, seconds in rows:
            lines.append(f"  {name:<22}{_ms(seconds):>10}  {100 * seconds / total:5.1f}%")
        lines.append(f"  (the pipeline alone makes a batch in {_ms(self.pipeline_seconds_per_batch)};"
                     f" one call costs the host {_ms(self.per_call)})")
        compiled = ", ".join(f"{_describe(m)} {s:.2f} s" for m, s in
                             self.compile_seconds.items() if s is not None)
        compiled = compiled or "none (already compiled)"
        lines.append(f"Tracing and compiling (first call, once per mode): {compiled}")
        lines.append("Retraces: " + ("; ".join(self.retraces) if self.retraces else "none"))
        if self.changes:
            lines.append("Changes that would help, best first (x: estimated time per training "
                         "step, from the measured parts):")
            lines += [f"  {i}. {c.line()}" for i, c in enumerate(self.changes, 1)]
        else:
            lines.append("No measured change helps by 5% or more: this is about as fast as "
                         "this model trains here.")
        if self.tried:
            lines.append("Tried, no gain: " + "; ".join(c.line() for c in self.tried))
        if self.findings:
            lines.append("Input pipeline findings: " + "; ".join(self.findings))
        if self.correctness:
            lines.append("Found while fitting (what is learned, not speed):")
            lines += [f"  - {text.removeprefix('tapeworks: ')}" for text in self.correctness]
        if self.profile_dir:
            lines.append(f"Profiler trace: {self.profile_dir} (open with TensorBoard's "
                         "Profile tab: `tensorboard --logdir` on that folder)")
        return "\n".join(lines)


def explain(trial, data, steps=20, batch_size=None, profile_dir=None, try_xla=True):
    """Measures a trainer on `data` through its `measuring.TrialRun`; returns an `Explanation`.

    Trains nothing: the trial run restores every variable on exit.
    """

    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 2:
        raise ConfigError(f"`steps` must be an integer >= 2. Received: steps={steps!r}. "
                          "Fix: e.g. steps=20 (more steps, steadier figures).")
    if trial.run_eagerly:
        raise ConfigError("explain measures the compiled step; this trainer runs eagerly "
                          "(run_eagerly=True). Fix: explain a trainer without run_eagerly.")
    prepared = trial.prepare(data, batch_size=batch_size)
    dataset = prepared.dataset
    mode = trial.mode
    per_call = trial.steps_per_call
    many = max(steps, per_call)
    in_memory = dataset.take(steps).cache()
    for _ in in_memory:   # fill the cache
        pass
    first = tf.nest.flatten(next(iter(in_memory)))[0]
    batch = int(tf.shape(first)[0])
    compile_seconds = {}

    def loop_for(jit):
        return trial.loop(jit)

    def first_call(jit, iterator):
        """The mode's first call of one step: its tracing and compiling, when new."""
        traced = trial.traces
        start = time.perf_counter()
        int(loop_for(jit)(iterator, tf.constant(1, tf.int64))[0])
        seconds = time.perf_counter() - start
        compile_seconds[jit] = seconds if trial.traces > traced else None

    def per_step(jit, iterator, steps_per_call, calls):
        return alternating(jit, [(iterator, steps_per_call)], calls)[0]

    def alternating(jit, runs, calls):
        """Seconds per step of each (iterator, steps per call): calls alternated, medians.

        Alternating keeps a drift of the machine's speed (another process,
        the clock) out of the difference between them.
        """
        loop, times = loop_for(jit), [[] for _ in runs]
        for _ in range(calls):
            for (iterator, steps_per_call), kept in zip(runs, times):
                start = time.perf_counter()
                ran = int(loop(iterator, tf.constant(steps_per_call, tf.int64))[0])
                kept.append((time.perf_counter() - start) / max(ran, 1))
        return [statistics.median(kept) for kept in times]

    memory = iter(in_memory.repeat())
    piped = iter(dataset.repeat())
    with retracing.RetraceWatch() as watch:
        with guards.inside_step():
            pipeline = 1.0 / diagnose_lib.pipeline_rate(dataset.repeat(), steps)
            first_call(mode, memory)
            per_step(mode, memory, many, 1)   # warm: caches, allocator, thread pools
            # One step per call and many, alternated: per step, t(k) = compute + call / k.
            bulk, one = alternating(mode, [(memory, many), (memory, 1)], 5)
            # The step from memory and fed by the pipeline, alternated:
            # their difference is the input wait.
            current, fed = alternating(mode, [(memory, per_call), (piped, per_call)],
                                       max(3, steps // per_call))
            compute, host, call_cost = split_step(bulk, one, many, current, per_call)
            wait = max(fed - current, 0.0)
            total = compute + host + wait
            changes, failed = [], []
            if per_call < many:
                changes.append(Change(
                    f"steps_per_call={many}", f"Trainer(..., steps_per_call={many}) or "
                    "\"auto\"", total / (bulk + wait),
                    f"measured: {_ms(bulk)} a step at {many} per call, "
                    f"{_ms(current)} at {per_call}"))
            best_step = min(current, bulk)
            best_calls = many if bulk < current else per_call
            if try_xla and config_lib.supports_xla(trial.models):
                for jit in (True, "update"):
                    if jit == mode:
                        continue
                    try:
                        first_call(jit, memory)
                    except (tf.errors.InvalidArgumentError,
                            tf.errors.UnimplementedError) as error:
                        reason = config_lib.describe_xla_failure(error)
                        failed.append(Change(f"jit_compile={jit!r}", "", None,
                                             f"XLA cannot compile this step: {reason}"))
                        continue
                    seconds = per_step(jit, memory, best_calls, 3)
                    changes.append(Change(
                        f"jit_compile={jit!r}" + (f", steps_per_call={best_calls}"
                                                  if best_calls != per_call else ""),
                        f"Trainer(..., jit_compile={jit!r})", total / (seconds + wait),
                        f"measured: {_ms(seconds)} a step against {_ms(best_step)}; "
                        f"compiling took {compile_seconds[jit]:.1f} s once"))
            if wait > 0.05 * total:
                for what, how, source in (
                        ("prefetch", "dataset = dataset.prefetch(tf.data.AUTOTUNE)",
                         dataset.prefetch(tf.data.AUTOTUNE)),
                        ("cache", "dataset.cache() after decoding, before random "
                         "augmentation and batching (if it fits in memory)", in_memory)):
                    faster = 1.0 / diagnose_lib.pipeline_rate(source.repeat(), steps)
                    new_wait = max(wait - max(pipeline - faster, 0.0), 0.0)
                    changes.append(Change(
                        what, how, total / (current + new_wait),
                        f"measured: the pipeline makes a batch in {_ms(faster)} "
                        f"against {_ms(pipeline)}"))
            if trial.precision_policy == "float32" and not trial.precision_measured:
                changes.append(_precision_change())
            profile = _profile(profile_dir, loop_for(mode), piped, per_call) \
                if profile_dir else None
    helpful = sorted((c for c in changes if c.speedup is None or c.speedup >= WORTHWHILE),
                     key=lambda c: -(c.speedup or 1.0))
    tried = [c for c in changes if c not in helpful] + failed
    # The user's tf.functions that traced again, in the last fit and here.
    retraces = [f"{r.function} ({r.where}), {r.traces} traces: "
                + "; ".join(f"`{arg}` changed" for arg, _, _ in r.changes)
                for r in trial.retraces + watch.reported]
    # The checker reads pipelines the user wrote; arrays get tapeworks' own.
    findings = ([f"{f.code}: {f.fix}" for f in pipeline_check.check(dataset, training=True)]
                if isinstance(data, tf.data.Dataset) else [])
    state = trial.state
    correctness = (loss_graph.findings(state.task, state.element_spec, state.counters)
                   + [message for _, message in trial.compiled.traced_numbers.messages()]
                   + list(trial.data_stage.value_findings.values()))
    return Explanation(
        batch_size=batch, steps=steps, mode=mode, steps_per_call=per_call,
        precision=trial.precision_policy, seconds_per_step=total, input_wait=wait,
        compute=compute, host=host, per_call=call_cost, pipeline_seconds_per_batch=pipeline,
        compile_seconds=compile_seconds, retraces=retraces,
        verdict=verdict_of(wait, host, compute), changes=helpful, tried=tried,
        findings=findings, profile_dir=profile, correctness=correctness,
        precision_reason=trial.precision_reason)


def verdict_of(input_wait, host, compute):
    """The name of a step's largest part: "input-bound", "host overhead" or "compute-bound"."""
    shares = {"input-bound": input_wait, "host overhead": host, "compute-bound": compute}
    return max(shares, key=shares.get)


def split_step(bulk, one, many, current, per_call):
    """(compute, host) seconds of a step measured at `current`, and the host's cost of a call.

    From the per-step times at `many` steps per call (`bulk`) and at one
    (`one`), with t(k) = compute + call / k. `current`, the step at the
    trainer's own `per_call`, is split as that model splits it, so that noise
    between its rounds and those of `bulk` and `one` (a shared machine) scales
    both parts rather than landing in the compute alone.
    """
    compute = max((many * bulk - one) / (many - 1), 1e-9) if many > 1 else bulk
    call_cost = max(one - compute, 0.0)
    host = current * (call_cost / per_call) / (compute + call_cost / per_call)
    return current - host, host, call_cost


def _precision_change():
    policy, reason = precision_lib.auto_choice()
    if policy == "float32":
        return Change("precision=\"mixed_bfloat16\"", "Trainer(..., precision=\"auto\")", None,
                      f"not worth trying here: {reason}")
    return Change(f"precision=\"{policy}\"", "Trainer(..., precision=\"auto\")", None,
                  f"this machine computes it natively ({reason}); \"auto\" measures float32 "
                  "against it at the first long fit and keeps the faster where the losses "
                  "agree")


def _profile(directory, loop, iterator, per_call):
    """A TensorBoard profiler trace of three calls."""
    os.makedirs(directory, exist_ok=True)
    tf.profiler.experimental.start(directory)
    try:
        for _ in range(3):
            int(loop(iterator, tf.constant(per_call, tf.int64))[0])
    finally:
        tf.profiler.experimental.stop()
    return directory


def _describe(mode):
    return autotune.describe(mode)


def _ms(seconds):
    return f"{1000 * seconds:.3f} ms" if seconds < 1 else f"{seconds:.2f} s"
