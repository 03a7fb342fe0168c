"""A script that sets `tf.config.run_functions_eagerly(True)` trains eagerly, as Keras' fit does.

TensorFlow's switch makes every tf.function run its Python eagerly; Keras'
fit then runs its step eagerly whatever `jit_compile` says. tapeworks does
the same, says so in one line, and measures (and stores) no compiled plan.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks


@pytest.fixture
def eager_functions():
    tf.config.run_functions_eagerly(True)
    try:
        yield
    finally:
        tf.config.run_functions_eagerly(False)


def model():
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(1)])
    m.compile(keras.optimizers.SGD(0.05), "mse")
    return m


def test_the_step_runs_eagerly_says_so_once_and_stores_no_plan(eager_functions, tmp_path,
                                                              capsys):
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = x.sum(1, keepdims=True)
    keras_model = model()
    expected = keras_model.fit(x, y, batch_size=16, epochs=2, shuffle=False,
                               verbose=0).history["loss"]
    trainer = tapeworks.Trainer(model(), seed=0, plan_cache=str(tmp_path))
    assert trainer.run_eagerly
    history = trainer.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=1)
    assert trainer.jit_compile is False
    out = capsys.readouterr().out
    assert out.count("tf.config.run_functions_eagerly(True) is set: the step runs "
                     "eagerly") == 1
    assert "jit_compile=" not in out and os.listdir(tmp_path) == []
    np.testing.assert_allclose(history.history["loss"], expected, rtol=1e-5)
    trainer.fit(x, y, batch_size=16, verbose=1)
    assert "run_functions_eagerly" not in capsys.readouterr().out   # said once


def test_an_explicit_xla_setting_is_not_refused_under_the_switch(eager_functions):
    x = np.ones((32, 4), "float32")
    trainer = tapeworks.Trainer(model(), jit_compile=True, seed=0)
    assert trainer.run_eagerly and trainer.jit_compile is False
    assert np.isfinite(trainer.fit(x, x[:, :1], verbose=0).history["loss"][0])
