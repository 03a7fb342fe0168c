"""A model's own `train_step` under MirroredStrategy over two logical CPUs, by Keras and tapeworks.

Run as a fresh process (`python -m tests.distribute.own_step_mirrored`):
logical devices are set before TensorFlow starts. Prints one JSON line per
model and fit: History, weights and the step's trace count.
"""

import json

import keras
import numpy as np
import tensorflow as tf

X = np.linspace(-1.0, 1.0, 48, dtype="float32").reshape(24, 2)
Y = (X @ np.array([[0.5], [-0.25]], "float32") + 0.1).astype("float32")


class GuideStep(keras.Sequential):
    """Keras' guide's custom step: `compute_loss` (which divides by the replicas), metrics."""

    traces = 0

    def train_step(self, data):
        GuideStep.traces += 1
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def guide_step():
    model = GuideStep([keras.Input((2,)), keras.layers.Dense(1, kernel_initializer="ones")])
    model.compile(keras.optimizers.Adam(0.1), loss="mse", metrics=["mae"])
    return model


def main():
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import tapeworks

    # One strategy for the process (two MirroredStrategy objects in one
    # process reuse collective keys: TensorFlow's own limit).
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    for fit in ("keras", "tapeworks"):
        with strategy.scope():
            model = guide_step()
        GuideStep.traces = 0
        trainer = model if fit == "keras" else tapeworks.Trainer(model, jit_compile=False)
        history = trainer.fit(X, Y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        print(json.dumps({"fit": fit, "history": history.history,
                          "weights": [w.tolist() for w in model.get_weights()],
                          "replicas": strategy.num_replicas_in_sync}), flush=True)


if __name__ == "__main__":
    main()
