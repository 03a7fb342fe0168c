"""MirroredStrategy over two logical CPUs trains as one device does at the same global batch.

Each mode runs in a fresh process (logical devices are set before TensorFlow
starts): `tests/distribute/scenarios.py` trains every scenario and prints its
weights, fit logs, evaluate and predict results; here they are compared.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.distribute.scenarios import SCENARIOS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# One xdist worker takes the whole module, so its module fixture (two fresh
# processes, about 80-130 s on the slow CI machine) runs once, not once per worker.
pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.xdist_group("mirrored")]


@pytest.fixture(scope="module")
def runs():
    env = dict(os.environ, TAPEWORKS_PLAN_CACHE="0", TF_CPP_MIN_LOG_LEVEL="2")
    processes = {
        mode: subprocess.Popen(
            [sys.executable, "-m", "tests.distribute.scenarios", mode, *SCENARIOS],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for mode in ("one", "mirrored")}
    results = {}
    for mode, process in processes.items():
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-3000:]
        results[mode] = {r["name"]: r for r in map(json.loads, (
            line for line in out.splitlines() if line.startswith("{")))}
    return results


def _max_difference(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b))


# float32: only the order of the sums differs. Mixed precision computes each
# replica's half batch in 16 bits, so roundings differ by the format's step.
TOLERANCE = {"bfloat16": 1e-2, "float16": 1e-4}


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n != "batchnorm_per_replica"])
def test_two_replicas_train_like_one_device(runs, name):
    one, mirrored = runs["one"][name], runs["mirrored"][name]
    assert mirrored["replicas"] == 2 and one["replicas"] == 1
    # Every step ran once, counted once (the counters are updated once across replicas).
    assert one["steps"] == mirrored["steps"] == 12
    tolerance = TOLERANCE.get(name, 1e-5)
    assert _max_difference(one["weights"], mirrored["weights"]) < tolerance
    # Losses and metrics are aggregated over the replicas: the global batch's.
    assert set(one["history"]) == set(mirrored["history"])
    for key in one["history"]:
        np.testing.assert_allclose(mirrored["history"][key], one["history"][key],
                                   rtol=tolerance, atol=tolerance, err_msg=key)
    if "evaluate" in one:
        for key in one["evaluate"]:
            assert abs(one["evaluate"][key] - mirrored["evaluate"][key]) < tolerance, key
        # predict joins the replicas' outputs in the order of the batch.
        assert _max_difference([one["predict"]], [mirrored["predict"]]) < 10 * tolerance


def test_batchnorm_differs_per_replica_unless_synchronised(runs):
    # Without sync_batchnorm each replica normalises by its half batch's statistics.
    one = runs["one"]["batchnorm_per_replica"]
    mirrored = runs["mirrored"]["batchnorm_per_replica"]
    assert _max_difference(one["weights"], mirrored["weights"]) > 1e-3
    synced_one, synced = runs["one"]["sync_batchnorm"], runs["mirrored"]["sync_batchnorm"]
    assert _max_difference(synced_one["weights"], synced["weights"]) < 1e-5


def test_the_task_loss_rule_holds_for_keras_losses_and_plain_means(runs):
    # "reductions" adds a Keras loss object (which divides by the replica count
    # by itself) to a plain tf.reduce_mean (which does not): the logged terms
    # are the per-sample means of the global batch, as on one device.
    one, mirrored = runs["one"]["reductions"], runs["mirrored"]["reductions"]
    for term in ("keras", "plain"):
        np.testing.assert_allclose(mirrored["history"][term], one["history"][term],
                                   rtol=1e-5)


def test_captures_come_from_the_first_replica(runs):
    # capture_every=2 on the GAN: the same steps; under two replicas the first
    # replica's share of the batch (its first half), as on one device.
    one, mirrored = runs["one"]["gan"]["captured"], runs["mirrored"]["gan"]["captured"]
    assert [step for step, _ in one] == [step for step, _ in mirrored] and len(one) == 6
    for (_, whole), (_, share) in zip(one, mirrored):
        assert len(whole) == 16 and len(share) == 8
        np.testing.assert_allclose(share, whole[:8], rtol=0, atol=1e-5)
