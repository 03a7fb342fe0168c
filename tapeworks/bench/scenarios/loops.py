"""Scenario `loops`: the same MLP trained by six different training loops.

Compares tapeworks' defaults with Keras `fit` (default and tuned), a
hand-written `tf.function` loop, an eager loop and a `train_on_batch` loop,
on a small and a large MLP. Achieved GFLOP/s is set against the float32
matmul peak measured in the same run, and against a ceiling: the matrix
products of one training step run alone, with the same kernels and shapes
(see `matmul_ceiling`), which tells what the loop itself costs.

GFLOP/s follow the usual convention of 6 FLOPs per weight per sample
(forward 2, backward 4), which counts the first layer's input gradient
that no loop computes: the ceiling rows show the real work.
"""

import dataclasses

import keras
import numpy as np
import tensorflow as tf

from tapeworks.bench.data import in_memory_dataset
from tapeworks.bench.peak import matmul_peak_gflops, memory_bandwidth_gbs
from tapeworks.bench.timing import QUICK_SETTLING, Approach, alternate, settle_trainer
from tapeworks.engine import Trainer

BASELINE = "keras fit (defaults)"
TAPEWORKS = "tapeworks (defaults)"
CEILINGS = {False: "ceiling: the step's matmuls alone (tf.function)",
            True: "ceiling: the step's matmuls alone (XLA)"}


@dataclasses.dataclass
class MLPSize:
    name: str
    widths: tuple     # input, hidden..., output
    batch: int
    steps: int        # steps per timed repeat (fewer for the eager loops)
    slow_steps: int

    def macs_per_sample(self):
        return sum(a * b for a, b in zip(self.widths[:-1], self.widths[1:]))

    def parameters(self):
        return sum(a * b + b for a, b in zip(self.widths[:-1], self.widths[1:]))


# Adam reads the weights, the gradient and both moments and writes the
# weights and both moments: at least 7 float32 transfers per weight per step.
ADAM_BYTES_PER_WEIGHT = 7 * 4


SIZES = [
    MLPSize("small MLP 32-64-64-10, batch 64", (32, 64, 64, 10), 64, 400, 40),
    MLPSize("large MLP 512-2048-2048-10, batch 256", (512, 2048, 2048, 10), 256, 40, 10),
]
QUICK_SIZES = [
    MLPSize("small MLP 32-64-64-10, batch 64", (32, 64, 64, 10), 64, 40, 4),
    MLPSize("large MLP (quick: 64-256-256-10), batch 64", (64, 256, 256, 10), 64, 20, 4),
]


def build_mlp(widths, seed=0):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((widths[0],))]
    layers += [keras.layers.Dense(w, activation="relu") for w in widths[1:-1]]
    layers += [keras.layers.Dense(widths[-1])]
    return keras.Sequential(layers)


