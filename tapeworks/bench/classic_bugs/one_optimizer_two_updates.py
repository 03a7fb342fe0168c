"""A GAN whose generator and discriminator share one Adam instance."""
# named-if: optimizer | share
import keras
import numpy as np
import tensorflow as tf
import tapeworks

adam = keras.optimizers.Adam(2e-4)


class GAN(tapeworks.Task):
    def __init__(self):
        super().__init__()
        self.generator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        self.discriminator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        self.add_update("discriminator", "d_loss", self.discriminator, adam)
        self.add_update("generator", "g_loss", self.generator, adam)

    def compute_losses(self, batch, training):
        real = batch
        fake = self.generator(tf.random.normal([tf.shape(real)[0], 4]), training=training)
        bce = keras.losses.BinaryCrossentropy(from_logits=True)
        real_score = self.discriminator(real, training=training)
        fake_score = self.discriminator(fake, training=training)
        return {"d_loss": bce(tf.ones_like(real_score), real_score)
                + bce(tf.zeros_like(fake_score), fake_score),
                "g_loss": bce(tf.ones_like(fake_score), fake_score)}


real = np.random.default_rng(0).normal(size=(256, 2)).astype("float32")
tapeworks.Trainer(GAN()).fit(real, batch_size=32, epochs=1)
