"""`tapeworks demo`'s arguments and what it says about the machine."""

import json
import subprocess
import sys

import pytest

from tapeworks.cli import build_parser
from tapeworks import machine
from tapeworks.demo import command


def demo_args(*argv):
    return build_parser().parse_args(["demo", *argv])


@pytest.mark.parametrize("argv, expected", [
    ([], (command.DEFAULT_EPOCHS, command.DEFAULT_SECONDS)),
    (["--seconds", "600"], (None, 600.0)),
    (["--epochs", "20"], (20, None)),
    (["--epochs", "2", "--seconds", "30"], (2, 30.0)),
])
def test_length_from_arguments(argv, expected):
    assert command.length(demo_args(*argv)) == expected


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "0"], "`--epochs` must be an integer >= 1. Received: --epochs 0."),
    (["--seconds", "-5"], "`--seconds` must be a number > 0. Received: --seconds -5."),
])
def test_length_refuses_nonsense(argv, message):
    with pytest.raises(SystemExit, match=message.replace(".", r"\.")):
        command.length(demo_args(*argv))


def test_describe_length():
    assert command.describe_length(4, 75.0) == "75 s or 4 epoch(s), whichever comes first"
    assert command.describe_length(None, 600.0) == "600 s"
    assert command.describe_length(3, None) == "3 epoch(s)"


def test_cpu_model_name_reads_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Example CPU @ 2.10GHz\nflags\t\t: fpu avx2\n")
    assert machine.cpu_model_name(str(cpuinfo)) == "Example CPU @ 2.10GHz"
    assert machine.cpu_model_name(str(tmp_path / "missing")) == ""


def test_describe_names_cores_flags_and_gpus():
    slow = machine.Machine(cpu="Some CPU", cores=2, total_cores=2, flags=("avx2",), gpus=())
    assert slow.describe() == ("Some CPU, 2 cores (CPU flags: avx2); "
                               "no GPU: training runs on the CPU")
    shared = machine.Machine(cpu="", cores=1, total_cores=8, flags=(), gpus=("NVIDIA H200",))
    assert shared.describe() == ("unknown CPU, 1 core of 8 (CPU flags: none of "
                                 "avx2/avx512f/avx512_bf16/amx_tile/amx_bf16); NVIDIA H200")


def test_gather_reads_this_machine():
    here = machine.gather()
    assert 1 <= here.cores <= here.total_cores
    assert list(here.flags) == [f for f in machine.SPEED_FLAGS if f in here.flags]


@pytest.mark.slow
def test_demo_with_a_time_budget_prints_the_machine_and_records_the_limits(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tapeworks.cli", "demo", "--quick", "--seconds", "3", "--quiet",
         "--out", str(tmp_path / "out"), "--json", str(tmp_path / "demo.json")],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("This machine: ")
    assert "CPU flags: " in result.stdout and "for 3 s (ask for more" in result.stdout
    summary = json.loads((tmp_path / "demo.json").read_text())
    assert (summary["epochs_limit"], summary["seconds_limit"]) == (None, 3.0)
    assert summary["steps"] > 0
    assert f"Trained {summary['steps']} steps" in result.stdout
