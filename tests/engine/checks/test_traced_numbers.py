"""A Python number a Task's step read while traced, changed later (issue 37 #2b)."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tapeworks import CorrectnessWarning, Task, Trainer
from tapeworks.engine.checks.traced_numbers import recording

FROZEN = "when the training step was traced"


class KLTask(Task):
    """A loss weight `beta` read in the step, and attributes a callback may change."""

    def __init__(self, beta=0.0):
        super().__init__()
        self.net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4)])
        self.beta = beta
        self.log_every = 10          # changed by the callback, never read in the step
        self.traces_seen = 0         # bumped by the trace itself: not a later change
        self.add_update("net", "loss", self.net, "sgd")

    def compute_losses(self, batch, training):
        self.traces_seen += 1
        out = self.net(batch, training=training)
        return {"loss": tf.reduce_mean(tf.square(out - batch))
                + self.beta * tf.reduce_mean(tf.square(out))}


class Anneal(keras.callbacks.Callback):
    def __init__(self, task, attribute="beta"):
        super().__init__()
        self.task, self.attribute = task, attribute

    def on_epoch_end(self, epoch, logs=None):
        value = getattr(self.task, self.attribute)
        if isinstance(value, tf.Variable):
            value.assign(value + 0.25)
        else:
            setattr(self.task, self.attribute, value + 0.25)


def fit(task, callbacks, epochs=3, **trainer):
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(task, **trainer).fit(x, batch_size=8, epochs=epochs, verbose=0,
                                     callbacks=callbacks)
    return [str(w.message) for w in caught
            if issubclass(w.category, CorrectnessWarning) and FROZEN in str(w.message)]


@pytest.mark.parametrize("jit_compile", [False, "update", True])
def test_a_float_changed_by_a_callback_is_named_once_with_both_values(jit_compile):
    task = KLTask()
    found = fit(task, [Anneal(task)], epochs=3, jit_compile=jit_compile)
    assert len(found) == 1
    line = KLTask.compute_losses.__code__.co_firstlineno + 4   # `+ self.beta * ...`
    assert found[0].startswith(f"tapeworks: `KLTask.beta` (read at test_traced_numbers.py:{line}) "
                               "was 0.0 when the training step was traced and is now 0.25, but "
                               "the compiled step still computes with 0.0")
    assert "keras.Variable(0.0, trainable=False)" in found[0]
    assert "task.beta.assign(new_value)" in found[0]
    assert type(task) is KLTask          # the recording class is gone after the trace


def test_the_compiled_step_really_keeps_the_traced_value():
    # What the warning says, shown: the loss does not change when beta does.
    task = KLTask(beta=0.0)
    x = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")
    trainer = Trainer(task, jit_compile=False, steps_per_call=1)
    trainer.fit(x, batch_size=8, epochs=1, verbose=0)
    before = trainer.evaluate(x, verbose=0, return_dict=True)["loss"]
    task.beta = 1000.0
    after = trainer.evaluate(x, verbose=0, return_dict=True)["loss"]
    assert before == after


def test_eager_steps_read_the_attribute_every_step_and_are_not_reported():
    task = KLTask()
    assert fit(task, [Anneal(task)], run_eagerly=True) == []


@pytest.mark.parametrize("attribute", ["log_every", "beta_variable"])
def test_attributes_the_step_does_not_read_or_that_are_variables_are_not_reported(attribute):
    task = KLTask()
    if attribute == "beta_variable":
        task.beta = keras.Variable(0.0, trainable=False)
        attribute = "beta"
    # jit_compile="auto" traces the step in more than one mode: the counter the traces
    # bump grows between them, and is not reported either.
    assert fit(task, [Anneal(task, attribute)], epochs=4, jit_compile="auto") == []
    assert task.traces_seen >= 1


def test_recording_sees_only_the_instance_numbers_read_inside_it():
    task = KLTask(beta=0.5)
    with recording(task) as seen:
        assert task.beta == 0.5 and task.net is not None and task.log_every
    assert seen.reads == {"beta": 0.5, "log_every": 10}
    assert type(task) is KLTask
    with recording(task) as outer:
        with recording(task) as inner:
            task.beta
        assert type(task) is not KLTask    # still recording for the outer one
        task.traces_seen
    assert set(inner.reads) == {"beta"} and set(outer.reads) == {"beta", "traces_seen"}
    assert type(task) is KLTask


def test_explain_lists_a_number_changed_since_the_trace():
    task = KLTask()
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    trainer = Trainer(task, jit_compile=False)
    trainer.fit(x, batch_size=8, epochs=1, verbose=0)
    task.beta = 2.0
    explained = trainer.explain(x, steps=2, batch_size=8, try_xla=False)
    assert [m for m in explained.correctness if "`KLTask.beta` (read at" in m and "was 0.0" in m
            and "is now 2.0" in m]
