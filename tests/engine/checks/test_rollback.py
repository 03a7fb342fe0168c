"""The non-finite guard's fast path: whole calls checked, rolled back and replayed when bad.

Each behaviour is compared with the same trainer whose fast path is off (a
guard on every step, as before the path existed): the weights, the history
and the error must be the same, bit for bit.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tapeworks import NonFiniteError, Trainer
from tapeworks.data import pipeline_check
from tapeworks.engine.inputs import adapters
from tapeworks.engine.checks import rollback

BATCH = 4


def _data(bad_sample=21):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(40, 3)).astype("float32")
    y = rng.normal(size=(40, 1)).astype("float32")
    if bad_sample is not None:
        x[bad_sample, 1] = np.nan
    return x, y


def _fit(data, *, fast, policy="raise", epochs=3, shuffle=True, layers=None, **options):
    """Trains a small model with dropout; returns (weights, trainer, history or error text)."""
    keras.utils.set_random_seed(0)
    # Named layers: the monitor's logs carry the names.
    model = keras.Sequential([keras.Input((3,)), *(layers or []),
                              keras.layers.Dense(8, activation="relu", name="hidden"),
                              keras.layers.Dropout(0.25), keras.layers.Dense(1, name="out")])
    trainer = Trainer(model, keras.optimizers.Adam(0.01), "mse", jit_compile=False,
                      steps_per_call=3, plan_cache=False, on_nonfinite=policy, **options)
    if not fast:
        trainer.rollback.disabled_reason = "off for the comparison"
    try:
        if isinstance(data, tf.data.Dataset):
            outcome = trainer.fit(data, epochs=epochs, verbose=0).history
        else:
            outcome = trainer.fit(*data, batch_size=BATCH, epochs=epochs, shuffle=shuffle,
                                  verbose=0).history
    except NonFiniteError as error:
        # The saved batch's file name holds the time: the rest must match.
        outcome = str(error).replace(error.report.batch_file, "<batch file>")
    return [w.copy() for w in model.get_weights()], trainer, outcome


def _same(a, b):
    weights_a, trainer_a, outcome_a = a
    weights_b, trainer_b, outcome_b = b
    np.testing.assert_equal(outcome_a, outcome_b)   # a NaN equals a NaN here
    for got, want in zip(weights_a, weights_b):
        np.testing.assert_array_equal(got, want)
    assert int(trainer_a.counters.step.numpy()) == int(trainer_b.counters.step.numpy())
    assert int(trainer_a.optimizer.iterations) == int(trainer_b.optimizer.iterations)


@pytest.mark.parametrize("policy", ["raise", "skip"])
@pytest.mark.parametrize("source", ["shuffled arrays", "arrays in order", "dataset"])
def test_the_fast_path_gives_what_a_guard_on_every_step_gives(policy, source):
    x, y = _data()
    if source == "dataset":
        data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    else:
        data = (x, y)
    shuffle = source == "shuffled arrays"
    fast = _fit(data, fast=True, policy=policy, shuffle=shuffle)
    guarded = _fit(data, fast=False, policy=policy, shuffle=shuffle)
    assert fast[1].rollback.snapshot is not None and guarded[1].rollback.snapshot is None
    _same(fast, guarded)
    if policy == "raise":
        assert "step " in fast[2] and "bad data" in fast[2]
        assert fast[1].rollback.disabled_reason is None
    else:
        assert fast[2]["nonfinite_steps"] == [1.0, 2.0, 3.0]   # the bad batch, each epoch
        # A bad call in every epoch: after the third replay, every step is guarded.
        assert fast[1].rollback.disabled_reason == "3 calls held non-finite steps"


@pytest.mark.parametrize("policy", ["raise", "skip"])
def test_monitored_calls_take_the_fast_path_too(policy):
    # monitor_every=3 with 3 steps per call: every call ends in a monitored step.
    data = _data()
    fast = _fit(data, fast=True, policy=policy, monitor_every=3)
    guarded = _fit(data, fast=False, policy=policy, monitor_every=3)
    assert fast[1].rollback.snapshot is not None
    assert fast[1].rollback.disabled_reason == (None if policy == "raise"
                                       else "3 calls held non-finite steps")
    _same(fast, guarded)
    assert fast[1].monitor_history
    np.testing.assert_equal(fast[1].monitor_history, guarded[1].monitor_history)


def test_healthy_training_on_the_fast_path_is_unchanged():
    data = _data(bad_sample=None)
    fast = _fit(data, fast=True)
    _same(fast, _fit(data, fast=False))
    assert fast[1].traces["train_step"] == 1   # no replay: the guarded step never traced


def test_a_shuffled_pipeline_is_guarded_step_by_step():
    # A new iterator of a shuffled pipeline draws another order: it cannot
    # replay a call, so every step keeps its guard.
    x, y = _data()
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(40, seed=1).batch(BATCH)
    _, trainer, outcome = _fit(data, fast=True)
    assert trainer.rollback.snapshot is None and "bad data" in outcome


def test_xla_and_eager_steps_keep_their_own_guard():
    for options in (dict(jit_compile="update"), dict(run_eagerly=True)):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        trainer = Trainer(model, "sgd", "mse", steps_per_call=2, plan_cache=False,
                          **options)
        with pytest.raises(NonFiniteError):
            trainer.fit(*_data(), batch_size=BATCH, shuffle=False, verbose=0)
        assert trainer.rollback.snapshot is None


class NotFiniteAside(keras.layers.Layer):
    """Passes its input through; holds a NaN in a weight no step reads or changes."""

    def build(self, shape):
        self.aside = self.add_weight(shape=(), initializer="zeros", trainable=False)
        self.aside.assign(float("nan"))

    def call(self, x):
        return x


def test_a_value_non_finite_before_the_call_is_not_the_calls_doing():
    data = _data(bad_sample=None)
    fast = _fit(data, fast=True, layers=[NotFiniteAside()])
    assert fast[1].rollback.disabled_reason is None and fast[1].traces["train_step"] == 1
    _same(fast, _fit(data, fast=False, layers=[NotFiniteAside()]))


class LogOfPrediction(keras.metrics.Mean):
    """A metric that turns NaN on its own (the log of a negative prediction)."""

    def update_state(self, y_true, y_pred, sample_weight=None):
        super().update_state(tf.math.log(y_pred))


class NaNAsideInCall(keras.layers.Layer):
    """Passes its input through; writes the log of its smallest input into a weight no loss reads."""

    def build(self, shape):
        self.aside = self.add_weight(shape=(), initializer="zeros", trainable=False)

    def call(self, x):
        self.aside.assign(tf.math.log(tf.reduce_min(x)))
        return x


def _fit_checked(fast, *, metrics=(), layers=()):
    data = _data(bad_sample=None)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), *layers, keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse", metrics=list(metrics))
    trainer = Trainer(model, jit_compile=False, steps_per_call=3, plan_cache=False)
    if not fast:
        trainer.rollback.disabled_reason = "off for the comparison"
    history = trainer.fit(*data, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return [w.copy() for w in model.get_weights()], trainer, history.history


def test_a_metric_that_turns_nan_alone_is_not_a_bad_call():
    # The loss and gradients stay finite, the metric does not: the guarded
    # step withholds nothing for it, and the call's check does not read the
    # metrics' variables, so the fast path stays on, with the same history.
    fast = _fit_checked(True, metrics=[LogOfPrediction()])
    assert fast[1].rollback.disabled_reason is None
    assert np.isnan(fast[2]["mean"][-1])
    _same(fast, _fit_checked(False, metrics=[LogOfPrediction()]))


def test_a_nan_no_step_made_turns_the_fast_path_off_and_trains_as_guarded():
    # A weight the step's forward pass writes turns NaN while the loss and
    # gradients stay finite: the replay finds no bad step, so the check goes
    # step by step from then on.
    fast = _fit_checked(True, layers=[NaNAsideInCall()])
    assert "no step made non-finite" in fast[1].rollback.disabled_reason
    _same(fast, _fit_checked(False, layers=[NaNAsideInCall()]))


def test_the_calls_check_leaves_out_the_metrics_but_the_snapshot_keeps_them():
    _, trainer, _ = _fit_checked(True, metrics=["mae", LogOfPrediction()])
    snapshot = trainer.rollback.snapshot
    tracker = trainer.training_state.loss_trackers["loss"].variables
    # (The loss tracker is the model's own, in `model.metrics` too: it stays checked.)
    metric = [v for v in trainer.model.metrics_variables
              if not any(v is t for t in tracker)]
    assert metric
    held = {id(v) for v in snapshot.variables}
    assert all(id(v) in held for v in metric + tracker)
    checked = {id(v) for v in snapshot.checked}
    assert not any(id(v) in checked for v in metric)
    assert all(id(v) in checked for v in tracker + trainer.model.trainable_variables)
    # A metric's state is still put back after a bad call.
    tf.function(snapshot.take)()
    kept = [v.numpy() for v in metric]
    for v in metric:
        v.assign(tf.fill(v.shape, np.nan) if tf.as_dtype(v.dtype).is_floating
                 else tf.zeros(v.shape, v.dtype))
    assert bool(snapshot.intact())
    snapshot.restore()
    for v, value in zip(metric, kept):
        np.testing.assert_array_equal(v.numpy(), value)


def test_a_state_too_large_to_copy_keeps_the_per_step_guard(monkeypatch):
    monkeypatch.setattr(rollback, "MAX_BYTES", 16)
    _, trainer, outcome = _fit(_data(), fast=True)
    assert trainer.rollback.snapshot is None and "too large" in trainer.rollback.disabled_reason
    assert "bad data" in outcome


def test_the_snapshot_puts_every_variable_back():
    variables = [tf.Variable([1.0, 2.0]), tf.Variable(3, dtype=tf.int64),
                 tf.Variable([[4.0], [5.0]]), tf.Variable(6.0, dtype=tf.float64)]
    snapshot = rollback.CallSnapshot(variables + variables[:1])   # shared: copied once
    assert len(snapshot.variables) == 4
    tf.function(snapshot.take)()
    variables[0].assign([np.nan, 5.0])
    variables[1].assign(7)
    variables[2].assign([[8.0], [np.inf]])
    variables[3].assign(9.0)
    assert not bool(tf.function(snapshot.intact)())
    snapshot.restore()
    np.testing.assert_array_equal(variables[0].numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(variables[2].numpy(), [[4.0], [5.0]])
    assert int(variables[1].numpy()) == 3 and float(variables[3].numpy()) == 6.0
    assert bool(tf.function(snapshot.intact)())
    variables[3].assign(np.nan)   # a float64 variable alone in its dtype is checked too
    assert not bool(tf.function(snapshot.intact)())
    assert rollback.fits(variables) and not rollback.fits([tf.Variable(tf.zeros([2 ** 23]))])


def test_the_seed_kept_for_replay_is_the_one_the_shuffle_would_draw():
    def orders(dataset):
        return [list(dataset.as_numpy_iterator()) for _ in range(2)]

    tf.random.set_seed(5)
    drawn_by_tf = orders(tf.data.Dataset.range(20).shuffle(20))
    tf.random.set_seed(5)
    kept = adapters.shuffle_seed()
    assert orders(tf.data.Dataset.range(20).shuffle(20, seed=kept)) == drawn_by_tf


def test_replay_draws_the_batches_of_the_pass_again():
    x = np.arange(40, dtype="float32")[:, None]
    prepared = adapters.prepare(x, x, batch_size=4, shuffle=True, seed=3)
    batches = adapters.EpochBatches(prepared, None)
    for _ in range(2):   # into the second pass, whose order is not the first's
        batches.start_epoch()
        batches.iterator().get_next()
        batches.consumed(1)
    replayed = batches.replay()
    expected = [batches.iterator().get_next()[0].numpy().tolist() for _ in range(3)]
    assert [replayed.get_next()[0].numpy().tolist() for _ in range(3)] == expected


def test_which_pipelines_replay_identically():
    def replays(dataset):
        return pipeline_check.replays_identically(pipeline_check.dataset_graph(dataset))

    x = np.zeros((8, 2), "float32")
    assert replays(tf.data.Dataset.from_tensor_slices(x).batch(2).cache().prefetch(1))
    assert not replays(tf.data.Dataset.from_tensor_slices(x).shuffle(8).batch(2))
    assert not replays(tf.data.Dataset.from_tensor_slices(x).map(
        lambda v: v + tf.random.uniform([2])).batch(2))


def test_the_calls_check_reads_the_variables_once_and_the_copies_on_the_host():
    # In the graph: one finiteness test per dtype over the variables joined
    # (the copies are read on the host only after a failed check), so the
    # check adds two nodes per variable to every call's graph (a read and a
    # reshape, beside the variable's handle), not five.
    _, trainer, _ = _fit(_data(bad_sample=None), fast=True, epochs=1)
    snapshot = trainer.rollback.snapshot
    graph = tf.function(lambda: snapshot.intact()).get_concrete_function().graph
    tests = [op for op in graph.get_operations() if op.type == "IsFinite"]
    floating = {tf.as_dtype(v.dtype) for v in snapshot.variables
                if tf.as_dtype(v.dtype).is_floating}
    assert len(tests) == len(floating) == 1
    assert len(graph.get_operations()) <= 3 * len(snapshot.variables) + 10
    assert not snapshot.made_non_finite()
    variable = next(v for v in snapshot.variables if len(v.shape) == 2)
    kept = variable.numpy()
    variable.assign(np.full(kept.shape, np.nan, kept.dtype))
    assert not bool(snapshot.intact()) and snapshot.made_non_finite()
    tf.function(snapshot.take)()   # non-finite before the call too: not the call's doing
    assert not snapshot.made_non_finite()
    variable.assign(kept)
