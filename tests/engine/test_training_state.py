"""`TrainingState` owns every variable training creates; trial runs leave the trainer as they found it."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks
from tests.engine import models


def every_variable(trainer):
    """Every variable of the trainer, found from its parts (not from `TrainingState`)."""
    state = trainer.training_state
    found = {}
    parts = [*trainer.task.models, trainer.optimizer, state.counters, trainer.precision,
             *state.update_states, state.guard, *state.dead_gradients, *state.monitors,
             *state.loss_trackers.values()]
    for part in parts:
        for variable in part.variables:
            found[id(variable)] = variable
    for model in trainer.task.models:
        for variable in model.metrics_variables:
            found[id(variable)] = variable
    if trainer.task.draws_random:   # a Keras model's task never draws: no state to keep
        found[id(trainer.task.random.state)] = trainer.task.random.state
    return list(found.values())


def values(variables):
    return [np.array(v.numpy()) for v in variables]


@pytest.fixture
def trained():
    keras.utils.set_random_seed(0)
    x, y = models.regression_data(n=48)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, activation="relu"),
                              keras.layers.Dropout(0.2), keras.layers.Dense(3)])
    trainer = tapeworks.Trainer(model, keras.optimizers.Adam(0.01), "mse", metrics=["mae"],
                                jit_compile=False, steps_per_call=2, plan_cache=False,
                                monitor_every=2, dead_gradient_steps=3, accumulate=2, seed=1)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    # Stops mid-window, with running metrics, dead-gradient sums and monitor slots set.
    trainer.fit(dataset, epochs=1, steps_per_epoch=5, verbose=0)
    return trainer, dataset


def test_everything_holds_every_variable_of_the_trainer(trained):
    trainer, _ = trained
    everything = {id(v) for v in trainer.training_state.everything()}
    assert {id(v) for v in every_variable(trainer)} <= everything


@pytest.mark.parametrize("measure", ["diagnose_input", "explain"])
def test_a_trial_run_leaves_every_variable_bit_for_bit(trained, measure):
    trainer, dataset = trained
    variables = every_variable(trainer)
    before = values(variables)
    assert any(float(np.max(np.abs(v))) > 0 for v in
               values([v for d in trainer.training_state.dead_gradients for v in d.variables]))
    history = len(trainer.monitor_history)
    if measure == "diagnose_input":
        trainer.diagnose_input(dataset.repeat(), batches=4)
    else:
        trainer.explain(dataset.repeat(), steps=3, try_xla=False)
    after = values(variables)
    for variable, old, new in zip(variables, before, after):
        np.testing.assert_array_equal(new, old, err_msg=variable.name)
    assert len(trainer.monitor_history) == history
    # And training goes on as if nothing had run in between.
    trainer.fit(dataset, epochs=1, steps_per_epoch=1, verbose=0)
