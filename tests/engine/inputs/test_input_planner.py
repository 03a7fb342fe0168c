"""The input planner: which way a built pipeline runs, chosen on epochs that train anyway.

The planner's rules are checked with hand-made epoch times (no clock); the
Trainer's use of it with a real pipeline: the same data in the same order
whichever way runs, and nothing measured where there is nothing to choose.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tapeworks import Trainer, data
from tapeworks.data.pipeline import PARALLELISM, is_built, parallelism_choices
from tapeworks.engine.inputs import input_planner
from tapeworks.engine.inputs.input_planner import InputPlanner

WAYS = [("a", "dataset a"), ("b", "dataset b"), ("c", "dataset c")]
MIN_SECONDS = 0.3   # the epoch times below are written against this


@pytest.fixture(autouse=True)
def min_seconds(monkeypatch):
    monkeypatch.setattr(input_planner, "MIN_SECONDS", MIN_SECONDS)


def run_epoch(planner, epochs_left, seconds, samples=100, settled=True, comparable=True):
    planner.start_epoch(epochs_left, settled)
    used = planner.name
    planner.end_epoch(samples, seconds, comparable)
    return used


def test_each_way_warmed_then_timed_and_the_fastest_kept():
    planner = InputPlanner(WAYS)
    seconds = {"a": 0.5, "b": 0.4, "c": 0.6}   # each epoch >= MIN_SECONDS: one timed epoch
    used = [run_epoch(planner, 100 - i, seconds[planner.name]) for i in range(8)]
    # a: warm-up, timed; b: warm-up, timed; c: warm-up, timed; then b for good.
    assert used == ["a", "a", "b", "b", "c", "c", "b", "b"]
    assert planner.choice.name == "b"
    assert planner.choice.rates == {"a": 200.0, "b": 250.0, "c": 100 / 0.6}
    assert planner.dataset == "dataset b"
    assert not planner.tuning


def test_no_trial_when_the_epochs_expected_cannot_repay_it():
    planner = InputPlanner(WAYS)
    # 3 ways to try take 6 epochs (a warm-up and a timed epoch each): worth it
    # only with at least 12 epochs expected.
    for epochs_left in (11, 10, 9):
        assert run_epoch(planner, epochs_left, 1.0) == "a"
    assert planner.report()["rates"] == {}
    # Later fits on the same data: as many epochs are expected as have run so
    # far. After 12 epochs in all, a one-epoch fit starts the trials.
    for _ in range(9):
        run_epoch(planner, 1, 1.0)
    assert planner.epochs_trained == 12 and planner.report()["rates"] == {}
    run_epoch(planner, 1, 0.5)
    assert planner.report()["rates"] == {"a": 200.0}


def test_epochs_that_compare_nothing_are_not_timed():
    planner = InputPlanner(WAYS)
    run_epoch(planner, 50, 1.0, settled=False)          # step planner still measuring
    assert planner.name == "a" and not planner.report()["rates"]
    run_epoch(planner, 49, 9.0, comparable=False)        # something was compiled
    assert planner.report()["rates"] == {}
    run_epoch(planner, 48, 0.5)
    assert planner.report()["rates"] == {"a": 200.0}


def test_short_epochs_are_timed_until_min_seconds():
    planner = InputPlanner(WAYS[:2])
    short = MIN_SECONDS / 3
    names = [run_epoch(planner, 100, short) for _ in range(10)]
    # a warm-up epoch, then 3 short timed epochs reach MIN_SECONDS; then b alike.
    assert names[:8] == ["a"] * 4 + ["b"] * 4
    assert set(planner.choice.rates) == {"a", "b"}
    np.testing.assert_allclose(planner.choice.rates["a"], 100 / short)


def test_while_the_step_is_measured_the_best_way_so_far_runs():
    planner = InputPlanner(WAYS)
    for seconds in (1.0, 1.0, 1.0, 0.5):    # a warm-up, a 100/s, b warm-up, b 200/s
        run_epoch(planner, 100, seconds)
    assert planner.report()["rates"] == {"a": 100.0, "b": 200.0}
    planner.start_epoch(100, step_settled=False)
    assert planner.name == "b" and planner.tuning


# With the Trainer -----------------------------------------------------------

def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


def _pipeline():
    # tf.data's seeded ops mix in the global seed: the same one for every build.
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 3)).astype("float32")
    y = rng.integers(0, 2, 48).astype("int64")

    def jitter(x, y, seed):
        return x + tf.random.stateless_normal((3,), seed, stddev=0.1), y

    return data.pipeline((x, y), batch_size=8, training=True, augment=jitter, seed=1)


def _losses(dataset, epochs):
    trainer = Trainer(_model(), keras.optimizers.SGD(0.1),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=False, steps_per_call=1, seed=0)
    history = trainer.fit(dataset, epochs=epochs, verbose=0)
    return trainer, history.history["loss"]


def test_the_ways_yield_the_same_elements_in_the_same_order():
    def epochs_of(dataset_for_epoch):
        return [np.concatenate([b[0].numpy() for b in dataset_for_epoch(e)]) for e in range(3)]

    plain = _pipeline()
    expected = epochs_of(lambda e: plain)
    built = _pipeline()
    ways = [dataset for _, dataset in parallelism_choices(built)]
    assert len(ways) == len(PARALLELISM)
    got = epochs_of(lambda e: ways[e % len(ways)])
    for want, have in zip(expected, got):
        np.testing.assert_array_equal(want, have)


@pytest.mark.filterwarnings("ignore::tapeworks.PerformanceWarning")
def test_trainer_tries_every_way_and_trains_on_the_same_data(monkeypatch):
    # One timed epoch per way, however short: 4 ways x (warm-up + timed) = 8
    # trial epochs, repaid by 20 (the rule, not the clock, decides here).
    monkeypatch.setattr(input_planner, "MIN_SECONDS", 0.0)
    built = _pipeline()
    trainer, losses = _losses(built, epochs=20)
    report = trainer.tuning["input"]
    assert set(report["rates"]) == set(dict(PARALLELISM))
    assert report["choice"] == max(report["rates"], key=report["rates"].get)
    assert report["in_use"] == report["choice"]
    # The same pipeline, hidden from the planner by a no-op stage: the same losses.
    hidden = _pipeline().map(lambda x, y: (x, y))
    assert not is_built(hidden)
    other, expected = _losses(hidden, epochs=20)
    assert other.tuning["input"] is None
    np.testing.assert_allclose(losses, expected, rtol=1e-6)


def test_nothing_to_choose_without_a_built_pipeline_or_with_steps_per_epoch():
    x = np.zeros((16, 3), "float32")
    y = np.zeros(16, "int64")
    arrays_trainer = Trainer(_model(), "sgd", keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), jit_compile=False, steps_per_call=1)
    arrays_trainer.fit(x, y, epochs=2, verbose=0)
    assert arrays_trainer.tuning["input"] is None
    steps_trainer = Trainer(_model(), "sgd", keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), jit_compile=False, steps_per_call=1)
    steps_trainer.fit(_pipeline(), epochs=2, steps_per_epoch=3, verbose=0)
    assert steps_trainer.tuning["input"] is None
