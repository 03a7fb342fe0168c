"""A measured choice is re-checked once against its runner-up, later in the run (`recheck`).

Fed with a fake clock, as tests/engine/plan/test_autotune.py: call = overhead +
steps x step time, so each expected decision can be worked out by hand.
"""

import pytest

from tapeworks.engine.plan import recheck
from tapeworks.engine.plan.autotune import CallPlanner

BATCH = 64
STEP = {False: 0.001, "update": 0.002}   # seconds a step, undisturbed: tf.function is faster


def drive(planner, calls, remaining=10**7, disturbed_while_tuning=1.0):
    """Runs `calls` calls; tf.function's calls while the planner tunes take `disturbed...` x longer."""
    asked = []
    for _ in range(calls):
        planner.remaining_steps = remaining
        probe = planner.next_call()
        slow = disturbed_while_tuning if planner.tuning and probe.jit is False else 1.0
        seconds = 0.001 + probe.steps * STEP[probe.jit] * slow
        planner.record(probe, probe.steps, probe.steps, probe.steps * BATCH, seconds)
        asked.append(probe)
    return asked


def tune(planner, disturbed_while_tuning=1.0):
    """Runs calls until the planner has chosen."""
    while planner.tuning:
        drive(planner, 1, disturbed_while_tuning=disturbed_while_tuning)


def test_a_choice_made_while_the_runner_up_was_disturbed_is_changed_by_the_recheck():
    # While tuning, tf.function's calls run 3x slower (other work on the
    # machine): 3 ms a step against the update's 2 ms, so the update wins
    # its check too. Undisturbed, tf.function steps in 1 ms.
    planner = CallPlanner("auto", "auto", xla_order=("update",))
    tune(planner, 3.0)
    assert not planner.tuning and planner.choice.jit_compile == "update"
    asked = drive(planner, 400)
    rechecks = [p for p in asked if p.kind == "recheck"]
    assert rechecks and {p.jit for p in rechecks} == {False, "update"}
    assert planner.choice.jit_compile is False
    steps = planner.choice.steps_per_call
    assert planner.choice.expected_samples_per_s == pytest.approx(
        steps * BATCH / (0.001 + steps * 0.001))
    assert any("re-checked" in note for note in planner.notes)
    assert set(planner.report()["rechecked"]) == {
        f"jit=False,steps={steps}", f"jit=update,steps={rechecks[0].steps}"}
    # Once only; every call after it runs the new choice.
    assert [p.kind for p in drive(planner, 200)] == ["chosen"] * 200


def test_a_right_choice_is_rechecked_once_and_kept():
    # The update really is faster here: 0.5 ms a step against tf.function's 1 ms.
    STEP["update"] = 0.0005
    try:
        planner = CallPlanner("auto", "auto", xla_order=("update",))
        tune(planner)
        assert planner.choice.jit_compile == "update"
        choice = planner.choice
        asked = drive(planner, 600)
        assert 0 < len([p for p in asked if p.kind == "recheck"]) <= 2 * 5
        assert planner.choice is choice
        assert asked[-1].kind == "chosen"
    finally:
        STEP["update"] = 0.002


def test_no_recheck_when_the_work_ahead_is_too_short_to_pay_for_it():
    planner = CallPlanner("auto", "auto", xla_order=("update",))
    tune(planner, 3.0)
    # Ten calls of the choice (about 1,000 steps), in a fit with 256 steps
    # left: the work expected ahead is far less than 20 re-checks would take.
    asked = drive(planner, 10, remaining=recheck.MIN_STEPS)
    assert not [p for p in asked if p.kind == "recheck"]
    assert planner.choice.jit_compile == "update"


def test_a_choice_from_the_plan_cache_is_not_rechecked():
    planner = CallPlanner("auto", "auto", xla_order=("update",))
    measured = CallPlanner("auto", "auto", xla_order=("update",))
    tune(measured, 3.0)
    planner.adopt(measured.choice)
    asked = drive(planner, 400)
    assert all(p.kind == "chosen" for p in asked)
