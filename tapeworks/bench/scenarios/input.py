"""Scenario `input`: what the input pipeline costs a convnet with CPU-heavy augmentation.

Measurements on the same images, alternating: the model trained through a
naive pipeline (augmentation mapped after batching with `tf.map_fn`, no
parallel calls, no prefetch: the sequential pipeline); through
`tapeworks.data.pipeline`, run the way the Trainer chose by measurement
(`engine.input_planner`); on pre-materialised augmented batches held in
memory (compute only); and the builder's pipeline iterated alone, as built
and the way the Trainer runs it.

The bound: when the pipeline and the step share the machine's cores, no
schedule trains faster than `cores / (CPU-seconds per sample of the pipeline
alone + CPU-seconds per sample of the step alone)`, both measured with
process CPU time in this run (the smaller of the two pipeline-alone costs).
Targets: the builder at least 1.0x the naive pipeline and 0.9x the bound.
The older ceiling, the smaller of the two stand-alone rates, is shown too; it
only holds when the step runs elsewhere (an accelerator).
"""

import os

import keras
import numpy as np
import tensorflow as tf

from tapeworks import data
from tapeworks.data.pipeline import parallelism_choices
from tapeworks.bench.timing import QUICK_SETTLING, Approach, alternate, settle_trainer
from tapeworks.engine import Trainer

DESCRIPTION = ("convnet with CPU-heavy augmentation: naive pipeline vs tapeworks.data.pipeline "
               "vs compute-only and pipeline-only ceilings")
SIDE = 64
EPOCHS_PER_REPEAT = 4


def augment(image, label, seed):
    """Per-image augmentation that costs real CPU: resize, crop, flip, colour jitter."""
    seeds = tf.random.experimental.stateless_split(seed, 4)
    image = tf.image.resize(image, (SIDE + SIDE // 2, SIDE + SIDE // 2))
    image = tf.image.stateless_random_crop(image, (SIDE, SIDE, 3), seed=seeds[0])
    image = tf.image.stateless_random_flip_left_right(image, seed=seeds[1])
    image = tf.image.stateless_random_contrast(image, 0.7, 1.3, seed=seeds[2])
    image = tf.image.stateless_random_hue(image, 0.1, seed=seeds[3])
    return image, label


def _naive(source, batch):
    def whole_batch(images, labels):
        seed = tf.constant([1, 2], tf.int64)
        return tf.map_fn(lambda image: augment(image, 0, seed)[0], images), labels

    return source.batch(batch, drop_remainder=True).map(whole_batch)


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((SIDE, SIDE, 3)),
        keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
        keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])


def _trainer():
    return Trainer(_model(), keras.optimizers.Adam(1e-3),
                   keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                   check_data=False)


def run(quick=False, repeats=5):
    batches, batch = (4, 16) if quick else (24, 64)
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 1, size=(batches * batch, SIDE, SIDE, 3)).astype("float32")
    labels = rng.integers(0, 10, batches * batch).astype("int32")
    source = tf.data.Dataset.from_tensor_slices((images, labels))
    samples = batches * batch
    built = data.pipeline(source, batch_size=batch, training=True, augment=augment, seed=0)
    naive = _naive(source, batch)
    materialised = built.take(batches).cache()
    for _ in materialised:  # fill the cache: augmented once, then replayed from memory
        pass
    builder_trainer = _trainer()

    def trained_on(dataset, name, trainer=None):
        trainer = trainer or _trainer()
        # A repeat is a fit of several epochs, as users run them: what a
        # one-epoch fit adds (its own set-up, a new pipeline each call) is
        # not what the step and the pipeline cost while training.
        return Approach(name, lambda: (trainer.fit(dataset, epochs=EPOCHS_PER_REPEAT,
                                                   verbose=0), samples * EPOCHS_PER_REPEAT)[1],
                        # Up to 120 epochs: enough for the input planner to
                        # have tried every way (a second of epochs each). Quick
                        # (the tests' smoke run): its short settling, the
                        # planner perhaps still trying.
                        setup=lambda: settle_trainer(trainer, dataset, **(
                            QUICK_SETTLING if quick else dict(max_epochs=120))))

    def alone(dataset_of):
        def iterate():
            for _ in dataset_of():
                pass
            return samples
        return iterate

    def as_the_trainer_runs_it():
        # The way the Trainer chose (set up before this approach runs).
        chosen = builder_trainer.tuning["input"]["in_use"]
        return dict(parallelism_choices(built))[chosen]

    names = {"naive": "naive pipeline (map after batch, sequential, no prefetch)",
             "builder": "tapeworks.data.pipeline (the Trainer's choice)",
             "compute": "compute only (pre-materialised batches)",
             "alone": "pipeline alone, as built (no training)",
             "alone_chosen": "pipeline alone, as the Trainer runs it (no training)"}
    approaches = [
        trained_on(naive, names["naive"]),
        trained_on(built, names["builder"], builder_trainer),
        trained_on(materialised, names["compute"]),
        Approach(names["alone"], alone(lambda: built)),
        Approach(names["alone_chosen"], alone(as_the_trainer_runs_it)),
    ]
    results = alternate(approaches, repeats)
    rates = {key: results[name]["samples_per_s"] for key, name in names.items()}
    cpu = {key: results[name]["cpu_seconds_per_sample"] for key, name in names.items()}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    bound = cores / (min(cpu["alone"], cpu["alone_chosen"]) + cpu["compute"])
    ceiling = min(rates["compute"], rates["alone"])
    rows = [{"approach": name, "samples_per_s": r["samples_per_s"],
             "cpu_us_per_sample": 1e6 * r["cpu_seconds_per_sample"],
             "vs_bound": r["samples_per_s"] / bound,
             "vs_naive": r["samples_per_s"] / rates["naive"],
             "vs_ceiling": r["samples_per_s"] / ceiling, "repeats": r["runs"],
             "notes": r["notes"], "group": "input pipeline"}
            for name, r in results.items()]
    report = builder_trainer.tuning["input"]
    return {
        "columns": [("approach", "approach"), ("samples_per_s", "samples/s"),
                    ("cpu_us_per_sample", "CPU us/sample"),
                    ("vs_naive", "x naive pipeline"),
                    ("vs_bound", "x CPU-time bound"),
                    ("vs_ceiling", "x min(compute only, pipeline alone)")],
        "rows": rows,
        "facts": {
            "images": f"{samples} of {SIDE}x{SIDE}x3, batch {batch}",
            "cores": cores,
            "CPU-time bound (samples/s)": bound,
            "bound": "cores / (CPU-s per sample of the pipeline alone + of the step alone)",
            "stand-alone ceiling (samples/s)": ceiling,
            "the Trainer's input choice": report["in_use"],
            "its measured rates while training (samples/s)": ", ".join(
                f"{name} {rate:,.0f}" for name, rate in report["rates"].items()),
        },
        "chart": {"group": "group", "bar": "approach", "value": "vs_bound",
                  "label": "throughput relative to the CPU-time bound of shared cores"},
    }
