"""A model's own `train_step` under MirroredStrategy over two logical CPUs, by Keras and tapeworks.

Run as a fresh process (`python -m tests.distribute.own_step_mirrored`):
logical devices are set before TensorFlow starts. Prints one JSON line per
model and fit: History and weights.
"""

import json

import keras
import tensorflow as tf

import tapeworks
from tests.engine.step.test_model_step import GuideStep, X, Y


def guide_step():
    """Keras' guide's custom step (`compute_loss`, which divides by the replicas), with Adam."""
    model = GuideStep([keras.Input((2,)), keras.layers.Dense(1, kernel_initializer="ones")])
    model.compile(keras.optimizers.Adam(0.1), loss="mse", metrics=["mae"])
    return model


def main():
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

    # One strategy for the process (two MirroredStrategy objects in one
    # process reuse collective keys: TensorFlow's own limit).
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    for fit in ("keras", "tapeworks"):
        with strategy.scope():
            model = guide_step()
        trainer = model if fit == "keras" else tapeworks.Trainer(model, jit_compile=False)
        history = trainer.fit(X, Y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        print(json.dumps({"fit": fit, "history": history.history,
                          "weights": [w.tolist() for w in model.get_weights()],
                          "replicas": strategy.num_replicas_in_sync}), flush=True)


if __name__ == "__main__":
    main()
