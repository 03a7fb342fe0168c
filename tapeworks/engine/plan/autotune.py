"""Chooses XLA on/off and the number of steps per call by measuring real training calls.

The objective is the wall-clock time of the whole `fit`, measuring included.
Nothing is guessed from the hardware, and measuring is only done where it can
pay for itself:

1. Start in the mode that is cheapest to start and already fast: `tf.function`
   (no XLA compile). Its first loop call is untimed: it traces, and its wall
   time is what starting a mode costs. Then alternating timed calls of 1 and n
   steps give `seconds(n) = overhead + n * step` and the steps per call that
   put the overhead under 0.5% of a call.
2. An XLA mode ("update": XLA for the optimizer update alone; True: the whole
   step) is tried only when it can repay the cost of trying it: its start is
   predicted from tf.function's measured start (`XLA_START_RATIO`; whole-step
   XLA's also from the update's, once that is measured), it can at best step
   in (1 - `XLA_BEST_SAVING`) of tf.function's step time, and what it can win
   over the best mode measured so far, over the remaining work (epochs x
   steps left in this `fit`, told by the Trainer, or the steps trained so far
   if more: a trainer that has trained N steps is expected to train about as
   many more), must exceed that start. All trying together may spend at most
   `TRY_BUDGET` of that remaining time at tf.function's speed, plus what a
   mode already measured faster wins over it: the fit is never more than
   `TRY_BUDGET` slower than tf.function alone. A mode that cannot pay yet is
   reconsidered as training goes on (`reconsider`), and across runs: the
   plan cache keeps the modes still waiting, what tf.function measured and
   the steps trained by the runs that used the plan (`memory`), so a script
   run again and again reaches XLA once its runs together can repay trying
   it, and the mode it then finds is what later runs start in. With data
   of unknown length the decision waits for the end of the first epoch (the
   calls meanwhile run tf.function at its chosen steps per call). After an
   XLA mode's first call its real start cost is known, and a mode that can no
   longer pay is dropped at once.
3. The fastest measured option is kept; when it is an XLA mode, it is checked
   against tf.function with one step per call in alternating calls and
   dropped (for tf.function at its measured steps per call) if it is not
   faster: "auto" never keeps a choice slower than plain `tf.function`.

Timed rounds, and the check, stop after MIN_ROUNDS once their answer is
clear (`_rounds_are_clear`, `_check_is_clear`): the steps they would have
run train in the mode that wins instead.

4. A measured choice is re-checked once, later, against the best measured
   mode of another kind, in alternating calls (`recheck.Recheck`): a
   measurement disturbed by other work on the machine is not kept for good.

Every call is a real training call: no data is thrown away. An XLA failure to
compile is caught on the mode's first call and that batch is trained without
XLA (see `CallLoop.first_step`).

The start costs behind `XLA_START_RATIO` and `START_OVER_UPDATE`, as measured,
are in docs/ARCHITECTURE.md ("How auto measures XLA's start").
"""

import dataclasses
import math
import statistics

from tapeworks.engine.plan import call_timing
from tapeworks.engine.plan import recheck as recheck_lib
from tapeworks.engine.plan.call_timing import MIN_ROUNDS
# The planner's vocabulary; `autotune.Choice` and `autotune.describe` stay its names here.
from tapeworks.engine.plan.plan_terms import (CHOSEN, FIRST, HOLD, TIMED, WARM, Choice,  # noqa: F401
                                         PlannedCall, describe)

PROBE_STEPS = 8          # the least second number of steps per call probed
PROBE_SECONDS = 0.02     # ... raised until such a call lasts about this long
ROUNDS = 5               # timed repeats of each probe at most (medians of these; with
                         # tf.data's autotuning model on, steps flip between two speeds, so
                         # three were too few)
# MIN_ROUNDS, SETTLED_SPREAD, OVERHEAD_SHARE, MAX_SECONDS_PER_CALL: `call_timing`.
MAX_STEPS_PER_CALL = 256
MAX_RETRIES = 2          # a timed call cut short (end of data) is run again
XLA_START_RATIO = {"update": 2.0, True: 5.0}   # start cost / tf.function's (measured at
                                               # most 1.89 and 4.81: see above)
XLA_BEST_SAVING = 0.6    # the most of tf.function's step time an XLA mode is expected to
                         # save (measured here: 52% for whole-step XLA on the large MLP,
                         # 0.62 s against 1.29 s an epoch; 32% for a bfloat16 update)
