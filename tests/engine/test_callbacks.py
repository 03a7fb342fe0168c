"""Keras' own callbacks work unchanged with Trainer.fit."""

import csv
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks
from tests.engine import models
from tests.engine.test_keras_compat import _BatchEnds


@pytest.fixture
def data():
    return models.regression_data(n=40)


def _trainer(lr=0.05, **kwargs):
    model = models.set_fixed_weights(models.sequential())
    kwargs.setdefault("jit_compile", False)
    kwargs.setdefault("steps_per_call", 2)
    return tapeworks.Trainer(model, keras.optimizers.SGD(lr), "mse", **kwargs)


def test_history_and_lambda_callback_hooks(data):
    trainer = _trainer(steps_per_call=2)
    events = []
    hook = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: events.append(("epoch", epoch)),
        on_train_batch_end=lambda batch, logs: events.append(("batch", batch)),
        on_train_end=lambda logs: events.append(("end", None)),
    )
    history = trainer.fit(data, batch_size=8, epochs=2, callbacks=[hook], verbose=0)
    # 5 steps per epoch, 2 per call: batch hooks fire once per call, with the
    # index of the call's last step.
    assert events == [("epoch", 0), ("batch", 1), ("batch", 3), ("batch", 4),
                      ("epoch", 1), ("batch", 1), ("batch", 3), ("batch", 4), ("end", None)]
    assert isinstance(history, keras.callbacks.History)
    assert history.epoch == [0, 1]
    assert history.history["loss"][1] < history.history["loss"][0]


def test_callbacks_see_the_model(data):
    trainer = _trainer()
    cb = keras.callbacks.Callback()
    trainer.fit(data, batch_size=8, callbacks=[cb], verbose=0)
    assert cb.model is trainer.model
    assert cb.params["epochs"] == 1 and cb.params["steps"] == 5


def test_model_checkpoint_saves_best(tmp_path, data):
    trainer = _trainer()
    path = str(tmp_path / "best.weights.h5")
    trainer.fit(data, batch_size=8, epochs=3, validation_data=data, verbose=0,
                callbacks=[keras.callbacks.ModelCheckpoint(
                    path, monitor="val_loss", save_best_only=True, save_weights_only=True)])
    restored = models.sequential()
    restored.load_weights(path)
    # Training lowers the validation loss every epoch here, so the best is the last.
    for a, b in zip(restored.get_weights(), trainer.model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_model_checkpoint_full_model(tmp_path, data):
    trainer = _trainer()
    path = str(tmp_path / "model.keras")
    trainer.fit(data, batch_size=8, callbacks=[keras.callbacks.ModelCheckpoint(path)], verbose=0)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded.predict(data[0], verbose=0),
                               trainer.model.predict(data[0], verbose=0), atol=1e-6)


def test_early_stopping_restores_best_weights(data):
    x, y = data
    # A learning rate this large diverges: validation loss is best at epoch 0.
    trainer = _trainer(lr=3.0)
    weights = []
    keep = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: weights.append(trainer.model.get_weights()))
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=2,
                                         restore_best_weights=True)
    history = trainer.fit(data, batch_size=8, epochs=20, validation_data=data,
                          callbacks=[keep, stop], verbose=0)
    losses = history.history["val_loss"]
    assert len(losses) < 20  # it stopped
    best = int(np.argmin(losses))
    for a, b in zip(trainer.model.get_weights(), weights[best]):
        np.testing.assert_array_equal(a, b)


def test_reduce_lr_on_plateau(data):
    trainer = _trainer(lr=0.1)
    # min_delta so large that every epoch counts as a plateau.
    cb = keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=1,
                                           min_delta=1e9, mode="min")
    trainer.fit(data, batch_size=8, epochs=3, callbacks=[cb], verbose=0)
    assert float(trainer.optimizer.learning_rate) == pytest.approx(0.1 * 0.5 ** 2)


