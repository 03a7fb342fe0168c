"""From timed training calls to a step's cost: the planner's statistics (`autotune`).

Pure functions of the timings the planner keeps: `calls` are
`(steps, samples, seconds)` per timed call. Two calls of 1 and n steps give
`seconds(n) = overhead + n * step`, and the steps per call that put the
overhead under `OVERHEAD_SHARE` of a call.
"""

import math
import statistics

MIN_ROUNDS = 2           # timed rounds at least: rounds stop early once the answer is clear
SETTLED_SPREAD = 0.05    # a mode's rounds are clear when each probe's timings lie within
                         # this share of their least
OVERHEAD_SHARE = 0.005   # target share of a call spent on per-call overhead (at 2%:
                         # 5 steps per call on the large MLP of `bench loops`, 10,846
                         # samples/s against 10,935 for Keras' fit with 32 steps per
                         # execution; at 0.5%: 14 steps, 11,000 against 11,047)
MAX_SECONDS_PER_CALL = 1.0


def rounds_are_clear(calls, *, fixed_steps):
    """Whether a mode's timed rounds so far already tell its speed.

    After at least MIN_ROUNDS complete rounds, when each probe's timings
    lie within SETTLED_SPREAD of each other, more rounds would only
    repeat them: the rest are dropped, and the steps they would have run
    train in the next mode (for a large model's 0.1 s steps, three more
    rounds of 1 and 8 steps are 27 steps in a mode that may be the
    slowest). Tiny models' millisecond calls rarely settle that tightly
    and keep all rounds, which cost them little. `fixed_steps`: the steps
    per call are fixed, so one probe size is a complete round.
    """
    by_steps = {}
    for n, _, seconds in calls:
        by_steps.setdefault(n, []).append(seconds)
    counts = {len(v) for v in by_steps.values()}
    if len(counts) != 1 or min(counts) < MIN_ROUNDS:
        return False   # a round is not complete yet
    if not fixed_steps and len(by_steps) < 2:
        return False
    return all(max(v) <= min(v) * (1 + SETTLED_SPREAD) for v in by_steps.values())


def check_is_clear(chosen, baseline):
    """Whether the winner's check against one-step tf.function is already decided.

    After MIN_ROUNDS complete rounds, when every call of one is faster per
    sample than every call of the other, the medians cannot change sides in
    the rounds left.
    """
    if len(chosen) != len(baseline) or len(chosen) < MIN_ROUNDS:
        return False
    return max(chosen) < min(baseline) or min(chosen) > max(baseline)


def estimate(calls, batch, fixed_steps, max_steps):
    """(seconds per sample, steps per call) from a mode's timed calls, or None."""
    if not calls:
        return None
    if fixed_steps is not None:
        return statistics.median(t / s for _, s, t in calls), fixed_steps
    singles = [t for n, _, t in calls if n == 1]
    if not singles or not any(n > 1 for n, _, _ in calls):
        return None
    t1 = statistics.median(singles)
    step = statistics.median((t - t1) / (n - 1) for n, _, t in calls if n > 1)
    # A noisy single call can make the increment look free: never let the
    # step cost fall below a twentieth of the average step of a long call.
    floor = statistics.median(t / n for n, _, t in calls if n > 1) / 20
    step = max(step, floor, 1e-7)
    overhead = max(t1 - step, 0.0)
    steps = math.ceil(overhead / (OVERHEAD_SHARE * step)) if overhead > 0 else 1
    steps = max(1, min(steps, max_steps, max(1, int(MAX_SECONDS_PER_CALL / step))))
    return (step + overhead / steps) / batch, steps


class RecentRates:
    """Samples per second of the last `keep` calls, for "what fit achieves" in a report.

    Each call's seconds include the host's work for it (callbacks, the
    progress bar, checkpoints' bookkeeping: `CallLoop.run_epoch`), as the
    planner's measuring calls' do, so the two describe the same thing.
    """

    def __init__(self, keep=64):
        self.keep = keep
        self.rates = []

    def add(self, samples, seconds):
        if seconds > 0:
            self.rates = self.rates[1 - self.keep:] + [samples / seconds]

    @property
    def count(self):
        return len(self.rates)

    def median(self):
        return statistics.median(self.rates) if self.rates else None
