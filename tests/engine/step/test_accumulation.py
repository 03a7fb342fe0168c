"""Gradient accumulation, clipping and loss scaling are exact."""

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
}


def _fit(optimizer, data, batch, accumulate=1, epochs=2, mode="tf.function", sample_weight=None,
         steps_per_call=2, **kwargs):
    x, y = data
    model = models.set_fixed_weights(models.sequential())
    parts = (x, y) if sample_weight is None else (x, y, sample_weight)
    dataset = tf.data.Dataset.from_tensor_slices(parts).batch(batch)
    trainer = tapeworks.Trainer(model, optimizer, "mse", accumulate=accumulate,
                                steps_per_call=steps_per_call, **MODES[mode], **kwargs)
    trainer.fit(dataset, epochs=epochs, verbose=0)
    return trainer


def _assert_same_weights(a, b, atol=1e-5):
    for got, want in zip(a.model.get_weights(), b.model.get_weights()):
        np.testing.assert_allclose(got, want, atol=atol)


OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "adam+schedule": lambda: keras.optimizers.Adam(
        keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=1, decay_rate=0.5)),
    "adamw": lambda: keras.optimizers.AdamW(0.05, weight_decay=0.1),
}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_accumulation_equals_one_large_batch(mode, name):
    data = models.regression_data(n=48)
    small = _fit(OPTIMIZERS[name](), data, batch=4, accumulate=3, mode=mode)
    large = _fit(OPTIMIZERS[name](), data, batch=12, accumulate=1, mode=mode)
    # The optimizer, and so its schedule and weight decay, advanced per update.
    assert int(small.optimizer.iterations) == int(large.optimizer.iterations) == 2 * 4
    _assert_same_weights(small, large)


def test_sample_weights_are_weighted_over_the_whole_window():
    data = models.regression_data(n=48)
    weights = np.random.default_rng(5).uniform(0, 2, 48).astype("float32")
    small = _fit(keras.optimizers.SGD(0.1), data, 4, accumulate=3, sample_weight=weights)
    large = _fit(keras.optimizers.SGD(0.1), data, 12, sample_weight=weights)
    _assert_same_weights(small, large)


@pytest.mark.parametrize("clip", [dict(clip_norm=0.05), dict(clip_value=0.01)])
def test_clipping_applies_to_the_accumulated_gradient(clip):
    data = models.regression_data(n=48)
    small = _fit(keras.optimizers.SGD(0.1), data, 4, accumulate=3, **clip)
    large = _fit(keras.optimizers.SGD(0.1), data, 12, **clip)
    _assert_same_weights(small, large)
    unclipped = _fit(keras.optimizers.SGD(0.1), data, 12)
    assert not np.allclose(unclipped.model.get_weights()[0], large.model.get_weights()[0])


@pytest.mark.parametrize("n", [40, 42])
def test_last_partial_window_is_applied_at_epoch_end(n):
    # n=40, micro-batches of 4, windows of 3: the 10th micro-batch is a window
    # of its own. n=42: the last window holds a micro-batch of 4 and one of 2.
    # Either way it is applied as the mean over its own samples, exactly as
    # a last, smaller large batch would be.
    data = models.regression_data(n=n)
    small = _fit(keras.optimizers.Adam(0.05), data, 4, accumulate=3, epochs=2)
    large = _fit(keras.optimizers.Adam(0.05), data, 12, epochs=2)
    assert int(small.optimizer.iterations) == int(large.optimizer.iterations) == 2 * 4
    assert int(small.state.micro_step) == 0
    _assert_same_weights(small, large)


def test_matches_keras_gradient_accumulation_steps():
    x, y = models.regression_data(n=48)
    keras_model = models.set_fixed_weights(models.sequential())
    keras_model.compile(keras.optimizers.SGD(0.1, gradient_accumulation_steps=3), "mse")
    keras_model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    ours = _fit(keras.optimizers.SGD(0.1), (x, y), 4, accumulate=3)
    for got, want in zip(ours.model.get_weights(), keras_model.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-5)


