"""The Trainer under tf.distribute strategies: one device works, several replicas are refused."""

import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks
from tests.engine import models


def test_one_device_strategy_trains_like_the_default_strategy():
    x, y = models.regression_data(n=32)
    weights = []
    for strategy in (tf.distribute.get_strategy(), tf.distribute.OneDeviceStrategy("/cpu:0")):
        with strategy.scope():
            keras.utils.set_random_seed(0)
            model = models.sequential()
            trainer = tapeworks.Trainer(model, "sgd", "mse", jit_compile=False,
                                        steps_per_call=2, accumulate=2)
        trainer.fit((x, y), batch_size=8, epochs=2, verbose=0, shuffle=False)
        weights.append(model.get_weights())
    for default, one_device in zip(*weights):
        np.testing.assert_allclose(default, one_device, rtol=0, atol=1e-6)


def test_a_one_device_mirrored_strategy_is_refused_too():
    # One replica, but MirroredStrategy's step synchronises through merge_call,
    # which fails inside the compiled step: refused up front, weights untouched.
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = models.sequential()
        before = model.get_weights()
        with pytest.raises(tapeworks.ConfigError, match=r"MirroredStrategy \(1 replica\)"):
            tapeworks.Trainer(model, "sgd", "mse")
    for was, now in zip(before, model.get_weights()):
        np.testing.assert_array_equal(was, now)


# Logical devices must be set before TensorFlow starts: a fresh process.
SEVERAL_REPLICAS = textwrap.dedent("""
    import keras, numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import tapeworks
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        before = [w.copy() for w in model.get_weights()]
        try:
            tapeworks.Trainer(model, "sgd", "mse")
        except tapeworks.ConfigError as error:
            print("REFUSED:", error)
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))
""")


@pytest.mark.multiprocess
def test_several_replicas_are_refused_with_a_clear_error():
    result = subprocess.run([sys.executable, "-c", SEVERAL_REPLICAS], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "REFUSED: tapeworks.Trainer was created under MirroredStrategy (2 replicas)" \
        in result.stdout
    assert "OneDeviceStrategy" in result.stdout
