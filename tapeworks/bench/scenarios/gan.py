"""Scenario `gan`: one GAN step written five ways, and a frozen critic against a trainable one.

GAN: two 3-layer MLPs (noise 32, width 256, data 64, batch 128), trained by
(1) `g.predict()` + two `train_on_batch` calls, the pattern of the seed
question; (2) the same with `g(noise, training=False)`; (3) a hand-written
`tf.function` step; (4) the same step under XLA; (5) a tapeworks Task with
its own choice of XLA and steps per call. Steps per second, alternating.

Perceptual loss: a small convolutional model trained through a deeper
convolutional critic, with the critic frozen by tapeworks, frozen by hand, or
left trainable inside the tape (its variables watched and differentiated, as
when it sits inside the trained model). Steps per second and the peak memory
each adds, sampled during its timed runs.
"""

import keras
import numpy as np
import tensorflow as tf

from tapeworks.bench.data import in_memory_dataset
from tapeworks.bench.memory import PeakSampler, rss_bytes
from tapeworks.bench.timing import QUICK_SETTLING, Approach, alternate, settle_trainer
from tapeworks.engine import Trainer
from tapeworks.engine.step.task import Task

DESCRIPTION = ("GAN step: predict + train_on_batch vs hand-written (tf.function, XLA) vs "
               "tapeworks; perceptual loss with a frozen vs trainable critic")
NOISE, WIDTH, DATA, BATCH = 32, 256, 64, 128
PREDICT_PATTERN = "g.predict() + train_on_batch x2"


def _mlp(inputs, outputs, name, seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((inputs,)),
                             keras.layers.Dense(WIDTH, activation="relu"),
                             keras.layers.Dense(WIDTH, activation="relu"),
                             keras.layers.Dense(outputs)], name=name)


def _pair(seed=0):
    return _mlp(NOISE, DATA, "generator", seed), _mlp(DATA, 1, "discriminator", seed + 1)


class _GAN(Task):
    def __init__(self):
        super().__init__()
        self.generator, self.discriminator = _pair()
        self.bce = keras.losses.BinaryCrossentropy(from_logits=True)
        self.add_update("discriminator", "d_loss", self.discriminator,
                        keras.optimizers.Adam(2e-4))
        self.add_update("generator", "g_loss", self.generator, keras.optimizers.Adam(2e-4))

    def compute_losses(self, real, training):
        noise = tf.random.normal((tf.shape(real)[0], NOISE))
        fake = self.generator(noise, training=training)
        real_logits = self.discriminator(real, training=training)
        fake_logits = self.discriminator(fake, training=training)
        return {"d_loss": self.bce(tf.ones_like(real_logits), real_logits)
                + self.bce(tf.zeros_like(fake_logits), fake_logits),
                "g_loss": self.bce(tf.ones_like(fake_logits), fake_logits)}


def _keras_pattern(use_predict, real, steps):
    generator, discriminator = _pair()
    discriminator.compile(keras.optimizers.Adam(2e-4),
                          keras.losses.BinaryCrossentropy(from_logits=True))
    # The classic combined model: the discriminator frozen inside it
    # (its own compile above keeps it trainable for its own train_on_batch).
    frozen = keras.models.clone_model(discriminator)
    frozen.trainable = False
    combined = keras.Sequential([generator, frozen])
    combined.compile(keras.optimizers.Adam(2e-4), keras.losses.BinaryCrossentropy(from_logits=True))
    labels = np.concatenate([np.ones((BATCH, 1)), np.zeros((BATCH, 1))]).astype("float32")
    ones = np.ones((BATCH, 1), "float32")
    rng = np.random.default_rng(0)

    def run():
        for i in range(steps):
            noise = rng.normal(size=(BATCH, NOISE)).astype("float32")
            if use_predict:
                fake = generator.predict(noise, verbose=0)
            else:
                fake = generator(noise, training=False).numpy()
            discriminator.train_on_batch(np.concatenate([real[i], fake]), labels)
            frozen.set_weights(discriminator.get_weights())
            combined.train_on_batch(noise, ones)
        return steps

    return run


def _hand_written(jit, real_batches):
    generator, discriminator = _pair()
    g_opt, d_opt = keras.optimizers.Adam(2e-4), keras.optimizers.Adam(2e-4)
    bce = keras.losses.BinaryCrossentropy(from_logits=True)

    @tf.function(jit_compile=jit)
    def step(real):
        noise = tf.random.normal((BATCH, NOISE))
        with tf.GradientTape() as g_tape, tf.GradientTape() as d_tape:
            fake = generator(noise, training=True)
            real_logits = discriminator(real, training=True)
            fake_logits = discriminator(fake, training=True)
            d_loss = bce(tf.ones_like(real_logits), real_logits) + bce(
                tf.zeros_like(fake_logits), fake_logits)
            g_loss = bce(tf.ones_like(fake_logits), fake_logits)
        d_opt.apply_gradients(zip(d_tape.gradient(d_loss, discriminator.trainable_variables),
                                  discriminator.trainable_variables))
        g_opt.apply_gradients(zip(g_tape.gradient(g_loss, generator.trainable_variables),
                                  generator.trainable_variables))
        return d_loss

    def run():
        for batch in real_batches:
            loss = step(batch)
        float(loss)  # wait for the last step
        return len(real_batches)

    return run


