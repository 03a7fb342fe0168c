"""The one re-check of a measured choice: it and its runner-up in alternating calls, later in the run.

Measuring lasts seconds, and other work on a shared machine during them can
make the runner-up look slower than it is (seen: a small MLP kept the
XLA-fused update at half tf.function's rate after a file scan ran beside its
tuning; benchmarks/diagnose-flat-snapshot/first-attempt.md). So once the
choice has trained as many steps as measuring took (and at least
`MIN_STEPS`), when the work ahead is at least `SHARE` times the re-check's
steps, the choice and the best measured mode of another kind run in
alternating calls, each at its own steps per call (both already compiled:
no trace, no start cost). The runner-up is taken if its median is more than
`MARGIN` faster per sample; either way there is no second re-check.
"""

import statistics

from tapeworks.engine.plan import call_timing
from tapeworks.engine.plan.plan_terms import RECHECK, Choice, PlannedCall, describe

MIN_STEPS = 256   # a choice trains at least this many steps before its re-check
SHARE = 20        # ... and the work ahead is at least this many times the re-check's steps
MARGIN = 0.1      # the runner-up replaces the choice if this much faster per sample


class Recheck:
    """The re-check of one planner's latest measured choice (`CallPlanner` asks and tells it)."""

    def __init__(self, rounds):
        self.rounds = rounds      # alternating pairs of calls, at most
        self.start(None, 0)

    def start(self, runner_up, steps_trained):
        """A choice was just made by measuring; `runner_up`: the best measured mode of another kind."""
        self.runner_up = runner_up          # a Choice, or None: nothing to re-check against
        self.steps_at_choice = steps_trained
        self.queue = []                     # the re-check's calls still to run
        self.keys = None                    # (jit, steps) of the choice and of the runner-up
        self.times = {}                     # (jit, steps) -> [seconds per sample]
        self.done = False

    def schedule(self, choice, steps_trained, expected_steps, max_steps):
        """Queues the alternating calls once `choice` has trained long enough, if the work ahead pays.

        `expected_steps`: the steps still expected (`CallPlanner._expected_steps`:
        the rest of this fit, or as many as trained so far if more).
        """
        if self.runner_up is None or self.done:
            return
        trained_since = steps_trained - self.steps_at_choice
        if trained_since < max(self.steps_at_choice, MIN_STEPS):
            return
        pair = (PlannedCall(choice.jit_compile, choice.steps_per_call, RECHECK),
                PlannedCall(self.runner_up.jit_compile,
                            min(self.runner_up.steps_per_call, max_steps), RECHECK))
        if expected_steps < SHARE * self.rounds * sum(p.steps for p in pair):
            return   # too little work ahead: a wrong choice would cost less than the re-check
        self.done = True
        self.queue = [p for _ in range(self.rounds) for p in pair]
        self.keys = [(p.jit, p.steps) for p in pair]

    def is_next(self, probe):
        return bool(self.queue) and probe is self.queue[0]

    def record(self, probe, seconds_per_sample, choice, steps_trained):
        """One re-check call done (`seconds_per_sample` None: not a full call).

        Returns (new Choice, note) when the runner-up wins, else None.
        """
        self.queue.pop(0)
        if seconds_per_sample is not None:
            self.times.setdefault((probe.jit, probe.steps), []).append(seconds_per_sample)
        chosen, runner = (self.times.get(key, []) for key in self.keys)
        if self.queue and not call_timing.check_is_clear(chosen, runner):
            return None
        self.queue = []
        if not chosen or not runner:
            return None
        chosen, runner = statistics.median(chosen), statistics.median(runner)
        if runner >= (1 - MARGIN) * chosen:
            return None
        mode, steps = self.keys[1]
        note = (f"re-checked after {steps_trained - self.steps_at_choice} steps: "
                f"{describe(mode)} at {steps} step(s) per call ran {1 / runner:,.0f} samples/s, "
                f"{describe(choice.jit_compile)} {1 / chosen:,.0f}; the choice changed (its "
                "first measurement was disturbed, or the machine's load changed)")
        return Choice(mode, steps, f"{describe(mode)} faster when re-checked: {1 / runner:,.0f} "
                      f"samples/s at {steps} step(s) per call", 1 / runner), note

    def report(self):
        """Samples per second of each side's re-check calls, for the tuning report."""
        return {f"jit={jit},steps={steps}": {"samples_per_s": 1 / statistics.median(v),
                                             "repeats": len(v)}
                for (jit, steps), v in self.times.items()}
