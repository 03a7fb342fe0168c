"""Chooses XLA on/off and the number of steps per call by measuring real training calls.

Nothing is guessed from the hardware: the first calls of `fit` are spent on a
short, alternating schedule of probes (each probe is a real training call that
advances the epoch like any other, so no data or work is thrown away), and the
choice is made from medians. Keras resolves `jit_compile="auto"` from the device
list instead; measuring is what lets tapeworks promise that its choice is never
slower than plain `tf.function` with one step per call: the winner is checked
against that baseline in alternating calls before it is kept.

Model of a call: `seconds(n) = overhead + n * step`. Probing n=1 and n=K per
mode gives both terms; steps per call is then the smallest n that puts the
overhead under 2% of the call, capped so that one call stays short enough for
the progress bar and callbacks to stay responsive.
"""

import dataclasses
import math
import statistics

PROBE_STEPS = 8          # K: the second number of steps per call probed
ROUNDS = 3               # timed repeats of each probe (medians of these)
OVERHEAD_SHARE = 0.02    # target share of a call spent on per-call overhead
MAX_STEPS_PER_CALL = 256
MAX_SECONDS_PER_CALL = 1.0
MAX_RETRIES = 2          # a probe cut short by the end of an epoch is retried


@dataclasses.dataclass(frozen=True)
class Probe:
    jit: bool
    steps: int
    timed: bool = True


@dataclasses.dataclass
class Choice:
    jit_compile: bool
    steps_per_call: int
    reason: str


