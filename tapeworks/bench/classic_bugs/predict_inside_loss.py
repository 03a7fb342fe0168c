"""A frozen critic scores the generator's output with .predict() inside the loss."""
# named-if: predict
import keras
import numpy as np
import tapeworks

critic = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
critic.trainable = False


class Generator(tapeworks.Task):
    def __init__(self):
        super().__init__()
        self.generator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4)])
        self.add_update("generator", "loss", self.generator, "adam")

    def compute_losses(self, batch, training):
        fake = self.generator(batch, training=training)
        score = critic.predict(fake)
        return {"loss": -score.mean()}


noise = np.random.default_rng(0).normal(size=(128, 2)).astype("float32")
tapeworks.Trainer(Generator()).fit(noise, batch_size=32, epochs=1)
