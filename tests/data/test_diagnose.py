"""Input-bound diagnosis on a deliberately slow pipeline."""

import time

import keras
import numpy as np
import tensorflow as tf

import tapeworks
from tapeworks import data


def slow(x, y):
    def sleep(batch):
        time.sleep(0.05)  # 50 ms per batch: far slower than the tiny step below
        return batch

    return tf.ensure_shape(tf.numpy_function(sleep, [x], tf.float32), x.shape), y


def test_slow_pipeline_is_reported_input_bound_and_nothing_is_trained():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype("float32")
    y = rng.normal(size=(256, 1)).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).map(slow).prefetch(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    trainer = tapeworks.Trainer(model, "adam", "mse", jit_compile=False, steps_per_call=4)
    before = [w.copy() for w in model.get_weights()]
    report = trainer.diagnose_input(dataset, batches=10)
    # The margin is a factor of about a hundred, not a timing threshold.
    assert report.input_bound and report.wait_share > 0.5
    assert "TD005" in " ".join(report.advice()) and "TD007" in " ".join(report.advice())
    assert "INPUT-BOUND" in str(report)
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), before))
    assert int(trainer.optimizer.iterations) == 0


def test_trainer_option_reports_after_the_first_epoch(capsys):
    x = np.ones((64, 4), "float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    trainer = tapeworks.Trainer(model, "sgd", "mse", jit_compile=False, diagnose_input=True)
    trainer.fit((x, np.ones((64, 1), "float32")), batch_size=8, epochs=2, verbose=2)
    assert isinstance(trainer.input_report, data.InputReport)
    assert capsys.readouterr().out.count("Input diagnosis") == 1
