"""A trainer's first fit of at most FEW_STEPS steps runs each step as one call, as Keras does.

The loop (`tf.while_loop`, `tf.cond`) costs tracing and a first call that a
fit of a few steps never repays (`CallLoop.few_steps_left`). Such a fit
trains exactly as the loop would, and as Keras' fit does.
"""

import keras
import numpy as np
import pytest

import tapeworks
from tapeworks.engine.call_loop import FEW_STEPS

X = np.linspace(-1.0, 1.0, 3 * 48, dtype="float32").reshape(48, 3)
Y = (X @ np.array([[0.5], [-0.25], [1.0]], "float32") + 0.1).astype("float32")


def model():
    keras.utils.set_random_seed(0)
    net = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                            keras.layers.Dense(1)])
    net.compile(keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
    return net


@pytest.mark.parametrize("jit_compile", ["auto", False, True])
def test_a_first_fit_of_few_steps_calls_the_step_alone_and_trains_as_keras(jit_compile):
    reference, net = model(), model()
    expected = reference.fit(X[:32], Y[:32], batch_size=4, epochs=1, shuffle=False, verbose=0)
    trainer = tapeworks.Trainer(net, jit_compile=jit_compile, plan_cache=False)
    history = trainer.fit(X[:32], Y[:32], batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert 32 // 4 == FEW_STEPS
    assert "train_loop" not in trainer.compiled.kinds()
    assert trainer.traces["train_step"] == 1
    assert int(trainer.counters.step.numpy()) == 8
    for key, values in expected.history.items():
        np.testing.assert_allclose(history.history[key], values, rtol=1e-5, err_msg=key)
    for got, want in zip(net.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # The next fit measures and runs the loop, which calls the step traced here.
    trainer.fit(X[:32], Y[:32], batch_size=4, epochs=3, shuffle=False, verbose=0)
    assert "train_loop" in trainer.compiled.kinds()


def test_a_longer_first_fit_runs_the_loop_from_its_first_step():
    trainer = tapeworks.Trainer(model(), jit_compile=False, plan_cache=False)
    trainer.fit(X[:36], Y[:36], batch_size=4, epochs=1, verbose=0)     # 9 steps
    assert trainer.compiled.kinds().count("train_loop") == 1
    assert trainer.traces["train_step"] == 1


def test_several_epochs_count_all_their_steps():
    # 2 epochs of 6 steps: 12 steps in the fit, so the loop (never a switch at its end).
    trainer = tapeworks.Trainer(model(), jit_compile=False, plan_cache=False)
    trainer.fit(X[:24], Y[:24], batch_size=4, epochs=2, verbose=0)
    assert "train_loop" in trainer.compiled.kinds()
