"""Trainer.fit gives the same weights as a hand-written GradientTape loop."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks
from tests.engine import models

MODES = {
    "eager": dict(run_eagerly=True, jit_compile=False),
    "tf.function": dict(jit_compile=False),
    "xla-update": dict(jit_compile="update"),
    "xla": dict(jit_compile=True),
    # XLA gradients, the checks in TensorFlow, XLA update: what jit_compile=True
    # runs on a CPU for large gradients (`CompiledSteps.splits_xla_step`),
    # whatever the gradients' size here.
    "xla-split": dict(jit_compile=True, split_xla_step_bytes=0),
}


def _dataset(kind, x, y, batch):
    return tf.data.Dataset.from_tensor_slices((models.model_inputs(kind, x), y)).batch(batch)


@pytest.mark.parametrize("kind", sorted(models.BUILDERS))
@pytest.mark.parametrize("mode,steps_per_call", [
    (mode, steps_per_call) for mode in sorted(MODES) for steps_per_call in (1, 3)
    if mode != "xla-split" or steps_per_call == 3])
def test_fit_matches_hand_written_loop(kind, mode, steps_per_call):
    x, y = models.regression_data(n=50)  # batch 8: 7 batches, the last one of 2
    build = models.BUILDERS[kind]
    reference = models.set_fixed_weights(build())
    models.hand_written_fit(reference, keras.optimizers.Adam(0.01),
                            keras.losses.MeanSquaredError(),
                            _dataset(kind, x, y, 8), epochs=3)

    model = models.set_fixed_weights(build())
    trainer = tapeworks.Trainer(model, keras.optimizers.Adam(0.01), "mse",
                                steps_per_call=steps_per_call, **MODES[mode])
    history = trainer.fit(_dataset(kind, x, y, 8), epochs=3, verbose=0)

    # Split, the step's update is the XLA-fused one ("update"'s updaters).
    fused = any(key.kind == "updaters" and key.mode == "update"
                for key in trainer.compiled.keys())
    assert fused == (mode in ("xla-update", "xla-split"))
    assert len(history.history["loss"]) == 3
    assert int(trainer.optimizer.iterations) == 3 * 7
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_an_xla_step_on_a_cpu_splits_only_for_large_gradients_a_check_reads():
    # The checks' gradient norms run in TensorFlow between the XLA gradients
    # and the XLA update when the gradients are large; with no check reading
    # them, or small ones, the step stays whole.
    from tapeworks.engine.step import step

    x, y = models.regression_data(n=24)
    checked = tapeworks.Trainer(models.sequential(), "sgd", "mse", jit_compile=True,
                                steps_per_call=2)
    checked.fit((x, y), batch_size=8, verbose=0)
    size = step.gradient_bytes(checked.task)
    assert size == 4 * sum(int(np.prod(v.shape)) for v in checked.model.trainable_variables)
    assert size < step.SPLIT_MIN_GRADIENT_BYTES
    assert not checked.compiled.splits_xla_step(True, monitored=False, checks_finite=True)
    at_size = tapeworks.Trainer(models.sequential(), "sgd", "mse", jit_compile=True,
                                steps_per_call=2, split_xla_step_bytes=size)
    at_size.fit((x, y), batch_size=8, verbose=0)
    assert at_size.compiled.splits_xla_step(True, monitored=False, checks_finite=True)
    assert not at_size.compiled.splits_xla_step("update", monitored=False, checks_finite=True)
    assert not at_size.compiled.splits_xla_step(False, monitored=False, checks_finite=True)
    bare = tapeworks.Trainer(models.sequential(), "sgd", "mse", jit_compile=True,
                             steps_per_call=2, on_nonfinite=None, dead_gradient_steps=None,
                             split_xla_step_bytes=0)
    bare.fit((x, y), batch_size=8, verbose=0)
    assert not bare.compiled.splits_xla_step(True, monitored=False, checks_finite=True)
    # the monitor reads them
    assert bare.compiled.splits_xla_step(True, monitored=True, checks_finite=True)
    # An update that runs every other step, or differentiates again after its
    # gradients (GradNorm), needs the whole step.
    assert step.differentiates_once(checked.task.updates)
    task = tapeworks.Task()
    task.add_update("every_other", lambda losses: losses["mse"], models.sequential(), "sgd",
                    every=2)
    assert not step.differentiates_once(task.updates)


def test_arrays_with_batch_size_match_dataset():
    x, y = models.regression_data(n=30)
    a = models.set_fixed_weights(models.sequential())
    b = models.set_fixed_weights(models.sequential())
    tapeworks.Trainer(a, "sgd", "mse", jit_compile=False, steps_per_call=2).fit(
        (x, y), batch_size=7, shuffle=False, epochs=2, verbose=0)
    tapeworks.Trainer(b, "sgd", "mse", jit_compile=False, steps_per_call=1).fit(
        _dataset("sequential", x, y, 7), epochs=2, verbose=0)
    for got, want in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_partial_last_batch_traces_the_step_once():
    x, y = models.regression_data(n=50)
    trainer = tapeworks.Trainer(models.sequential(), "sgd", "mse",
                                jit_compile=False, steps_per_call=3)
    trainer.fit(_dataset("sequential", x, y, 8), epochs=3, verbose=0)
    assert trainer.traces["train_step"] == 1


def test_loss_reported_is_the_sample_weighted_epoch_mean():
    # SGD with learning rate 0 leaves the weights alone, so the reported epoch
    # loss must equal the mean squared error of the fixed model over all data.
    x, y = models.regression_data(n=50)
    model = models.set_fixed_weights(models.sequential())
    expected = float(np.mean((model(x).numpy() - y) ** 2))
    trainer = tapeworks.Trainer(model, keras.optimizers.SGD(0.0), "mse",
                                jit_compile=False, steps_per_call=4)
    history = trainer.fit((x, y), batch_size=8, shuffle=False, verbose=0)
    assert history.history["loss"][0] == pytest.approx(expected, rel=1e-5)
    assert trainer.evaluate((x, y), batch_size=16, return_dict=True)["loss"] == pytest.approx(expected, rel=1e-5)


def test_sample_weights_weight_the_loss():
    x, y = models.regression_data(n=16)
    w = np.zeros(16, "float32")
    w[:8] = 1.0
    model = models.set_fixed_weights(models.sequential())
    per_sample = np.mean((model(x).numpy() - y) ** 2, axis=1)
    trainer = tapeworks.Trainer(model, keras.optimizers.SGD(0.0), "mse", jit_compile=False)
    logs = trainer.evaluate(tf.data.Dataset.from_tensor_slices((x, y, w)).batch(16),
                          return_dict=True)
    # Keras' "sum_over_batch_size": sum(w * loss) / batch size.
    assert logs["loss"] == pytest.approx(float(np.sum(w * per_sample) / 16), rel=1e-5)


@pytest.mark.parametrize("mode", sorted(set(MODES) - {"xla-split"}))   # training only
def test_predict_and_evaluate(mode):
    x, y = models.regression_data(n=45)
    model = models.set_fixed_weights(models.sequential())
    trainer = tapeworks.Trainer(model, "sgd", "mse", metrics=["mae"], **MODES[mode])
    predictions = trainer.predict(x, batch_size=8)
    np.testing.assert_allclose(predictions, model(x).numpy(), atol=1e-5)
    logs = trainer.evaluate((x, y), batch_size=8, return_dict=True)
    assert set(logs) == {"loss", "mae"}
    assert logs["mae"] == pytest.approx(float(np.mean(np.abs(model(x).numpy() - y))), rel=1e-5)


def test_predict_multi_output_returns_a_list():
    inputs = keras.Input((4,))
    model = keras.Model(inputs, [keras.layers.Dense(2)(inputs), keras.layers.Dense(1)(inputs)])
    trainer = tapeworks.Trainer(model, "sgd", ["mse", "mse"], jit_compile=False)
    x, _ = models.regression_data(n=10)
    out = trainer.predict(x, batch_size=4)
    assert [o.shape for o in out] == [(10, 2), (10, 1)]


def test_generator_input():
    x, y = models.regression_data(n=24)

    def batches():
        for i in range(0, 24, 8):
            yield x[i:i + 8], y[i:i + 8]

    trainer = tapeworks.Trainer(models.sequential(), "sgd", "mse", jit_compile=False,
                                steps_per_call=2)
    history = trainer.fit(batches, epochs=2, verbose=0)
    assert int(trainer.optimizer.iterations) == 6
    assert len(history.history["loss"]) == 2


def test_generator_of_lists_trains_like_one_of_tuples():
    # Keras takes [x, y] as well as (x, y); tf.data needs every batch, not
    # only the first, turned into the signature's tuple.
    x, y = models.regression_data(n=24)
    weights = []
    for pack in (tuple, list):
        def batches(pack=pack):
            for i in range(0, 24, 8):
                yield pack((x[i:i + 8], y[i:i + 8]))

        keras.utils.set_random_seed(0)
        model = models.sequential()
        tapeworks.Trainer(model, "sgd", "mse", jit_compile=False).fit(batches, epochs=2,
                                                                      verbose=0)
        weights.append(model.get_weights())
    for as_tuples, as_lists in zip(*weights):
        np.testing.assert_array_equal(as_tuples, as_lists)


def test_exhausted_generator_object_gets_a_clear_error():
    x, y = models.regression_data(n=16)
    gen = ((x[i:i + 8], y[i:i + 8]) for i in range(0, 16, 8))
    trainer = tapeworks.Trainer(models.sequential(), "sgd", "mse", jit_compile=False)
    with pytest.raises(tapeworks.DataSpecError, match="read only once"):
        trainer.fit(gen, epochs=2, verbose=0)   # refused before the first epoch
    assert int(trainer.optimizer.iterations) == 0
    # With steps_per_epoch it may be endless; a finite one runs out in epoch 2.
    gen = ((x[i:i + 8], y[i:i + 8]) for i in range(0, 16, 8))
    with pytest.raises(tapeworks.DataSpecError, match="ran out in epoch 2.*read only once"):
        trainer.fit(gen, epochs=2, steps_per_epoch=2, verbose=0)


def test_steps_per_epoch_carries_the_iterator_over_and_ends_an_epoch_short_at_the_end():
    x, y = models.regression_data(n=40)  # 5 batches of 8
    trainer = tapeworks.Trainer(models.sequential(), "sgd", "mse", jit_compile=False,
                                steps_per_call=2)
    with pytest.warns(tapeworks.CorrectnessWarning,
                      match="ran out in epoch 2 after 2 of steps_per_epoch=3.*ended short"):
        history = trainer.fit((x, y), batch_size=8, epochs=3, steps_per_epoch=3, verbose=0)
    # 3 steps, then the last 2 batches (the epoch ends short, as in Keras'
    # fit), then the data again from its start: 3.
    assert int(trainer.optimizer.iterations) == 8
    assert len(history.history["loss"]) == 3
