"""What the machine has: gathered once, parsed from the tools' own output.

Everything the checks judge comes through `Facts`, so that the checks are
pure functions of it: tests build `Facts` from a real GPU machine's captured
output (`nvidia-smi`, `ldconfig -p`) with a faked TensorFlow side. Gathering
never raises: a tool that is missing, fails, hangs (a timeout) or prints
something unexpected leaves its fact empty and a note saying why.
"""

import dataclasses
import os
import platform
import re
import subprocess
import sys
from importlib import metadata

NVIDIA_SMI_QUERY = ("--query-gpu=name,driver_version,compute_cap,memory.total,memory.used"
                    " --format=csv,noheader,nounits")
TIMEOUT_SECONDS = 10


@dataclasses.dataclass
class Gpu:
    name: str
    driver: str = None
    compute_capability: str = None    # "9.0"
    memory_mib: int = None


@dataclasses.dataclass
class Facts:
    python: str = platform.python_version()
    packages: dict = dataclasses.field(default_factory=dict)   # name -> version
    tf_build: dict = dataclasses.field(default_factory=dict)   # tf.sysconfig.get_build_info()
    tf_gpus: list = None           # [(name, compute capability)] TensorFlow sees; None: unknown
    tf_memory_growth: dict = dataclasses.field(default_factory=dict)  # gpu name -> bool
    nvidia_gpus: list = dataclasses.field(default_factory=list)  # [Gpu] from nvidia-smi
    driver: str = None
    driver_cuda: str = None        # the highest CUDA the driver supports ("13.0")
    libraries: dict = dataclasses.field(default_factory=dict)  # "libcudart" -> {"13"}
    cpu_flags: set = dataclasses.field(default_factory=set)
    # oneDNN, as TensorFlow runs it (`parse_onednn_verbose`): version, ISA, and the
    # kernel of a bfloat16 matmul ("brg_matmul:avx512_core_amx" on AMX tiles).
    onednn: dict = dataclasses.field(default_factory=dict)
    environment: dict = dataclasses.field(default_factory=dict)
    notes: list = dataclasses.field(default_factory=list)      # why a fact is missing


# Parsers of real tool output --------------------------------------------------

def parse_nvidia_smi_query(text):
    """[Gpu] from `nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,...`.

    Accepts the output with or without the header line and units.
    """
    gpus = []
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4 or fields[0].lower() == "name":
            continue
        memory = re.match(r"(\d+)", fields[3])
        capability = fields[2] if re.fullmatch(r"\d+\.\d+", fields[2]) else None
        gpus.append(Gpu(fields[0], fields[1] or None, capability,
                        int(memory.group(1)) if memory else None))
    return gpus


def parse_nvidia_smi_banner(text):
    """(driver version, CUDA version) from plain `nvidia-smi`'s banner, or Nones."""
    driver = re.search(r"Driver Version:\s*([\d.]+)", text)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", text)
    return (driver.group(1) if driver else None, cuda.group(1) if cuda else None)


_LIBRARY = re.compile(r"^\s*(lib(?:cudart|cublas|cublasLt|cudnn|cuda|nccl|cufft|cusolver|"
                      r"cusparse|curand|nvrtc|nvJitLink))\.so\.(\d+)\b")


def parse_ldconfig(text):
    """{"libcudart": {"13"}, "libcudnn": {"9"}, ...}: major versions the dynamic loader finds."""
    found = {}
    for line in text.splitlines():
        match = _LIBRARY.match(line)
        # ldconfig's own lines only ("libX.so.N (libc6,x86-64) => /path"), not a
        # listing of some folder printed beside them.
        if match and "=>" in line:
            found.setdefault(match.group(1), set()).add(match.group(2))
    return found


_PIP_LIBRARIES = {
    # pip package (CUDA major in the name) -> the library it ships
    "nvidia-cuda-runtime-cu": "libcudart", "nvidia-cublas-cu": "libcublas",
    "nvidia-cudnn-cu": "libcudnn", "nvidia-nccl-cu": "libnccl", "nvidia-cufft-cu": "libcufft",
}


def pip_libraries(packages):
    """{"libcudart": {"12"}, ...} from pip's `nvidia-*-cuXX` packages (tensorflow[and-cuda])."""
    found = {}
    for name, version in packages.items():
        for prefix, library in _PIP_LIBRARIES.items():
            match = re.fullmatch(re.escape(prefix) + r"(\d+)", name)
            if match:
                major = version.split(".")[0] if library == "libcudnn" else match.group(1)
                found.setdefault(library, set()).add(major)
    return found


