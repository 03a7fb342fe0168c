"""The planner that chooses XLA and steps per call, fed with synthetic timings.

The costs are made up (call = overhead + steps * step time), so the expected
choice can be worked out by hand; nothing here measures the machine.
"""

import numpy as np
import pytest

import tapeworks
from tapeworks.engine.autotune import MAX_STEPS_PER_CALL, CallPlanner
from tests.engine import models

BATCH = 64


def drive(planner, cost, calls=200, epoch_steps=None):
    """Runs the planner against a cost model; returns the probes it asked for."""
    asked = []
    for _ in range(calls):
        if not planner.tuning:
            break
        probe = planner.next_call()
        asked.append(probe)
        steps = probe.steps if epoch_steps is None else min(probe.steps, epoch_steps)
        planner.record(probe, probe.steps, steps, steps * BATCH, cost(probe.jit, steps))
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
    # The probes alternate modes rather than running one mode's repeats in a row.
    timed = [p.jit for p in asked if p.kind == "timed"][:6]
    assert timed == [False, False, "update", "update", True, True]


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
    while planner.tuning and planner._candidate is None:
        probe = planner.next_call()
        planner.record(probe, probe.steps, probe.steps, probe.steps * BATCH,
                       cost(probe.jit, probe.steps))
    state["verifying"] = True
    drive(planner, cost)
    assert (planner.choice.jit_compile, planner.choice.steps_per_call) == (False, 1)
    assert "not faster" in planner.choice.reason


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
    search = [p.steps for p in asked if p.kind == "timed"][:6]  # 3 rounds of 1 and n steps
    assert search == [1, 67] * 3


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
    assert {p.jit for p in planner._queue} == {False, "update"}
    assert "XLA could not compile the XLA step" in planner.report()["notes"][0]
    planner.drop_xla(RuntimeError("no kernel"), "update")
    assert {p.jit for p in planner._queue} == {False}


def test_trainer_auto_resolves_and_reports():
    x, y = models.regression_data(n=2000)
    trainer = tapeworks.Trainer(models.sequential(), "sgd", "mse", seed=0)
    assert trainer.tuning is None
    fits = 0
    while trainer.jit_compile is None:  # measuring carries over from fit to fit
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
    assert trainer.jit_compile is None and trainer.tuning["reason"] == "still measuring"
    for _ in range(200):
        if trainer.jit_compile is not None:
            break
        trainer.fit((x, y), batch_size=10, verbose=0)
    assert trainer.jit_compile in (True, False, "update")
    assert np.isfinite(trainer.evaluate((x, y), batch_size=100, return_dict=True)["loss"])


@pytest.mark.parametrize("bad", [0, -1, 2.5, "many"])
def test_bad_steps_per_call(bad):
    with pytest.raises(tapeworks.ConfigError, match="steps_per_call"):
        tapeworks.Trainer(models.sequential(), "sgd", "mse", steps_per_call=bad)