def _one_weight_model():
    model = keras.Sequential([keras.Input((1,)),
                              keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
    return model


@pytest.mark.parametrize("clip, expected", [(dict(clip_value=0.5), 0.5),
                                            (dict(clip_norm=2.0), -1.0),
                                            (dict(), 1.0 - 200.0)])
def test_clipping_by_hand(clip, expected):
    # loss = (10 w - 0)^2, w = 1: gradient 2 * 10 * 10 = 200; SGD with rate 1.
    trainer = tapeworks.Trainer(_one_weight_model(), keras.optimizers.SGD(1.0), "mse",
                                jit_compile=False, steps_per_call=1, accumulate=2, **clip)
    x = np.array([[10.0], [10.0]], "float32")
    trainer.fit((x, np.zeros((2, 1), "float32")), batch_size=1, shuffle=False, verbose=0)
    assert trainer.model.get_weights()[0][0, 0] == pytest.approx(expected)


@pytest.mark.parametrize("mode", ["tf.function", "xla-update", "xla"])
@pytest.mark.parametrize("accumulate", [1, 2])
def test_overflow_skips_the_window_and_lowers_the_scale(accumulate, mode):
    model = models.set_fixed_weights(models.sequential())
    before = model.get_weights()
    x, y = models.regression_data(n=8)
    x[5, 0] = np.inf  # in the second micro-batch (batch 4)
    if accumulate == 1:
        x, y = x[4:], y[4:]
    trainer = tapeworks.Trainer(model, keras.optimizers.SGD(0.1), "mse", steps_per_call=1,
                                accumulate=accumulate, precision="mixed_float16",
                                **MODES[mode])
    history = trainer.fit((x, y), batch_size=4, shuffle=False, verbose=0)
    assert all(np.array_equal(a, b) for a, b in zip(model.get_weights(), before))
    assert float(trainer.precision.scale) == 2.0 ** 14
    assert int(trainer.precision.skipped_steps) == 1
    assert int(trainer.optimizer.iterations) == 0
    assert history.history["skipped_steps"] == [1]
    assert history.history["loss_scale"] == [2.0 ** 14]


def test_finite_window_is_applied_and_scale_grows():
    model = models.set_fixed_weights(models.sequential())
    before = model.get_weights()
    trainer = tapeworks.Trainer(model, keras.optimizers.SGD(0.1), "mse", jit_compile=False,
                                steps_per_call=1, accumulate=2, precision="mixed_float16")
    trainer.precision.growth_interval = 2
    trainer.fit(models.regression_data(n=16), batch_size=4, shuffle=False, verbose=0)
    assert int(trainer.optimizer.iterations) == 2
    assert float(trainer.precision.scale) == 2.0 ** 16
    assert not np.allclose(model.get_weights()[0], before[0])


def test_mixed_precision_keeps_float32_variables_and_output_layer():
    model = models.sequential()
    trainer = tapeworks.Trainer(model, "sgd", "mse", precision="mixed_bfloat16",
                                jit_compile=False)
    assert model.layers[0].compute_dtype == "bfloat16"
    assert model.layers[-1].compute_dtype == "float32"
    assert all(w.dtype == "float32" for w in model.weights)
    trainer.fit(models.regression_data(n=16), batch_size=8, verbose=0)
    assert all(w.dtype == "float32" for w in model.weights)


def test_low_precision_output_is_named_in_a_warning():
    model = models.TwoLayer()  # subclassed: tapeworks cannot tell its output layer
    trainer = tapeworks.Trainer(model, "sgd", "mse", precision="mixed_bfloat16",
                                jit_compile=False)
    with pytest.warns(tapeworks.CorrectnessWarning,
                      match="computed in bfloat16.*dtype=\"float32\".*setup-mistakes"):
        trainer.fit(models.regression_data(n=16), batch_size=8, verbose=0)


def test_bfloat16_converges_like_float32():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = (x[order] / 16.0).astype("float32"), y[order]
    accuracy = {}
    for precision in ("float32", "mixed_bfloat16"):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(10)])
        trainer = tapeworks.Trainer(
            model, keras.optimizers.Adam(3e-3),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"], precision=precision, seed=0, jit_compile=False)
        trainer.fit((x[:1500], y[:1500]), batch_size=32, epochs=8, verbose=0)
        accuracy[precision] = trainer.evaluate((x[1500:], y[1500:]), return_dict=True)["accuracy"]
    assert accuracy["float32"] > 0.9
    assert abs(accuracy["mixed_bfloat16"] - accuracy["float32"]) < 0.04


def test_checkpoint_mid_window_resumes_exactly(tmp_path):
    x, y = models.regression_data(n=32)  # 8 micro-batches of 4, windows of 3

    def make():
        model = models.set_fixed_weights(models.sequential())
        return tapeworks.Trainer(model, keras.optimizers.Adam(0.05), "mse",
                                 jit_compile=False, steps_per_call=1, accumulate=3,
                                 precision="mixed_float16")

    reference = make()
    reference.fit((x, y), batch_size=4, shuffle=False, verbose=0)

    first = make()
    saved = {}

    def save_after_step(batch, logs):
        if batch == 4:  # 5 micro-batches in: one window applied, two pending
            saved["path"] = first.checkpoint.write(str(tmp_path / "ckpt"))
            first.model.stop_training = True

    first.fit((x, y), batch_size=4, shuffle=False, verbose=0,
              callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=save_after_step)])

    resumed = make().build_state((x, y), batch_size=4)
    resumed.checkpoint.read(saved["path"]).assert_existing_objects_matched()
    assert int(resumed.state.micro_step) == 2
    resumed.fit((x[20:], y[20:]), batch_size=4, shuffle=False, verbose=0)
    assert int(resumed.optimizer.iterations) == int(reference.optimizer.iterations) == 3
    _assert_same_weights(resumed, reference, atol=0)


