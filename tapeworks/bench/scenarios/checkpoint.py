"""Scenario `checkpoint`: what `fit(checkpoint_dir=..., checkpoint_every=100)` costs.

On the `loops` small and large MLPs (arrays passed to `fit`, the usual way:
their position is replayed from the seed, so no data goes into a
checkpoint): training throughput with a save every 100 steps against the
same trainer setup without checkpointing, alternating, in the mode "auto"
settles on (fixed for all, so only the saving differs), with the default
saves (training waits for all of a save) and with `checkpoint_async=True`
(its sync, checksums and rename on a background thread). Each timed repeat
is one fit of 300 steps into an empty folder (saves at 100, 200 and 300).
Also: how long training waits for one save, either way, how long the
publication takes (fsync, checksums, manifest, rename), one
restore (read and assign), TensorFlow's own write of the same state alone,
eager and traced (the bound: what a save every 100 steps would cost if the
training waited only for the traced write), and the size of a checkpoint
against the size of the weights (Adam keeps two moments per weight: about 3x), and, for
comparison, the size when the same arrays come as a cached `tf.data`
dataset (its iterator checkpoint holds the cached data). Target: at least
0.95x the throughput without checkpointing.
"""

import os
import shutil
import statistics
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

from tapeworks.bench.data import in_memory_dataset
from tapeworks.bench.scenarios.loops import QUICK_SIZES, SIZES, build_mlp, mlp_data, mlp_loss
from tapeworks.bench.timing import Approach, alternate, settle_trainer
from tapeworks.engine import Trainer

DESCRIPTION = ("cost of fit(checkpoint_dir=..., checkpoint_every=100) on the bench MLPs: "
               "throughput, save and restore time, checkpoint size")
EVERY = 100
STEPS = 300


