"""Chooses XLA on/off and the number of steps per call by measuring real training calls.

Nothing is guessed from the hardware: the first calls of `fit` follow a short,
alternating schedule of probes. Each probe is a real training call that
advances the epoch like any other, so no data or work is thrown away; the
choice is made from medians. Keras resolves `jit_compile="auto"` from the
device list instead; measuring is what lets tapeworks promise that its choice
is never slower than plain `tf.function` with one step per call: the winner
is checked against that baseline in alternating calls before it is kept.

Model of a call: `seconds(n) = overhead + n * step`. Timed calls of one step
and of several steps per mode give both terms; steps per call is then the
smallest n that puts the overhead under 0.5% of the call, capped so that one
call stays short enough for the progress bar and callbacks to stay responsive.

Modes: `False` (tf.function), `True` (the whole step through XLA) and
`"update"` (tf.function for forward and backward, XLA for the optimizer
update alone). The last exists because XLA fuses an optimizer's dozen
elementwise passes over every weight into one, while on CPUs with native
bfloat16 the forward and backward run faster outside XLA: measured on this
project's CPU, a bfloat16 MLP trained 1.46x faster with only its update
fused than with no XLA, and 1.58x faster than the whole step under XLA.

Every mode's first call is untimed and runs one step on a batch drawn outside
the compiled loop (see `Trainer._run_first_step`), its second call is an
untimed run of the loop: tracing, XLA compilation and the first execution of
a graph all cost far more than a steady-state call.
"""

import dataclasses
import math
import statistics

PROBE_STEPS = 8          # the least second number of steps per call probed
PROBE_SECONDS = 0.02     # ... raised until such a call lasts about this long
ROUNDS = 5               # timed repeats of each probe (medians of these; with tf.data's
                         # autotuning model on, steps flip between two speeds, so three
                         # were too few)
OVERHEAD_SHARE = 0.005   # target share of a call spent on per-call overhead (at 2%:
                         # 5 steps per call on the large MLP of `bench loops`, 10,846
                         # samples/s against 10,935 for Keras' fit with 32 steps per
                         # execution; at 0.5%: 14 steps, 11,000 against 11,047)
MAX_STEPS_PER_CALL = 256
MAX_SECONDS_PER_CALL = 1.0
MAX_RETRIES = 2          # a timed call cut short (end of data) is run again

FIRST, WARM, TIMED, CHOSEN = "first", "warm", "timed", "chosen"


@dataclasses.dataclass(frozen=True)
class Probe:
    """One call: XLA or not, how many steps, and what the call is for."""

    jit: object   # False, True or "update"
    steps: int
    kind: str = TIMED
    attempt: int = 0

    @property
    def first(self):
        return self.kind == FIRST


@dataclasses.dataclass
class Choice:
    jit_compile: object   # False, True or "update"
    steps_per_call: int
    reason: str


