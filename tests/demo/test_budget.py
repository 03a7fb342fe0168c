"""The demo's time budget: the callback that stops `fit` and anneals the rate, on real fits."""

import math

import keras
import numpy as np
import pytest

import tapeworks
from tapeworks.demo.budget import TimeBudget


def tiny_fit(budget_kwargs, epochs, steps_per_call=2):
    """A Dense model on 64 samples, batches of 8 (8 steps an epoch), under a TimeBudget."""
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam(0.01)
    budget = TimeBudget(optimizer, 0.01, verbose=False, **budget_kwargs)
    rates = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: rates.append(float(optimizer.learning_rate)))
    trainer = tapeworks.Trainer(model, optimizer, "mse", jit_compile=False,
                                steps_per_call=steps_per_call, seed=0)
    history = trainer.fit(x, y, batch_size=8, epochs=epochs, verbose=0,
                          callbacks=[budget, record])
    return budget, rates, history


def test_steps_budget_counts_every_step_and_ends_annealed():
    budget, rates, history = tiny_fit({"steps": 16}, epochs=2)
    assert budget.steps_done == 16
    assert len(history.history["loss"]) == 2
    # One batch hook per call of 2 steps: the cosine at 2/16, 4/16, ..., 16/16.
    expected = [0.01 * 0.5 * (1 + math.cos(math.pi * k / 8)) for k in range(1, 9)]
    assert rates == pytest.approx(expected, abs=1e-9)
    assert rates[-1] == pytest.approx(0.0, abs=1e-12)


def test_seconds_budget_stops_training_mid_epoch():
    # A budget already spent when the first call ends: training stops there,
    # in the first epoch of fifty.
    budget, rates, history = tiny_fit({"seconds": 1e-9}, epochs=50)
    assert budget.steps_done == 2
    assert len(history.history["loss"]) == 1
    assert budget.fraction() == 1.0
    assert rates == [pytest.approx(0.0, abs=1e-12)]


def test_a_budget_needs_a_length():
    with pytest.raises(ValueError, match="needs `seconds` or `steps`"):
        TimeBudget(keras.optimizers.Adam(0.01), 0.01)


def test_a_clock_started_before_fit_counts_the_set_up_too():
    # Started a whole budget before fit: spent when the first call ends,
    # where the same budget started at on_train_begin would still be running.
    import time

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam(0.01)
    budget = TimeBudget(optimizer, 0.01, seconds=0.05, verbose=False)
    budget.start_clock()
    time.sleep(0.06)
    trainer = tapeworks.Trainer(model, optimizer, "mse", jit_compile=False, steps_per_call=2,
                                seed=0)
    trainer.fit(x, x.sum(axis=1, keepdims=True), batch_size=8, epochs=50, verbose=0,
                callbacks=[budget])
    assert budget.steps_done == 2 and budget.elapsed >= 0.06
