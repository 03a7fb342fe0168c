"""The doctor's checks: pure functions of `Facts`, each a pass / warn / fail with the fix.

Versions are judged against `support.json` (the one support table) and the
installed TensorFlow's own metadata (its `Requires-Python` and Keras
requirement). The GPU checks follow the chain TensorFlow needs: a driver
whose CUDA is at least the one TensorFlow was built for, that CUDA's
runtime/cuBLAS and a cuDNN of the same major version found by the loader
(system-wide or from pip's `nvidia-*` packages), then the GPUs themselves.
"""

import dataclasses
import json
import os

PASS, WARN, FAIL = "pass", "warn", "fail"


@dataclasses.dataclass
class Check:
    """One line of the report. `id` is stable (the JSON schema's key)."""

    id: str
    title: str
    status: str
    found: str
    fix: str = ""
    seconds: float = None


def support_table():
    with open(os.path.join(os.path.dirname(__file__), "support.json"), encoding="utf-8") as f:
        return json.load(f)


def version_tuple(text):
    parts = []
    for piece in str(text).split("."):
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _release(table, tf_version):
    return table["tensorflow"]["releases"].get(".".join(map(str, version_tuple(tf_version)[:2])))


def check_versions(facts, table):
    checks = []
    tf_version = facts.packages.get("tensorflow") or facts.packages.get("tensorflow-cpu")
    keras_version = facts.packages.get("keras")
    release = _release(table, tf_version) if tf_version else None

    low, high = (release or {}).get("python", [table["python"]["minimum"], None])
    python = version_tuple(facts.python)
    if python < version_tuple(table["python"]["minimum"]) or (
            release and not version_tuple(low) <= python[:2] <= version_tuple(high)):
        checks.append(Check("python", "Python", FAIL, f"Python {facts.python}",
                            f"Use Python {low} to {high} with TensorFlow {tf_version}."))
    else:
        checks.append(Check("python", "Python", PASS, f"Python {facts.python}"
                            + (f" (TensorFlow {tf_version} supports {low} to {high})"
                               if release else "")))

    minimum = table["tensorflow"]["minimum"]
    if tf_version is None:
        checks.append(Check("tensorflow", "TensorFlow", FAIL, "TensorFlow is not installed",
                            f"pip install \"tensorflow>={minimum}\""))
    elif version_tuple(tf_version) < version_tuple(minimum):
        checks.append(Check("tensorflow", "TensorFlow", FAIL, f"TensorFlow {tf_version}",
                            f"tapeworks needs TensorFlow >= {minimum}: "
                            f"pip install -U \"tensorflow>={minimum}\""))
    elif release is None:
        checks.append(Check("tensorflow", "TensorFlow", WARN,
                            f"TensorFlow {tf_version}, newer than the support table "
                            f"(tested: {', '.join(table['tensorflow']['tested'])})",
                            "Report problems with the versions in `tapeworks doctor --json`."))
    else:
        checks.append(Check("tensorflow", "TensorFlow", PASS, f"TensorFlow {tf_version}"))

    if keras_version is None:
        checks.append(Check("keras", "Keras", FAIL, "Keras is not installed",
                            f"pip install \"keras>={table['keras']['minimum']}\""))
    else:
        bad = next((b for b in table["keras"]["known_bad"]
                    if version_tuple(keras_version) < version_tuple(b["below"])), None)
        needs = (release or {}).get("keras")
        if bad:
            checks.append(Check("keras", "Keras", FAIL, f"Keras {keras_version}: {bad['why']}",
                                bad["fix"]))
        elif version_tuple(keras_version)[:1] != (3,):
            checks.append(Check("keras", "Keras", FAIL, f"Keras {keras_version}",
                                "tapeworks works with Keras 3: pip install \"keras>=3.13.2,<4\""))
        elif needs and version_tuple(keras_version) < version_tuple(needs):
            checks.append(Check("keras", "Keras", FAIL,
                                f"Keras {keras_version}; TensorFlow {tf_version} needs >= {needs}",
                                f"pip install -U \"keras>={needs}\""))
        else:
            checks.append(Check("keras", "Keras", PASS, f"Keras {keras_version}"
                                + (f" with TensorFlow {tf_version}" if tf_version else "")))
    return checks


def _have(facts, library):
    """CUDA/cuDNN major versions of `library` the loader or pip provides."""
    from tapeworks.doctor.facts import pip_libraries

    found = set(facts.libraries.get(library, set()))
    found |= pip_libraries(facts.packages).get(library, set())
    return found