def test_batch_norm_updates_per_micro_batch():
    keras.utils.set_random_seed(0)
    bn = keras.layers.BatchNormalization(momentum=0.5)
    model = keras.Sequential([keras.Input((2,)), bn, keras.layers.Dense(1)])
    trainer = tapeworks.Trainer(model, keras.optimizers.SGD(0.01), "mse", jit_compile=False,
                                steps_per_call=1, accumulate=2)
    x = np.array([[0.0, 0.0], [2.0, 2.0], [4.0, 4.0], [6.0, 6.0]], "float32")
    history = trainer.fit((x, np.ones((4, 1), "float32")), batch_size=2, shuffle=False,
                          verbose=0)
    # Means of the micro-batches: 1 then 5. 0 -> 0.5 * 0 + 0.5 * 1 -> 0.5 * 0.5 + 0.5 * 5.
    np.testing.assert_allclose(bn.moving_mean.numpy(), [2.75, 2.75], atol=1e-6)
    assert int(trainer.optimizer.iterations) == 1
    assert np.isfinite(history.history["loss"][0])


def test_batch_norm_model_trains_with_accumulation():
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(256, 8)).astype("float32")
    y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
                              keras.layers.BatchNormalization(), keras.layers.ReLU(),
                              keras.layers.Dense(1)])
    trainer = tapeworks.Trainer(model, keras.optimizers.Adam(0.01),
                                keras.losses.BinaryCrossentropy(from_logits=True),
                                metrics=["binary_accuracy"], accumulate=4, jit_compile=False)
    history = trainer.fit((x, y), batch_size=8, epochs=5, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert history.history["binary_accuracy"][-1] > 0.85


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(accumulate=0), "`accumulate` must be an integer >= 1. Received: accumulate=0"),
    (dict(accumulate=2.0), "`accumulate` must be an integer"),
    (dict(precision="fp16"), "`precision` must be one of"),
    (dict(clip_norm=0), "`clip_norm` must be None or a number > 0"),
    (dict(clip_value=-1.0), "`clip_value` must be None or a number > 0"),
])
def test_bad_options(kwargs, pattern):
    with pytest.raises(tapeworks.ConfigError, match=pattern.replace("(", "\\(")):
        tapeworks.Trainer(models.sequential(), "sgd", "mse", **kwargs)


def test_precision_auto_follows_the_cpu_flags(tmp_path):
    from tapeworks.engine.step import precision

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor : 0\nflags : fpu sse avx512f avx512_bf16 amx_tile\n")
    assert "avx512_bf16" in precision.cpu_flags(str(cpuinfo))
    name, reason = precision.auto_choice()
    if tf.config.list_physical_devices("GPU"):
        return
    native = precision.cpu_flags() & {"avx512_bf16", "amx_bf16"}
    assert name == ("mixed_bfloat16" if native else "float32")
    # Either reason names native bfloat16; only the positive one lists the flags.
    assert ("has native bfloat16 instructions (" in reason) == bool(native)
    assert ("has no native bfloat16" in reason) == (not native)
    trainer = tapeworks.Trainer(models.sequential(), "sgd", "mse", precision="auto")
    # With native bfloat16 "auto" starts in float32 and measures at the first
    # long fit (tests/engine/plan/test_precision_trial.py); without, float32.
    assert trainer.precision.policy == "float32"
    assert trainer.precision.measured == bool(native)
