"""Scenario `distribute`: what a step costs under tf.distribute, against no strategy.

Per-step time of the bench MLPs (`loops`' sizes, Adam, float32, the same
fixed mode everywhere: `jit_compile=False`, 20 steps per call, since a
replicated step never runs XLA) under:

- no strategy (the default one);
- `MirroredStrategy` with one replica: what the replicated step's shape
  costs by itself (its own `tf.function`, `merge_call`, the loop without a
  branch around the step); once in processes of its own, and once paired
  with a no-strategy trainer in the same process, the two alternated (the
  row the target is judged on: on this shared machine two processes can
  land on moments that differ by more than the 5% measured);
- `MirroredStrategy` over two logical CPUs of this machine;
- two local worker processes under `MultiWorkerMirroredStrategy`
  (`tapeworks launch --workers 2`), all-reducing over loopback gRPC.

And, as the bound for a step so small that the strategy's own machinery
outweighs it: Keras' `fit` without a strategy and under `MirroredStrategy`
with one replica (one step per execution: with more, Keras' fit fails under
MirroredStrategy in this TensorFlow).

Every approach runs in fresh processes (logical devices and collective ops
are set when TensorFlow starts), alternated round by round. In each, after a
warm-up fit, fits of N and 2N steps alternate and a step's time is their
difference over N (a fit's start-up cancels); the median pair. All
approaches train the same global batch. On a 2-core machine two replicas
share the cores the one replica had: this measures overhead, not speed-up.
Bytes all-reduced per step: every gradient, float32, once (plus a few
verdict scalars).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

DESCRIPTION = ("per-step time under MirroredStrategy (1 replica, 2 logical CPUs) and two "
               "local MultiWorkerMirroredStrategy workers, against no strategy, on both bench "
               "MLPs (overhead on one 2-core machine, not speed-up)")

PAIRED = "MirroredStrategy, 1 replica, paired in one process"
APPROACHES = ["no strategy", "MirroredStrategy, 1 replica", PAIRED,
              "MirroredStrategy, 2 logical CPUs", "2 workers (MultiWorkerMirroredStrategy)",
              # The bound for the small step: what MirroredStrategy's own machinery
              # costs Keras' fit per step, measured in the same run.
              "keras fit, no strategy", "keras fit, MirroredStrategy, 1 replica"]
STEPS_PER_CALL = 20


def _sizes(quick):
    from tapeworks.bench.scenarios.loops import QUICK_SIZES, SIZES

    return QUICK_SIZES if quick else SIZES


# The worker: one process of one approach ---------------------------------------

def worker(spec):
    """The marginal time of a step under `spec["approach"]`; returns {"seconds_per_step", ...}.

    Fits of `calls` and of `2 * calls` calls alternate after a warm-up fit;
    a step's time is their difference over the extra steps, so what a fit
    costs to start (callbacks, data set-up) cancels out. Median of `fits` pairs.

    The paired approach trains two trainers in this one process, one without
    a strategy and one under `MirroredStrategy` with one replica, and
    alternates them pair by pair: both see the same moment of a noisy
    machine, and the ratio of each round's two steps is the measure.
    """
    import tensorflow as tf

    approach = spec["approach"]
    if "2 logical CPUs" in approach:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import tapeworks

    if "no strategy" in approach:
        strategies = [tf.distribute.get_strategy()]
    elif approach == PAIRED:
        strategies = [tf.distribute.get_strategy(), tf.distribute.MirroredStrategy(["/cpu:0"])]
    elif "1 replica" in approach:
        strategies = [tf.distribute.MirroredStrategy(["/cpu:0"])]
    elif "2 logical CPUs" in approach:
        strategies = [tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])]
    else:
        strategies = [tapeworks.distribute.strategy()]   # from TF_CONFIG
    from tapeworks.bench.scenarios.loops import mlp_data

    size = next(s for s in _sizes(spec["quick"]) if s.name == spec["model"])
    short = STEPS_PER_CALL * spec["calls"]
    x, y = mlp_data(size, 2 * short)
    fits = [_fit_under(strategy, approach, size) for strategy in strategies]
    for fit in fits:
        fit(x, y, batch_size=size.batch, epochs=1, verbose=0)   # traced and warm
    per_step = [[] for _ in fits]
    for round_index in range(spec["fits"]):
        # Alternate which trainer goes first, so neither always follows the other.
        order = list(range(len(fits)))[::(-1) ** round_index]
        for index in order:
            start = time.perf_counter()
            fits[index](x[:short * size.batch], y[:short * size.batch],
                        batch_size=size.batch, epochs=1, verbose=0)
            middle = time.perf_counter()
            fits[index](x, y, batch_size=size.batch, epochs=1, verbose=0)
            per_step[index].append(
                ((time.perf_counter() - middle) - (middle - start)) / short)
    result = {"seconds_per_step": statistics.median(per_step[-1]),
              "per_fit": per_step[-1],
              "replicas": strategies[-1].num_replicas_in_sync}
    if approach == PAIRED:
        result["baseline_seconds_per_step"] = statistics.median(per_step[0])
        result["ratios"] = [mirrored / plain for plain, mirrored in zip(*per_step)]
        result["ratio"] = statistics.median(result["ratios"])
    return result


def _fit_under(strategy, approach, size):
    """The `fit` of a fresh bench MLP built and compiled in `strategy`'s scope."""
    import keras

    import tapeworks
    from tapeworks.bench.scenarios.loops import build_mlp, mlp_loss

    with strategy.scope():
        model = build_mlp(size.widths)
        if approach.startswith("keras"):
            # Keras' own fit, one step per execution: with more, its fit
            # fails under MirroredStrategy in this TensorFlow (see README).
            model.compile(keras.optimizers.Adam(1e-3), mlp_loss(), jit_compile=False)
            return model.fit
        return tapeworks.Trainer(model, keras.optimizers.Adam(1e-3), mlp_loss(),
                                 jit_compile=False, steps_per_call=STEPS_PER_CALL,
                                 plan_cache=False, seed=0).fit


