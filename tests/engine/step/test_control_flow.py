"""The step's cond and while_loop: plain Python eagerly, TensorFlow's when traced, same results."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks
from tapeworks.engine.step import control_flow


def count_to(limit):
    return control_flow.while_loop(lambda i, total: i < limit,
                                   lambda i, total: (i + 1, total + i),
                                   (tf.constant(0), tf.constant(0)))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf.function"])
def test_loop_and_branch_give_what_tensorflow_gives(traced):
    run = tf.function(count_to, autograph=False) if traced else count_to
    steps, total = run(tf.constant(5))
    assert (int(steps), int(total)) == (5, 0 + 1 + 2 + 3 + 4)
    pick = (tf.function(control_flow.cond, autograph=False) if traced
            else control_flow.cond)
    assert int(pick(tf.constant(True), lambda: tf.constant(1), lambda: tf.constant(2))) == 1
    assert int(pick(tf.constant(False), lambda: tf.constant(1), lambda: tf.constant(2))) == 2


def test_traced_they_are_graph_control_flow():
    graph = tf.function(count_to, autograph=False).get_concrete_function(
        tf.TensorSpec([], tf.int32)).graph
    assert {"While", "StatelessWhile"} & {op.type for op in graph.get_operations()}


def test_an_eager_step_calls_neither_tf_cond_nor_tf_while_loop(monkeypatch):
    # An eager update run through tf.cond was slower (see control_flow.py).
    called = []
    for name in ("cond", "while_loop"):
        original = getattr(tf, name)
        monkeypatch.setattr(tf, name, lambda *a, _name=name, _original=original, **k: (
            called.append(_name), _original(*a, **k))[1])
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x, y = np.ones((8, 2), "float32"), np.ones((8, 1), "float32")
    history = tapeworks.Trainer(model, run_eagerly=True, steps_per_call=4,
                                plan_cache=False).fit(x, y, batch_size=2, epochs=1, verbose=0,
                                                      shuffle=False)
    assert np.isfinite(history.history["loss"][0])
    assert called == []


def test_an_eager_fit_counts_its_steps_in_python(monkeypatch):
    # Eagerly, the loop's bookkeeping as tensors (the optional's tests, the
    # count's comparison and sums, the halt's test) and the non-finite
    # verdict's sums are about a dozen ops a step the step itself does not
    # need (see `step.make_loop`'s eager_loop, `NonFiniteGuard.verdict`).
    from tensorflow.python import pywrap_tfe

    def model():
        made = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        made.set_weights([np.array([[0.5], [-0.25]], "float32"), np.zeros(1, "float32")])
        made.compile(keras.optimizers.SGD(0.1), "mse", run_eagerly=True)
        return made

    x = np.arange(20, dtype="float32").reshape(10, 2) / 10
    y = x.sum(axis=1, keepdims=True)
    keras_history = model().fit(x, y, batch_size=2, epochs=2, verbose=0, shuffle=False)
    ran = []
    original = pywrap_tfe.TFE_Py_FastPathExecute
    monkeypatch.setattr(pywrap_tfe, "TFE_Py_FastPathExecute",
                        lambda ctx, op, *a: (ran.append(op), original(ctx, op, *a))[1])
    trainer = tapeworks.Trainer(model(), steps_per_call=4, plan_cache=False)
    history = trainer.fit(x, y, batch_size=2, epochs=2, verbose=0, shuffle=False)
    bookkeeping = {"IteratorGetNextAsOptional", "OptionalHasValue", "Less", "LogicalAnd",
                   "LogicalNot", "Equal", "AddN", "IsFinite", "Pack"}
    assert bookkeeping.isdisjoint(ran), sorted(bookkeeping & set(ran))
    # 5 batches an epoch in calls of 4 (the second call meets the data's end):
    # every batch trained once, the losses Keras' own eager fit gives.
    assert int(trainer.training_state.counters.step.value()) == 10
    np.testing.assert_allclose(history.history["loss"], keras_history.history["loss"],
                               rtol=1e-6)
