"""One training run with `checkpoint_dir`, in its own process, for the kill tests.

`python -m tests.engine.resume.worker SPEC_JSON`. It trains a tiny deterministic
setup described by the spec, appends `global_step loss` to `spec["log"]`
after every step, and writes the final weights, optimizer state and metrics
to `spec["result"]` (.npz). Fault injection, for the kill tests:
`kill_at_step` sends this process SIGKILL after the call that reaches that
global step;
`kill_in_save` SIGKILLs it in the middle of the n-th save (after the
TensorFlow files are written, before the manifest); `kill_in_publish` in
the n-th save's background publication (manifest written, folder not yet
renamed).
"""

import json
import os
import signal
import sys


def small_gan_class():
    import keras
    import tensorflow as tf

    import tapeworks

    class SmallGAN(tapeworks.Task):
        """The README's GAN, tiny; its noise comes from the checkpointed `self.random`."""

        def __init__(self, generator, discriminator):
            super().__init__()
            self.generator, self.discriminator = generator, discriminator
            self.bce = keras.losses.BinaryCrossentropy(from_logits=True)
            self.add_update("discriminator", loss="d_loss", trains=discriminator,
                            optimizer=keras.optimizers.Adam(1e-2))
            self.add_update("generator", loss="g_loss", trains=generator,
                            optimizer=keras.optimizers.Adam(1e-2))

        def compute_losses(self, real, training):
            noise = self.random.normal((tf.shape(real)[0], 3))
            fake = self.generator(noise, training=training)
            real_logits = self.discriminator(real, training=training)
            fake_logits = self.discriminator(fake, training=training)
            d_loss = (self.bce(tf.ones_like(real_logits), real_logits)
                      + self.bce(tf.zeros_like(fake_logits), fake_logits))
            return {"d_loss": d_loss,
                    "g_loss": self.bce(tf.ones_like(fake_logits), fake_logits)}

    return SmallGAN


def build(spec):
    import keras
    import numpy as np
    import tensorflow as tf

    import tapeworks

    keras.utils.set_random_seed(0)
    rng = np.random.RandomState(0)
    x = rng.randn(96, 4).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32")
    options = dict(seed=3, jit_compile=spec.get("jit", False),
                   steps_per_call=spec.get("steps_per_call", 1),
                   accumulate=spec.get("accumulate", 1))
    if spec.get("auto"):
        options.update(jit_compile="auto", steps_per_call="auto", deterministic=True,
                       plan_cache=False)
    if spec.get("model") == "gan":
        SmallGAN = small_gan_class()
        images = rng.rand(96, 6).astype("float32")
        generator = keras.Sequential([keras.Input((3,)), keras.layers.Dense(6)])
        discriminator = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4,
                                          activation="relu"), keras.layers.Dense(1)])
        task = SmallGAN(generator, discriminator)
        trainer = tapeworks.Trainer(task, **options)
        data = tf.data.Dataset.from_tensor_slices(images).shuffle(96, seed=5).batch(16)
        return trainer, (data,), {}, [generator, discriminator]
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dropout(0.25), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(1e-2),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    trainer = tapeworks.Trainer(model, **options)
    if spec.get("data") == "pipeline":
        def augment(features, label, seed):
            noise = tf.random.stateless_normal(tf.shape(features), seed)
            return features + 0.1 * noise, label

        data = tapeworks.data.pipeline((x, y), batch_size=16, training=True,
                                       augment=augment, seed=7)
        return trainer, (data,), {}, [model]
    return trainer, (x, y), {"batch_size": 16}, [model]


def main(spec):
    import keras
    import numpy as np
    import tensorflow as tf

    from tapeworks.engine.resume import run_checkpoint

    tf.config.experimental.enable_op_determinism()
    trainer, data, data_options, models = build(spec)
    log = open(spec["log"], "a", buffering=1)

    class Record(keras.callbacks.Callback):
        # It reads the step counter: calls of several steps ("auto") are kept.
        batch_hooks_per_call = True

        def on_train_batch_end(self, batch, logs=None):
            step = int(trainer.counters.step)
            loss = logs.get("loss", logs.get("d_loss"))
            log.write(f"{step} {float(loss)!r}\n")
            if spec.get("kill_at_step") is not None and step >= spec["kill_at_step"]:
                log.flush()
                os.kill(os.getpid(), signal.SIGKILL)

    if spec.get("kill_in_save"):
        saves = {"n": 0}
        original = run_checkpoint.CheckpointFolder.write

        def write(self, step, write_files):
            def write_then_die(folder):
                write_files(folder)
                saves["n"] += 1
                if saves["n"] == spec["kill_in_save"]:
                    os.kill(os.getpid(), signal.SIGKILL)
            return original(self, step, write_then_die)

        run_checkpoint.CheckpointFolder.write = write

    if spec.get("kill_in_publish"):
        # On the background thread of an asynchronous save: the manifest is
        # written and synced, the folder not yet renamed into place.
        published = {"n": 0}
        original_publish = run_checkpoint.CheckpointFolder.publish
        from tapeworks.engine.resume import checkpoint_folder

        original_sync = checkpoint_folder.fsync_folder

        def publish(self, partial, final):
            published["n"] += 1
            return original_publish(self, partial, final)

        def sync_or_die(path):
            if published["n"] == spec["kill_in_publish"] and ".partial-" in path:
                os.kill(os.getpid(), signal.SIGKILL)
            original_sync(path)

        run_checkpoint.CheckpointFolder.publish = publish
        checkpoint_folder.fsync_folder = sync_or_die

    callbacks = [Record()]
    if spec.get("early_stopping"):
        callbacks.append(keras.callbacks.EarlyStopping("loss", patience=2, min_delta=10.0,
                                                       restore_best_weights=True))
    history = trainer.fit(*data, epochs=spec["epochs"], verbose=0, callbacks=callbacks,
                          checkpoint_dir=spec["dir"],
                          checkpoint_every=spec.get("every", 5),
                          checkpoint_async=spec.get("async", False), **data_options)
    arrays = {f"w{i}_{j}": np.asarray(w) for i, m in enumerate(models)
              for j, w in enumerate(m.get_weights())}
    for i, update in enumerate(trainer.task.updates):
        for j, v in enumerate(update.optimizer.variables):
            arrays[f"opt{i}_{j}"] = np.asarray(v)
    arrays["step"] = np.asarray(int(trainer.counters.step))
    np.savez(spec["result"], **arrays)
    print(json.dumps({"history": {k: [float(v) for v in vs]
                                  for k, vs in history.history.items()}}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