def parse_onednn_verbose(text):
    """{"version", "isa", "bf16_matmul"} from oneDNN's ONEDNN_VERBOSE=1 lines (absent: left out).

    oneDNN prints `onednn_verbose,v1,info,oneDNN v3.7.3 ...`, `...,info,cpu,isa:<the
    ISA it dispatches for>` and, per primitive run, `...,primitive,exec,cpu,matmul,
    <implementation>,...,src:bf16...`: the implementation names the kernel
    (`brg_matmul:avx512_core_bf16` with AVX512_BF16 instructions,
    `brg_matmul:avx512_core_amx` on AMX tiles).
    """
    found = {}
    for line in text.splitlines():
        parts = line.strip().split(",")
        if not parts or parts[0] != "onednn_verbose":
            continue
        body = parts[2:] if len(parts) > 1 and parts[1].startswith("v") else parts[1:]
        if body[:1] == ["info"]:
            version = re.search(r"oneDNN v([\d.]+)", line)
            if version:
                found.setdefault("version", version.group(1))
            if len(body) > 2 and body[1] == "cpu" and body[2].startswith("isa:"):
                found.setdefault("isa", ",".join(body[2:])[len("isa:"):].strip())
        elif body[:4] == ["primitive", "exec", "cpu", "matmul"] and len(body) > 5 \
                and "src:bf16" in ",".join(body[5:]):
            found.setdefault("bf16_matmul", body[4])
    return found


# What a fresh process prints with ONEDNN_VERBOSE=1 for one bfloat16 matmul: oneDNN
# reads the variable once, at its first use, so the probe is a process of its own.
ONEDNN_PROBE = """\
import os
os.environ["ONEDNN_VERBOSE"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
a = tf.ones((64, 64), tf.bfloat16)
tf.matmul(a, a).numpy()
"""


# Gathering ----------------------------------------------------------------------

def run_tool(args, timeout=TIMEOUT_SECONDS):
    """(stdout, None) or (None, why it gave nothing): never raises."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return None, f"`{args[0]}` is not installed (not on PATH)"
    except subprocess.TimeoutExpired:
        return None, f"`{' '.join(args)}` did not answer within {timeout} s (hung)"
    except OSError as error:
        return None, f"`{args[0]}` could not run ({error})"
    if done.returncode != 0:
        first = (done.stderr or done.stdout).strip().splitlines()[:1]
        return None, (f"`{' '.join(args)}` failed (exit {done.returncode}"
                      + (f": {first[0]}" if first else "") + ")")
    return done.stdout, None


def gather_nvidia(facts, run=run_tool):
    out, why = run(["nvidia-smi"] + NVIDIA_SMI_QUERY.split())
    if out is None:
        facts.notes.append(why)
        return
    facts.nvidia_gpus = parse_nvidia_smi_query(out)
    if not facts.nvidia_gpus and out.strip():
        facts.notes.append("`nvidia-smi` printed something unexpected: "
                           + out.strip().splitlines()[0][:120])
    banner, why = run(["nvidia-smi"])
    if banner is not None:
        facts.driver, facts.driver_cuda = parse_nvidia_smi_banner(banner)
    elif why:
        facts.notes.append(why)
    if facts.driver is None and facts.nvidia_gpus:
        facts.driver = facts.nvidia_gpus[0].driver


def gather_libraries(facts, run=run_tool):
    out, why = run(["ldconfig", "-p"])
    if out is None:
        out, why2 = run(["/sbin/ldconfig", "-p"])
        if out is None:
            facts.notes.append(why)
            return
    facts.libraries = parse_ldconfig(out)


def installed_packages():
    names = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name:
            names[name] = dist.version
    return names


def gather_tensorflow(facts):
    import tensorflow as tf

    facts.tf_build = dict(tf.sysconfig.get_build_info())
    gpus = tf.config.list_physical_devices("GPU")
    facts.tf_gpus = []
    for gpu in gpus:
        details = tf.config.experimental.get_device_details(gpu)
        capability = details.get("compute_capability")
        facts.tf_gpus.append((details.get("device_name", gpu.name),
                              ".".join(map(str, capability)) if capability else None))
        try:
            facts.tf_memory_growth[gpu.name] = bool(tf.config.experimental.get_memory_growth(gpu))
        except (ValueError, RuntimeError):
            pass


def gather_onednn(facts, run=run_tool):
    out, why = run([sys.executable, "-c", ONEDNN_PROBE], timeout=120)
    if out is None:
        facts.notes.append(f"oneDNN's kernels unknown: {why}")
        return
    facts.onednn = parse_onednn_verbose(out)
    if not facts.onednn:
        facts.notes.append("oneDNN printed nothing with ONEDNN_VERBOSE=1 (TensorFlow built "
                           "without oneDNN, or TF_ENABLE_ONEDNN_OPTS=0)")


def gather(run=run_tool, with_tensorflow=True, probe_onednn=True):
    """All the facts of this machine.

    `probe_onednn`: start a process that runs one bfloat16 matmul under
    ONEDNN_VERBOSE (about a TensorFlow import's time) to read oneDNN's kernel.
    """
    from tapeworks.engine.step.precision import cpu_flags

    facts = Facts(python=platform.python_version())
    facts.packages = installed_packages()
    facts.cpu_flags = cpu_flags()
    facts.environment = {k: v for k, v in os.environ.items()
                         if k.startswith(("CUDA", "TF_", "XLA_", "LD_LIBRARY_PATH",
                                          "NVIDIA_VISIBLE_DEVICES"))}
    gather_nvidia(facts, run)
    gather_libraries(facts, run)
    if with_tensorflow:
        gather_tensorflow(facts)
        if probe_onednn:
            gather_onednn(facts, run)
    return facts