class CallPlanner:
    """Hands out the (jit, steps) of each call of `fit` and learns from their timings.

    Args:
        jit_compile: True, False, "update" or "auto".
        steps_per_call: an int >= 1 or "auto".
        xla_available: False when XLA cannot be used at all (eager mode, a
            layer that does not support it).
    """

    def __init__(self, jit_compile, steps_per_call, xla_available=True, max_steps=None):
        self._fixed_steps = None if steps_per_call == "auto" else int(steps_per_call)
        if max_steps == 1:
            self._fixed_steps = 1
        if jit_compile == "auto":
            self._modes = [False, "update", True] if xla_available else [False]
        else:
            self._modes = [jit_compile]
        self._step_options = ([1, min(PROBE_STEPS, max_steps or PROBE_STEPS)]
                              if self._fixed_steps is None
                              else [self._fixed_steps])
        self._calls = {}          # jit -> [(steps, samples, seconds)] of full timed calls
        self._checks = {}         # (jit, steps) -> [seconds per sample] while verifying
        self._reference_batch = None
        # A hard cap from the caller (captures every k steps), never lifted.
        self._cap = max_steps or MAX_STEPS_PER_CALL
        self._max_steps = self._cap
        self._candidate = None    # the measured best, while it is checked
        self._rounds_pending = False
        self._warm_seconds = []
        self.notes = []
        self.choice = None
        if len(self._modes) == 1 and self._fixed_steps is not None:
            self.choice = Choice(self._modes[0], self._fixed_steps, "fixed by the caller")
            self._queue = []
        else:
            self._queue = self._search_schedule()

    @property
    def tuning(self):
        return self.choice is None

    def next_call(self):
        """Returns the `Probe` to run next."""
        if self.choice is not None:
            return Probe(self.choice.jit_compile, self.choice.steps_per_call, CHOSEN)
        return self._queue[0]

    def limit_steps(self, max_steps):
        """Caps steps per call, at half an epoch once its length is known.

        A call as long as an epoch would nearly always be cut short by the end
        of the data.
        """
        self._max_steps = max(1, min(int(max_steps), self._cap))
        if self.choice is not None and self.choice.steps_per_call > self._max_steps \
                and self._fixed_steps is None:
            self.choice = Choice(self.choice.jit_compile, self._max_steps,
                                 self.choice.reason + ", capped at half an epoch")

    def record(self, probe, requested, ran, samples, seconds):
        """Records a finished call of `probe` that asked for `requested` steps."""
        if self.choice is not None or not self._queue or self._queue[0] is not probe:
            return
        self._queue.pop(0)
        if probe.kind == WARM:
            if ran:
                self._warm_seconds.append(seconds / ran)
        elif probe.kind == FIRST:
            pass
        elif self._is_full(requested, ran, samples):
            if self._candidate is None:
                self._calls.setdefault(probe.jit, []).append((ran, samples, seconds))
            else:
                self._checks.setdefault((probe.jit, probe.steps), []).append(seconds / samples)
        elif probe.attempt < MAX_RETRIES:
            # Cut short by the end of the data, or a smaller last batch: its
            # time does not describe a full call. Run it again.
            self._queue.insert(0, dataclasses.replace(probe, attempt=probe.attempt + 1))
        if not self._queue:
            self._advance()

    def drop_xla(self, error, mode=True):
        """XLA failed to compile `mode` for this model: continue without that mode."""
        self.notes.append(f"XLA could not compile the {describe(mode)} step "
                          f"({type(error).__name__}); that mode is not used")
        self._modes = [m for m in self._modes if m != mode]
        self._queue = [p for p in self._queue if p.jit != mode]
        if not self._modes:
            self._modes = [False]
            self._queue = self._search_schedule() if self._fixed_steps is None else []
        if self.choice is None and not self._queue:
            self._advance()

    def report(self):
        """A dict of what was measured and chosen, for logs and `Trainer.tuning`."""
        measured = {}
        for jit, calls in self._calls.items():
            for steps in sorted({c[0] for c in calls}):
                rates = [s / t for n, s, t in calls if n == steps]
                measured[f"jit={jit},steps={steps}"] = {
                    "samples_per_s": statistics.median(rates), "repeats": len(rates)}
        checks = {f"jit={jit},steps={steps}": {"samples_per_s": 1 / statistics.median(v),
                                               "repeats": len(v)}
                  for (jit, steps), v in self._checks.items()}
        return {
            "jit_compile": self.choice.jit_compile if self.choice else None,
            "steps_per_call": self.choice.steps_per_call if self.choice else None,
            "reason": self.choice.reason if self.choice else "still measuring",
            "measured": measured,
            "checked_against_baseline": checks,
            "notes": list(self.notes),
        }

    # Schedule -----------------------------------------------------------

    def _search_schedule(self):
        """The warm-up calls; the timed rounds follow once they tell a call's length."""
        self._warm_seconds = []
        self._rounds_pending = True
        return [Probe(m, 1, kind) for m in self._modes for kind in (FIRST, WARM)]

    def _timed_rounds(self):
        options = list(self._step_options)
        if self._fixed_steps is None and self._warm_seconds:
            # Calls of a few milliseconds are mostly noise on a busy machine:
            # make the longer probe last about PROBE_SECONDS.
            wanted = math.ceil(PROBE_SECONDS / max(min(self._warm_seconds), 1e-6))
            options[1] = max(options[1], min(wanted, self._max_steps, self._cap))
        return [Probe(m, n) for _ in range(ROUNDS) for m in self._modes for n in options]

    def _is_full(self, requested, ran, samples):
        if ran != requested or samples <= 0:
            return False
        if self._reference_batch is None:
            self._reference_batch = samples / ran
        return samples == ran * self._reference_batch

    def _advance(self):
        if self._rounds_pending:
            self._rounds_pending = False
            self._queue = self._timed_rounds()
            if self._queue:
                return
        if self._candidate is None:
            candidate = self._best_measured()
            baseline_measured = any(n == 1 for n, _, _ in self._calls.get(False, []))
            if candidate is None:
                self.choice = Choice(False, 1, "no full call could be measured")
            elif (candidate.jit_compile, candidate.steps_per_call) == (False, 1) \
                    or not baseline_measured:
                self.choice = candidate
            else:
                # Confirm the winner against plain tf.function, one step per
                # call, in alternating calls: the promise is never to be slower.
                self._candidate = candidate
                chosen = (candidate.jit_compile, candidate.steps_per_call)
                self._queue = [Probe(*p) for _ in range(ROUNDS) for p in (chosen, (False, 1))]
            return
        chosen = self._median_check((self._candidate.jit_compile,
                                     self._candidate.steps_per_call))
        baseline = self._median_check((False, 1))
        if chosen is not None and baseline is not None and chosen > baseline:
            self.choice = Choice(False, 1, (
                f"the measured best ({self._candidate.reason}) was not faster than "
                "tf.function with one step per call when checked"))
        else:
            self.choice = self._candidate

    def _median_check(self, key):
        values = self._checks.get(key)
        return statistics.median(values) if values else None

    def _best_measured(self):
        best = None
        for mode in self._modes:
            option = self._estimate(mode)
            if option is not None and (best is None or option[0] < best[0]):
                best = option
        if best is None:
            return None
        per_sample, choice = best
        choice.reason = (f"{describe(choice.jit_compile)} measured fastest: {1.0 / per_sample:,.0f} samples/s "
                         f"expected at {choice.steps_per_call} step(s) per call")
        return choice

    def _estimate(self, mode):
        """(seconds per sample, Choice) for `mode` from its timed calls."""
        calls = self._calls.get(mode)
        if not calls:
            return None
        batch = self._reference_batch
        if self._fixed_steps is not None:
            per_sample = statistics.median(t / s for _, s, t in calls)
            return per_sample, Choice(mode, self._fixed_steps, "")
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
        steps = max(1, min(steps, self._max_steps,
                           max(1, int(MAX_SECONDS_PER_CALL / step))))
        return (step + overhead / steps) / batch, Choice(mode, steps, "")


def describe(mode):
    """Words for an execution mode, for logs and reports."""
    return {False: "tf.function", True: "XLA",
            "update": "tf.function with an XLA-fused update"}[mode]