def _run(spec):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_CONFIG", None)
    command = [sys.executable, "-m", "tapeworks.bench.scenarios.distribute"]
    if spec["approach"].startswith("2 workers"):
        with tempfile.TemporaryDirectory() as folder:
            done = subprocess.run(
                [sys.executable, "-m", "tapeworks.cli", "launch", "--workers", "2", "--",
                 *command, json.dumps(dict(spec, out=folder))],
                capture_output=True, text=True, env=env)
            if done.returncode != 0:
                raise RuntimeError(f"distribute workers failed for {spec}:\n"
                                   f"{done.stdout[-2000:]}")
            # Both workers ran every step in lockstep: the chief's time is the run's.
            with open(os.path.join(folder, "worker-0.json")) as f:
                return json.load(f)
    done = subprocess.run([*command, json.dumps(spec)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"distribute worker failed for {spec}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# The scenario --------------------------------------------------------------------

def run(quick=False, repeats=3):
    rows = []
    fits = 2 if quick else 5
    # Quick (the tests' smoke run): the small MLP, tapeworks' five ways, and
    # one process per approach whose repeats are its fits (a fresh process
    # costs about 11 s of imports on this project's slowest CI machine).
    approaches = APPROACHES[:5] if quick else APPROACHES
    for size in _sizes(quick)[:1] if quick else _sizes(quick):
        # About as many steps for each model as a fit of a few seconds holds.
        calls = 2 if quick else (10 if size.widths[1] < 256 else 2)
        times = {name: [] for name in approaches}
        paired = []   # (no strategy's seconds per step, the ratio) of each paired process
        for round_index in range(1 if quick else repeats):
            shift = round_index % len(approaches)
            for approach in approaches[shift:] + approaches[:shift]:
                result = _run({"model": size.name, "approach": approach, "quick": quick,
                               "calls": calls, "fits": repeats if quick else fits})
                if quick:
                    times[approach].extend(result["per_fit"])
                    if approach == PAIRED:
                        paired.extend((result["baseline_seconds_per_step"], ratio)
                                      for ratio in result["ratios"])
                    continue
                times[approach].append(result["seconds_per_step"])
                if approach == PAIRED:
                    paired.append((result["baseline_seconds_per_step"], result["ratio"]))
        gradient_bytes = size.parameters() * 4
        for approach in approaches:
            median = statistics.median(times[approach])
            if approach == PAIRED:
                # Judged within each process: its own no-strategy trainer's step.
                base = statistics.median(b for b, _ in paired)
                ratio = statistics.median(r for _, r in paired)
                overhead = statistics.median(
                    t - b for t, (b, _) in zip(times[approach], paired))
            else:
                base = statistics.median(times["keras fit, no strategy" if approach.startswith(
                    "keras") else "no strategy"])
                ratio, overhead = median / base, median - base
            rows.append({"model": size.name, "approach": approach,
                         "label": f"{size.name}: {approach}",
                         "ms_per_step": median * 1e3, "repeats": times[approach],
                         "vs_no_strategy": ratio, "overhead_ms": overhead * 1e3,
                         "allreduced_kib": (0 if "no strategy" in approach
                                            else gradient_bytes / 1024)})
            if approach == PAIRED:
                rows[-1]["ratios"] = [r for _, r in paired]   # each process's own
    return {
        "scenario": "distribute",
        "description": DESCRIPTION,
        "rows": rows,
        "columns": [("model", "model"), ("approach", "approach"),
                    ("ms_per_step", "ms per step (median)"),
                    ("vs_no_strategy", "time x no strategy"),
                    ("overhead_ms", "overhead ms per step"),
                    ("allreduced_kib", "all-reduced per step (KiB)")],
        "chart": {"group": "model", "bar": "label", "value": "vs_no_strategy",
                  "label": "step time / no strategy's"},
        "facts": {
            "target": "MirroredStrategy with one replica within 5% of no strategy, judged on "
                      "the paired row (both trainers in one process, alternated; its ratio is "
                      "the median of each round's own ratio, so two processes landing on "
                      "different moments of a noisy machine do not decide it); where the "
                      "step is too small for that, its overhead per step (ms) against Keras' "
                      "own fit's under the same strategy (the rows marked keras: "
                      "steps_per_execution=1, each against Keras' fit without a strategy)",
            "what this measures": (
                "overhead, not speed-up: this machine's cores are shared by the replicas (two "
                "logical CPUs of one 2-core CPU; two worker processes on the same cores). On "
                "several GPUs or hosts each replica brings its own compute."),
            "mode": f"jit_compile=False, steps_per_call={STEPS_PER_CALL}, Adam, float32, the "
                    "same global batch everywhere",
            "timing": (f"per process: one warm-up fit, then {fits} pairs of fits of N and 2N "
                       f"steps (N = {STEPS_PER_CALL} x 10 for the small MLP, x 2 for the "
                       "large; quick: x 2): a step's time is the pair's difference over N, "
                       "so a fit's start-up cancels; the median pair; cells: medians over "
                       "fresh processes, alternated (quick: one process per approach, its "
                       "pairs the repeats). The paired row: one process trains "
                       "both, each round's pairs in alternating order"),
            "all-reduced": "the gradients, float32, once per step (one replica all-reduces "
                           "too: the size is the same; no strategy all-reduces nothing)",
        },
    }


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    result = worker(spec)
    if "out" in spec:
        config = json.loads(os.environ.get("TF_CONFIG", "{}"))
        name = f"worker-{config['task']['index']}" if config else "single"
        with open(os.path.join(spec["out"], name + ".json"), "w") as f:
            json.dump(result, f)
    else:
        print(json.dumps(result))
