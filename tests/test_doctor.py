"""tapeworks doctor: real GPU-machine output parsed, the TensorFlow side faked, real processes.

`fixtures/gpu-h200/` (from shared/fixtures) holds what an H200 machine with driver 580 and
CUDA 13 only printed. The TensorFlow side is the 2.21 pip wheel's build
information (CUDA 12.5.1, cuDNN 9). A fake `nvidia-smi` on PATH (a real
process) stands in where the tool's absence, hang or odd output is tested.
"""

import json
import os
import pathlib
import stat
import subprocess
import sys

import pytest

from tapeworks import doctor
from tapeworks.doctor import checks, facts

# A copy of shared/fixtures/gpu-h200 (see its README), kept with the tests.
FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "gpu-h200"
TF_221_BUILD = {"cuda_compute_capabilities": ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"],
                "cuda_version": "12.5.1", "cudnn_version": "9", "is_cuda_build": True}
PACKAGES = {"tensorflow": "2.21.0", "keras": "3.15.1"}


def fixture(name):
    return (FIXTURES / name).read_text()


def h200_facts(**changes):
    driver, cuda = facts.parse_nvidia_smi_banner(fixture("nvidia-smi.txt"))
    found = facts.Facts(
        python="3.11.9", packages=dict(PACKAGES), tf_build=dict(TF_221_BUILD), tf_gpus=[],
        nvidia_gpus=facts.parse_nvidia_smi_query(fixture("nvidia-smi-query.csv")),
        driver=driver, driver_cuda=cuda,
        libraries=facts.parse_ldconfig(fixture("cuda-env.txt")),
        cpu_flags={"avx", "avx2", "avx512f"})
    for key, value in changes.items():
        setattr(found, key, value)
    return found


def by_id(report_checks):
    return {c.id: c for c in report_checks}


def test_parsers_read_the_real_outputs():
    gpus = facts.parse_nvidia_smi_query(fixture("nvidia-smi-query.csv"))
    assert gpus == [facts.Gpu("NVIDIA H200", "580.159.04", "9.0", 143771)]
    assert facts.parse_nvidia_smi_banner(fixture("nvidia-smi.txt")) == ("580.159.04", "13.0")
    libraries = facts.parse_ldconfig(fixture("cuda-env.txt"))
    assert libraries["libcudart"] == {"13"} and libraries["libcublas"] == {"13"}
    assert libraries["libcudnn"] == {"9"} and libraries["libcuda"] == {"1"}
    assert "12" not in libraries["libcudart"]


def test_cuda_13_only_and_a_cuda_12_wheel_is_named_exactly():
    found = by_id(checks.all_checks(h200_facts()))
    libraries = found["cuda_libraries"]
    assert libraries.status == checks.FAIL
    assert "built for CUDA 12.5.1" in libraries.found
    assert "libcudart.so.12" in libraries.found and "libcublas.so.12" in libraries.found
    assert "CUDA 13 only" in libraries.found
    assert "TensorFlow will not use the GPU" in libraries.found
    assert 'pip install "tensorflow[and-cuda]"' in libraries.fix
    # The driver (CUDA 13.0) is new enough for a CUDA 12.5 build: not the problem.
    assert found["nvidia_driver"].status == checks.PASS
    assert "580.159.04" in found["nvidia_driver"].found
    gpus = found["gpus"]
    assert gpus.status == checks.FAIL and "TensorFlow sees none" in gpus.found
    assert gpus.fix == libraries.fix
    gpu = found["gpu0"]
    assert "NVIDIA H200, compute capability 9.0, 143,771 MiB" in gpu.found
    assert "mixed_bfloat16" in gpu.found
    # sm_90 is not prebuilt in the wheel (compute_90 PTX is): a start-up warning.
    assert gpu.status == checks.WARN and "PTX" in gpu.found


def test_a_matching_pair_passes():
    pip = {"nvidia-cuda-runtime-cu12": "12.5.82", "nvidia-cublas-cu12": "12.5.3.2",
           "nvidia-cudnn-cu12": "9.3.0.75"}
    found = by_id(checks.all_checks(h200_facts(
        packages=dict(PACKAGES, **pip), tf_gpus=[("NVIDIA H200", "9.0")])))
    assert found["cuda_libraries"].status == checks.PASS
    assert "libcudart.so.12/13" in found["cuda_libraries"].found
    assert found["gpus"].status == checks.PASS
    assert found["gpu_memory"].status == checks.PASS and found["gpu_memory"].fix