def check_gpu_stack(facts):
    """Driver -> CUDA libraries -> TensorFlow's GPUs: the chain, and where it breaks."""
    build = facts.tf_build or {}
    tf_cuda = build.get("cuda_version")
    tf_cudnn = build.get("cudnn_version")
    smi_gpus = facts.nvidia_gpus
    checks = []
    if not smi_gpus:
        why = "; ".join(facts.notes) or "nvidia-smi lists no GPU"
        checks.append(Check("nvidia_driver", "NVIDIA driver", PASS,
                            f"no NVIDIA GPU found ({why}): training runs on the CPU"))
        if facts.tf_gpus:
            checks.append(Check("gpus", "GPUs TensorFlow sees", PASS,
                                f"{len(facts.tf_gpus)} GPU(s): "
                                + ", ".join(name for name, _ in facts.tf_gpus)))
        return checks

    driver_cuda = facts.driver_cuda
    found = (f"driver {facts.driver or '?'}, supports CUDA up to {driver_cuda or '?'}; "
             f"{len(smi_gpus)} GPU(s): {', '.join(g.name for g in smi_gpus)}")
    if tf_cuda and driver_cuda and version_tuple(driver_cuda)[:2] < version_tuple(tf_cuda)[:2]:
        checks.append(Check("nvidia_driver", "NVIDIA driver", FAIL,
                            found + f"; TensorFlow was built for CUDA {tf_cuda}",
                            f"Upgrade the NVIDIA driver to one that supports CUDA {tf_cuda} "
                            "or later (`nvidia-smi` shows the highest CUDA it supports)."))
    else:
        checks.append(Check("nvidia_driver", "NVIDIA driver", PASS, found))

    if not build.get("is_cuda_build"):
        checks.append(Check("cuda_libraries", "CUDA libraries", FAIL,
                            "this TensorFlow build has no CUDA support (a CPU-only wheel)",
                            "pip install \"tensorflow[and-cuda]\" (and uninstall tensorflow-cpu "
                            "if present)."))
    else:
        checks.append(_check_cuda_libraries(facts, tf_cuda, tf_cudnn))

    tf_gpus = facts.tf_gpus
    if tf_gpus is None:
        pass
    elif not tf_gpus:
        broken = next((c for c in checks if c.status == FAIL), None)
        checks.append(Check(
            "gpus", "GPUs TensorFlow sees", FAIL,
            f"nvidia-smi lists {len(smi_gpus)} GPU(s) but TensorFlow sees none"
            + (f": {broken.title.lower()} check failed" if broken else ""),
            broken.fix if broken else
            "Run `python -c \"import tensorflow as tf; tf.config.list_physical_devices('GPU')\"` "
            "with TF_CPP_MIN_LOG_LEVEL=0 and read the first 'Could not load dynamic library' "
            "line; check NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES."))
    else:
        checks.append(Check("gpus", "GPUs TensorFlow sees", PASS,
                            f"{len(tf_gpus)} GPU(s): "
                            + ", ".join(f"{n} ({c})" for n, c in tf_gpus)))
    checks.extend(check_gpu_capabilities(facts))
    return checks


def _check_cuda_libraries(facts, tf_cuda, tf_cudnn):
    major = str(version_tuple(tf_cuda)[0]) if tf_cuda else None
    cudnn_major = str(version_tuple(tf_cudnn)[0]) if tf_cudnn else None
    needed = {"libcudart": major, "libcublas": major, "libcudnn": cudnn_major}
    missing = [lib for lib, want in needed.items() if want and want not in _have(facts, lib)]
    def listing(lib):
        versions = sorted(_have(facts, lib))
        return f"{lib}.so.{'/'.join(versions)}" if versions else f"no {lib}"

    found = ", ".join(listing(lib) for lib in needed)
    if not missing:
        return Check("cuda_libraries", "CUDA libraries", PASS,
                     f"TensorFlow built for CUDA {tf_cuda}, cuDNN {tf_cudnn}; found {found}")
    other = sorted(_have(facts, "libcudart") - {major})
    only_other = (f"this machine has CUDA {' and '.join(other)} only" if other
                  else "this machine has no CUDA runtime")
    pip_cuda = sorted(v for v in _have(facts, "libcudart") if v == major)
    return Check(
        "cuda_libraries", "CUDA libraries", FAIL,
        f"TensorFlow {facts.packages.get('tensorflow', '')} was built for CUDA {tf_cuda} and "
        f"cuDNN {tf_cudnn}: it needs "
        + ", ".join(f"{lib}.so.{needed[lib]}" for lib in missing)
        + f", and {only_other} ({found}"
        + ("" if pip_cuda else f"; no nvidia-*-cu{major} pip packages")
        + "). TensorFlow will not use the GPU.",
        f"pip install \"tensorflow[and-cuda]\" (brings the CUDA {major} and cuDNN "
        f"{cudnn_major} libraries from pip, beside the system's), or install the CUDA {major} "
        f"runtime, cuBLAS and cuDNN {cudnn_major} libraries.")


