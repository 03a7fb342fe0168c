"""The planner that chooses XLA and steps per call, fed with synthetic timings.

The costs are made up (call = overhead + steps * step time), so the expected
choice can be worked out by hand; nothing here measures the machine.
"""

import numpy as np
import pytest

import tapeworks
from tapeworks.engine.plan.autotune import (MAX_STEPS_PER_CALL, MIN_ROUNDS, ROUNDS, CallPlanner,
                                       Choice)
from tests.engine import models

BATCH = 64


def drive(planner, cost, calls=200, epoch_steps=None, remaining=10**7, with_kind=False):
    """Runs the planner against a cost model; returns the probes it asked for.

    `cost(jit, steps)` (or `cost(jit, steps, kind)` with `with_kind`) is the
    fake clock: the seconds a call takes. `remaining` is the work left in the
    fit, as the Trainer would tell it.
    """
    asked = []
    for _ in range(calls):
        if not planner.tuning:
            break
        planner.remaining_steps = remaining
        probe = planner.next_call()
        asked.append(probe)
        steps = probe.steps if epoch_steps is None else min(probe.steps, epoch_steps)
        seconds = cost(probe.jit, steps, probe.kind) if with_kind else cost(probe.jit, steps)
        planner.record(probe, probe.steps, steps, steps * BATCH, seconds)
    return asked


def test_fixed_settings_need_no_measurement():
    planner = CallPlanner(False, 4)
    assert not planner.tuning
    assert (planner.choice.jit_compile, planner.choice.steps_per_call) == (False, 4)


def test_picks_faster_mode_and_amortises_overhead():
    # XLA: 1 ms per step; XLA update only: 1.5 ms; tf.function: 2 ms; all 1.25 ms per call.
    def cost(jit, steps):
        return 0.00125 + steps * {True: 0.001, "update": 0.0015, False: 0.002}[jit]

    planner = CallPlanner("auto", "auto")
    asked = drive(planner, cost)
    assert planner.choice.jit_compile is True
    # Overhead 1.25 ms must fall under 0.5% of the call: n >= 0.00125 / (0.005 * 0.001) = 250
    # (251 when the float quotient lands a hair above 250 before the ceiling).
    assert planner.choice.steps_per_call in (250, 251)
    # tf.function first (the cheapest to start), 1 and n steps alternating;
    # then each XLA mode, since a long run can repay trying them.
    timed = [(p.jit, p.steps == 1) for p in asked if p.kind == "timed"]
    assert timed[:4] == [(False, True), (False, False)] * 2
    # tf.function starts with its loop call; an XLA mode with one step first.
    assert [p.jit for p in asked if p.kind == "first"] == ["update", True]
    assert [p.jit for p in asked if p.kind == "warm"] == [False, "update", True]


def test_never_keeps_a_choice_slower_than_one_step_tf_function():
    # The search phase says XLA with many steps wins, but when checked against
    # the baseline in alternating calls XLA turns out slower (say, a
    # recompilation on every call): the planner must fall back.
    state = {"verifying": False}

    def cost(jit, steps):
        if state["verifying"] and jit:
            return 10.0
        return 0.005 + steps * {True: 0.001, "update": 0.0015, False: 0.002}[jit]

    planner = CallPlanner("auto", "auto")
    while planner.tuning and planner.candidate is None:
        planner.remaining_steps = 10**7
        probe = planner.next_call()
        planner.record(probe, probe.steps, probe.steps, probe.steps * BATCH,
                       cost(probe.jit, probe.steps))
    state["verifying"] = True
    drive(planner, cost)
    # tf.function at the steps per call its own rounds measured best:
    # overhead 5 ms under 0.5% of a call of 2 ms steps -> 500, capped at 256.
    assert (planner.choice.jit_compile, planner.choice.steps_per_call) == (False, 256)
    assert "not faster" in planner.choice.reason