def test_an_old_driver_is_named():
    found = by_id(checks.all_checks(h200_facts(driver_cuda="12.2")))
    assert found["nvidia_driver"].status == checks.FAIL
    assert "Upgrade the NVIDIA driver" in found["nvidia_driver"].fix


def test_cpu_only_tensorflow_on_a_gpu_machine():
    found = by_id(checks.all_checks(h200_facts(tf_build={"is_cuda_build": False})))
    assert found["cuda_libraries"].status == checks.FAIL
    assert "CPU-only" in found["cuda_libraries"].found


def test_versions_against_the_support_table():
    found = by_id(checks.all_checks(h200_facts(packages={"tensorflow": "2.21.0",
                                                         "keras": "3.10.0"})))
    assert found["keras"].status == checks.FAIL
    assert "safe_mode" in found["keras"].found and "keras>=3.13.2" in found["keras"].fix
    found = by_id(checks.all_checks(h200_facts(python="3.9.18")))
    assert found["python"].status == checks.FAIL
    found = by_id(checks.all_checks(h200_facts(packages={"tensorflow": "2.99.0",
                                                         "keras": "3.15.1"})))
    assert found["tensorflow"].status == checks.WARN
    found = by_id(checks.all_checks(h200_facts(packages={"keras": "3.15.1"})))
    assert found["tensorflow"].status == checks.FAIL


def test_cpu_features_and_bfloat16():
    native = checks.check_cpu(h200_facts(cpu_flags={"avx", "avx2", "avx512f", "avx512_bf16",
                                                    "amx_bf16", "amx_tile"}))
    assert native.status == checks.PASS and "native bfloat16" in native.found
    plain = checks.check_cpu(h200_facts(cpu_flags={"avx", "avx2"}))
    assert "no native bfloat16" in plain.found
    assert checks.check_cpu(h200_facts(cpu_flags={"sse4_2"})).status == checks.FAIL


def test_onednn_verbose_output_is_parsed():
    text = (FIXTURES.parent / "onednn" / "amd-epyc-avx512-bf16.txt").read_text()
    assert facts.parse_onednn_verbose(text) == {
        "version": "3.7.3", "isa": "Intel AVX-512 with Intel DL Boost and bfloat16 support",
        "bf16_matmul": "brg_matmul:avx512_core_bf16"}
    assert facts.parse_onednn_verbose("unrelated\nonednn_verbose,v1,info,cpu,nthr:1") == {}


@pytest.mark.parametrize("flags, kernel, status, says", [
    ({"avx", "avx2", "avx512f", "avx512_bf16"}, "brg_matmul:avx512_core_bf16", checks.PASS,
     "(AVX512_BF16 instructions)"),
    ({"avx", "avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"},
     "brg_matmul:avx512_core_amx", checks.PASS, "(AMX tiles)"),
    # The CPU has AMX, but oneDNN does not run on it (an old kernel, a capped ISA).
    ({"avx", "avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"},
     "brg_matmul:avx512_core_bf16", checks.WARN, "not on the CPU's AMX tiles"),
    ({"avx", "avx2"}, "brg_matmul:avx2", checks.PASS, "converted to float32"),
])
def test_the_cpu_check_names_onednns_bfloat16_kernel(flags, kernel, status, says):
    check = checks.check_cpu(h200_facts(cpu_flags=flags,
                                        onednn={"version": "3.7.3", "bf16_matmul": kernel}))
    assert check.status == status and says in check.found and kernel in check.found
    if status == checks.WARN:
        assert "ONEDNN_MAX_CPU_ISA" in check.fix


@pytest.mark.slow
def test_the_onednn_probe_runs_a_real_process():
    found = facts.Facts()
    facts.gather_onednn(found)
    # TensorFlow's CPU wheels use oneDNN for matmuls: its version at least.
    assert "version" in found.onednn, found.notes


# A fake nvidia-smi on PATH: a real process --------------------------------------

