"""A VAE Task whose KL weight `beta` is a Python float that a warm-up callback raises."""
# named-if: beta | traced | keras.Variable
import keras
import numpy as np
import tensorflow as tf
import tapeworks


class VAE(tapeworks.Task):
    def __init__(self, latent=2):
        super().__init__()
        self.encoder = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                                         keras.layers.Dense(2 * latent)])
        self.decoder = keras.Sequential([keras.Input((latent,)), keras.layers.Dense(32, activation="relu"),
                                         keras.layers.Dense(16)])
        self.beta = 0.0
        self.add_update("vae", "loss", [self.encoder, self.decoder], "adam")

    def compute_losses(self, batch, training):
        mean, log_var = tf.split(self.encoder(batch, training=training), 2, axis=-1)
        z = mean + tf.exp(0.5 * log_var) * self.random.normal(tf.shape(mean))
        reconstruction = tf.reduce_mean(tf.reduce_sum(
            tf.square(batch - self.decoder(z, training=training)), -1))
        kl = tf.reduce_mean(-0.5 * tf.reduce_sum(1 + log_var - mean ** 2 - tf.exp(log_var), -1))
        return {"loss": reconstruction + self.beta * kl, "kl": kl}


class KLWarmUp(keras.callbacks.Callback):
    def __init__(self, vae, epochs):
        super().__init__()
        self.vae, self.epochs = vae, epochs

    def on_epoch_begin(self, epoch, logs=None):
        self.vae.beta = min(1.0, epoch / self.epochs)


data = np.random.default_rng(0).normal(size=(512, 16)).astype("float32")
vae = VAE()
tapeworks.Trainer(vae).fit(data, batch_size=32, epochs=4, callbacks=[KLWarmUp(vae, 3)])