class CallPlanner:
    """Hands out (jit, steps) for each call of `fit` and learns from their timings.

    Args:
        jit_compile: True, False or "auto".
        steps_per_call: an int >= 1 or "auto".
        xla_available: False when XLA cannot be used at all (eager mode, a
            layer that does not support it).
    """

    def __init__(self, jit_compile, steps_per_call, xla_available=True):
        self._fixed_steps = None if steps_per_call == "auto" else int(steps_per_call)
        if jit_compile == "auto":
            self._modes = [False, True] if xla_available else [False]
        else:
            self._modes = [bool(jit_compile)]
        self._step_options = [1, PROBE_STEPS] if self._fixed_steps is None else [
            self._fixed_steps]
        self._timings = {}   # Probe -> list of seconds per sample
        self._call_seconds = {}  # Probe -> list of seconds per call
        self._retries = {}
        self._reference_batch = None
        self.choice = None
        self.notes = []
        self._candidate = None   # the measured best, while it is checked
        self._verify = None      # (candidate probe, baseline probe)
        self._max_steps = MAX_STEPS_PER_CALL
        if len(self._modes) == 1 and len(self._step_options) == 1:
            self.choice = Choice(self._modes[0], self._step_options[0], "fixed by the caller")
            self._queue = []
        else:
            self._queue = self._search_schedule()

    def limit_steps(self, max_steps):
        """Caps steps per call, at half an epoch once its length is known.

        A call as long as an epoch would nearly always be cut short by the end
        of the data, and could then never be measured (or used) whole.
        """
        self._max_steps = max(1, int(max_steps))
        if self.choice is not None and self.choice.steps_per_call > self._max_steps:
            self.choice = Choice(self.choice.jit_compile, self._max_steps,
                                 self.choice.reason + ", capped at the epoch length")

    @property
    def tuning(self):
        return self.choice is None

    def next_call(self):
        """Returns the `Probe` (jit, steps) to run next."""
        if self.choice is not None:
            return Probe(self.choice.jit_compile, self.choice.steps_per_call, timed=False)
        return self._queue[0]

    def record(self, probe, steps_run, samples, seconds):
        """Records one finished call; advances the schedule."""
        if self.choice is not None:
            return
        if self._queue and self._queue[0] == probe:
            self._queue.pop(0)
        full = steps_run == probe.steps and samples > 0
        if full and self._reference_batch is None and probe.timed:
            self._reference_batch = samples / steps_run
        full = full and samples == steps_run * (self._reference_batch or samples / steps_run)
        if probe.timed:
            if full:
                self._timings.setdefault(probe, []).append(seconds / samples)
                self._call_seconds.setdefault(probe, []).append(seconds)
            elif self._retries.get(probe, 0) < MAX_RETRIES:
                # Cut short by the end of the epoch or a partial batch: its
                # time does not describe a full call, run it again.
                self._retries[probe] = self._retries.get(probe, 0) + 1
                self._queue.insert(0, probe)
        if not self._queue:
            self._advance()

    def drop_xla(self, error):
        """XLA failed to compile this model: continue without it."""
        self.notes.append(f"XLA could not compile the step ({type(error).__name__}); using tf.function")
        self._modes = [m for m in self._modes if not m]
        self._queue = [p for p in self._queue if not p.jit]
        if self.choice is not None and self.choice.jit_compile:
            self.choice = Choice(False, self.choice.steps_per_call, "XLA failed to compile")
        if self.choice is None and not self._queue:
            self._advance()

    def finish_early(self):
        """`fit` ended before the schedule did: keep the best choice measured so far."""
        if self.choice is None:
            self._queue = []
            self.choice = self._best_measured() or Choice(False, 1, "too few calls to measure")

    def report(self):
        """A dict of what was measured and chosen, for logs and `Trainer.tuning`."""
        measured = {
            f"jit={p.jit},steps={p.steps}": {
                "samples_per_s": 1.0 / statistics.median(v),
                "call_ms": 1000 * statistics.median(self._call_seconds[p]),
                "repeats": len(v),
            }
            for p, v in self._timings.items()
        }
        return {
            "jit_compile": self.choice.jit_compile if self.choice else None,
            "steps_per_call": self.choice.steps_per_call if self.choice else None,
            "reason": self.choice.reason if self.choice else "still measuring",
            "measured": measured,
            "notes": list(self.notes),
        }

    # Schedule -----------------------------------------------------------

    def _search_schedule(self):
        # A mode's first call traces and compiles it: one step, not timed.
        warmups = [Probe(m, 1, timed=False) for m in self._modes]
        rounds = [Probe(m, n) for _ in range(ROUNDS) for m in self._modes
                  for n in self._step_options]
        return warmups + rounds

    def _advance(self):
        if self._candidate is None:
            candidate = self._best_measured()
            if candidate is None:
                self.choice = Choice(False, 1, "no full call could be measured")
                return
            baseline = Probe(False, 1)
            if (candidate.jit_compile, candidate.steps_per_call) == (False, 1) or (
                    baseline not in self._timings):
                self.choice = candidate
                return
            # Confirm the winner against plain tf.function, one step per call,
            # in alternating calls: the promise is never to be slower.
            self._candidate = candidate
            chosen = Probe(candidate.jit_compile, candidate.steps_per_call)
            self._verify = (chosen, baseline)
            self._timings.pop(baseline, None)
            self._call_seconds.pop(baseline, None)
            self._queue = [p for _ in range(ROUNDS) for p in (chosen, baseline)]
            return
        chosen, baseline = self._verify
        t_chosen = self._median(chosen)
        t_base = self._median(baseline)
        if t_chosen is not None and t_base is not None and t_chosen > t_base:
            self.choice = Choice(False, 1, (
                f"the measured best ({self._candidate.reason}) was not faster than "
                "tf.function with one step per call when checked"))
        else:
            self.choice = self._candidate

    def _median(self, probe):
        values = self._timings.get(probe)
        return statistics.median(values) if values else None

    def _best_measured(self):
        best = None
        for mode in self._modes:
            if self._fixed_steps is not None:
                per_sample = self._median(Probe(mode, self._fixed_steps))
                if per_sample is None:
                    continue
                option = (per_sample, Choice(mode, self._fixed_steps, ""))
            else:
                option = self._fit_call_model(mode)
                if option is None:
                    continue
            if best is None or option[0] < best[0]:
                best = option
        if best is None:
            return None
        per_sample, choice = best
        xla = "XLA" if choice.jit_compile else "tf.function"
        choice.reason = f"{xla} measured fastest ({1.0 / per_sample:,.0f} samples/s)"
        return choice

    def _fit_call_model(self, mode):
        one = self._call_seconds.get(Probe(mode, 1))
        many = self._call_seconds.get(Probe(mode, PROBE_STEPS))
        if not one or not many:
            return None
        t1, tk = statistics.median(one), statistics.median(many)
        step = max((tk - t1) / (PROBE_STEPS - 1), tk / PROBE_STEPS * 0.05, 1e-7)
        overhead = max(t1 - step, 0.0)
        steps = math.ceil(overhead / (OVERHEAD_SHARE * step)) if overhead > 0 else 1
        steps = max(1, min(steps, self._max_steps,
                           max(1, int(MAX_SECONDS_PER_CALL / step))))
        per_step = step + overhead / steps
        samples_per_step = self._reference_batch or 1.0
        return per_step / samples_per_step, Choice(mode, steps, "")
