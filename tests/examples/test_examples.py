"""The runnable examples, each in quick mode, as real processes."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_example(name, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "examples", name), "--quick",
                           *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_gan_digits(tmp_path):
    result = run_example("gan_digits.py", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "captures" in result.stdout
    assert (tmp_path / "samples.png").stat().st_size > 2_000


@pytest.mark.slow
def test_distill_digits():
    result = run_example("distill_digits.py")
    assert result.returncode == 0, result.stderr
    assert "teacher weights unchanged: True" in result.stdout
    teacher = float(result.stdout.split("teacher ")[1].split(",")[0])
    assert teacher > 0.9


@pytest.mark.slow
def test_explain_mlp():
    result = run_example("explain_mlp.py")
    assert result.returncode == 0, result.stderr
    assert "tapeworks explain: 4 steps of batch 32" in result.stdout
    assert "Verdict: " in result.stdout
