"""SIGTERM to one of two workers: every worker saves at the same step and exits; a relaunch
resumes, and every step runs exactly once.

Real processes: `tapeworks launch --workers 2` over `tests/distribute/preemptible.py`,
the signal sent to one worker's pid while it trains.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from tests.distribute import preemptible
from tests.distribute.preemptible import EPOCHS
from tests.forked import Forked

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = EPOCHS * 4   # 64 samples, global batch 16

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def _env():
    env = dict(os.environ, TAPEWORKS_PLAN_CACHE="0", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    return env


def _alone(checkpoint_dir, out):
    """One worker without the launcher, in a fresh process (forked: `tests/forked.py`)."""
    env = {"TAPEWORKS_PLAN_CACHE": "0", "TF_CONFIG": None}
    return Forked(preemptible.main, (str(checkpoint_dir), str(out)), env,
                  str(out) + "-alone").wait(timeout=300)


def _launch(checkpoint_dir, out, signal_worker_at=None):
    """Runs the launcher; with `signal_worker_at`, SIGTERM to worker 1 once it passed that step."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tapeworks.cli", "launch", "--workers", "2", "--",
         sys.executable, "-m", "tests.distribute.preemptible", str(checkpoint_dir), str(out)],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, pid, sent = [], None, []
    timer = threading.Timer(300, process.kill)
    timer.start()
    try:
        for line in process.stdout:
            lines.append(line)
            match = re.match(r"\[worker 1\] PID (\d+)", line)
            if match:
                pid = int(match.group(1))
            match = re.match(r"\[worker 1\] PROGRESS (\d+)", line)
            if match and signal_worker_at is not None and not sent \
                    and int(match.group(1)) >= signal_worker_at:
                os.kill(pid, signal.SIGTERM)
                sent.append(int(match.group(1)))
        process.wait()
    finally:
        timer.cancel()
    return process.returncode, "".join(lines), sent


def test_sigterm_to_one_worker_saves_everywhere_and_a_relaunch_finishes_exactly(tmp_path):
    checkpoint_dir, out = tmp_path / "ckpt", tmp_path / "out"
    out.mkdir()
    code, _, err = _alone(tmp_path / "single-ckpt", out)
    assert code == 0, err[-3000:]

    code, output, sent = _launch(checkpoint_dir, out, signal_worker_at=20)
    assert sent, output[-3000:]
    # The worker that got the signal and the one that did not both saved and
    # exited with 128 + SIGTERM; the launcher reports that status.
    assert code == 143, output[-3000:]
    saved = sorted(name for name in os.listdir(checkpoint_dir) if name.startswith("ckpt-"))
    assert saved, os.listdir(checkpoint_dir)
    assert not any(".partial" in name for name in saved)
    stopped_at = int(saved[-1].split("-")[1])
    assert sent[0] <= stopped_at < STEPS
    # Both saved the same step (the chief wrote it) and said so.
    for worker in (0, 1):
        assert re.search(rf"\[worker {worker}\] tapeworks: SIGTERM: saved \S*{saved[-1]}\. "
                         r"Run the same command again", output), output[-3000:]
    assert not (out / "worker-0.json").exists()
    # The chief's checkpoint restores on any number of workers: here, one.
    shutil.copytree(checkpoint_dir, tmp_path / "ckpt-copy")
    (tmp_path / "out-one").mkdir()
    code, stdout, err = _alone(tmp_path / "ckpt-copy", tmp_path / "out-one")
    assert code == 0, err[-3000:]
    assert int(re.search(r"PROGRESS (\d+)", stdout).group(1)) == stopped_at + 1

    code, output, _ = _launch(checkpoint_dir, out)
    assert code == 0, output[-3000:]
    for worker in (0, 1):
        # The relaunch starts after the saved step: no step runs twice.
        first = re.search(rf"\[worker {worker}\] PROGRESS (\d+)", output)
        assert int(first.group(1)) == stopped_at + 1
    one = json.loads((out / "single.json").read_text())
    for result_file in (out / "worker-0.json", out / "worker-1.json",
                        tmp_path / "out-one" / "single.json"):
        result = json.loads(result_file.read_text())
        # Every step once: the step counter is the steps asked for, and the
        # weights are an uninterrupted run's (data replayed from the seed).
        assert result["steps"] == one["steps"] == STEPS
        for want, got in zip(one["weights"], result["weights"]):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