def mlp_loss():
    """The loss every `loops` MLP trains on: sparse categorical cross-entropy on logits."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def mlp_data(size, steps):
    """(x, y) for `steps` batches of the MLP `size`: normal inputs, integer labels, seed 0.

    The scenarios that train a `loops` MLP all use it, so their figures compare.
    """
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * size.batch, size.widths[0])).astype("float32")
    y = rng.integers(0, size.widths[-1], steps * size.batch).astype("int32")
    return x, y


def approaches(size, quick=False):
    """The six loops, each on its own copy of the same model and data."""
    x, y = mlp_data(size, size.steps)
    dataset = in_memory_dataset((x, y), size.batch)
    sx, sy = mlp_data(size, size.slow_steps)
    slow_dataset = in_memory_dataset((sx, sy), size.batch)
    samples, slow_samples = len(x), len(sx)
    out = []

    trainer = Trainer(build_mlp(size.widths), keras.optimizers.Adam(1e-3), mlp_loss())

    def tapeworks_setup():
        # "auto" measures its first calls; train until it has chosen, and
        # record what that cost, as part of the results.
        notes = settle_trainer(trainer, dataset, **(QUICK_SETTLING if quick else {}))
        tuning = trainer.tuning
        return dict(notes, reason=tuning["reason"])

    out.append(Approach(TAPEWORKS, lambda: (trainer.fit(dataset, verbose=0),
                                                         samples)[1], setup=tapeworks_setup))

    def keras_fit(jit_compile, steps_per_execution):
        model = build_mlp(size.widths)
        model.compile(keras.optimizers.Adam(1e-3), mlp_loss(), jit_compile=jit_compile,
                      steps_per_execution=steps_per_execution)
        return lambda: (model.fit(dataset, shuffle=False, verbose=0), samples)[1]

    out.append(Approach(BASELINE, keras_fit("auto", 1)))
    out.append(Approach("keras fit (jit_compile=True, steps_per_execution=32)",
                        keras_fit(True, 32)))

    def tape_step(model, optimizer, loss_fn):
        def step(bx, by):
            with tf.GradientTape() as tape:
                loss = loss_fn(by, model(bx, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return step

    model = build_mlp(size.widths)
    compiled = tf.function(tape_step(model, keras.optimizers.Adam(1e-3), mlp_loss()))

    def hand_written():
        for bx, by in dataset:
            compiled(bx, by)
        float(model.trainable_variables[0][0, 0])  # wait for the last step
        return samples

    out.append(Approach("hand-written tf.function loop", hand_written))

    eager_model = build_mlp(size.widths)
    eager = tape_step(eager_model, keras.optimizers.Adam(1e-3), mlp_loss())

    def eager_loop():
        for bx, by in slow_dataset:
            eager(bx, by)
        return slow_samples

    out.append(Approach("eager loop", eager_loop))

    tob_model = build_mlp(size.widths)
    tob_model.compile(keras.optimizers.Adam(1e-3), mlp_loss())
    batches = [(sx[i:i + size.batch], sy[i:i + size.batch])
               for i in range(0, slow_samples, size.batch)]

    def train_on_batch_loop():
        for bx, by in batches:
            tob_model.train_on_batch(bx, by)
        return slow_samples

    out.append(Approach("train_on_batch loop", train_on_batch_loop))
    for jit_compile, name in CEILINGS.items():
        out.append(Approach(name, matmul_ceiling(size, jit_compile)))
    return out


def matmul_ceiling(size, jit_compile):
    """Returns a run() doing the matrix products of `size.steps` training steps, and nothing else.

    Per step: the forward product of every layer, the weight gradient
    h^T @ dY of every layer, and the input gradient dY @ W^T of every layer
    but the first (the data needs no gradient); each weight gradient is
    summed once, as any optimizer must read it. No activations, no loss,
    no optimizer update: with these kernels on these shapes no training
    loop can go faster, so a loop's distance from this is its own cost.
    """
    widths, batch = size.widths, size.batch
    weights = [tf.random.stateless_normal((a, b), seed=(i, 0)) / a ** 0.5
               for i, (a, b) in enumerate(zip(widths[:-1], widths[1:]))]
    x = tf.random.stateless_normal((batch, widths[0]), seed=(99, 0))

    @tf.function(jit_compile=jit_compile, autograph=False)
    def products(x):
        inputs = [x]
        for w in weights:
            inputs.append(tf.matmul(inputs[-1], w))
        upstream, total = inputs.pop(), 0.0
        for layer in reversed(range(len(weights))):
            total += tf.reduce_sum(tf.matmul(inputs[layer], upstream, transpose_a=True))
            if layer > 0:
                upstream = tf.matmul(upstream, weights[layer], transpose_b=True)
        return total

    @tf.function(autograph=False)
    def steps(n):
        return tf.while_loop(lambda i, total: i < n,
                             lambda i, total: (i + 1, total + products(x)),
                             (tf.constant(0), tf.constant(0.0)))[1]

    def run():
        steps(tf.constant(size.steps)).numpy()
        return size.steps * batch

    return run


def bound_with_adam(size, ceiling_samples_per_s, bandwidth_gbs):
    """Samples/s of the fastest step with Adam on this machine: an estimate from two measurements.

    The matrix products at the ceiling's speed, then Adam's minimal memory
    traffic at the measured streaming bandwidth, and nothing else (no
    activations, no loss, no overlap: two cores cannot stream and multiply
    at full speed at once).
    """
    step_seconds = (size.batch / ceiling_samples_per_s
                    + size.parameters() * ADAM_BYTES_PER_WEIGHT / (bandwidth_gbs * 1e9))
    return size.batch / step_seconds


def run(quick=False, repeats=5):
    sizes = QUICK_SIZES if quick else SIZES
    peak = matmul_peak_gflops(size=512 if quick else 2048, repeats=3 if quick else 5)
    bandwidth = memory_bandwidth_gbs(megabytes=16 if quick else 64, repeats=3 if quick else 5)
    rows, facts = [], {"float32 matmul peak (GFLOP/s)": peak,
                       "memory bandwidth, streaming (GB/s)": bandwidth}
    for size in sizes:
        results = alternate(approaches(size, quick), repeats)
        base = results[BASELINE]["samples_per_s"]
        ceiling = max(results[name]["samples_per_s"] for name in CEILINGS.values())
        ours = results[TAPEWORKS]["samples_per_s"]
        facts[f"{size.name}: tapeworks, % of the faster ceiling"] = 100 * ours / ceiling
        # The planner's promise against what the timed fits ran at (whole
        # fits: epoch starts and ends included).
        expected = results[TAPEWORKS]["notes"].get("expected_samples_per_s")
        if expected:
            facts[f"{size.name}: planner's expected rate for its choice (samples/s)"] = expected
            facts[f"{size.name}: tapeworks fits / planner's expected rate"] = ours / expected
        bound = bound_with_adam(size, ceiling, bandwidth)
        facts[f"{size.name}: bound with Adam (ceiling + Adam's memory traffic), "
              "% of matmul peak"] = 100 * bound * 6 * size.macs_per_sample() / 1e9 / peak
        facts[f"{size.name}: tapeworks, % of that bound"] = 100 * ours / bound
        flops_per_sample = 6 * size.macs_per_sample()  # forward 2, backward 4 per MAC
        for name, result in results.items():
            gflops = result["samples_per_s"] * flops_per_sample / 1e9
            rows.append({
                "size": size.name,
                "approach": name,
                "samples_per_s": result["samples_per_s"],
                "vs_keras_fit": result["samples_per_s"] / base,
                "gflops": gflops,
                "pct_of_peak": 100 * gflops / peak,
                "repeats": result["runs"],
                "notes": result["notes"],
            })
    return {
        "columns": [("size", "model"), ("approach", "approach"),
                    ("samples_per_s", "samples/s"), ("vs_keras_fit", "x Keras fit default"),
                    ("gflops", "GFLOP/s"), ("pct_of_peak", "% of matmul peak")],
        "rows": rows,
        "facts": facts,
        "chart": {"group": "size", "bar": "approach", "value": "vs_keras_fit",
                  "label": "throughput relative to Keras fit (defaults)"},
    }


DESCRIPTION = ("MLPs trained by tapeworks, Keras fit (default, tuned), a tf.function loop, "
               "an eager loop and train_on_batch")