def _gan_rows(quick, repeats):
    rng = np.random.default_rng(0)
    slow_steps, fast_steps = (4, 40) if quick else (20, 400)
    real = rng.normal(size=(fast_steps, BATCH, DATA)).astype("float32")
    dataset = in_memory_dataset(real.reshape(-1, DATA), BATCH)
    batches = [tf.constant(b) for b in real]
    trainer = Trainer(_GAN(), seed=0)

    approaches = [
        Approach(PREDICT_PATTERN, _keras_pattern(True, real, slow_steps)),
        Approach("g(noise) + train_on_batch x2", _keras_pattern(False, real, slow_steps)),
        Approach("hand-written tf.function step", _hand_written(False, batches)),
        Approach("hand-written XLA step", _hand_written(True, batches)),
        Approach("tapeworks Task", lambda: (trainer.fit(dataset, verbose=0), fast_steps)[1],
                 setup=lambda: settle_trainer(trainer, dataset,
                                              **(QUICK_SETTLING if quick else {}))),
    ]
    results = alternate(approaches, repeats)
    base = results[PREDICT_PATTERN]["samples_per_s"]
    best_hand = max(results[n]["samples_per_s"] for n in results if n.startswith("hand"))
    return [{"part": "GAN step", "approach": name, "value": r["samples_per_s"],
             "unit": "steps/s", "vs_predict_pattern": r["samples_per_s"] / base,
             "vs_best_hand_written": r["samples_per_s"] / best_hand,
             "repeats": r["runs"], "notes": r["notes"]} for name, r in results.items()]


def _convnet(widths, outputs, name, seed):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((32, 32, 3))]
    layers += [keras.layers.Conv2D(w, 3, padding="same", activation="relu") for w in widths]
    layers += [keras.layers.Conv2D(outputs, 3, padding="same")]
    return keras.Sequential(layers, name=name)


class _Perceptual(Task):
    def __init__(self, model, critic):
        super().__init__()
        self.network = model
        self.critic = self.freeze(critic)
        self.add_update("network", "loss", model, keras.optimizers.Adam(1e-3))

    def compute_losses(self, batch, training):
        x, y = batch
        return {"loss": tf.reduce_mean(tf.square(
            self.critic(self.network(x, training=training)) - self.critic(y)))}


def _perceptual_rows(quick, repeats):
    steps = 4 if quick else 30
    batch = 8 if quick else 32
    critic_widths = (16, 16) if quick else (64, 64, 64, 64)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * batch, 32, 32, 3)).astype("float32")
    y = rng.normal(size=(steps * batch, 32, 32, 3)).astype("float32")
    dataset = in_memory_dataset((x, y), batch)
    pairs = [(tf.constant(x[i:i + batch]), tf.constant(y[i:i + batch]))
             for i in range(0, len(x), batch)]

    def hand(frozen):
        model = _convnet((32, 32), 3, "model", 0)
        critic = _convnet(critic_widths, 16, "critic", 1)
        critic.trainable = not frozen
        optimizer = keras.optimizers.Adam(1e-3)
        watched = model.trainable_variables + critic.trainable_variables

        @tf.function
        def step(a, b):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(critic(model(a, training=True),
                                                       training=not frozen)
                                                - critic(b, training=not frozen)))
            grads = tape.gradient(loss, watched)
            n = len(model.trainable_variables)
            optimizer.apply_gradients(zip(grads[:n], model.trainable_variables))
            return loss

        def run():
            for a, b in pairs:
                loss = step(a, b)
            float(loss)
            return steps

        return run

    trainer = Trainer(_Perceptual(_convnet((32, 32), 3, "model", 0),
                                  _convnet(critic_widths, 16, "critic", 1)), seed=0)
    memory = {}

    def measured(name, run):
        def wrapped():
            before = rss_bytes()
            with PeakSampler() as sampler:
                done = run()
            memory.setdefault(name, []).append((sampler.peak - before) / 2**20)
            return done
        return wrapped

    def tapeworks_run():
        trainer.fit(dataset, verbose=0)
        return steps

    approaches = [
        Approach("critic frozen by tapeworks", measured("tapeworks", tapeworks_run),
                 setup=lambda: settle_trainer(trainer, dataset,
                                              **(QUICK_SETTLING if quick else {}))),
        Approach("critic frozen by hand (tf.function)", measured("frozen", hand(True))),
        Approach("critic left trainable in the tape (tf.function)",
                 measured("trainable", hand(False))),
    ]
    results = alternate(approaches, repeats)
    trainable = results["critic left trainable in the tape (tf.function)"]["samples_per_s"]
    rows = []
    for (name, r), key in zip(results.items(), ("tapeworks", "frozen", "trainable")):
        peak = max(memory[key][-repeats:])
        rows.append({"part": "perceptual loss", "approach": name, "value": r["samples_per_s"],
                     "unit": "steps/s", "vs_predict_pattern": float("nan"),
                     "vs_best_hand_written": r["samples_per_s"] / trainable,
                     "repeats": r["runs"],
                     "notes": dict(r["notes"], peak_added_mib=round(peak, 1))})
    return rows


def run(quick=False, repeats=5):
    rows = _gan_rows(quick, repeats) + _perceptual_rows(quick, repeats)
    return {
        "columns": [("part", "part"), ("approach", "approach"), ("value", "value"),
                    ("unit", "unit"), ("vs_predict_pattern", "x predict pattern"),
                    ("vs_best_hand_written", "x best hand-written (perceptual: x trainable)")],
        "rows": rows,
        "facts": {"GAN": f"MLPs noise {NOISE} -> {WIDTH} -> {WIDTH} -> {DATA}, batch {BATCH}"},
        "chart": {"group": "part", "bar": "approach", "value": "vs_best_hand_written",
                  "label": "throughput ratio"},
    }
