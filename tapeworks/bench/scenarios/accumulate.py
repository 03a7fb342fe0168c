"""Scenario `accumulate`: what gradient accumulation costs in time and saves in memory.

Throughput: `accumulate=4` at micro-batch B against plain training at batch B,
alternating in one process. Memory: peak memory of `accumulate=8` at
micro-batch B against plain training at batch B and at batch 8B. Peak
resident memory only ever grows within a process, so each memory case runs in
a fresh process of its own (`python -m tapeworks.bench.scenarios.accumulate`),
and reports its peak over the memory it had once the model was built: the
memory that training adds. On a GPU the peak of
`tf.config.experimental.get_memory_info` is reported instead.
"""

import json
import os
import statistics
import subprocess
import sys

import keras
import numpy as np
import tensorflow as tf

from tapeworks.bench.data import in_memory_dataset
from tapeworks.bench.memory import PeakSampler, rss_bytes
from tapeworks.bench.timing import QUICK_SETTLING, Approach, alternate, settle_trainer
from tapeworks.engine import Trainer

DESCRIPTION = ("accumulate=4 vs plain throughput; peak memory of accumulate=8 at B vs "
               "plain B and 8B (separate processes)")


def build_convnet(side, width, seed=0):
    """A small convolutional net whose activations, not weights, fill memory."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((side, side, 3)),
        keras.layers.Conv2D(width, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(width, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(2 * width, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])


def _config(quick):
    return dict(side=32, width=16, micro=16, steps=16) if quick else \
        dict(side=64, width=32, micro=64, steps=24)


def _data(side, samples, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, side, side, 3)).astype("float32")
    y = rng.integers(0, 10, samples).astype("int32")
    return x, y


def _trainer(side, width, accumulate, **options):
    return Trainer(build_convnet(side, width), keras.optimizers.Adam(1e-3),
                   keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                   accumulate=accumulate, **options)


def measure_memory(accumulate, batch, side, width, steps):
    """Runs in its own process: trains, returns memory figures in MiB.

    XLA is off and steps per call fixed here: compiling would add the
    compiler's own memory, which says nothing about accumulation.
    """
    x, y = _data(side, batch * steps)
    dataset = in_memory_dataset((x, y), batch)
    trainer = _trainer(side, width, accumulate, jit_compile=False, steps_per_call=4)
    trainer.build_state(dataset)
    # Warm up outside the measured span on one whole window, so that both the
    # accumulating step and the update (its first run allocates too) have run.
    trainer.fit(dataset.take(accumulate), verbose=0)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.experimental.reset_memory_stats("GPU:0")
    before = rss_bytes()
    with PeakSampler() as sampler:
        trainer.fit(dataset, epochs=2, verbose=0)
    result = {"rss_before_mib": before / 2**20, "rss_peak_mib": sampler.peak / 2**20,
              "training_mib": (sampler.peak - before) / 2**20}
    if gpus:
        result["gpu_peak_mib"] = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
    return result


def _memory_cases(cases, config):
    """Each (accumulate, batch) of `cases`, in order, in one fresh process; their figures."""
    args = json.dumps([dict(accumulate=accumulate, batch=batch, side=config["side"],
                            width=config["width"], steps=config["steps"] // 4)
                       for accumulate, batch in cases])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-m", "tapeworks.bench.scenarios.accumulate", args],
                          capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(quick=False, repeats=5):
    config = _config(quick)
    side, width, micro, steps = config["side"], config["width"], config["micro"], config["steps"]
    x, y = _data(side, micro * steps)
    dataset = in_memory_dataset((x, y), micro)
    samples = len(x)
    approaches = []
    for accumulate in (1, 4):
        trainer = _trainer(side, width, accumulate)

        def setup(trainer=trainer):
            # Short settling for the quick (test) run: there "auto" keeps XLA modes
            # waiting (epochs too short to repay them), so settling would run to max_epochs.
            return settle_trainer(trainer, dataset, **(QUICK_SETTLING if quick else {}))

        approaches.append(Approach(
            f"accumulate={accumulate}, micro-batch {micro}" if accumulate > 1
            else f"plain, batch {micro}",
            lambda trainer=trainer: (trainer.fit(dataset, verbose=0), samples)[1],
            setup=setup))
    timing = alternate(approaches, repeats)
    plain = timing[approaches[0].name]["samples_per_s"]
    rows = []
    for name, result in timing.items():
        rows.append({"measure": "throughput", "case": name,
                     "value": result["samples_per_s"], "unit": "samples/s",
                     "ratio": result["samples_per_s"] / plain, "ratio_to": approaches[0].name,
                     "repeats": result["runs"], "notes": result["notes"]})
    # Each case in fresh processes, three of each, alternating; the median of
    # their peaks (one process' allocator can keep tens of MiB more by chance).
    # Quick (the tests' smoke run, its figures not kept): the three cases one
    # after another in one fresh process (a process costs about 11 s of
    # imports on this project's slowest CI machine).
    cases = {f"plain, batch {micro}": (1, micro),
             f"accumulate=8, micro-batch {micro}": (8, micro),
             f"plain, batch {8 * micro}": (1, 8 * micro)}
    runs = {name: [] for name in cases}
    if quick:
        for name, figures in zip(cases, _memory_cases(list(cases.values()), config)):
            runs[name].append(figures)
    for _ in range(0 if quick else max(3, repeats)):
        for name, case in cases.items():
            runs[name].append(_memory_cases([case], config)[0])
    memory = {name: {key: statistics.median(r[key] for r in results)
                     for key in results[0]} for name, results in runs.items()}
    key = "gpu_peak_mib" if "gpu_peak_mib" in next(iter(memory.values())) else "training_mib"
    base = memory[f"plain, batch {micro}"][key]
    for name, figures in memory.items():
        rows.append({"measure": "peak memory added by training" if key == "training_mib"
                     else "GPU peak memory", "case": name, "value": figures[key], "unit": "MiB",
                     "ratio": figures[key] / base, "ratio_to": f"plain, batch {micro}",
                     "repeats": [], "notes": {"rss_peak_mib": round(figures["rss_peak_mib"], 1)}})
    return {
        "columns": [("measure", "measure"), ("case", "case"), ("value", "value"),
                    ("unit", "unit"), ("ratio", "ratio"), ("ratio_to", "ratio to")],
        "rows": rows,
        "facts": {"model": f"convnet on {side}x{side}x3 inputs, width {width}",
                  "memory": (("the memory cases in turn in one fresh process (quick run), XLA "
                              if quick else
                              "fresh processes per memory case (median of their peaks), XLA ")
                             + "off, 4 steps per call; peak RSS sampled during fit minus "
                             "RSS before it")},
        "chart": {"group": "measure", "bar": "case", "value": "ratio",
                  "label": "ratio to plain training at the micro-batch size"},
    }


if __name__ == "__main__":
    print(json.dumps([measure_memory(**case) for case in json.loads(sys.argv[1])]))
