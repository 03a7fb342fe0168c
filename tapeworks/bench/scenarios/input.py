"""Scenario `input`: what the input pipeline costs a convnet with CPU-heavy augmentation.

Four measurements on the same images, alternating: the model trained through
a naive pipeline (augmentation mapped after batching with `tf.map_fn`, no
parallel calls, no prefetch); through `tapeworks.data.pipeline`; on
pre-materialised augmented batches held in memory (the compute-only ceiling);
and the builder's pipeline iterated alone (the input ceiling). The builder's
target is 0.9x the smaller of the two ceilings.
"""

import keras
import numpy as np
import tensorflow as tf

from tapeworks import data
from tapeworks.bench.timing import Approach, alternate, settle_trainer
from tapeworks.engine import Trainer

DESCRIPTION = ("convnet with CPU-heavy augmentation: naive pipeline vs tapeworks.data.pipeline "
               "vs compute-only and pipeline-only ceilings")
SIDE = 64


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

    def trained_on(dataset, name):
        trainer = _trainer()

        return Approach(name, lambda: (trainer.fit(dataset, verbose=0), samples)[1],
                        setup=lambda: settle_trainer(trainer, dataset))

    def pipeline_alone():
        for _ in built:
            pass
        return samples

    approaches = [
        trained_on(naive, "naive pipeline (map after batch, sequential, no prefetch)"),
        trained_on(built, "tapeworks.data.pipeline"),
        trained_on(materialised, "compute only (pre-materialised batches)"),
        Approach("pipeline alone (no training)", pipeline_alone),
    ]
    results = alternate(approaches, repeats)
    rates = {name: r["samples_per_s"] for name, r in results.items()}
    ceiling = min(rates["compute only (pre-materialised batches)"],
                  rates["pipeline alone (no training)"])
    rows = [{"approach": name, "samples_per_s": r["samples_per_s"],
             "vs_ceiling": r["samples_per_s"] / ceiling, "repeats": r["runs"],
             "notes": r["notes"], "group": "input pipeline"}
            for name, r in results.items()]
    return {
        "columns": [("approach", "approach"), ("samples_per_s", "samples/s"),
                    ("vs_ceiling", "x min(compute only, pipeline alone)")],
        "rows": rows,
        "facts": {"images": f"{samples} of {SIDE}x{SIDE}x3, batch {batch}",
                  "ceiling (samples/s)": ceiling},
        "chart": {"group": "group", "bar": "approach", "value": "vs_ceiling",
                  "label": "throughput relative to min(compute only, pipeline alone)"},
    }
