"""Two worker processes under MultiWorkerMirroredStrategy, started by `tapeworks launch`.

They train as one process does at the same global batch: the dataset is
sharded between the workers, the gradients all-reduced over loopback, the
counters and the logs agree.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def test_two_workers_train_like_one_process(tmp_path):
    env = dict(os.environ, TAPEWORKS_PLAN_CACHE="0", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    command = [sys.executable, "-m", "tests.distribute.multiworker", str(tmp_path)]
    launched = subprocess.Popen(
        [sys.executable, "-m", "tapeworks.cli", "launch", "--workers", "2", "--", *command],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    single = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    output, _ = launched.communicate(timeout=300)
    assert launched.returncode == 0, output[-3000:]
    assert single.returncode == 0, single.stderr[-3000:]
    results = {name: json.loads((tmp_path / f"{name}.json").read_text())
               for name in ("single", "worker-0", "worker-1")}
    assert results["single"]["replicas"] == 1
    # One process may checkpoint its pipeline's iterator: not refused there.
    assert results["single"]["refused"] is None
    for worker in ("worker-0", "worker-1"):
        result = results[worker]
        assert result["replicas"] == 2
        assert result["strategy"] in ("MultiWorkerMirroredStrategy",
                                      "CollectiveAllReduceStrategy")
        assert result["steps"] == results["single"]["steps"] == 12
        for one, several in zip(results["single"]["weights"], result["weights"]):
            np.testing.assert_allclose(several, one, rtol=0, atol=1e-6)
        # One file for two workers: by data under AUTO (8 records, global batch 4),
        # a clear error under FILE, before any step.
        assert result["sharding"]["auto_steps"] == 2
        assert "reads 1 file(s) and asks for FILE sharding between 2 workers" in \
            result["sharding"]["file_refused"]
        assert "under 2 workers" in result["refused"]
        assert 'checkpoint_data="skip"' in result["refused"]
        for key, values in results["single"]["history"].items():
            np.testing.assert_allclose(result["history"][key], values, rtol=1e-5)
