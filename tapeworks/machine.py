"""What this machine is, in the terms that decide training speed: cores, CPU flags, GPUs.

A first run's time depends mostly on the machine (the same demo trained in
42 s on one 2-core machine and 271 s on another), so the demo says what it
runs on, and every benchmark report records it beside its figures, in the
terms that decide speed: how many cores this process may use,
the CPU's vector and matrix extensions, and whether a GPU is there.
"""

import dataclasses
import os

from tapeworks.engine.step.precision import cpu_flags

# The CPU flags that decide TensorFlow's CPU speed, in the order they matter:
# 256-bit vectors, 512-bit vectors, bfloat16 dot products, AMX matrix tiles.
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


@dataclasses.dataclass
class Machine:
    """The facts the demo prints and benchmark reports record.

    Attributes:
        cpu: the CPU's model name ("" where it cannot be read).
        cores: cores this process may run on (its affinity), the parallelism
            TensorFlow gets.
        total_cores: cores the machine has.
        flags: which of `SPEED_FLAGS` the CPU has, in that order.
        gpus: the GPUs TensorFlow sees, by name.
    """

    cpu: str
    cores: int
    total_cores: int
    flags: tuple
    gpus: tuple

    def describe(self):
        """One line: `Intel Xeon, 2 cores (avx2 avx512f); no GPU`."""
        cores = f"{self.cores} core{'s' if self.cores != 1 else ''}"
        if self.total_cores != self.cores:
            cores += f" of {self.total_cores}"
        flags = " ".join(self.flags) or "none of " + "/".join(SPEED_FLAGS)
        gpus = ", ".join(self.gpus) if self.gpus else "no GPU: training runs on the CPU"
        return f"{self.cpu or 'unknown CPU'}, {cores} (CPU flags: {flags}); {gpus}"


def cpu_model_name(path="/proc/cpuinfo"):
    """The CPU's model name (Linux); "" where it cannot be read."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def gather():
    """The `Machine` this process runs on (imports TensorFlow to list its GPUs)."""
    import tensorflow as tf

    total = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else total
    flags = cpu_flags()
    gpus = tuple(tf.config.experimental.get_device_details(gpu).get("device_name", gpu.name)
                 for gpu in tf.config.list_physical_devices("GPU"))
    return Machine(cpu=cpu_model_name(), cores=usable, total_cores=total,
                   flags=tuple(f for f in SPEED_FLAGS if f in flags), gpus=gpus)