def test_tensorboard_writes_events(tmp_path, data):
    trainer = _trainer()
    logdir = tmp_path / "tb"
    trainer.fit(data, batch_size=8, epochs=2, validation_data=data, verbose=0,
                callbacks=[keras.callbacks.TensorBoard(str(logdir))])
    tags = set()
    for root, _, files in os.walk(logdir / "train"):
        for name in files:
            for event in tf.compat.v1.train.summary_iterator(os.path.join(root, name)):
                tags.update(v.tag for v in event.summary.value)
    assert "epoch_loss" in tags


def test_csv_logger(tmp_path, data):
    trainer = _trainer()
    path = tmp_path / "log.csv"
    trainer.fit(data, batch_size=8, epochs=2, callbacks=[keras.callbacks.CSVLogger(str(path))],
                verbose=0)
    rows = list(csv.DictReader(open(path)))
    assert [r["epoch"] for r in rows] == ["0", "1"]
    assert float(rows[1]["loss"]) < float(rows[0]["loss"])


def test_terminate_on_nan(data):
    x, y = data
    y = y.copy()
    y[10] = np.nan  # in the second batch of 8
    trainer = _trainer(steps_per_call=1)
    with pytest.warns(tapeworks.CorrectnessWarning, match="bad data.*Training stopped"):
        history = trainer.fit((x, y), batch_size=8, shuffle=False, epochs=3,
                              callbacks=[keras.callbacks.TerminateOnNaN()], verbose=0)
    # Keras applies the NaN batch's update, then stops (2 iterations); tapeworks
    # withholds it (on_nonfinite="raise"), so the weights stay finite.
    assert int(trainer.optimizer.iterations) == 1
    assert all(np.isfinite(w.numpy()).all() for w in trainer.model.weights)
    assert len(history.epoch) == 1

    keras_like = _trainer(steps_per_call=1, on_nonfinite=None)
    keras_like.fit((x, y), batch_size=8, shuffle=False, epochs=3,
                   callbacks=[keras.callbacks.TerminateOnNaN()], verbose=0)
    assert int(keras_like.optimizer.iterations) == 2   # Keras' behaviour, check off


def test_verbose_zero_prints_nothing(data, capsys):
    _trainer().fit(data, batch_size=8, epochs=2, verbose=0)
    assert capsys.readouterr().out == ""


def test_verbose_two_prints_a_line_per_epoch(data, capsys):
    _trainer().fit(data, batch_size=8, epochs=2, verbose=2)
    out = capsys.readouterr().out
    assert out.count("Epoch ") == 2 and "samples/s" in out and "loss" in out


class _StopAtBatchTwo(_BatchEnds):
    """A user's batch hook that counts on seeing every batch, as Keras' fit calls it."""

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        if batch == 2:
            self.model.stop_training = True


def test_a_users_batch_hook_sees_every_batch_when_steps_per_call_is_auto(data):
    # It saw calls of several steps: batch 2 never came, and training ran on.
    trainer = _trainer(steps_per_call="auto", plan_cache=False)
    stop = _StopAtBatchTwo()
    history = trainer.fit(data, batch_size=8, epochs=5, callbacks=[stop], verbose=0)
    assert stop.batches == [0, 1, 2]
    assert len(history.history["loss"]) == 1
    assert int(trainer.optimizer.iterations.numpy()) == 3


def test_which_callbacks_need_every_batch():
    from tapeworks.engine.callback_bridge import needs_every_train_batch

    def needs(*callbacks):
        return needs_every_train_batch(keras.callbacks.CallbackList(list(callbacks)))

    class PerCall(_StopAtBatchTwo):
        batch_hooks_per_call = True

    # Keras' own are written for calls of several steps (steps_per_execution).
    assert not needs(keras.callbacks.ModelCheckpoint("/tmp/unused.keras", save_freq=5),
                     keras.callbacks.TensorBoard(update_freq=1), keras.callbacks.History(),
                     keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: None))
    assert needs(keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: None))
    assert needs(_StopAtBatchTwo())
    assert not needs(PerCall())
