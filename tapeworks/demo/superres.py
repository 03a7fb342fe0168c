"""The demo: x2 super-resolution trained on scikit-image's bundled photographs.

A small ESPCN-style network (five convolutions, pixel shuffle) learns the
residual on top of bicubic upsampling. It trains on patches of the luminance
(Y) channel of every bundled photograph except the astronaut, which is held
out: PSNR on its luminance is reported for the network and for bicubic, as is
usual for super-resolution. Colour in the PNG comes from bicubic-upsampled
chroma. Nothing is downloaded.
"""

import dataclasses
import os
import time

import keras
import numpy as np
import tensorflow as tf

from tapeworks.demo.budget import TimeBudget
from tapeworks.engine import Trainer
from tapeworks.engine.step.task import Task
from tapeworks.engine.step.weighting import StaticWeights

SCALE = 2
TRAIN_IMAGES = (
    "camera", "chelsea", "coffee", "rocket", "brick", "grass", "gravel", "clock",
    "coins", "moon", "page", "text", "immunohistochemistry", "hubble_deep_field",
    "retina",
)
HELD_OUT = "astronaut"
SHAVE = 4  # border pixels left out of PSNR, as SR papers do
# The epochs `fit` is given when only a time budget limits training: a cap
# no budget a user would ask for reaches on any machine.
EPOCHS_UNTIL_BUDGET = 1000


@dataclasses.dataclass
class DemoConfig:
    """The demo's sizes and its length.

    Training ends at whichever limit comes first: `epochs` epochs, or
    `seconds` of training (from the start of `fit`: tracing and measuring
    included). Either may be None (no limit of that kind), not both. The
    defaults (4 epochs or 75 s) let a fast, idle 2-core machine finish the
    four epochs (54 s measured) and stop a slow one (about 0.135 s a step)
    at the budget, near 500 steps, so the demo takes under 2 minutes on
    both.
    """

    patch: int = 48          # high-resolution patch side
    patches: int = 16000
    batch_size: int = 32
    epochs: int = 4
    seconds: float = 75.0
    learning_rate: float = 2e-3
    width: int = 48
    seed: int = 0

    @classmethod
    def quick(cls):
        return cls(patches=4096, epochs=1, seconds=None, width=16)


def luminance(rgb):
    """ITU-R BT.601 luma of an RGB image in [0, 1]."""
    return rgb @ np.array([0.299, 0.587, 0.114], np.float32)


def load_photo(name):
    import skimage.data

    image = np.asarray(getattr(skimage.data, name)(), np.float32) / 255.0
    if image.ndim == 2:
        image = np.stack([image] * 3, axis=-1)
    return image[..., :3]


def downscale(hr):
    """The degradation the network learns to invert: antialiased bicubic x1/2."""
    hr = tf.convert_to_tensor(hr)
    size = tf.shape(hr)[-3:-1] // SCALE
    return tf.image.resize(hr, size, method="bicubic", antialias=True)


def upscale_bicubic(lr):
    size = tf.shape(lr)[-3:-1] * SCALE
    return tf.clip_by_value(tf.image.resize(lr, size, method="bicubic"), 0.0, 1.0)


def make_patches(config):
    """HR luminance patches cut at random places, flipped and rotated at random."""
    rng = np.random.default_rng(config.seed)
    images = [luminance(load_photo(name)) for name in TRAIN_IMAGES]
    weights = np.array([im.size for im in images], np.float64)
    weights /= weights.sum()
    p = config.patch
    out = np.empty((config.patches, p, p, 1), np.float32)
    for i, which in enumerate(rng.choice(len(images), config.patches, p=weights)):
        image = images[which]
        top = rng.integers(0, image.shape[0] - p + 1)
        left = rng.integers(0, image.shape[1] - p + 1)
        patch = np.rot90(image[top:top + p, left:left + p], rng.integers(4))
        if rng.integers(2):
            patch = patch[:, ::-1]
        out[i, ..., 0] = patch
    hr = out
    lr = downscale(hr).numpy()
    return lr, hr