def check_gpu_capabilities(facts):
    """Each GPU's compute capability and memory, and what they mean for precision and start-up."""
    table = support_table()["precision"]
    built = (facts.tf_build or {}).get("cuda_compute_capabilities") or []
    checks = []
    for index, gpu in enumerate(facts.nvidia_gpus):
        capability = gpu.compute_capability
        memory = f"{gpu.memory_mib:,} MiB" if gpu.memory_mib else "memory unknown"
        if capability is None:
            checks.append(Check(f"gpu{index}", f"GPU {index}", WARN,
                                f"{gpu.name}, {memory}, compute capability unknown"))
            continue
        cc = version_tuple(capability)
        if cc >= version_tuple(table["bfloat16_compute_capability"]):
            precision = "precision=\"auto\" uses mixed_bfloat16 (bfloat16 from 8.0)"
        elif cc >= version_tuple(table["float16_compute_capability"]):
            precision = ("precision=\"auto\" uses mixed_float16 with loss scaling (float16 "
                         "from 7.0, no bfloat16)")
        else:
            precision = "no fast bfloat16 or float16: precision=\"auto\" stays float32"
        sm = "sm_" + capability.replace(".", "")
        status, fix, jit = PASS, "", ""
        if built and sm not in built:
            ptx = [c for c in built if c.startswith("compute_")
                   and version_tuple(c.split("_")[1]) <= (cc[0] * 10 + cc[1],)]
            if ptx:
                status = WARN
                jit = (f"; TensorFlow has no prebuilt kernels for {sm} (built for "
                       f"{', '.join(built)}): they are compiled from PTX at start-up")
                fix = ("The first start takes minutes while kernels compile; they are cached "
                       "in ~/.nv/ComputeCache. Set CUDA_CACHE_MAXSIZE=4294967296 so the "
                       "cache holds them all.")
            else:
                status = FAIL
                jit = f"; TensorFlow has no kernels for {sm} (built for {', '.join(built)})"
                fix = "Install a TensorFlow build that includes this GPU's architecture."
        checks.append(Check(f"gpu{index}", f"GPU {index}", status,
                            f"{gpu.name}, compute capability {capability}, {memory}: "
                            f"{precision}{jit}", fix))
    return checks


def check_cpu(facts):
    flags = facts.cpu_flags
    table = support_table()["precision"]
    if not flags:
        return Check("cpu", "CPU features", WARN, "the CPU's features could not be read "
                     "(not Linux?)")
    listed = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
              if f in flags]
    native = [f for f in table["cpu_bfloat16_flags"] if f in flags]
    if "avx" not in flags:
        return Check("cpu", "CPU features", FAIL, "no AVX: TensorFlow's pip wheels need it",
                     "Use a machine with AVX, or a TensorFlow built without it.")
    meaning = ("native bfloat16 (" + ", ".join(native) + "): precision=\"auto\" measures "
               "float32 against mixed_bfloat16 at the first long fit and keeps the faster, "
               "where the losses agree") if native else (
        "no native bfloat16: precision=\"auto\" stays float32 on this CPU (bfloat16 would be "
        "emulated, slower than float32)")
    found = f"{', '.join(listed) or 'none of avx2/avx512f/avx512_bf16/amx'}; {meaning}"
    kernel = facts.onednn.get("bf16_matmul")
    if kernel is None:
        return Check("cpu", "CPU features", PASS, found)
    found += f"; oneDNN {facts.onednn.get('version', '?')} runs bfloat16 matmuls with {kernel}"
    if "amx_bf16" in flags and "amx" not in kernel:
        return Check("cpu", "CPU features", WARN, found + ", not on the CPU's AMX tiles",
                     "A process may use AMX only where Linux (5.16 or later) grants it and a "
                     "hypervisor exposes its state; check `uname -r`, and that "
                     "ONEDNN_MAX_CPU_ISA is unset (or AVX512_CORE_AMX).")
    return Check("cpu", "CPU features", PASS, found + (
        " (AMX tiles)" if "amx" in kernel else
        " (AVX512_BF16 instructions)" if "bf16" in kernel else
        " (no bfloat16 instructions: converted to float32)"))


def check_memory_mode(facts):
    if not facts.tf_gpus:
        return Check("gpu_memory", "GPU memory mode", PASS, "no GPU in use")
    growth = facts.environment.get("TF_FORCE_GPU_ALLOW_GROWTH", "").lower() == "true" or (
        facts.tf_memory_growth and all(facts.tf_memory_growth.values()))
    if growth:
        return Check("gpu_memory", "GPU memory mode", PASS,
                     "memory growth: TensorFlow takes GPU memory as it needs it")
    return Check("gpu_memory", "GPU memory mode", PASS,
                 "TensorFlow's default: each process takes nearly all GPU memory at start",
                 "To share a GPU between processes: TF_FORCE_GPU_ALLOW_GROWTH=true, or "
                 "tf.config.experimental.set_memory_growth(gpu, True) before any op; for a cap, "
                 "tf.config.set_logical_device_configuration(gpu, "
                 "[tf.config.LogicalDeviceConfiguration(memory_limit=MiB)]).")


def all_checks(facts):
    table = support_table()
    return (check_versions(facts, table) + check_gpu_stack(facts)
            + [check_cpu(facts), check_memory_mode(facts)])
