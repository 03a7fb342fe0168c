"""Per-call host overhead before and after the Trainer's split, paired in one run.

Usage (from the repository root; OLD is a checkout of the code before the
split, e.g. `git worktree add --detach /tmp/old dd50b96`):

    python benchmarks/trainer-split-overhead/run.py OLD . --rounds 7

Each round runs one fresh process per version, alternated, each training
the bench's small MLP (32-64-64-10, batch 64, Adam; `tapeworks bench loops`'
model, where host overhead shows) with a fixed mode (tf.function) at 1 and at
8 steps per call, the default checks on: a warm-up epoch, then the median of
5 timed epochs. The result is each version's median over rounds and the
median of the round-by-round ratios new/old, with their 95% interval
(`tapeworks.bench.timing.median_interval`).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
import numpy as np, keras, tensorflow as tf
import tapeworks
rng = np.random.default_rng(0)
x = rng.normal(size=(64 * 100, 32)).astype("float32")
y = rng.integers(0, 10, size=64 * 100)
out = {"tapeworks": tapeworks.__file__}
for steps in (1, 8):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])
    trainer = tapeworks.Trainer(model, "adam", keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), jit_compile=False, steps_per_call=steps, plan_cache=False)
    trainer.fit(x, y, batch_size=64, epochs=1, verbose=0)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        trainer.fit(x, y, batch_size=64, epochs=1, verbose=0)
        times.append(time.perf_counter() - start)
    out[f"steps_{steps}"] = len(x) / sorted(times)[2]
print("RESULT " + json.dumps(out))
"""


def run(path):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(path), TAPEWORKS_PLAN_CACHE="0",
               TF_CPP_MIN_LOG_LEVEL="3")
    # In an empty folder: `python -c` puts the working folder first on sys.path,
    # ahead of PYTHONPATH, and a checkout there would win over `path`.
    with tempfile.TemporaryDirectory() as empty:
        done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                              text=True, check=True, cwd=empty)
    line = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    from tapeworks.bench.timing import median_interval

    rows = []
    for index in range(args.rounds):
        pair = [("old", run(args.old)), ("new", run(args.new))]
        if index % 2:
            pair.reverse()   # which version runs first alternates too
        rows.append(dict(pair))
        assert {v["tapeworks"] for v in rows[-1].values()} == {
            os.path.join(os.path.abspath(p), "tapeworks", "__init__.py")
            for p in (args.old, args.new)}, rows[-1]   # each version ran its own code
        print(f"round {index + 1}: " + ", ".join(
            f"{k} {v['steps_1']:.0f} / {v['steps_8']:.0f} samples/s" for k, v in rows[-1].items()),
            flush=True)
    report = {"rounds": rows}
    for steps in ("steps_1", "steps_8"):
        ratios = [r["new"][steps] / r["old"][steps] for r in rows]
        _, low, high = median_interval(ratios)
        report[steps] = {"old": statistics.median(r["old"][steps] for r in rows),
                         "new": statistics.median(r["new"][steps] for r in rows),
                         "ratio": statistics.median(ratios), "interval": [low, high]}
        print(f"{steps}: old {report[steps]['old']:.0f}, new {report[steps]['new']:.0f} "
              f"samples/s; new/old {report[steps]['ratio']:.3f} [{low:.3f}, {high:.3f}]")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