@keras.saving.register_keras_serializable(package="tapeworks")
class BicubicResidual(keras.layers.Layer):
    """Adds the pixel-shuffled residual to the bicubic upsampling of the input.

    Registered, so a saved demo network loads without `custom_objects=` (in
    a process that imports this module).
    """

    def call(self, inputs):
        lr, residual = inputs
        # Under a mixed policy the residual is bfloat16 or float16, while the
        # resize computes in float32: the sum is in the layer's compute dtype.
        upscaled = tf.cast(upscale_bicubic(lr), residual.dtype)
        return upscaled + tf.nn.depth_to_space(residual, SCALE)


def build_model(width=48):
    """ESPCN-style: five convolutions in low resolution, then pixel shuffle."""
    lr = keras.Input((None, None, 1), name="low_res")
    h = keras.layers.Conv2D(width, 5, padding="same", activation="relu")(lr)
    h = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(h)
    h = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(h)
    h = keras.layers.Conv2D(width // 2, 3, padding="same", activation="relu")(h)
    residual = keras.layers.Conv2D(SCALE * SCALE, 3, padding="same",
                                   kernel_initializer="zeros")(h)
    return keras.Model(lr, BicubicResidual()([lr, residual]), name="espcn_x2")


def build_critic(width=16):
    """A small convolutional critic: tells original patches from bicubic ones."""
    hr = keras.Input((None, None, 1), name="image")
    h = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(hr)
    h = keras.layers.Conv2D(width, 3, padding="same", activation="relu", name="features")(h)
    score = keras.layers.Dense(1)(keras.layers.GlobalAveragePooling2D()(h))
    return keras.Model(hr, score, name="sharpness_critic")


def pretrain_critic(hr, config):
    """Trains the critic to tell sharp originals (1) from their bicubic round trip (0).

    This is the "pretrained evaluation model" of the perceptual loss: trained
    once, here, on the training patches (no download), then frozen.
    """
    blurred = upscale_bicubic(downscale(hr)).numpy()
    x = np.concatenate([hr, blurred])
    y = np.concatenate([np.ones(len(hr)), np.zeros(len(hr))]).astype("float32")
    critic = build_critic()
    Trainer(critic, keras.optimizers.Adam(1e-3),
            keras.losses.BinaryCrossentropy(from_logits=True), seed=config.seed).fit(
        (x, y), batch_size=64, epochs=1, verbose=0)
    return keras.Model(critic.input, critic.get_layer("features").output,
                       name="critic_features")


class PerceptualSR(Task):
    """Pixel MSE plus the distance between the frozen critic's features of SR and HR."""

    def __init__(self, model, critic_features, weight, optimizer):
        super().__init__()
        self.network = model
        self.critic = self.freeze(critic_features)
        self.add_update("network", StaticWeights({"pixel": 1.0, "perceptual": weight}),
                        model, optimizer)

    def compute_losses(self, batch, training):
        lr, hr = batch
        sr = self.network(lr, training=training)
        return {"pixel": tf.reduce_mean(tf.square(sr - hr)),
                "perceptual": tf.reduce_mean(tf.square(self.critic(sr) - self.critic(hr)))}


def psnr(a, b, shave=SHAVE):
    a = np.clip(a, 0, 1)[shave:-shave, shave:-shave]
    b = np.clip(b, 0, 1)[shave:-shave, shave:-shave]
    return float(10 * np.log10(1.0 / np.mean((a - b) ** 2)))


def evaluate_held_out(model):
    """PSNR (dB, luminance) of the network and of bicubic on the astronaut, and the images."""
    hr_rgb = load_photo(HELD_OUT)
    hr_rgb = hr_rgb[: hr_rgb.shape[0] // SCALE * SCALE, : hr_rgb.shape[1] // SCALE * SCALE]
    lr_rgb = downscale(hr_rgb[None]).numpy()[0]
    bicubic_rgb = upscale_bicubic(lr_rgb[None]).numpy()[0]
    hr_y, lr_y, bicubic_y = luminance(hr_rgb), luminance(lr_rgb), luminance(bicubic_rgb)
    net_y = np.clip(model(lr_y[None, ..., None], training=False).numpy()[0, ..., 0], 0, 1)
    # Colour: bicubic chroma with the network's luminance.
    net_rgb = np.clip(bicubic_rgb + (net_y - bicubic_y)[..., None], 0, 1)
    return {
        "psnr_network": psnr(net_y, hr_y),
        "psnr_bicubic": psnr(bicubic_y, hr_y),
        "images": {"low-res": np.clip(lr_rgb, 0, 1), "bicubic": bicubic_rgb, "network": net_rgb,
                   "original": hr_rgb},
    }


def save_comparison(images, path, psnrs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    crop = slice(60, 260), slice(130, 330)  # the face, where detail shows
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.6))
    for ax, (title, image) in zip(axes, images.items()):
        if title == "low-res":
            view = image[crop[0].start // 2:crop[0].stop // 2,
                         crop[1].start // 2:crop[1].stop // 2]
            ax.imshow(view, interpolation="nearest")
        else:
            ax.imshow(image[crop])
        label = title
        if title in psnrs:
            label += f" ({psnrs[title]:.2f} dB)"
        ax.set_title(label)
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def run(out_dir="tapeworks-demo", quick=False, verbose="auto", config=None,
        perceptual=None):
    """Trains the demo network and writes the comparison PNG and TensorBoard logs.

    With `perceptual=w`, the loss adds w times a frozen critic's feature
    distance (the critic is pretrained here first; see `pretrain_critic`).

    Args:
        out_dir: folder for `comparison.png` and the TensorBoard logs.
        quick: a seconds-long run at small sizes (`DemoConfig.quick()`).
        verbose: "auto" or 1 shows a progress line with the budget; 0 none.
        config: a `DemoConfig` (its `epochs` and `seconds` set the length).
        perceptual: the weight of the frozen critic's loss, or None.

    Returns:
        A dict with the PSNRs, the gain over bicubic, the steps and epochs
        trained, timings, paths and the Trainer's `tuning`.

    Raises:
        ValueError: when `config` limits neither the epochs nor the seconds.
    """
    config = config or (DemoConfig.quick() if quick else DemoConfig())
    if config.epochs is None and config.seconds is None:
        raise ValueError("The demo needs a length: `epochs`, `seconds` or both. Received: "
                         "epochs=None, seconds=None. Fix: e.g. DemoConfig(seconds=75).")
    os.makedirs(out_dir, exist_ok=True)
    start = time.perf_counter()
    keras.utils.set_random_seed(config.seed)
    lr, hr = make_patches(config)
    model = build_model(config.width)
    steps_per_epoch = config.patches // config.batch_size
    optimizer = keras.optimizers.Adam(config.learning_rate)
    if perceptual:
        critic = pretrain_critic(hr[: len(hr) // 2], config)
        trainer = Trainer(PerceptualSR(model, critic, perceptual, optimizer), seed=config.seed)
    else:
        trainer = Trainer(model, optimizer, "mse", seed=config.seed)
    dataset = (tf.data.Dataset.from_tensor_slices((lr, hr))
               .shuffle(len(lr), seed=config.seed)
               .batch(config.batch_size, drop_remainder=True)
               .prefetch(tf.data.AUTOTUNE))
    budget = TimeBudget(optimizer, config.learning_rate, seconds=config.seconds,
                        steps=None if config.epochs is None else config.epochs * steps_per_epoch,
                        verbose=bool(verbose))
    logs = os.path.join(out_dir, "logs")
    train_start = time.perf_counter()
    # The budget counts from here: on a slow machine fit's set-up before its
    # first callback took 10 s, which the budget did not see (85.6 s trained
    # for 75 s asked, one-off).
    budget.start_clock()
    # The budget draws the progress line (Keras' bar counts epochs, which a
    # time budget makes meaningless).
    trainer.fit(dataset, epochs=config.epochs or EPOCHS_UNTIL_BUDGET, verbose=0,
                callbacks=[budget, keras.callbacks.TensorBoard(logs)])
    train_seconds = time.perf_counter() - train_start
    result = evaluate_held_out(model)
    png = os.path.join(out_dir, "comparison.png")
    save_comparison(result.pop("images"), png, {
        "bicubic": result["psnr_bicubic"], "network": result["psnr_network"]})
    result.update(
        gain_db=result["psnr_network"] - result["psnr_bicubic"],
        steps=budget.steps_done,
        epochs=budget.steps_done / steps_per_epoch,
        epochs_limit=config.epochs,
        seconds_limit=config.seconds,
        train_seconds=train_seconds,
        total_seconds=time.perf_counter() - start,
        png=png, logs=logs, tuning=trainer.tuning,
        precision=trainer.precision.policy, precision_reason=trainer.precision.reason,
    )
    return result