def fake_tool(folder, body):
    path = folder / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_a_fake_nvidia_smi_printing_the_real_outputs(tmp_path, monkeypatch):
    query = tmp_path / "query.csv"
    query.write_text(fixture("nvidia-smi-query.csv"))
    banner = tmp_path / "banner.txt"
    banner.write_text(fixture("nvidia-smi.txt"))
    fake_tool(tmp_path, f'if [ -n "$1" ]; then cat "{query}"; else cat "{banner}"; fi')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    found = facts.Facts()
    facts.gather_nvidia(found)
    assert found.nvidia_gpus[0].name == "NVIDIA H200"
    assert (found.driver, found.driver_cuda) == ("580.159.04", "13.0")
    assert found.notes == []


def test_no_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))   # nothing there
    found = facts.Facts()
    facts.gather_nvidia(found)
    assert found.nvidia_gpus == [] and "not installed" in found.notes[0]
    check = by_id(checks.check_gpu_stack(found))["nvidia_driver"]
    assert check.status == checks.PASS and "runs on the CPU" in check.found


def test_a_hanging_nvidia_smi_times_out(tmp_path, monkeypatch):
    fake_tool(tmp_path, "sleep 30")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    found = facts.Facts()
    facts.gather_nvidia(found, run=lambda args: facts.run_tool(args, timeout=1))
    assert found.nvidia_gpus == [] and "did not answer within 1 s" in found.notes[0]


def test_unexpected_nvidia_smi_output(tmp_path, monkeypatch):
    fake_tool(tmp_path, 'echo "NVIDIA-SMI has failed because it could not communicate"')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    found = facts.Facts()
    facts.gather_nvidia(found)
    assert found.nvidia_gpus == [] and "unexpected" in found.notes[0]
    failing = tmp_path / "fail"
    failing.mkdir()
    fake_tool(failing, 'echo "driver not loaded" >&2; exit 9')
    monkeypatch.setenv("PATH", f"{failing}{os.pathsep}{os.environ['PATH']}")
    found = facts.Facts()
    facts.gather_nvidia(found)
    assert "exit 9: driver not loaded" in found.notes[0]


# On this machine ----------------------------------------------------------------

@pytest.mark.slow
def test_doctor_json_on_this_machine():
    done = subprocess.run([sys.executable, "-m", "tapeworks.cli", "doctor", "--json"],
                          capture_output=True, text=True, timeout=300)
    report = json.loads(done.stdout)
    assert report["schema"] == doctor.SCHEMA
    assert set(report) == {"schema", "tapeworks", "ok", "summary", "checks", "notes"}
    assert done.returncode == (0 if report["ok"] else 1)
    ids = [c["id"] for c in report["checks"]]
    for expected in ("python", "tensorflow", "keras", "nvidia_driver", "cpu", "gpu_memory",
                     "smoke_import", "smoke_devices", "smoke_matmul", "smoke_gradient", "xla",
                     "smoke_fit"):
        assert expected in ids
    for check in report["checks"]:
        assert set(check) == {"id", "title", "status", "found", "fix", "seconds"}
        assert check["status"] in ("pass", "warn", "fail")
    smoke = {c["id"]: c for c in report["checks"]}
    assert smoke["smoke_fit"]["status"] == "pass" and smoke["smoke_fit"]["seconds"] > 0
    assert smoke["xla"]["status"] == "pass"
    assert report["summary"]["fail"] == sum(c["status"] == "fail" for c in report["checks"])


def test_doctor_quick_text(capsys):
    report = doctor.diagnose(h200_facts(), quick=True, smoke_checks=False)
    assert not report.ok
    text = report.text()
    assert "FAIL  CUDA libraries" in text and "fix: pip install" in text
    assert report.to_json()["summary"]["fail"] == 2


def test_a_tensorflow_that_fails_to_import_is_a_failed_check_with_the_fix():
    from tapeworks.doctor import smoke

    found = smoke.run(import_error=ImportError("libcudart.so.12: cannot open shared object"))
    assert [c.id for c in found] == ["smoke_import"]
    check = found[0]
    assert check.status == checks.FAIL
    assert check.found == "ImportError: libcudart.so.12: cannot open shared object"
    assert "pip install --force-reinstall" in check.fix
    report = doctor.Report(found, [])
    assert not report.ok and report.to_json()["summary"]["fail"] == 1