def _folder_bytes(path):
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def run(quick=False, repeats=5):
    rows = []
    facts = {"target": "throughput with checkpoint_every=100 at least 0.95x without",
             "bound": "the throughput if training waited for each save only as long as "
                      "TensorFlow's own write of the same state takes, traced "
                      "(tf.train.Checkpoint.write in a tf.function, measured alone in this "
                      "run): 100 steps' time / (100 steps' time + one write)"}
    scratch = tempfile.mkdtemp(prefix="tapeworks-bench-checkpoint-")
    try:
        for size in (QUICK_SIZES if quick else SIZES):
            steps = 30 if quick else STEPS
            x, y = mlp_data(size, steps)
            samples = steps * size.batch
            probe = Trainer(build_mlp(size.widths), keras.optimizers.Adam(1e-3), mlp_loss(),
                            plan_cache=False, seed=0)
            settle_trainer(probe, in_memory_dataset((x, y), size.batch),
                           long_fit_seconds=2.0 if quick else 20.0)
            mode = dict(jit_compile=probe.jit_compile, steps_per_call=probe.steps_per_call)
            saved = {False: [], True: []}

            def trainer():
                return Trainer(build_mlp(size.widths), keras.optimizers.Adam(1e-3), mlp_loss(),
                               plan_cache=False, seed=0, **mode)

            plain, checkpointed, asynchronous_ = trainer(), trainer(), trainer()
            runs = {"n": 0}

            def fit_plain():
                plain.fit(x, y, batch_size=size.batch, verbose=0)
                return samples

            def fitter(checkpointing, asynchronous):
                def fit_checkpointed():
                    runs["n"] += 1
                    folder = os.path.join(scratch, f"{size.widths[1]}-{runs['n']}")
                    checkpointing.fit(x, y, batch_size=size.batch, verbose=0,
                                      checkpoint_dir=folder, checkpoint_every=EVERY,
                                      checkpoint_async=asynchronous)
                    saved[asynchronous].extend(checkpointing.checkpoint_saves)
                    shutil.rmtree(folder)
                    return samples
                return fit_checkpointed

            results = alternate([Approach("no checkpointing", fit_plain),
                                 Approach(f"checkpoint_every={EVERY}",
                                          fitter(checkpointed, False)),
                                 Approach(f"checkpoint_every={EVERY}, checkpoint_async=True",
                                          fitter(asynchronous_, True))],
                                repeats)
            base = results["no checkpointing"]["samples_per_s"]
            throughput_rows = []
            for name, result in results.items():
                throughput_rows.append({"model": size.name, "approach": name,
                                        "samples_per_s": result["samples_per_s"],
                                        "vs_plain": result["samples_per_s"] / base,
                                        "repeats": result["runs"], "group": size.name})
            rows.extend(throughput_rows)

            # One checkpoint, kept: its size, and the time to restore it.
            folder = os.path.join(scratch, f"{size.widths[1]}-kept")
            kept = trainer()
            kept.fit(x, y, batch_size=size.batch, verbose=0, checkpoint_dir=folder,
                     checkpoint_every=EVERY)
            latest = kept.checkpoint_saves[-1].folder
            weights = sum(np.asarray(w).nbytes for w in kept.model.weights)
            restores, writes, traced_writes = [], [], []
            traced = tf.function(kept.training_state.run_checkpoint().write, autograph=False,
                                 input_signature=[tf.TensorSpec([], tf.string)])
            # A traced write does not create its folder (an eager one does).
            for name in ["bare-trace"] + [f"bare-traced-{i}" for i in range(repeats)]:
                os.makedirs(os.path.join(scratch, name), exist_ok=True)
            traced(tf.constant(os.path.join(scratch, "bare-trace", "state")))
            for index in range(repeats):
                start = time.perf_counter()
                kept.training_state.run_checkpoint().read(
                    os.path.join(latest, "state")).assert_existing_objects_matched()
                restores.append(time.perf_counter() - start)
                # The bound: TensorFlow's own write of the same state, alone
                # (no manifest, checksums, fsync or rename), eager and traced.
                start = time.perf_counter()
                kept.training_state.run_checkpoint().write(os.path.join(scratch, f"bare-{index}", "state"))
                writes.append(time.perf_counter() - start)
                start = time.perf_counter()
                traced(tf.constant(os.path.join(scratch, f"bare-traced-{index}", "state")))
                traced_writes.append(time.perf_counter() - start)
            cached = os.path.join(scratch, f"{size.widths[1]}-dataset")
            as_dataset = trainer()
            as_dataset.fit(in_memory_dataset((x, y), size.batch), verbose=0,
                           checkpoint_dir=cached, checkpoint_every=EVERY)
            bare = statistics.median(traced_writes)
            # What a save every EVERY steps would cost if training waited only
            # for TensorFlow's traced write: the bound the same run measures.
            hundred_steps = EVERY * size.batch / base
            for row in throughput_rows[1:]:
                row["bound"] = hundred_steps / (hundred_steps + bare)
                row["vs_bound"] = row["vs_plain"] / row["bound"]
            rows.append({"model": size.name, "approach": "one save / one restore",
                         "bare_write_ms": 1000 * statistics.median(writes),
                         "traced_write_ms": 1000 * bare,
                         "save_ms": 1000 * statistics.median(r.seconds for r in saved[False]),
                         "async_save_ms": 1000 * statistics.median(
                             r.seconds for r in saved[True]),
                         "publish_ms": 1000 * statistics.median(
                             r.publish_seconds for r in saved[True]),
                         "restore_ms": 1000 * statistics.median(restores),
                         "checkpoint_mb": _folder_bytes(latest) / 2**20,
                         "weights_mb": weights / 2**20,
                         "dataset_checkpoint_mb": _folder_bytes(
                             as_dataset.checkpoint_saves[-1].folder) / 2**20,
                         "repeats": [], "group": size.name})
            facts[f"{size.name}: mode"] = (f"jit_compile={mode['jit_compile']}, "
                                           f"steps_per_call={mode['steps_per_call']}")
            facts[f"{size.name}: saves timed"] = len(saved[False]) + len(saved[True])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "columns": [("model", "model"), ("approach", "approach"),
                    ("samples_per_s", "samples/s"), ("vs_plain", "x no checkpointing"),
                    ("bound", "bound: saves cost only TF's write"), ("vs_bound", "x bound"),
                    ("save_ms", "training waits per save (ms, median)"),
                    ("async_save_ms", "... with checkpoint_async=True (ms, median)"),
                    ("publish_ms", "publication, in the background (ms, median)"),
                    ("bare_write_ms", "TF's write alone, eager (ms, median)"),
                    ("traced_write_ms", "TF's write alone, traced (ms, median)"),
                    ("restore_ms", "one restore (ms, median)"),
                    ("checkpoint_mb", "checkpoint MiB"), ("weights_mb", "weights MiB"),
                    ("dataset_checkpoint_mb", "MiB with a cached tf.data dataset")],
        "rows": rows,
        "facts": facts,
        "chart": {"group": "group", "bar": "approach", "value": "vs_plain",
                  "label": "throughput relative to no checkpointing"},
    }
