"""Data of a few batches is evaluated one step a call, with the loop's results.

The loop (`step.make_loop`) costs start-up that a validation set of two
batches never repays (`step.make_single_call`); both must give the same
loss, metrics, batch hooks and History, in tf.function and XLA modes.
"""

import keras
import numpy as np
import pytest

from tapeworks import Trainer
from tapeworks.engine import evaluation


def _data(samples):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, 4)).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32") > 0).astype("float32")


class BatchHooks(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = []

    def on_test_batch_end(self, batch, logs=None):
        self.seen.append((batch, round(float(logs["loss"]), 6)))


def _run(jit_compile):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    trainer = Trainer(model, jit_compile=jit_compile, steps_per_call=2, plan_cache=False)
    x, y = _data(40)
    history = trainer.fit(x, y, batch_size=8, epochs=2, validation_data=_data(20), verbose=0)
    hooks = BatchHooks()
    logs = trainer.evaluate(*_data(20), batch_size=8, return_dict=True, callbacks=[hooks],
                            verbose=0)
    kinds = {key.kind for key in trainer.compiled.keys()}
    return history.history, logs, hooks.seen, kinds


@pytest.mark.parametrize("jit_compile", [False, True], ids=["tf.function", "xla"])
def test_a_few_batches_are_evaluated_without_the_loop_and_give_what_it_gives(
        jit_compile, monkeypatch):
    history, logs, seen, kinds = _run(jit_compile)
    assert "test_call" in kinds and "test_loop" not in kinds
    assert [batch for batch, _ in seen] == [0, 1, 2]   # 20 samples in batches of 8
    monkeypatch.setattr(evaluation, "FEW_BATCHES", 0)
    monkeypatch.setattr(evaluation, "FEW_BATCHES_IN_FIT", 0)
    looped_history, looped_logs, looped_seen, looped_kinds = _run(jit_compile)
    assert "test_call" not in looped_kinds and "test_loop" in looped_kinds
    assert history == looped_history and logs == looped_logs and seen == looped_seen


def _validated(epochs, validation_samples):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    trainer = Trainer(model, jit_compile=False, steps_per_call=2, plan_cache=False)
    history = trainer.fit(*_data(16), batch_size=8, epochs=epochs,
                          validation_data=_data(validation_samples), verbose=0)
    fitted = {key.kind for key in trainer.compiled.keys()}
    trainer.evaluate(*_data(validation_samples), batch_size=8, verbose=0)
    return fitted, {key.kind for key in trainer.compiled.keys()} - fitted, history.history


def test_more_than_a_few_batches_are_evaluated_without_the_loop_when_the_fit_has_few_in_all():
    # 12 batches of validation: 2 evaluations are 24 batches in all, under
    # FEW_BATCHES_IN_FIT (96); 9 evaluations are 108, over it.
    assert evaluation.FEW_BATCHES < 12 and 24 <= evaluation.FEW_BATCHES_IN_FIT < 108
    fitted, evaluated, history = _validated(epochs=2, validation_samples=96)
    assert "test_call" in fitted and "test_loop" not in fitted
    # `evaluate` may be called again and again: more than FEW_BATCHES loop.
    assert evaluated == {"test_loop"}
    fitted, _, _ = _validated(epochs=9, validation_samples=96)
    assert "test_loop" in fitted and "test_call" not in fitted


def test_the_fits_validation_without_the_loop_logs_what_the_loop_logs(monkeypatch):
    fitted, _, history = _validated(epochs=2, validation_samples=96)
    assert "test_call" in fitted
    monkeypatch.setattr(evaluation, "FEW_BATCHES_IN_FIT", 0)
    looped, _, looped_history = _validated(epochs=2, validation_samples=96)
    assert "test_loop" in looped and "test_call" not in looped
    assert history == looped_history and len(history["val_loss"]) == 2
