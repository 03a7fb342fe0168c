"""Several models in one compiled step: GANs, frozen helpers, weighting, capture."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks

MODES = {
    "eager": dict(run_eagerly=True, jit_compile=False),
    "tf.function": dict(jit_compile=False),
    "xla": dict(jit_compile=True),
}


def mlp(widths, seed, name):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((widths[0],))]
    layers += [keras.layers.Dense(w, activation="tanh") for w in widths[1:-1]]
    layers += [keras.layers.Dense(widths[-1])]
    return keras.Sequential(layers, name=name)


def gan_data(n=24, seed=0):
    rng = np.random.default_rng(seed)
    real = rng.normal(1.0, 0.5, size=(n, 3)).astype("float32")
    noise = rng.normal(size=(n, 2)).astype("float32")
    return real, noise


class GAN(tapeworks.Task):
    """Noise comes with the data so that a hand-written step sees the same noise."""

    def __init__(self, generator, discriminator, generator_every=1):
        super().__init__()
        self.generator, self.discriminator = generator, discriminator
        self.bce = keras.losses.BinaryCrossentropy(from_logits=True)
        self.add_update("discriminator", "d_loss", discriminator, keras.optimizers.SGD(0.1))
        self.add_update("generator", "g_loss", generator, keras.optimizers.SGD(0.1),
                        every=generator_every)

    def compute_losses(self, batch, training):
        real, noise = batch
        fake = self.generator(noise, training=training)
        real_logits = self.discriminator(real, training=training)
        fake_logits = self.discriminator(fake, training=training)
        self.capture("fake", fake)
        return {"d_loss": self.bce(tf.ones_like(real_logits), real_logits)
                + self.bce(tf.zeros_like(fake_logits), fake_logits),
                "g_loss": self.bce(tf.ones_like(fake_logits), fake_logits)}


def hand_written_gan(generator, discriminator, batches):
    bce = keras.losses.BinaryCrossentropy(from_logits=True)
    g_opt, d_opt = keras.optimizers.SGD(0.1), keras.optimizers.SGD(0.1)
    for real, noise in batches:
        with tf.GradientTape() as g_tape, tf.GradientTape() as d_tape:
            fake = generator(noise, training=True)
            real_logits = discriminator(real, training=True)
            fake_logits = discriminator(fake, training=True)
            d_loss = bce(tf.ones_like(real_logits), real_logits) + bce(
                tf.zeros_like(fake_logits), fake_logits)
            g_loss = bce(tf.ones_like(fake_logits), fake_logits)
        d_grads = d_tape.gradient(d_loss, discriminator.trainable_variables)
        g_grads = g_tape.gradient(g_loss, generator.trainable_variables)
        d_opt.apply_gradients(zip(d_grads, discriminator.trainable_variables))
        g_opt.apply_gradients(zip(g_grads, generator.trainable_variables))


@pytest.mark.parametrize("mode", sorted(MODES))
def test_gan_step_equals_hand_written_two_tape_step(mode):
    real, noise = gan_data()
    dataset = tf.data.Dataset.from_tensor_slices((real, noise)).batch(8)
    g_ref, d_ref = mlp((2, 8, 3), 1, "g"), mlp((3, 8, 1), 2, "d")
    hand_written_gan(g_ref, d_ref, dataset)
    g, d = mlp((2, 8, 3), 1, "g"), mlp((3, 8, 1), 2, "d")
    trainer = tapeworks.Trainer(GAN(g, d), steps_per_call=2, **MODES[mode])
    history = trainer.fit(dataset, verbose=0)
    assert set(history.history) == {"d_loss", "g_loss"}
    for model, reference in ((g, g_ref), (d, d_ref)):
        for got, want in zip(model.get_weights(), reference.get_weights()):
            np.testing.assert_allclose(got, want, atol=1e-5)


def test_k_discriminator_updates_per_generator_update():
    real, noise = gan_data(n=32)
    task = GAN(mlp((2, 8, 3), 1, "g"), mlp((3, 8, 1), 2, "d"), generator_every=2)
    trainer = tapeworks.Trainer(task, jit_compile=False, steps_per_call=3)
    trainer.fit(tf.data.Dataset.from_tensor_slices((real, noise)).batch(4), verbose=0)
    d_update, g_update = task.updates
    assert int(d_update.optimizer.iterations) == 8
    assert int(g_update.optimizer.iterations) == 4


class Perceptual(tapeworks.Task):
    """A model trained through a frozen critic: perceptual loss only."""

    def __init__(self, model, critic):
        super().__init__()
        self.model_ = model
        self.critic = self.freeze(critic)
        self.add_update("model", "perceptual", model, keras.optimizers.Adam(0.05))

    def compute_losses(self, batch, training):
        x, y = batch
        features = self.critic(self.model_(x, training=training))
        return {"perceptual": tf.reduce_mean(tf.square(features - self.critic(y)))}


def critic_with_batchnorm():
    keras.utils.set_random_seed(7)
    critic = keras.Sequential([keras.Input((3,)), keras.layers.Dense(6),
                               keras.layers.BatchNormalization(),
                               keras.layers.Dropout(0.5), keras.layers.Dense(4)])
    # Non-trivial moving statistics, as a pretrained model would have.
    critic.layers[1].moving_mean.assign(tf.fill((6,), 0.3))
    return critic


@pytest.mark.parametrize("mode", sorted(MODES))
def test_frozen_critic_is_bitwise_unchanged_and_passes_gradients(mode):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 2)).astype("float32")
    y = rng.normal(size=(32, 3)).astype("float32")
    model, critic = mlp((2, 8, 3), 1, "model"), critic_with_batchnorm()
    critic_before = [w.copy() for w in critic.get_weights()]
    model_before = [w.copy() for w in model.get_weights()]
    task = Perceptual(model, critic)
    trainer = tapeworks.Trainer(task, steps_per_call=2, **MODES[mode])
    history = trainer.fit((x, y), batch_size=8, epochs=3, verbose=0)
    for got, want in zip(critic.get_weights(), critic_before):
        assert np.array_equal(got, want)  # bitwise, moving statistics included
    assert not critic.trainable
    # Gradients flowed through the frozen critic into the model.
    assert all(not np.array_equal(a, b) for a, b in zip(model.get_weights(), model_before))
    assert history.history["perceptual"][-1] < history.history["perceptual"][0]
    # The optimizer holds slots for the model only.
    reference = keras.optimizers.Adam(0.05)
    reference.build(model.trainable_variables)
    assert len(task.updates[0].optimizer.variables) == len(reference.variables)
    assert all(id(v) not in {id(c) for c in critic.weights}
               for v in task.updates[0].variables())


def test_helper_left_trainable_but_never_updated_gets_a_warning():
    class Forgot(Perceptual):
        def __init__(self, model, critic):
            tapeworks.Task.__init__(self)
            self.model_ = model
            self.critic = critic  # not frozen
            self.add_update("model", "perceptual", model, "adam")

    rng = np.random.default_rng(0)
    data = (rng.normal(size=(8, 2)).astype("float32"), rng.normal(size=(8, 3)).astype("float32"))
    task = Forgot(mlp((2, 8, 3), 1, "model"), critic_with_batchnorm())
    with pytest.warns(UserWarning, match="is trainable but no update trains it.*freeze"):
        tapeworks.Trainer(task, jit_compile=False).fit(data, batch_size=4, verbose=0)


class TwoHeads(tapeworks.Task):
    def __init__(self, weighting, seed=0):
        super().__init__()
        keras.utils.set_random_seed(seed)
        inputs = keras.Input((4,))
        self.trunk = keras.layers.Dense(16, activation="tanh", name="trunk")
        shared = self.trunk(inputs)
        self.net = keras.Model(inputs, [keras.layers.Dense(1)(shared),
                                        keras.layers.Dense(1)(shared)])
        self.add_update("net", weighting, self.net, keras.optimizers.Adam(0.02))

    def compute_losses(self, batch, training):
        x, (ya, yb) = batch
        pa, pb = self.net(x, training=training)
        return {"a": tf.reduce_mean(tf.square(pa - ya)), "b": tf.reduce_mean(tf.square(pb - yb))}


def two_task_data(noise_a=0.0, noise_b=0.0, scale_b=1.0, n=256):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, 4)).astype("float32")
    ya = (x[:, :1] + noise_a * rng.normal(size=(n, 1))).astype("float32")
    yb = (scale_b * x[:, 1:2] + noise_b * rng.normal(size=(n, 1))).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, (ya, yb))).batch(32)


def test_static_weights_are_logged_and_applied():
    task = TwoHeads(tapeworks.StaticWeights({"a": 1.0, "b": 0.0}))
    trainer = tapeworks.Trainer(task, jit_compile=False)
    history = trainer.fit(two_task_data(), epochs=2, verbose=0)
    assert history.history["weight/a"] == [1.0, 1.0] and history.history["weight/b"] == [0.0, 0.0]
    # With weight 0, only loss a trains: b's head keeps its initial weights.
    assert history.history["b"][0] == pytest.approx(history.history["b"][1], rel=0.2)


def test_scheduled_weights_change_without_retracing():
    weights = tapeworks.ScheduledWeights(
        {"a": 1.0, "b": lambda step, epoch: tf.cast(epoch + 1, tf.float32) / 4.0})
    trainer = tapeworks.Trainer(TwoHeads(weights), jit_compile=False, steps_per_call=2)
    history = trainer.fit(two_task_data(), epochs=3, verbose=0)
    assert history.history["weight/b"] == [0.25, 0.5, 0.75]
    assert trainer.traces["train_step"] == 1  # fixed settings: the loop's one trace


def test_uncertainty_weights_are_learned():
    weights = tapeworks.UncertaintyWeighting(["a", "b"])
    trainer = tapeworks.Trainer(TwoHeads(weights), jit_compile=False)
    history = trainer.fit(two_task_data(noise_a=1.0, noise_b=0.05), epochs=15, verbose=0)
    # exp(-s) tends to 1 / loss: the noisy task's weight stays near 1 while the
    # clean task's grows, and both moved from their start at 1.
    final_a, final_b = history.history["weight/a"][-1], history.history["weight/b"][-1]
    assert final_b > 2 * final_a
    assert final_a != 1.0 and history.history["weight/b"][0] < final_b
    assert len(weights.trainable_variables) == 2
    assert all(id(v) in {id(u) for u in trainer.task.updates[0].variables()}
               for v in weights.trainable_variables)


def test_gradnorm_balances_gradient_norms():
    task = TwoHeads(None)
    weights = tapeworks.GradNorm(["a", "b"], shared=task.trunk, alpha=1.5, learning_rate=0.05)
    task.updates[0].loss = weights
    trainer = tapeworks.Trainer(task, jit_compile=False)
    # Task b's targets are 10x larger, so its gradients dominate at first.
    history = trainer.fit(two_task_data(scale_b=10.0), epochs=4, verbose=0)
    final = history.history["weight/a"][-1], history.history["weight/b"][-1]
    assert sum(final) == pytest.approx(2.0, abs=1e-5)
    assert final[1] < 1.0 < final[0]


@pytest.mark.parametrize("mode", ["tf.function", "xla", "xla-split"])
def test_capture_yields_the_right_steps_tensors(mode):
    # "xla-split": the captures leave the XLA gradients' function as its
    # outputs (`CompiledSteps.splits_xla_step`).
    real, noise = gan_data(n=28)  # batches of 4: 7 steps
    seen = []
    # One step per call, so the batch hooks can snapshot the weights of every step.
    trainer = tapeworks.Trainer(GAN(mlp((2, 8, 3), 1, "g"), mlp((3, 8, 1), 2, "d")),
                                steps_per_call=1, capture_every=3,
                                **(dict(jit_compile=True, split_xla_step_bytes=0)
                                   if mode == "xla-split" else MODES[mode]))
    generator = trainer.task.generator
    dataset = tf.data.Dataset.from_tensor_slices((real, noise)).batch(4)
    captured = tapeworks.CaptureCallback(lambda step, t: seen.append((step, t["fake"])))
    weights = {}
    snapshot = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda batch, logs: weights.setdefault(
            batch, generator.get_weights()))
    trainer.fit(dataset, callbacks=[captured, snapshot], verbose=0)
    assert [step for step, _ in seen] == [2, 5]
    for step, fake in seen:
        # The captured fakes are what the generator made from that step's noise.
        assert fake.shape == (4, 3)
        assert np.isfinite(fake).all()
        np.testing.assert_allclose(fake, _generate(generator, weights, step, noise), atol=1e-5)


def test_capture_with_auto_steps_per_call_keeps_every_capture():
    real, noise = gan_data(n=96)
    seen = []
    trainer = tapeworks.Trainer(GAN(mlp((2, 8, 3), 1, "g"), mlp((3, 8, 1), 2, "d")),
                                capture_every=4)
    trainer.fit(tf.data.Dataset.from_tensor_slices((real, noise)).batch(4), epochs=3,
                callbacks=[tapeworks.CaptureCallback(lambda step, t: seen.append(step))],
                verbose=0)
    # Every 4th step captured, whatever the calls measured while tuning.
    assert seen == list(range(3, 72, 4))
    assert all(p.steps <= 4 for p in trainer.plan.planner.queued())


def _generate(generator, weights, step, noise):
    """The generator's output at the start of `step`, from the weights seen then."""
    start = max(b for b in weights if b <= step)
    assert start == step, "need the weights at the captured step itself"
    model = keras.models.clone_model(generator)
    model.set_weights(weights[step])
    return model(noise[4 * step:4 * step + 4], training=True).numpy()


