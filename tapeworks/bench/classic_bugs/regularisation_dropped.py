"""A Task whose objective leaves out the model's L2 kernel regularisers (model.losses)."""
# named-if: leaves them out | kernel_regularizer | model.losses
import keras
import numpy as np
import tensorflow as tf
import tapeworks

l2 = keras.regularizers.L2(1e-3)


class Classifier(tapeworks.Task):
    def __init__(self):
        super().__init__()
        self.classifier = keras.Sequential([
            keras.Input((20,)),
            keras.layers.Dense(64, activation="relu", kernel_regularizer=l2),
            keras.layers.Dense(64, activation="relu", kernel_regularizer=l2),
            keras.layers.Dense(3)])
        self.xent = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.add_update("classifier", "loss", self.classifier, "adam")

    def compute_losses(self, batch, training):
        x, y = batch
        logits = self.classifier(x, training=training)
        return {"loss": self.xent(y, logits)}


rng = np.random.default_rng(0)
x = rng.normal(size=(600, 20)).astype("float32")
y = rng.integers(0, 3, 600)
tapeworks.Trainer(Classifier()).fit(x, y, batch_size=32, epochs=3)
