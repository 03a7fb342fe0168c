"""A GAN on scikit-learn's bundled handwritten digits, in one compiled step per batch.

Both updates (discriminator, then generator) come from one forward pass; the
generated samples are captured from inside the compiled step every few
hundred steps (no `predict()`), and a grid of them is written as a PNG.

    python examples/gan_digits.py [--quick] [--out gan-digits]
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tapeworks  # noqa: E402

NOISE = 32


def load_digits():
    from sklearn.datasets import load_digits as digits

    images = digits().images.reshape(-1, 64).astype("float32")
    return images / 8.0 - 1.0  # pixels 0..16 -> -1..1


def generator():
    return keras.Sequential([keras.Input((NOISE,)),
                             keras.layers.Dense(128), keras.layers.LeakyReLU(0.2),
                             keras.layers.Dense(128), keras.layers.LeakyReLU(0.2),
                             keras.layers.Dense(64, activation="tanh")], name="generator")


def discriminator():
    return keras.Sequential([keras.Input((64,)),
                             keras.layers.Dense(128), keras.layers.LeakyReLU(0.2),
                             keras.layers.Dense(128), keras.layers.LeakyReLU(0.2),
                             keras.layers.Dense(1)], name="discriminator")


class DigitsGAN(tapeworks.Task):
    def __init__(self, discriminator_steps=1):
        super().__init__()
        self.generator = generator()
        self.discriminator = discriminator()
        self.bce = keras.losses.BinaryCrossentropy(from_logits=True)
        self.add_update("discriminator", "d_loss", self.discriminator,
                        keras.optimizers.Adam(2e-4, beta_1=0.5))
        self.add_update("generator", "g_loss", self.generator,
                        keras.optimizers.Adam(2e-4, beta_1=0.5), every=discriminator_steps)

    def compute_losses(self, real, training):
        noise = self.random.normal((tf.shape(real)[0], NOISE))
        fake = self.generator(noise, training=training)
        real_logits = self.discriminator(real, training=training)
        fake_logits = self.discriminator(fake, training=training)
        self.capture("fake", fake[:16])
        return {
            "d_loss": self.bce(tf.fill(tf.shape(real_logits), 0.9), real_logits)
            + self.bce(tf.zeros_like(fake_logits), fake_logits),
            "g_loss": self.bce(tf.ones_like(fake_logits), fake_logits),
        }


def save_grid(samples, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = len(samples)
    fig, axes = plt.subplots(rows, 16, figsize=(8, rows * 0.6 + 0.2))
    axes = np.atleast_2d(axes)
    for r, (step, images) in enumerate(samples):
        for c in range(16):
            axes[r, c].imshow(images[c].reshape(8, 8), cmap="gray_r", vmin=-1, vmax=1)
            axes[r, c].axis("off")
        axes[r, 0].set_title(f"step {step}", fontsize=6, loc="left")
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds, for tests")
    parser.add_argument("--out", default="gan-digits")
    args = parser.parse_args(argv)
    keras.utils.set_random_seed(0)
    real = load_digits()
    epochs, every = (3, 50) if args.quick else (60, 1000)
    dataset = (tf.data.Dataset.from_tensor_slices(real).shuffle(len(real), seed=0)
               .batch(64, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
    samples = []
    trainer = tapeworks.Trainer(DigitsGAN(), capture_every=every, seed=0)
    history = trainer.fit(dataset, epochs=epochs, verbose=0 if args.quick else 2,
                          callbacks=[tapeworks.CaptureCallback(
                              lambda step, t: samples.append((step, t["fake"])))])
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "samples.png")
    save_grid(samples[-8:], path)
    print(f"d_loss {history.history['d_loss'][-1]:.3f}, g_loss "
          f"{history.history['g_loss'][-1]:.3f} after {epochs} epochs; "
          f"{len(samples)} captures; wrote {path}")
    return history, samples


if __name__ == "__main__":
    main()
