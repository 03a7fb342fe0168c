"""A model's own `train_step` trains under MirroredStrategy (two replicas) as Keras' fit trains it.

The step is Keras code: its `compute_loss` divides by the replica count (Keras'
`scale_loss_for_distribution`), which tapeworks switches off only for its own
step, and its logs are the replicas' mean, as Keras reports them. Before, the
build's trace ran outside a replica context (the optimizer's `merge_call`
failed) and Keras' division was off inside the model's step (twice the update).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def test_an_own_train_step_on_two_replicas_trains_and_reports_as_keras():
    env = dict(os.environ, TAPEWORKS_PLAN_CACHE="0", TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-m", "tests.distribute.own_step_mirrored"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = {r["fit"]: r for r in map(json.loads, (
        line for line in done.stdout.splitlines() if line.startswith("{")))}
    keras_run, tapeworks_run = runs["keras"], runs["tapeworks"]
    assert keras_run["replicas"] == tapeworks_run["replicas"] == 2
    assert sorted(tapeworks_run["history"]) == sorted(keras_run["history"]) == ["loss", "mae"]
    for key, values in keras_run["history"].items():
        np.testing.assert_allclose(tapeworks_run["history"][key], values, rtol=1e-5, err_msg=key)
    for got, want in zip(tapeworks_run["weights"], keras_run["weights"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
