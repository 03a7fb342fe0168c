"""The resume guarantee, proved with real processes killed by SIGKILL (and stopped by SIGTERM).

Each case trains `tests/engine/resume/worker.py` once without interruption (the
reference), then again in the same configuration killed at several points and
restarted with the same command until it finishes. The guarantee (README,
"Resume"): every step's logged loss equals the reference's at that step (so
the batches are the uninterrupted sequence: no repeat, no gap), and the final
weights, optimizer state and step counter are bitwise the reference's.

Kill points: ten drawn at random in every run (the drawn steps are printed
when a case fails), plus the hard cases: inside an accumulation window, on the
last batch of an epoch, during a save, while EarlyStopping waits, during the
"auto" planner's measuring calls, with a shuffled and augmented
`tapeworks.data.pipeline`, with Dropout (every MLP case), with a GAN Task
drawing noise, and a kill from outside at an arbitrary moment.

Each run is a fresh process forked from a server that has imported
TensorFlow once (`tests/forked.py`): the same guarantee as a new interpreter
(no TensorFlow runtime exists before the fork), ~10 s sooner per restart.
"""

import itertools
import json
import os
import random
import signal
import time

import numpy as np
import pytest

from tests.forked import Forked
from tests.engine.resume import worker

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

STEPS_PER_EPOCH = 6   # 96 samples, batches of 16


_starts = itertools.count()


def start(spec):
    """The worker in a fresh process (forked before any TensorFlow runtime exists)."""
    return Forked(worker.main, (spec,), {"TAPEWORKS_PLAN_CACHE": "0"},
                  f"{spec['log']}.{next(_starts)}")


def run(spec):
    return start(spec).wait(timeout=300)


def files(tmp_path, name, config):
    return dict(config, dir=str(tmp_path / f"{name}-ckpt"), log=str(tmp_path / f"{name}.log"),
                result=str(tmp_path / f"{name}.npz"))


def read_log(path):
    """{step: loss text} and the steps in the order they were logged."""
    lines = [line.split() for line in open(path).read().splitlines() if line]
    return {int(step): loss for step, loss in lines}, [int(step) for step, _ in lines]


def check_same_as_uninterrupted(tmp_path, config, kills, why=""):
    reference = files(tmp_path, "reference", config)
    code, _, err = run(reference)
    assert code == 0, err[-3000:]
    spec = files(tmp_path, "killed", config)
    codes = []
    for kill in kills:
        code, _, err = run(dict(spec, **kill))
        codes.append(code)
    code, _, err = run(spec)
    assert code == 0, err[-3000:]
    assert -signal.SIGKILL in codes, f"no kill happened ({codes}){why}"

    expected, _ = read_log(reference["log"])
    logged, order = read_log(spec["log"])
    # Every step logged by any of the processes, the steps repeated after a
    # restart included, has the uninterrupted run's loss at that step.
    for step in order:
        if step in expected:
            assert logged[step] == expected[step], f"step {step} differs{why}"
    assert max(order) == max(expected)
    a, b = np.load(reference["result"]), np.load(spec["result"])
    assert sorted(a.files) == sorted(b.files)
    for name in a.files:
        np.testing.assert_array_equal(a[name], b[name], err_msg=f"{name}{why}")
    return codes


def test_ten_random_kill_points_with_dropout_and_accumulation(tmp_path):
    # 5 epochs x 6 steps; windows of 4 micro-batches; a save every 5 steps.
    config = {"epochs": 5, "accumulate": 4, "every": 5}
    points = sorted(random.SystemRandom().sample(range(1, 5 * STEPS_PER_EPOCH), 10))
    points[0] = 2   # inside the first accumulation window, before any save
    codes = check_same_as_uninterrupted(
        tmp_path, config, [{"kill_at_step": p} for p in sorted(set(points))],
        why=f" (kill points {points})")
    assert codes.count(-signal.SIGKILL) >= 1


def test_kill_on_the_last_batch_of_an_epoch_and_mid_epoch_of_an_augmented_pipeline(tmp_path):
    check_same_as_uninterrupted(tmp_path, {"epochs": 3, "data": "pipeline", "every": 5},
                                [{"kill_at_step": STEPS_PER_EPOCH}, {"kill_at_step": 9}])


def test_kill_during_a_save_its_publication_and_a_gan_drawing_noise(tmp_path):
    # Asynchronous saves: the publication runs on its background thread.
    check_same_as_uninterrupted(tmp_path, {"epochs": 3, "model": "gan", "every": 4,
                                           "async": True},
                                [{"kill_in_save": 2}, {"kill_in_publish": 3},
                                 {"kill_at_step": 13}])
    # The interrupted saves left partial folders; the restarts removed them.
    names = os.listdir(tmp_path / "killed-ckpt")
    assert not [n for n in names if ".partial" in n]


def test_kill_while_early_stopping_waits(tmp_path):
    # min_delta=10 never counts as improvement: it waits from epoch 2 and
    # stops after epoch 3; the kill lands in epoch 3 with wait=1 saved.
    codes = check_same_as_uninterrupted(
        tmp_path, {"epochs": 8, "early_stopping": True, "every": "epoch"},
        [{"kill_at_step": 2 * STEPS_PER_EPOCH + 2}])
    assert codes[0] == -signal.SIGKILL
    run_json = json.load(open(tmp_path / "killed-ckpt" / "ckpt-000000000018" / "run.json"))
    assert run_json["callbacks"][1]["class"] == "EarlyStopping"


def test_kill_during_auto_measuring(tmp_path):
    # deterministic=True: "auto" measures steps per call with tf.function only.
    check_same_as_uninterrupted(tmp_path, {"epochs": 4, "auto": True, "every": 3},
                                [{"kill_at_step": 4}, {"kill_at_step": 14}])


def test_sigkill_from_outside_at_an_arbitrary_moment_and_sigterm_saves(tmp_path):
    config = {"epochs": 40, "every": 7}
    reference = files(tmp_path, "reference", config)
    code, _, err = run(reference)
    assert code == 0, err[-3000:]
    spec = files(tmp_path, "killed", config)

    def wait_for_steps(count):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if os.path.exists(spec["log"]) and sum(1 for _ in open(spec["log"])) >= count:
                return
            time.sleep(0.05)
        raise AssertionError("the worker did not train")

    process = start(spec)
    wait_for_steps(random.SystemRandom().randint(20, 60))
    os.kill(process.pid, signal.SIGKILL)
    code, _, _ = process.wait(timeout=60)
    assert code == -signal.SIGKILL

    process = start(spec)
    wait_for_steps(100)
    os.kill(process.pid, signal.SIGTERM)
    code, _, err = process.wait(timeout=60)
    assert code == 128 + signal.SIGTERM, err[-2000:]
    assert "SIGTERM: saved" in err and "Run the same command again" in err

    code, _, err = run(spec)
    assert code == 0, err[-3000:]
    expected, _ = read_log(reference["log"])
    logged, order = read_log(spec["log"])
    assert all(logged[s] == expected[s] for s in order)
    a, b = np.load(reference["result"]), np.load(spec["result"])
    for name in a.files:
        np.testing.assert_array_equal(a[name], b[name])
