# Source: keras-team/keras, examples/keras_io/tensorflow/generative/dcgan_overriding_train_step.py
# (all code; the Keras 3 port of keras-io's examples/generative/dcgan_overriding_train_step.py,
# kept in keras-team/keras until e5dad39 removed the keras-io copies), commit
# bc4308ce1c0cbd322117ad90a5ce0ca710495913 (2023-11-03). Licence: Apache-2.0 (keras-team/keras'
# licence; the example's author: fchollet).
# Changed, and nothing else: the CelebA download (os.makedirs, gdown, ZipFile) -> size(16, 8)
# random 64x64 RGB PNG files written in a temporary folder (seeded by corpus_fit), which the
# example's own keras.utils.image_dataset_from_directory reads (its "celeba_gan" folder -> that
# folder; batch_size 32 -> size(16, 4): one fit step at batch 32 took 47 s, compile included,
# on 2 shared CPU cores); the sample-image plotting cell and the matplotlib, gdown and
# ZipFile imports removed; the GANMonitor callback's img.save(...) line dropped (it wrote PNG
# files; the callback is otherwise kept); gan.fit(...) -> corpus_fit.fit(gan, ...) with the
# same arguments (the switch: see corpus_fit.py); corpus_fit.report(history) at the end. The
# example's fit runs one epoch, kept.
import corpus_fit  # noqa: F401  (first: picks whose fit trains)

"""
Title: DCGAN to generate face images
Author: [fchollet](https://twitter.com/fchollet)
Date created: 2019/04/29
Last modified: 2021/01/01
Description: A simple DCGAN trained using `fit()` by overriding `train_step` on CelebA images.
Accelerator: GPU
"""
"""
## Setup
"""

import tensorflow as tf
import keras
from keras import layers
import os

"""
## Prepare CelebA data

We'll use face images from the CelebA dataset, resized to 64x64.
"""

# Stand-in for the CelebA download (os.makedirs, gdown, ZipFile; no download here):
# random 64x64 RGB images written as PNG files in a temporary folder, read back by
# the example's own image_dataset_from_directory below.
import tempfile
import numpy as np

celeba_gan = os.path.join(tempfile.mkdtemp(), "celeba_gan")
os.makedirs(os.path.join(celeba_gan, "img_align_celeba"))
for i in range(corpus_fit.size(16, 8)):
    keras.utils.save_img(
        os.path.join(celeba_gan, "img_align_celeba", "%06d.png" % (i + 1)),
        np.random.randint(0, 256, (64, 64, 3)).astype("uint8"),
    )

"""
Create a dataset from our folder, and rescale the images to the [0-1] range:
"""

dataset = keras.utils.image_dataset_from_directory(
    celeba_gan, label_mode=None, image_size=(64, 64), batch_size=corpus_fit.size(16, 4)
)
dataset = dataset.map(lambda x: x / 255.0)


"""
## Create the discriminator

It maps a 64x64 image to a binary classification score.
"""

discriminator = keras.Sequential(
    [
        keras.Input(shape=(64, 64, 3)),
        layers.Conv2D(64, kernel_size=4, strides=2, padding="same"),
        layers.LeakyReLU(alpha=0.2),
        layers.Conv2D(128, kernel_size=4, strides=2, padding="same"),
        layers.LeakyReLU(alpha=0.2),
        layers.Conv2D(128, kernel_size=4, strides=2, padding="same"),
        layers.LeakyReLU(alpha=0.2),
        layers.Flatten(),
        layers.Dropout(0.2),
        layers.Dense(1, activation="sigmoid"),
    ],
    name="discriminator",
)
discriminator.summary()

"""
## Create the generator

It mirrors the discriminator, replacing `Conv2D` layers with `Conv2DTranspose` layers.
"""

latent_dim = 128

generator = keras.Sequential(
    [
        keras.Input(shape=(latent_dim,)),
        layers.Dense(8 * 8 * 128),
        layers.Reshape((8, 8, 128)),
        layers.Conv2DTranspose(128, kernel_size=4, strides=2, padding="same"),
        layers.LeakyReLU(alpha=0.2),
        layers.Conv2DTranspose(256, kernel_size=4, strides=2, padding="same"),
        layers.LeakyReLU(alpha=0.2),
        layers.Conv2DTranspose(512, kernel_size=4, strides=2, padding="same"),
        layers.LeakyReLU(alpha=0.2),
        layers.Conv2D(3, kernel_size=5, padding="same", activation="sigmoid"),
    ],
    name="generator",
)
generator.summary()

"""
## Override `train_step`
"""


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn
        self.d_loss_metric = keras.metrics.Mean(name="d_loss")
        self.g_loss_metric = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_metric, self.g_loss_metric]

    def train_step(self, real_images):
        # Sample random points in the latent space
        batch_size = tf.shape(real_images)[0]
        random_latent_vectors = tf.random.normal(
            shape=(batch_size, self.latent_dim)
        )

        # Decode them to fake images
        generated_images = self.generator(random_latent_vectors)

        # Combine them with real images
        combined_images = tf.concat([generated_images, real_images], axis=0)

        # Assemble labels discriminating real from fake images
        labels = tf.concat(
            [tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0
        )
        # Add random noise to the labels - important trick!
        labels += 0.05 * tf.random.uniform(tf.shape(labels))

        # Train the discriminator
        with tf.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss = self.loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(
            zip(grads, self.discriminator.trainable_weights)
        )

        # Sample random points in the latent space
        random_latent_vectors = tf.random.normal(
            shape=(batch_size, self.latent_dim)
        )

        # Assemble labels that say "all real images"
        misleading_labels = tf.zeros((batch_size, 1))

        # Train the generator (note that we should *not* update the weights
        # of the discriminator)!
        with tf.GradientTape() as tape:
            predictions = self.discriminator(
                self.generator(random_latent_vectors)
            )
            g_loss = self.loss_fn(misleading_labels, predictions)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(
            zip(grads, self.generator.trainable_weights)
        )

        # Update metrics
        self.d_loss_metric.update_state(d_loss)
        self.g_loss_metric.update_state(g_loss)
        return {
            "d_loss": self.d_loss_metric.result(),
            "g_loss": self.g_loss_metric.result(),
        }


"""
## Create a callback that periodically saves generated images
"""


class GANMonitor(keras.callbacks.Callback):
    def __init__(self, num_img=3, latent_dim=128):
        self.num_img = num_img
        self.latent_dim = latent_dim

    def on_epoch_end(self, epoch, logs=None):
        random_latent_vectors = tf.random.normal(
            shape=(self.num_img, self.latent_dim)
        )
        generated_images = self.model.generator(random_latent_vectors)
        generated_images *= 255
        generated_images.numpy()
        for i in range(self.num_img):
            img = keras.utils.array_to_img(generated_images[i])


"""
## Train the end-to-end model
"""

epochs = 1  # In practice, use ~100 epochs

gan = GAN(
    discriminator=discriminator, generator=generator, latent_dim=latent_dim
)
gan.compile(
    d_optimizer=keras.optimizers.Adam(learning_rate=0.0001),
    g_optimizer=keras.optimizers.Adam(learning_rate=0.0001),
    loss_fn=keras.losses.BinaryCrossentropy(),
)

history = corpus_fit.fit(
    gan,
    dataset,
    epochs=epochs,
    callbacks=[GANMonitor(num_img=10, latent_dim=latent_dim)],
)

"""
Some of the last generated images around epoch 30
(results keep improving after that):

![results](https://i.imgur.com/h5MtQZ7l.png)
"""

corpus_fit.report(history)