def test_rounds_stop_once_the_timings_agree_and_run_all_five_when_they_do_not():
    steady = CallPlanner(False, "auto")
    asked = drive(steady, lambda jit, steps: 0.001 + steps * 0.002)
    # Two rounds of 1 and 8 steps agree exactly.
    assert [p.steps for p in asked if p.kind == "timed"] == [1, 8, 1, 8]

    # Every other round 10% slower: the timings never lie within 5%.
    calls = {"n": 0}

    def noisy(jit, steps):
        calls["n"] += 1
        slow = 1.1 if (calls["n"] // 2) % 2 else 1.0
        return (0.001 + steps * 0.002) * slow

    restless = CallPlanner(False, "auto")
    asked = drive(restless, noisy)
    assert len([p for p in asked if p.kind == "timed"]) == 2 * ROUNDS


def test_the_check_of_an_xla_winner_stops_once_it_is_decided():
    # XLA steps in half tf.function's time: every checked call is faster
    # than every one-step tf.function call, so two rounds decide it.
    def cost(jit, steps):
        return 0.001 + steps * (0.001 if jit else 0.002)

    planner = CallPlanner("auto", "auto")
    asked = drive(planner, cost)
    assert planner.choice.jit_compile in (True, "update")
    chosen = (planner.choice.jit_compile, planner.choice.steps_per_call)
    checks = [(p.jit, p.steps) for p in asked if p.kind == "timed"
              and (p.jit, p.steps) in (chosen, (False, 1))][-2 * MIN_ROUNDS:]
    assert checks == [chosen, (False, 1)] * MIN_ROUNDS
    assert planner.report()["checked_against_baseline"][
        f"jit={chosen[0]},steps={chosen[1]}"]["repeats"] == MIN_ROUNDS


def test_steps_are_capped_by_half_an_epoch_and_call_length():
    def cost(jit, steps):
        return 0.01 + steps * 0.0001

    planner = CallPlanner(False, "auto")
    planner.limit_steps(20)
    drive(planner, cost, epoch_steps=40)
    assert planner.choice.steps_per_call == 20

    slow = CallPlanner(False, "auto")
    drive(slow, lambda jit, steps: 0.01 + steps * 0.4)  # 0.4 s per step
    assert slow.choice.steps_per_call == 2  # 1 s per call at most
    assert MAX_STEPS_PER_CALL >= 250


def test_probe_calls_grow_until_they_last_long_enough():
    # 0.1 ms per step, 0.2 ms per call: an 8-step call would last 1 ms, mostly
    # noise; the longer probe is sized to about 20 ms instead.
    planner = CallPlanner(False, "auto")
    asked = drive(planner, lambda jit, steps: 0.0002 + steps * 0.0001)
    search = [p.steps for p in asked if p.kind == "timed"]  # rounds of 1 and n steps
    assert search == [1, 67] * MIN_ROUNDS   # exact timings: clear after the least rounds


def test_cut_short_calls_are_not_measured():
    planner = CallPlanner(False, "auto")
    # Every call of 8 steps is cut to 5 by the end of the data: those are
    # retried, then given up; the choice rests on full calls only.
    drive(planner, lambda jit, steps: 0.001 * steps, epoch_steps=5)
    report = planner.report()
    assert "jit=False,steps=8" not in report["measured"]
    assert planner.choice is not None


def test_xla_failure_drops_only_the_failed_mode():
    planner = CallPlanner("auto", 4)
    planner.drop_xla(RuntimeError("no kernel"), True)
    assert planner.untried == ["update"]
    assert "XLA could not compile the XLA step" in planner.report()["notes"][0]
    planner.drop_xla(RuntimeError("no kernel"), "update")
    assert {p.jit for p in planner.queued()} == {False} and planner.untried == []


def steady_cost(first=0.3, warm=0.3, step=0.002, overhead=0.001, xla_step=0.001,
                xla_first=None):
    """A fake clock: first calls cost `first` (XLA: 4x), loop calls overhead + n x step."""
    def cost(jit, steps, kind):
        if kind == "first":
            return xla_first if (jit and xla_first) else first * (1 if jit is False else 4)
        if kind == "warm":
            return warm * (1 if jit is False else 4)
        return overhead + steps * (step if jit is False else xla_step)

    return cost


def drive_kinds(planner, cost, remaining, calls=400):
    return drive(planner, cost, calls=calls, remaining=remaining, with_kind=True)


def test_xla_is_never_tried_when_the_remaining_work_cannot_repay_its_start():
    # tf.function starts in 0.3 s (its first loop call) and steps in 2 ms.
    # 2,000 steps left: 4 s of work, at best 2 s to win, but trying the
    # XLA-fused update is predicted to cost 2 x 0.3 = 0.6 s, over 10% of 4 s.
    planner = CallPlanner("auto", "auto")
    asked = drive_kinds(planner, steady_cost(), remaining=2000)
    assert {p.jit for p in asked} == {False}
    assert planner.choice.jit_compile is False
    assert any("not tried" in note for note in planner.report()["notes"])


def test_xla_is_tried_when_a_long_run_can_repay_it():
    planner = CallPlanner("auto", "auto")
    asked = drive_kinds(planner, steady_cost(), remaining=2_000_000)
    # tf.function starts with its loop call; an XLA mode with one step first.
    assert [p.jit for p in asked if p.kind == "first"] == ["update", True]
    assert [p.jit for p in asked if p.kind == "warm"] == [False, "update", True]
    assert planner.choice.jit_compile in (True, "update")   # both step in 1 ms here


def test_an_xla_mode_whose_first_call_cannot_pay_is_dropped_at_once():
    # Predicted to pay (4 x 0.3 s against a long run), but its first call
    # takes 500 s: the rest of its start (the loop's compile) is not paid.
    planner = CallPlanner("auto", "auto")
    asked = drive_kinds(planner, steady_cost(xla_first=500.0), remaining=200_000)
    xla_kinds = [p.kind for p in asked if p.jit == "update"]
    assert xla_kinds == ["first"]
    assert any("dropped after its first call" in n for n in planner.report()["notes"])


def test_with_data_of_unknown_length_the_xla_decision_waits():
    planner = CallPlanner("auto", "auto")
    asked = drive_kinds(planner, steady_cost(), remaining=None, calls=20)
    assert planner.tuning and {p.jit for p in asked} == {False}
    assert asked[-1].kind == "hold" and asked[-1].steps > 1   # trains at its best meanwhile
    drive_kinds(planner, steady_cost(), remaining=2000)        # the epoch ended: 2,000 left
    assert planner.choice.jit_compile is False


def test_progress_status_names_the_mode_being_measured():
    planner = CallPlanner("auto", "auto")
    assert planner.status() == "tuning 1/3"
    seen = []
    while planner.tuning:
        planner.remaining_steps = 2_000_000
        probe = planner.next_call()
        seen.append((probe.jit, planner.status()))
        planner.record(probe, probe.steps, probe.steps, probe.steps * BATCH,
                       steady_cost()(probe.jit, probe.steps, probe.kind))
    assert seen[0] == (False, "tuning 1/3")
    assert ("update", "tuning 2/3") in seen and (True, "tuning 3/3") in seen
    assert planner.status() is None


def test_trainer_auto_resolves_and_reports():
    x, y = models.regression_data(n=2000)
    trainer = tapeworks.Trainer(models.sequential(), "sgd", "mse", seed=0)
    assert trainer.tuning is None and trainer.jit_compile is None
    fits = 0
    while trainer.tuning is None or trainer.tuning["jit_compile"] is None:
        # measuring carries over from fit to fit
        trainer.fit((x, y), batch_size=10, epochs=2, verbose=0)
        fits += 1
        assert fits < 10
    tuning = trainer.tuning
    assert trainer.jit_compile in (True, False, "update")
    assert 1 <= trainer.steps_per_call <= 100
    assert tuning["jit_compile"] == trainer.jit_compile
    assert "jit=False,steps=1" in tuning["measured"]
    # Measuring spent real training steps, none twice or lost.
    assert int(trainer.optimizer.iterations) == fits * 2 * 200
    # Each mode tried is traced twice (its first step alone, then inside the
    # loop), whatever the steps per call; later fits trace nothing new.
    assert trainer.traces["train_step"] <= 6
    traces = dict(trainer.traces)
    trainer.fit((x, y), batch_size=10, verbose=0)
    assert dict(trainer.traces) == traces


def test_measuring_carries_over_to_the_next_fit():
    x, y = models.regression_data(n=40)
    trainer = tapeworks.Trainer(models.sequential(), "sgd", "mse")
    trainer.fit((x, y), batch_size=10, verbose=0)  # 4 steps: far too few to choose
    assert trainer.tuning["reason"] == "still measuring"
    assert trainer.jit_compile is False   # the mode in use: tf.function first
    for _ in range(200):
        if trainer.tuning["jit_compile"] is not None:
            break
        trainer.fit((x, y), batch_size=10, verbose=0)
    assert trainer.jit_compile in (True, False, "update")
    assert np.isfinite(trainer.evaluate((x, y), batch_size=100, return_dict=True)["loss"])


@pytest.mark.parametrize("bad", [0, -1, 2.5, "many"])
def test_bad_steps_per_call(bad):
    with pytest.raises(tapeworks.ConfigError, match="steps_per_call"):
        tapeworks.Trainer(models.sequential(), "sgd", "mse", steps_per_call=bad)


def test_a_run_of_many_short_fits_reaches_xla_once_it_has_trained_enough():
    planner = CallPlanner("auto", "auto")
    drive_kinds(planner, steady_cost(), remaining=100)   # a short fit: XLA cannot pay yet
    assert planner.choice.jit_compile is False
    assert planner.report()["waiting_to_try"] == ["tf.function with an XLA-fused update", "XLA"]
    planner.reconsider()
    assert not planner.tuning   # still nothing to win
    planner.steps_trained = 5_000_000   # ... until it has trained for long
    planner.reconsider()
    assert planner.tuning and planner.next_call().jit == "update"
    drive_kinds(planner, steady_cost(), remaining=100)
    assert planner.choice.jit_compile in (True, "update")


def test_a_mode_a_run_could_not_afford_is_tried_by_a_later_run_of_the_same_plan():
    # Run 1: 2,000 steps of 2 ms (4 s) cannot repay the XLA update's predicted
    # 0.6 s start (over 10% of 4 s): it stays tf.function and its plan keeps
    # the waiting modes, what tf.function measured and the steps it trained.
    first = CallPlanner("auto", "auto")
    drive_kinds(first, steady_cost(), remaining=2000)
    assert first.choice.jit_compile is False
    first.steps_trained = 2000
    memory = first.memory()
    assert memory["waiting"] == ["update", True] and memory["steps_seen"] == 2000

    # Run 2 starts in that plan, with no measuring, and counts run 1's steps:
    # 2,000 + 2,000 expected steps (8 s) repay the update's 0.6 s but not
    # whole-step XLA's 1.5 s, which keeps waiting.
    second = CallPlanner("auto", "auto")
    second.adopt(first.choice, memory)
    assert not second.tuning and second.from_cache
    second.remaining_steps = 2000
    second.reconsider()
    assert second.tuning and not second.from_cache and second.next_call().jit == "update"
    asked = drive_kinds(second, steady_cost(), remaining=2000)
    assert {p.jit for p in asked} == {"update", False}   # False only to confirm the winner
    assert second.choice.jit_compile == "update"
    assert second.memory()["waiting"] == [True]


def test_steps_of_runs_that_used_a_plan_add_up_until_a_mode_can_pay():
    memory = None
    for run in range(10):
        planner = CallPlanner("auto", "auto")
        planner.limit_steps(50)   # epochs of 100 steps: a trial fits in a run
        if memory is None:
            drive_kinds(planner, steady_cost(), remaining=500)
            assert planner.choice.jit_compile is False
        else:
            planner.adopt(Choice(False, 4, "from the cache"), memory)
            planner.remaining_steps = 500
            planner.reconsider()
            if planner.tuning:
                break
        planner.steps_trained = 500    # each run trains 500 steps (1 s)
        memory = planner.memory()
        assert memory["steps_seen"] == 500 * (run + 1)
    # 0.6 s to start the update repays itself once the runs together reach
    # 6 s (3,000 steps): the seventh run (3,000 before it + 500 of its own).
    assert run == 5 and planner.next_call().jit == "update"


def test_a_plan_memory_from_another_version_is_ignored():
    planner = CallPlanner("auto", "auto")
    planner.adopt(Choice(False, 4, "from the cache"), {"waiting": ["update"], "calls": "?"})
    planner.remaining_steps = 10**9
    planner.reconsider()
    assert not planner.tuning and planner.choice.steps_per_call == 4
    fixed = CallPlanner(False, "auto")   # XLA not asked for: a memory changes nothing
    fixed.adopt(Choice(False, 4, "from the cache"), {"waiting": ["update"]})
    assert fixed.memory() is None


def test_a_later_run_too_short_to_finish_a_trial_does_not_start_one():
    # Runs 1 and 2 together repay the update's start, but run 2 has 60 steps
    # left: too few for the trial's start, timed rounds and check (its
    # results would be lost with the process). It waits for a longer run.
    first = CallPlanner("auto", "auto")
    drive_kinds(first, steady_cost(), remaining=2000)
    first.steps_trained = 10_000
    memory = first.memory()
    short = CallPlanner("auto", "auto")
    short.adopt(first.choice, memory)
    short.remaining_steps = 60
    short.reconsider()
    assert not short.tuning and short.memory()["waiting"] == ["update", True]
    longer = CallPlanner("auto", "auto")
    longer.adopt(first.choice, memory)
    longer.remaining_steps = 2000
    longer.reconsider()
    assert longer.tuning and longer.next_call().jit == "update"


def test_a_trial_is_started_only_when_its_check_at_the_chosen_steps_fits_too():
    # Epochs of 200 steps: calls of at most 100. The check of an XLA winner
    # runs calls as long as the winner's (up to 100 steps), so a trial of as
    # many rounds as tf.function's took (two: these timings agree exactly)
    # needs 2 + 2 x (1 + 8) + 2 x (1 + 100) = 222 steps. A run with 221 steps
    # left has room for the timed rounds but not for the check: it must not
    # start a trial that the process would end in the middle of (nothing
    # stored, the next run pays the start again).
    first = CallPlanner("auto", "auto")
    first.limit_steps(100)
    drive_kinds(first, steady_cost(), remaining=2000)
    first.steps_trained = 10_000
    memory = first.memory()
    for left, starts in ((221, False), (222, True)):
        planner = CallPlanner("auto", "auto")
        planner.limit_steps(100)
        planner.adopt(first.choice, memory)
        planner.remaining_steps = left
        planner.reconsider()
        assert planner.tuning is starts
        cost = steady_cost()
        while planner.tuning and left > 0:   # the fit's steps, counted down
            planner.remaining_steps = left
            probe = planner.next_call()
            steps = min(probe.steps, left)
            planner.record(probe, probe.steps, steps, steps * BATCH,
                           cost(probe.jit, steps, probe.kind))
            left -= steps
        assert not planner.tuning   # a started trial ended within the fit


def large_mlp_cost(update_step):
    """A fake clock shaped like `bench wallclock`'s large MLP on the 2-core CPU.

    tf.function starts in 0.7 s and steps in 0.125 s; the XLA update starts
    in 0.72 s (two calls of 0.36 s); whole-step XLA in 2 s, stepping in 0.062 s.
    """
    def cost(jit, steps, kind):
        if kind in ("first", "warm"):
            return {False: 0.7, "update": 0.36, True: 1.0}[jit]
        return 0.001 + steps * {False: 0.125, "update": update_step, True: 0.062}[jit]

    return cost


def run_counting_down(planner, cost, steps):
    """Runs a fit of `steps` steps, telling the planner how many are left; returns the probes."""
    asked = []
    while planner.tuning and steps > 0:
        planner.remaining_steps = steps
        probe = planner.next_call()
        ran = min(probe.steps, steps)
        planner.record(probe, probe.steps, ran, ran * BATCH, cost(probe.jit, ran, probe.kind))
        asked.append(probe)
        steps -= ran
    return asked


def test_time_a_measured_mode_won_pays_for_trying_the_next():
    # 200 steps (25 s at tf.function's speed). The update is tried first
    # (1.4 s predicted against a 2.5 s budget). When it steps in 0.087 s it
    # has won about 6 s over the 161 steps left, which pays whole-step XLA's
    # start, predicted from the update's measured one: min(5 x 0.7,
    # 3.5 x 0.72) = 2.52 s, against a budget of 2.0 + 6.1 - 0.72 s.
    planner = CallPlanner("auto", "auto")
    asked = run_counting_down(planner, large_mlp_cost(update_step=0.087), 200)
    assert [p.jit for p in asked if p.kind == "first"] == ["update", True]
    assert planner.choice.jit_compile is True
    # When the update wins nothing, the same start only has 10% of the run
    # (2.0 s, less the update's 0.72 s) and is not tried.
    planner = CallPlanner("auto", "auto")
    asked = run_counting_down(planner, large_mlp_cost(update_step=0.125), 200)
    assert [p.jit for p in asked if p.kind == "first"] == ["update"]
    assert any("XLA not tried yet: starting it was predicted to cost 2.52 s" in note
               for note in planner.report()["notes"])


def test_a_mode_reconsidered_after_a_check_is_timed_and_can_win():
    # 200 steps: the update is tried, checked and kept; whole-step XLA waits
    # (the update won nothing, so only 10% of the run may be spent). Once the
    # trainer has trained far more, XLA is reconsidered: its calls must be
    # timed as a mode's rounds (not taken for the finished check's) and win.
    planner = CallPlanner("auto", "auto")
    run_counting_down(planner, large_mlp_cost(update_step=0.12), 200)
    assert planner.choice.jit_compile == "update"
    assert planner.report()["waiting_to_try"] == ["XLA"]
    planner.steps_trained = 100_000
    planner.reconsider()
    assert planner.tuning and planner.next_call().jit is True
    run_counting_down(planner, large_mlp_cost(update_step=0.12), 10_000)
    assert planner.choice.jit_compile is True
    assert "jit=True,steps=1" in planner.report()["measured"]


def test_the_report_says_the_rate_expected_for_the_choice_and_the_rate_fit_achieves():
    # XLA at 1 ms a step, tf.function 2 ms, 1.25 ms a call: the choice's
    # rate is measured in the check's alternating calls at its steps per call.
    def cost(jit, steps):
        return 0.00125 + steps * {True: 0.001, "update": 0.0015, False: 0.002}[jit]

    planner = CallPlanner("auto", "auto")
    drive(planner, cost)
    choice = planner.choice
    steps = choice.steps_per_call
    expected = steps * BATCH / cost(choice.jit_compile, steps)
    report = planner.report()
    assert report["expected_samples_per_s"] == pytest.approx(expected)
    assert report["achieved_samples_per_s"] is None and report["achieved_calls"] == 0
    # Fit then runs the choice 20% slower (say, host work the timing missed);
    # a call cut short by the end of the data, and another mode, are not counted.
    for seconds in (1.2, 1.3, 1.1):
        planner.record(planner.next_call(), steps, steps, steps * BATCH,
                       seconds * cost(choice.jit_compile, steps))
    planner.record(planner.next_call(), steps, steps - 1, (steps - 1) * BATCH, 1e-6)
    report = planner.report()
    assert report["achieved_calls"] == 3
    assert report["achieved_samples_per_s"] == pytest.approx(expected / 1.2)


def test_a_choice_made_without_measuring_expects_no_rate():
    planner = CallPlanner(False, 4)
    assert planner.report()["expected_samples_per_s"] is None