def test_gradient_penalty_of_a_linear_critic():
    critic = keras.Sequential([keras.Input((3,)),
                               keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
    real = tf.random.normal((5, 3))
    # The gradient of x -> sum(x) is (1, 1, 1) everywhere: norm sqrt(3).
    penalty = tapeworks.gradient_penalty(critic, real, tf.random.normal((5, 3)))
    assert float(penalty) == pytest.approx((3 ** 0.5 - 1) ** 2, rel=1e-5)


class WGANGP(tapeworks.Task):
    def __init__(self):
        super().__init__()
        self.generator, self.critic = mlp((2, 8, 3), 1, "g"), mlp((3, 8, 1), 2, "c")
        self.add_update("critic", "critic_loss", self.critic, keras.optimizers.Adam(1e-3))
        self.add_update("generator", "g_loss", self.generator, keras.optimizers.Adam(1e-3),
                        every=3)

    def compute_losses(self, batch, training):
        real, noise = batch
        fake = self.generator(noise, training=training)
        gap = tf.reduce_mean(self.critic(fake)) - tf.reduce_mean(self.critic(real))
        penalty = tapeworks.gradient_penalty(self.critic, real, fake)
        return {"critic_loss": gap + 10.0 * penalty, "g_loss": -tf.reduce_mean(self.critic(fake)),
                "penalty": penalty}


@pytest.mark.parametrize("mode", ["tf.function", "xla"])
def test_wgan_gp_trains_with_a_nested_tape(mode):
    real, noise = gan_data(n=64)
    trainer = tapeworks.Trainer(WGANGP(), steps_per_call=4, **MODES[mode])
    history = trainer.fit(tf.data.Dataset.from_tensor_slices((real, noise)).batch(8),
                          epochs=3, verbose=0)
    assert np.isfinite(history.history["penalty"]).all()
    assert int(trainer.task.updates[1].optimizer.iterations) == 8  # every 3rd of 24 steps


def test_task_errors():
    class NoUpdates(tapeworks.Task):
        def __init__(self):
            super().__init__()
            self.model_ = mlp((2, 3), 0, "m")

    with pytest.raises(tapeworks.ConfigError, match="declares no update"):
        tapeworks.Trainer(NoUpdates())
    with pytest.raises(tapeworks.ConfigError, match="`optimizer`, `loss` given with a Task"):
        tapeworks.Trainer(GAN(mlp((2, 3), 0, "g"), mlp((3, 1), 0, "d")), "adam", "mse")

    class WrongName(GAN):
        def compute_losses(self, batch, training):
            losses = super().compute_losses(batch, training)
            return {"d_loss": losses["d_loss"], "generator": losses["g_loss"]}

    real, noise = gan_data()
    trainer = tapeworks.Trainer(WrongName(mlp((2, 3), 0, "g"), mlp((3, 1), 0, "d")),
                                jit_compile=False)
    with pytest.raises(tapeworks.ConfigError, match="trains on loss 'g_loss'.*'generator'"):
        trainer.fit(tf.data.Dataset.from_tensor_slices((real, noise)).batch(8), verbose=0)
    with pytest.raises(tapeworks.ConfigError, match="capture_every"):
        tapeworks.Trainer(GAN(mlp((2, 3), 0, "g"), mlp((3, 1), 0, "d")), capture_every=0)


def test_a_task_gets_the_same_batch_from_arrays_and_from_a_dataset():
    # The README's GAN does `tf.shape(real)[0]` on the batch: from an array it
    # must be a tensor too, not the 1-tuple (x,) Keras' unpacking expects.
    seen = []

    class Recon(tapeworks.Task):
        def __init__(self):
            super().__init__()
            self.net = mlp((3, 4, 3), 0, "recon")
            self.add_update("recon", "loss", self.net, keras.optimizers.SGD(0.1))

        def compute_losses(self, batch, training):
            seen.append(type(batch).__name__)
            return {"loss": tf.reduce_mean(tf.square(self.net(batch) - batch))
                    + 0.0 * tf.cast(tf.shape(batch)[0], tf.float32)}

    x = np.random.default_rng(0).normal(size=(8, 3)).astype("float32")
    from_array = tapeworks.Trainer(Recon(), jit_compile=False, steps_per_call=2, seed=0,
                                   plan_cache=False)
    from_array.fit(x, batch_size=4, shuffle=False, epochs=1, verbose=0)
    from_dataset = tapeworks.Trainer(Recon(), jit_compile=False, steps_per_call=2, seed=0,
                                     plan_cache=False)
    from_dataset.fit(tf.data.Dataset.from_tensor_slices(x).batch(4), epochs=1, verbose=0)
    assert "tuple" not in seen and seen
    for a, b in zip(from_array.model.get_weights(), from_dataset.model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_two_updates_that_train_the_same_variables_are_refused_unless_shared():
    def gan(shared):
        class StackedGAN(tapeworks.Task):
            def __init__(self):
                super().__init__()
                self.generator = mlp((2, 8, 3), 1, "g")
                self.discriminator = mlp((3, 8, 1), 2, "d")
                self.stacked = keras.Sequential([self.generator, self.discriminator])
                self.add_update("discriminator", "d_loss", self.discriminator,
                                keras.optimizers.SGD(0.1), shared=shared)
                # The classic mistake: the generator's update lists the stacked model.
                self.add_update("generator", "g_loss", self.stacked, keras.optimizers.SGD(0.1),
                                shared=shared)

            def compute_losses(self, batch, training):
                real, noise = batch
                fake = self.generator(noise, training=training)
                d = tf.reduce_mean(self.discriminator(fake)) - tf.reduce_mean(
                    self.discriminator(real))
                return {"d_loss": d, "g_loss": -tf.reduce_mean(self.stacked(noise))}
        return StackedGAN()

    rng = np.random.default_rng(0)
    data = (rng.normal(size=(8, 3)).astype("float32"), rng.normal(size=(8, 2)).astype("float32"))
    trainer = tapeworks.Trainer(gan(shared=False), jit_compile=False, plan_cache=False)
    with pytest.raises(tapeworks.ConfigError, match="'discriminator' and 'generator' both train"):
        trainer.fit(tf.data.Dataset.from_tensor_slices(data).batch(4), verbose=0)
    tapeworks.Trainer(gan(shared=True), jit_compile=False, plan_cache=False).fit(
        tf.data.Dataset.from_tensor_slices(data).batch(4), verbose=0)
