"""Small trainings run on one device or under MirroredStrategy over two logical CPUs.

`python -m tests.distribute.scenarios one|mirrored NAME...` prints one JSON
line per scenario: the weights after training, the fit logs, evaluate's and
predict's results. The test compares the two modes. Every global batch
splits evenly over two replicas, where the rule "each replica's loss is the
mean over its share, gradients summed" equals the global-batch mean.
"""

import contextlib
import json
import logging
import re
import sys

import keras
import numpy as np
import tensorflow as tf

import tapeworks

rng = np.random.default_rng(0)
X = rng.normal(size=(64, 4)).astype("float32")
Y = rng.normal(size=(64, 2)).astype("float32")
LABELS = (X[:, 0] + X[:, 1] > 0).astype("int32")


def sequential():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2)])
    trainer = tapeworks.Trainer(model, keras.optimizers.Adam(0.01), "mse", metrics=["mae"],
                                steps_per_call=2)
    return model, trainer, (X, Y)


def functional():
    a, b = keras.Input((2,), name="a"), keras.Input((2,), name="b")
    hidden = keras.layers.Dense(8, activation="tanh")(keras.layers.Concatenate()([a, b]))
    model = keras.Model([a, b], keras.layers.Dense(2, name="logits")(hidden))
    trainer = tapeworks.Trainer(
        model, "adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"], jit_compile=False, steps_per_call="auto")
    return model, trainer, ((X[:, :2], X[:, 2:]), LABELS)


class GAN(tapeworks.Task):
    """Noise comes with the batch, so both modes see the same numbers."""

    def __init__(self):
        super().__init__()
        self.generator = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)])
        self.discriminator = keras.Sequential([keras.Input((4,)),
                                               keras.layers.Dense(6, activation="relu"),
                                               keras.layers.Dense(1)])
        self.bce = keras.losses.BinaryCrossentropy(from_logits=True)
        self.add_update("discriminator", loss="d_loss", trains=self.discriminator,
                        optimizer=keras.optimizers.Adam(1e-2, beta_1=0.5))
        self.add_update("generator", loss="g_loss", trains=self.generator,
                        optimizer=keras.optimizers.Adam(1e-2, beta_1=0.5))

    def compute_losses(self, batch, training):
        real, noise = batch
        fake = self.generator(noise, training=training)
        real_logits = self.discriminator(real, training=training)
        fake_logits = self.discriminator(fake, training=training)
        d_loss = (self.bce(tf.ones_like(real_logits), real_logits)
                  + self.bce(tf.zeros_like(fake_logits), fake_logits))
        self.capture("fake", fake)
        return {"d_loss": d_loss, "g_loss": self.bce(tf.ones_like(fake_logits), fake_logits)}


def gan():
    task = GAN()
    noise = rng.normal(size=(64, 3)).astype("float32")
    trainer = tapeworks.Trainer(task, steps_per_call=2, capture_every=2)
    return task.generator, trainer, tf.data.Dataset.from_tensor_slices((X, noise)).batch(16)


class MixedReductions(tapeworks.Task):
    """One loss term from a Keras loss object (which divides by the replicas
    on its own), one from a plain `tf.reduce_mean` (which does not)."""

    def __init__(self):
        super().__init__()
        self.net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        self.mse = keras.losses.MeanSquaredError()
        self.add_update("model", loss=lambda losses, counters: losses["keras"]
                        + losses["plain"], trains=self.net,
                        optimizer=keras.optimizers.SGD(0.1))

    def compute_losses(self, batch, training):
        x, y = batch
        prediction = self.net(x, training=training)
        return {"keras": self.mse(y, prediction),
                "plain": tf.reduce_mean(tf.abs(y - prediction))}


def reductions():
    task = MixedReductions()
    trainer = tapeworks.Trainer(task, steps_per_call=2)
    return task.net, trainer, tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)


def with_options(**options):
    def build():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(2)])
        trainer = tapeworks.Trainer(model, keras.optimizers.SGD(0.1), "mse",
                                    jit_compile=False, **options)
        return model, trainer, (X, Y)
    return build


def batchnorm(sync):
    def build():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8),
                                  keras.layers.BatchNormalization(), keras.layers.Dense(2)])
        trainer = tapeworks.Trainer(model, "sgd", "mse", steps_per_call=2,
                                    sync_batchnorm=sync)
        return model, trainer, (X, Y)
    return build


SCENARIOS = {
    "sequential": sequential,
    "functional": functional,
    "gan": gan,
    "reductions": reductions,
    "accumulate": with_options(accumulate=2, steps_per_call=3),
    "clip": with_options(clip_norm=0.05, steps_per_call=2),
    "bfloat16": with_options(precision="mixed_bfloat16", steps_per_call=2),
    "float16": with_options(precision="mixed_float16", steps_per_call=2),
    "sync_batchnorm": batchnorm(True),
    "batchnorm_per_replica": batchnorm(False),
}


class AnnouncedReplicas(logging.Handler):
    """The replica count a Trainer announces ("training on 2 replicas under ..."); 1 if none."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.count = 1

    def emit(self, record):
        match = re.search(r"training on (\d+) replicas? under", record.getMessage())
        if match:
            self.count = int(match.group(1))


def run(strategy, name):
    with strategy.scope() if strategy else contextlib.nullcontext():
        keras.utils.set_random_seed(1)
        model, trainer, data = SCENARIOS[name]()
    kwargs = {} if isinstance(data, tf.data.Dataset) else {"batch_size": 16, "shuffle": False}
    captured = []
    callbacks = [tapeworks.CaptureCallback(
        lambda step, tensors: captured.append((step, tensors["fake"].tolist())))]
    announced = AnnouncedReplicas()
    log = logging.getLogger("tapeworks")
    level = log.level
    log.setLevel(logging.INFO)
    log.addHandler(announced)
    try:
        history = trainer.fit(data, epochs=3, verbose=0, callbacks=callbacks, **kwargs)
    finally:
        log.removeHandler(announced)
        log.setLevel(level)
    result = {
        "name": name,
        "replicas": announced.count,
        "weights": [w.tolist() for w in model.get_weights()],
        "history": history.history,
        "steps": int(trainer.counters.step.numpy()),
        "captured": captured,
    }
    if not isinstance(data, tf.data.Dataset):
        result["evaluate"] = trainer.evaluate(data, batch_size=16, verbose=0, return_dict=True)
        x = data[0]
        result["predict"] = np.asarray(trainer.predict(x, batch_size=16, verbose=0)).tolist()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    # Two logical CPUs, before TensorFlow starts (the test imports only the names).
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    # One strategy per process, as in a real script: two MirroredStrategy
    # objects in one process reuse collective keys (TensorFlow's own limit).
    mirrored = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
                if sys.argv[1] == "mirrored" else None)
    for scenario in sys.argv[2:]:
        run(mirrored, scenario)