START_OVER_UPDATE = 3.5  # whole-step XLA's start / the XLA update's (measured at most 3.2:
                         # see `_predicted_start`)
TRY_BUDGET = 0.1         # trying XLA modes may cost at most this share of the remaining time


class CallPlanner:
    """Hands out the (jit, steps) of each call of `fit` and learns from their timings.

    Args:
        jit_compile: True, False, "update" or "auto".
        steps_per_call: an int >= 1 or "auto".
        xla_available: False when XLA cannot be used (eager mode, a layer
            that does not support it, or `deterministic=True`).
        max_steps: a hard cap on steps per call (captures every k steps).

    The Trainer sets `remaining_steps` (steps left in this `fit`, or None
    when unknown) before each call; it decides whether an XLA mode is worth
    trying.
    """

    def __init__(self, jit_compile, steps_per_call, xla_available=True, max_steps=None,
                 xla_order=("update", True)):
        self._fixed_steps = None if steps_per_call == "auto" else int(steps_per_call)
        self._jit_fixed = jit_compile != "auto" or not xla_available
        if max_steps == 1:
            self._fixed_steps = 1
        if jit_compile == "auto":
            self._modes = [False]
            self._untried = list(xla_order) if xla_available else []
        else:
            self._modes = [jit_compile]
            self._untried = []
        self._step_options = ([1, min(PROBE_STEPS, max_steps or PROBE_STEPS)]
                              if self._fixed_steps is None
                              else [self._fixed_steps])
        self._calls = {}          # jit -> [(steps, samples, seconds)] of full timed calls
        self._checks = {}         # (jit, steps) -> [seconds per sample] while verifying
        self._achieved = call_timing.RecentRates()   # the chosen mode's full calls in fit
        self._start_seconds = {}  # jit -> seconds of its first and first loop calls
        self._reference_batch = None
        # A hard cap from the caller (captures every k steps), never lifted.
        self._cap = max_steps or MAX_STEPS_PER_CALL
        self._max_steps = self._cap
        self._candidate = None    # the measured best, while it is checked
        self._warm_seconds = {}   # jit -> seconds per step of its first loop call
        self._trying_spent = 0.0
        self._deferred = []       # XLA modes that could not pay yet: reconsidered later
        self.remaining_steps = None
        self.steps_trained = 0    # every step this planner has seen, all fits together
        self.steps_before = 0     # steps of earlier runs that used this plan (the plan cache)
        self._restored_calls = 0  # tf.function's timed calls of those runs, first in _calls
        self.notes = []
        self.choice = None
        self.from_cache = False
        self._recheck = recheck_lib.Recheck(ROUNDS)   # of a measured choice, once
        if len(self._modes) == 1 and not self._untried and self._fixed_steps is not None:
            self.choice = Choice(self._modes[0], self._fixed_steps, "fixed by the caller")
            self._queue = []
        else:
            self._queue = self._start_schedule(self._modes[0])

    @property
    def tuning(self):
        return self.choice is None

    @property
    def mode(self):
        """The execution mode of the next call (the chosen one once chosen)."""
        return self.next_call().jit

    @property
    def candidate(self):
        """The measured best (a `Choice`) while it is checked against tf.function, else None."""
        return self._candidate

    @property
    def untried(self):
        """The XLA modes not tried yet, in the order they would be (a copy)."""
        return list(self._untried)

    def queued(self):
        """The planned calls still waiting, in order (a copy)."""
        return list(self._queue)

    def next_call(self):
        """Returns the `PlannedCall` to run next."""
        if self.choice is not None:
            if self._recheck.queue:
                return self._recheck.queue[0]
            return PlannedCall(self.choice.jit_compile, self.choice.steps_per_call, CHOSEN)
        if not self._queue:
            # Waiting to learn how long the run is (data of unknown length):
            # train in the best mode measured so far meanwhile.
            best = self._estimate(False) or self._estimate(self._modes[0])
            steps = best[1].steps_per_call if best else 1
            return PlannedCall(self._modes[0] if best is None else best[1].jit_compile, steps, HOLD)
        return self._queue[0]

    def status(self):
        """"tuning k/n": measuring the k-th of n execution modes; None once chosen."""
        if self.choice is not None:
            return None
        modes = self._modes + self._untried
        probe = self.next_call()
        index = modes.index(probe.jit) + 1 if probe.jit in modes else 1
        return f"tuning {index}/{len(modes)}"

    def adopt(self, choice, memory=None):
        """Takes a choice made before (the plan cache): no measuring now.

        `memory` (from `memory()` of the run that stored the plan) carries the
        XLA modes that run could not yet afford to try, with what it measured:
        they are tried here once the runs together can repay them.
        """
        self.choice = Choice(choice.jit_compile,
                             min(choice.steps_per_call, self._max_steps), choice.reason)
        self.from_cache = True
        self._queue = []
        if not memory or self._jit_fixed:
            return
        try:
            waiting = [m for m in memory["waiting"] if m in XLA_START_RATIO
                       and m not in self._modes]
            calls = [(jit, int(n), float(s), float(t)) for jit, n, s, t in memory["calls"]]
            starts = {jit: float(t) for jit, t in memory["start_seconds"]}
            batch, seen = float(memory["reference_batch"]), int(memory["steps_seen"])
        except (KeyError, TypeError, ValueError):
            return   # an entry written by another version: the choice alone is used
        if not waiting or False not in starts:
            return
        restored = [(n, samples, seconds) for jit, n, samples, seconds in calls if jit is False]
        self._calls[False] = restored + self._calls.get(False, [])
        self._restored_calls = len(restored)
        self._start_seconds[False] = starts[False]
        self._reference_batch = batch
        self._deferred = waiting
        self.steps_before = seen
        if False not in self._modes:
            self._modes.insert(0, False)

    def memory(self):
        """What a later run of the same plan needs to go on deciding, or None.

        Only when XLA modes are still waiting to be tried: tf.function's timed
        calls and start, and every step trained with this plan so far.
        """
        if not self._deferred or self.choice is None:
            return None
        return {"waiting": list(self._deferred),
                "calls": [[False, n, s, t] for n, s, t in self._calls.get(False, [])],
                "start_seconds": [[False, self._start_seconds[False]]]
                if False in self._start_seconds else [],
                "reference_batch": self._reference_batch,
                "steps_seen": self.steps_before + self.steps_trained}

    def limit_steps(self, max_steps):
        """Caps steps per call (half an epoch once known: a call that long is nearly always cut short)."""
        self._max_steps = max(1, min(int(max_steps), self._cap))
        if self.choice is not None and self.choice.steps_per_call > self._max_steps \
                and self._fixed_steps is None:
            self.choice = Choice(self.choice.jit_compile, self._max_steps,
                                 self.choice.reason + ", capped at half an epoch")

    def record(self, probe, requested, ran, samples, seconds):
        """Records a finished call of `probe` that asked for `requested` steps."""
        self.steps_trained += ran
        if self.choice is not None:
            if (probe.jit == self.choice.jit_compile
                    and ran == requested == self.choice.steps_per_call):
                self._achieved.add(samples, seconds)
            if self._recheck.is_next(probe):
                full = ran == requested == probe.steps and self._is_full(requested, ran, samples)
                changed = self._recheck.record(probe, seconds / samples if full else None,
                                               self.choice, self.steps_trained)
                if changed is not None:   # stored anew; its rate in fit measured anew
                    (self.choice, note), self.from_cache = changed, False
                    self.notes.append(note)
                    self._achieved = call_timing.RecentRates()
            elif not self.from_cache:
                self._recheck.schedule(self.choice, self.steps_trained,
                                       self._expected_steps(), self._max_steps)
            return
        if probe.kind == HOLD:
            if self.remaining_steps is not None:
                self._consider_xla()
                if not self._queue:
                    self._choose()
            return
        if not self._queue or self._queue[0] is not probe:
            return
        self._queue.pop(0)
        if probe.kind == FIRST:
            self._start_seconds[probe.jit] = seconds
            if probe.jit is not False and not self._still_worth_it(probe.jit, seconds):
                self._give_up(probe.jit)
        elif probe.kind == WARM:
            self._start_seconds[probe.jit] = self._start_seconds.get(probe.jit, 0.0) + seconds
            if ran:
                self._warm_seconds[probe.jit] = seconds / ran
            if probe.jit is not False:
                self._trying_spent += self._start_seconds[probe.jit]
            self._queue[0:0] = self._timed_rounds(probe.jit)
        elif self._is_full(requested, ran, samples):
            if self._candidate is None:
                self._calls.setdefault(probe.jit, []).append((ran, samples, seconds))
                if self._rounds_are_clear(probe.jit):
                    self._queue = [p for p in self._queue
                                   if not (p.kind == TIMED and p.jit == probe.jit)]
            else:
                self._checks.setdefault((probe.jit, probe.steps), []).append(seconds / samples)
                if self._check_is_clear():
                    self._queue = [p for p in self._queue if p.kind != TIMED]
        elif probe.attempt < MAX_RETRIES:
            # Cut short by the end of the data, or a smaller last batch: its
            # time does not describe a full call. Run it again.
            self._queue.insert(0, dataclasses.replace(probe, attempt=probe.attempt + 1))
        if not self._queue:
            self._after_mode()

    def reconsider(self):
        """Reopens measuring when an XLA mode that could not pay before now can.

        A trainer that has trained N steps is expected to train about as many
        more (the ski-rental rule): a run made of many short fits (one epoch
        each) reaches XLA once the time it has trained makes trying it cheap.
        The same holds across runs of a script (`steps_before`, from the plan
        cache); a mode found then is stored for the runs after.
        """
        if self.choice is None or not self._deferred:
            return
        chosen, self.choice = self.choice, None
        self._untried, self._deferred = self._deferred, []
        self._consider_xla(quiet=True)
        if not self._queue:
            self.choice = chosen
        else:
            self.from_cache = False   # measuring again: the new choice is stored

    def drop_xla(self, error, mode=True):
        """XLA failed to compile `mode` for this model: continue without that mode."""
        self.notes.append(f"XLA could not compile the {describe(mode)} step "
                          f"({type(error).__name__}); that mode is not used")
        self._modes = [m for m in self._modes if m != mode]
        self._untried = [m for m in self._untried if m != mode]
        self._queue = [p for p in self._queue if p.jit != mode]
        if not self._modes:
            self._modes = [False]
            self._queue = self._start_schedule(False)
        if self.choice is None and not self._queue:
            self._after_mode()

    def report(self):
        """A dict of what was measured and chosen, for logs and `Trainer.tuning`."""
        measured = {}
        for jit, calls in self._calls.items():
            if jit is False:
                calls = calls[self._restored_calls:]   # this run's alone
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
            "from_cache": self.from_cache,
            "measured": measured,
            "start_seconds": {str(k): v for k, v in self._start_seconds.items()},
            "checked_against_baseline": checks,
            "rechecked": self._recheck.report(),
            # Expected for the choice, and achieved by its calls in fit since.
            "expected_samples_per_s": self.choice.expected_samples_per_s if self.choice else None,
            "achieved_samples_per_s": self._achieved.median(),
            "achieved_calls": self._achieved.count,
            "waiting_to_try": [describe(m) for m in self._deferred],
            "steps_of_earlier_runs": self.steps_before,
            "notes": list(self.notes),
        }

    # Schedule -----------------------------------------------------------

    def _start_schedule(self, mode):
        """A mode's untimed start; its timed rounds follow.

        An XLA mode starts with one step on a batch drawn outside the loop
        (an XLA compile failure then loses no data), then its first loop call.
        tf.function cannot fail that way: it starts with the loop call alone,
        so it traces once, as a fixed mode would. The loop call runs the
        steps per call the caller fixed, if any: a batch hook then sees the
        calls Keras' `steps_per_execution` makes ([3, 7] for 8 batches at 4,
        not [0, 4, 7]); its start then holds those steps' time too.
        """
        warm = PlannedCall(mode, self._fixed_steps or 1, WARM)
        return [warm] if mode is False else [PlannedCall(mode, 1, FIRST), warm]

    def _timed_rounds(self, mode):
        options = list(self._step_options)
        warm = self._warm_seconds.get(mode)
        if self._fixed_steps is None and warm:
            # Calls of a few milliseconds are mostly noise on a busy machine:
            # make the longer probe last about PROBE_SECONDS.
            wanted = math.ceil(PROBE_SECONDS / max(warm, 1e-6))
            options[1] = max(options[1], min(wanted, self._max_steps, self._cap))
        return [PlannedCall(mode, n) for _ in range(ROUNDS) for n in options]

    def _this_runs_calls(self, mode):
        calls = self._calls.get(mode, [])
        return calls[self._restored_calls:] if mode is False else calls

    def _rounds_are_clear(self, mode):
        """Whether `mode`'s timed rounds so far already tell its speed (`call_timing`)."""
        return call_timing.rounds_are_clear(self._this_runs_calls(mode),
                                            fixed_steps=self._fixed_steps is not None)

    def _check_is_clear(self):
        """Whether the winner's check against one-step tf.function is already decided."""
        return call_timing.check_is_clear(
            self._checks.get((self._candidate.jit_compile, self._candidate.steps_per_call), []),
            self._checks.get((False, 1), []))

    def _after_mode(self):
        """A mode's timed rounds are done: try the next XLA mode that can pay, or choose."""
        if self._candidate is not None:
            self._conclude()
            return
        if self._untried:
            if self.remaining_steps is None:
                return   # HOLD calls until the Trainer knows how long the run is
            self._consider_xla()
            if self._queue:
                return
        self._choose()

    def _consider_xla(self, quiet=False):
        """Queues the next untried XLA mode that can repay trying it; defers those that cannot."""
        while self._untried:
            mode = self._untried[0]
            baseline = self._estimate(False)
            start = self._start_seconds.get(False)
            if baseline is None or start is None:
                self._untried.pop(0)
                continue
            step = baseline[0] * self._reference_batch   # seconds per step, chosen calls
            remaining = self._expected_steps()
            remaining_time = remaining * step
            cost = self._predicted_start(mode)
            gain = self._possible_gain(remaining)
            # The budget protects one promise: trying never makes the fit
            # more than TRY_BUDGET slower than tf.function alone would have
            # been. A mode already measured faster has won time over the
            # steps left; spending it on the next trial keeps that promise.
            won = remaining * max(0.0, step - self._best_step())
            budget = TRY_BUDGET * remaining_time + won - self._trying_spent
            self._untried.pop(0)
            if gain > cost and cost <= budget and self._trial_fits_this_fit():
                self._modes.append(mode)
                self._queue = self._start_schedule(mode)
                return
            self._deferred.append(mode)
            if not quiet:
                self.notes.append(
                    f"{describe(mode)} not tried yet: starting it was predicted to cost "
                    f"{cost:.2f} s against at most {gain:.2f} s to win over the {remaining} "
                    f"steps expected (trying may spend {TRY_BUDGET:.0%} of their "
                    f"{remaining_time:.2f} s)")

    def _trial_fits_this_fit(self):
        """Whether a trial started now can end before this fit does.

        Only asked when earlier runs' steps count (`steps_before`): a process
        that ends mid-trial stores nothing, so the next run would pay the same
        start again (measured: short warm runs of the large MLP each started
        the XLA update anew). Within a process a trial goes on in the next fit.
        """
        if not self.steps_before:
            return True
        probe = max((n for n, _, _ in self._calls.get(False, [])), default=PROBE_STEPS)
        # As many rounds as tf.function's took (the same noise). Then its
        # start, its timed rounds of 1 and `probe` steps, and the check against
        # one-step tf.function at the winner's steps per call: unknown before
        # the trial, at most the cap (half an epoch once that is known).
        rounds = sum(1 for n, _, _ in self._calls.get(False, []) if n == 1)
        rounds = min(max(rounds, MIN_ROUNDS), ROUNDS)
        trial = 2 + rounds * (1 + probe) + rounds * (1 + max(probe, self._max_steps))
        return (self.remaining_steps or 0) >= trial

    def _still_worth_it(self, mode, first_seconds):
        """After an XLA mode's first call: can the rest of its start (its loop) still pay?"""
        baseline = self._estimate(False)
        if self.remaining_steps is None or baseline is None:
            return True
        # The first loop call costs about as much again as the first step
        # (measured 0.5x to 1.4x; see the module docstring).
        still_to_pay = first_seconds
        return self._possible_gain(self._expected_steps()) > still_to_pay

    def _best_step(self):
        """Seconds per step of the fastest mode measured so far, at its chosen steps per call."""
        measured = [self._estimate(mode) for mode in self._modes]
        return min(e[0] for e in measured if e is not None) * self._reference_batch

    def _possible_gain(self, steps):
        """The most an untried XLA mode can save over `steps` against the best measured so far.

        No XLA mode is expected to step faster than (1 - XLA_BEST_SAVING) of
        tf.function's step: a mode already measured near that leaves little
        to win (the whole-step XLA after an update that halved the step).
        """
        tf_step = self._estimate(False)[0] * self._reference_batch
        return steps * max(0.0, self._best_step() - (1 - XLA_BEST_SAVING) * tf_step)

    def _predicted_start(self, mode):
        """What starting `mode` is predicted to cost, from the starts measured in this run.

        From tf.function's start (`XLA_START_RATIO`) and, for whole-step XLA
        once the XLA update has started, from the update's too: both compile
        the same model's update, and whole-step XLA's start measured 2.4x to
        3.2x the update's on two models and two machines (`START_OVER_UPDATE`
        rounds that up), a narrower range than its 2.9x to 4.8x tf.function's.
        The lower of the two predictions is taken: each bounds what was measured.
        """
        cost = XLA_START_RATIO[mode] * self._start_seconds[False]
        if mode is True and "update" in self._start_seconds:
            cost = min(cost, START_OVER_UPDATE * self._start_seconds["update"])
        return cost

    def _expected_steps(self):
        """Steps a mode found now can still speed up.

        The rest of this fit, or the steps trained so far if more (about as
        many more are expected), plus the steps of earlier runs of this plan:
        a mode found now is stored and used by the runs after this one, and
        those are expected to be like the runs before.
        """
        return max(self.remaining_steps or 0, self.steps_trained) + self.steps_before

    def _give_up(self, mode):
        self.notes.append(f"{describe(mode)} dropped after its first call: its measured start "
                          "cannot be repaid by the steps left")
        self._trying_spent += self._start_seconds.get(mode, 0.0)
        self._modes = [m for m in self._modes if m != mode]
        self._queue = [p for p in self._queue if p.jit != mode]

    def _is_full(self, requested, ran, samples):
        if ran != requested or samples <= 0:
            return False
        if self._reference_batch is None:
            self._reference_batch = samples / ran
        return samples == ran * self._reference_batch

    def _choose(self):
        candidate = self._best_measured()
        baseline_measured = any(n == 1 for n, _, _ in self._calls.get(False, []))
        if candidate is None:
            self.choice = Choice(self._modes[0] if self._fixed_steps else False,
                                 self._fixed_steps or 1, "no full call could be measured")
        elif (candidate.jit_compile, candidate.steps_per_call) == (False, 1) \
                or not baseline_measured or candidate.jit_compile is False:
            # tf.function at n steps was measured against 1 step in the same
            # alternating rounds: nothing left to check.
            self.choice = candidate
            self._note_runner_up()
        else:
            # Confirm the winner against plain tf.function, one step per
            # call, in alternating calls: the promise is never to be slower.
            self._candidate = candidate
            self._checks = {}   # a check of its own (an earlier one's calls are not its rounds)
            chosen = (candidate.jit_compile, candidate.steps_per_call)
            self._queue = [PlannedCall(*p) for _ in range(ROUNDS) for p in (chosen, (False, 1))]

    def _conclude(self):
        chosen = self._median_check((self._candidate.jit_compile,
                                     self._candidate.steps_per_call))
        baseline = self._median_check((False, 1))
        if chosen is not None and baseline is not None and chosen > baseline:
            # tf.function at its own measured steps per call: those were
            # timed against one step in the same alternating rounds.
            fallback = self._estimate(False)
            steps = fallback[1].steps_per_call if fallback else 1
            self.choice = Choice(False, steps, (
                f"the measured best ({self._candidate.reason}) was not faster than "
                "tf.function with one step per call when checked"),
                1.0 / fallback[0] if fallback else None)
        else:
            self.choice = self._candidate
            if chosen is not None:   # the check's calls ran the choice as fit will
                self.choice.expected_samples_per_s = 1.0 / chosen
        # Checked: a mode reconsidered later is timed again, not checked.
        self._candidate = None
        self._note_runner_up()

    def _note_runner_up(self):
        """After a measured choice: the best measured mode of another kind, re-checked later."""
        best = self._fastest([m for m in self._modes if m != self.choice.jit_compile])
        self._recheck.start(None if best is None else best[1], self.steps_trained)

    def _median_check(self, key):
        values = self._checks.get(key)
        return statistics.median(values) if values else None

    def _fastest(self, modes):
        """(seconds per sample, Choice) of the fastest of `modes` measured, or None."""
        measured = [e for e in map(self._estimate, modes) if e is not None]
        return min(measured, key=lambda e: e[0]) if measured else None

    def _best_measured(self):
        best = self._fastest(self._modes)
        if best is None:
            return None
        per_sample, choice = best
        choice.expected_samples_per_s = 1.0 / per_sample
        choice.reason = (f"{describe(choice.jit_compile)} measured fastest: {1.0 / per_sample:,.0f} samples/s "
                         f"expected at {choice.steps_per_call} step(s) per call")
        return choice

    def _estimate(self, mode):
        """(seconds per sample, Choice) for `mode` from its timed calls (`call_timing`)."""
        estimate = call_timing.estimate(self._calls.get(mode), self._reference_batch,
                                        self._fixed_steps, self._max_steps)
        return None if estimate is None else (estimate[0], Choice(mode, estimate[1], ""))
