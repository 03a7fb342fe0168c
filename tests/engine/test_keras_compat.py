"""`trainer.fit/evaluate/predict` against `model.fit/evaluate/predict`, argument for argument.

Each case calls Keras and tapeworks with the same arguments on twin models
(same seeded initial weights) and compares History keys and values, the final
weights and what `evaluate` returns. tapeworks runs in a fixed mode
(tf.function, one step per call), as Keras' fit does by default.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks

RNG = np.random.default_rng(0)
X = RNG.normal(size=(40, 4)).astype("float32")
XB = RNG.normal(size=(40, 3)).astype("float32")
LABELS = RNG.integers(0, 3, size=40)
WEIGHTS = RNG.uniform(0.5, 2.0, size=40).astype("float32")


def one_input():
    inputs = keras.Input((4,), name="a")
    hidden = keras.layers.Dense(8, activation="relu",
                                kernel_initializer=keras.initializers.GlorotUniform(seed=1))(inputs)
    outputs = keras.layers.Dense(3, kernel_initializer=keras.initializers.GlorotUniform(seed=2))(
        hidden)
    return keras.Model(inputs, outputs)


def two_inputs():
    a, b = keras.Input((4,), name="a"), keras.Input((3,), name="b")
    merged = keras.layers.Concatenate()([a, b])
    outputs = keras.layers.Dense(3, kernel_initializer=keras.initializers.GlorotUniform(seed=3))(
        merged)
    return keras.Model({"a": a, "b": b}, outputs)


def two_inputs_list():
    a, b = keras.Input((4,), name="a"), keras.Input((3,), name="b")
    merged = keras.layers.Concatenate()([a, b])
    outputs = keras.layers.Dense(3, kernel_initializer=keras.initializers.GlorotUniform(seed=3))(
        merged)
    return keras.Model([a, b], outputs)


def compiled(build):
    model = build()
    model.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


CASES = {
    "arrays": (one_input, dict(x=X, y=LABELS, batch_size=8, epochs=2, shuffle=False)),
    "default batch size": (one_input, dict(x=X, y=LABELS, epochs=1, shuffle=False)),
    "dict inputs": (two_inputs, dict(x={"a": X, "b": XB}, y=LABELS, batch_size=8, epochs=2,
                                     shuffle=False)),
    "list inputs": (two_inputs_list, dict(x=[X, XB], y=LABELS, batch_size=8, epochs=2,
                                          shuffle=False)),
    "class_weight": (one_input, dict(x=X, y=LABELS, batch_size=8, epochs=2, shuffle=False,
                                     class_weight={0: 1.0, 1: 3.0, 2: 0.5})),
    "sample_weight": (one_input, dict(x=X, y=LABELS, batch_size=8, epochs=2, shuffle=False,
                                      sample_weight=WEIGHTS)),
    "validation_split": (one_input, dict(x=X, y=LABELS, batch_size=8, epochs=2, shuffle=False,
                                         validation_split=0.25)),
    "validation_data with weights, every 2nd epoch": (one_input, dict(
        x=X[:30], y=LABELS[:30], batch_size=8, epochs=4, shuffle=False,
        validation_data=(X[30:], LABELS[30:], WEIGHTS[30:]), validation_freq=2,
        validation_batch_size=4)),
    "validation_freq as a list": (one_input, dict(
        x=X[:30], y=LABELS[:30], batch_size=8, epochs=3, shuffle=False,
        validation_data=(X[30:], LABELS[30:]), validation_freq=[1, 3])),
    "initial_epoch": (one_input, dict(x=X, y=LABELS, batch_size=8, epochs=3, initial_epoch=1,
                                      shuffle=False)),
    # Two epochs of 2 of the 5 batches: the iterator carries over, as in Keras.
    "steps_per_epoch": (one_input, dict(x=X, y=LABELS, batch_size=8, epochs=2,
                                        steps_per_epoch=2, shuffle=False)),
    # Past the data: the third epoch ends short (1 batch), the fourth starts
    # the data again, as in Keras' fit.
    "steps_per_epoch past the data": (one_input, dict(x=X, y=LABELS, batch_size=8, epochs=4,
                                                      steps_per_epoch=2, shuffle=False)),
    "validation_steps": (one_input, dict(
        x=X[:30], y=LABELS[:30], batch_size=8, epochs=1, shuffle=False,
        validation_data=(X[30:], LABELS[30:]), validation_steps=2, validation_batch_size=2)),
    "zero epochs": (one_input, dict(x=X, y=LABELS, epochs=0)),
    "initial_epoch past epochs": (one_input, dict(x=X, y=LABELS, epochs=2, initial_epoch=2)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fit_matches_keras(case):
    build, arguments = CASES[case]
    reference = compiled(build)
    expected = reference.fit(verbose=0, **arguments).history
    model = compiled(build)
    trainer = tapeworks.Trainer(model, jit_compile=False, steps_per_call=1)
    got = trainer.fit(verbose=0, **arguments).history
    assert sorted(got) == sorted(expected)
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, atol=1e-6, err_msg=key)
    for mine, theirs in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    evaluate = {k: v for k, v in arguments.items() if k in ("x", "y")}
    np.testing.assert_allclose(trainer.evaluate(verbose=0, **evaluate),
                               reference.evaluate(verbose=0, **evaluate), rtol=1e-5)
    assert trainer.evaluate(verbose=0, return_dict=True, **evaluate).keys() == \
        reference.evaluate(verbose=0, return_dict=True, **evaluate).keys()


def test_shuffled_validation_split_keeps_the_last_samples_for_validation():
    # Keras takes the validation part from the end before shuffling: the
    # validation loss of the first epoch only depends on the weights after it,
    # so compare the split itself through a model that does not train.
    model = compiled(one_input)
    model.trainable = False
    reference = compiled(one_input)
    reference.trainable = False
    expected = reference.fit(X, LABELS, validation_split=0.25, shuffle=True, verbose=0)
    got = tapeworks.Trainer(model, jit_compile=False, steps_per_call=1, seed=0).fit(
        X, LABELS, validation_split=0.25, shuffle=True, verbose=0)
    np.testing.assert_allclose(got.history["val_loss"], expected.history["val_loss"], rtol=1e-5)
    np.testing.assert_allclose(got.history["loss"], expected.history["loss"], rtol=1e-5)


def test_evaluate_returns_a_scalar_without_metrics_and_accepts_keras_arguments():
    model = one_input()
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    reference = one_input()
    reference.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer = tapeworks.Trainer(model)
    got = trainer.evaluate(X, LABELS, batch_size=16, verbose=0, sample_weight=WEIGHTS, steps=2)
    expected = reference.evaluate(X, LABELS, batch_size=16, verbose=0, sample_weight=WEIGHTS,
                                  steps=2)
    assert isinstance(got, float)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    with pytest.raises(tapeworks.ConfigError, match="not recognized"):
        trainer.evaluate(X, LABELS, nosuch=1)


def test_predict_takes_keras_arguments_and_calls_predict_callbacks():
    model = compiled(one_input)
    trainer = tapeworks.Trainer(model, jit_compile=False)
    seen = []
    hook = keras.callbacks.LambdaCallback(
        on_predict_batch_end=lambda batch, logs: seen.append((batch, logs["outputs"].shape)))
    out = trainer.predict(X, batch_size=16, verbose=0, steps=2, callbacks=[hook])
    np.testing.assert_allclose(out, model.predict(X[:32], batch_size=16, verbose=0), rtol=1e-5)
    assert seen == [(0, (16, 3)), (1, (16, 3))]


def test_trainer_uses_a_compiled_models_configuration_and_changes_none_of_it():
    model = one_input()
    optimizer = keras.optimizers.Adam(0.01)
    model.compile(optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"],
                  jit_compile=True, steps_per_execution=8)
    trainer = tapeworks.Trainer(model)
    history = trainer.fit(X, LABELS, epochs=1, verbose=0)
    assert model.optimizer is optimizer and trainer.optimizer is optimizer
    assert model.jit_compile is True and model.steps_per_execution == 8
    assert sorted(history.history) == ["accuracy", "loss"]
    assert int(optimizer.iterations) == 2   # 40 samples, batch 32


def test_explicit_arguments_override_compile_and_keep_its_other_settings():
    model = one_input()
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"],
                  steps_per_execution=4)
    tapeworks.Trainer(model, keras.optimizers.SGD(0.5))
    assert isinstance(model.optimizer, keras.optimizers.SGD)
    assert model.steps_per_execution == 4
    assert [m.name for m in model.metrics] == ["loss", "compile_metrics"]


def test_uncompiled_model_without_optimizer_and_loss_is_refused():
    with pytest.raises(tapeworks.ConfigError, match="not compiled"):
        tapeworks.Trainer(one_input())


def test_legacy_tuple_and_batched_validation_dataset():
    model = compiled(one_input)
    trainer = tapeworks.Trainer(model, jit_compile=False)
    validation = tf.data.Dataset.from_tensor_slices((X, LABELS)).batch(10)
    history = trainer.fit((X, LABELS), batch_size=8, validation_data=validation, verbose=0)
    assert "val_loss" in history.history
    assert isinstance(trainer.evaluate((X, LABELS), batch_size=20, verbose=0), list)


def test_pydataset_is_accepted():
    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 5

        def __getitem__(self, index):
            rows = slice(index * 8, index * 8 + 8)
            return X[rows], LABELS[rows]

    model = compiled(one_input)
    reference = compiled(one_input)
    expected = reference.fit(Batches(), epochs=2, shuffle=False, verbose=0).history
    got = tapeworks.Trainer(model, jit_compile=False, steps_per_call=1).fit(
        Batches(), epochs=2, shuffle=False, verbose=0).history
    np.testing.assert_allclose(got["loss"], expected["loss"], rtol=1e-5)


def test_a_custom_task_predicts():
    class Regression(tapeworks.Task):
        def __init__(self):
            super().__init__()
            self.net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            self.add_update("net", loss="loss", trains=self.net, optimizer="sgd")

        def compute_losses(self, batch, training):
            x, y = batch
            return {"loss": tf.reduce_mean(tf.square(self.net(x, training=training) - y))}

    trainer = tapeworks.Trainer(Regression(), jit_compile=False)
    assert trainer.predict(X, verbose=0).shape == (40, 1)


def test_run_eagerly_runs_call_eagerly_from_the_first_batch():
    class NumpyInCall(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x):
            assert x.numpy().shape[1] == 4   # fails on a symbolic tensor
            return self.dense(x)

    model = NumpyInCall()
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  run_eagerly=True)
    trainer = tapeworks.Trainer(model)
    assert trainer.run_eagerly
    assert np.isfinite(trainer.fit(X, LABELS, batch_size=8, verbose=0).history["loss"][0])


class CountsCalls(keras.layers.Layer):
    """The identity; counts the batches it saw."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.rows = []

    def call(self, x):
        if tf.executing_eagerly():
            self.rows.append(int(tf.shape(x)[0]))
        return x

    def compute_output_shape(self, shape):
        return shape


def eager_counted():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    counted = CountsCalls()
    outputs = keras.layers.Dense(3)(counted(inputs))
    model = keras.Model(inputs, outputs)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], run_eagerly=True)
    return model, counted


def test_an_eager_fit_runs_the_model_on_its_batches_only_and_matches_keras(tmp_path):
    # As Keras' eager fit: the first step names the losses and builds the
    # metrics, with no run on zeros before it.
    reference, _ = eager_counted()
    expected = reference.fit(X, LABELS, batch_size=8, epochs=2, verbose=0, shuffle=False)
    model, counted = eager_counted()
    history = tapeworks.Trainer(model).fit(X, LABELS, batch_size=8, epochs=2, verbose=0,
                                          shuffle=False)
    assert counted.rows == [8] * 10
    assert list(history.history) == list(expected.history)
    for key, values in expected.history.items():
        np.testing.assert_allclose(history.history[key], values, rtol=1e-5, err_msg=key)
    # Where a checkpoint may be restored before the first step, the state is built whole first.
    model, counted = eager_counted()
    tapeworks.Trainer(model).fit(X, LABELS, batch_size=8, epochs=1, verbose=0, shuffle=False,
                                 checkpoint_dir=str(tmp_path))
    assert counted.rows == [1] + [8] * 5


def test_a_model_without_trainable_weights_still_runs_its_metrics():
    model = compiled(one_input)
    model.trainable = False
    model.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    before = model.get_weights()
    history = tapeworks.Trainer(model, jit_compile=False).fit(X, LABELS, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_array_valued_metric_goes_into_the_logs():
    model = one_input()
    model.compile("sgd", keras.losses.CategoricalCrossentropy(from_logits=True),
                  metrics=[keras.metrics.F1Score()])
    onehot = keras.utils.to_categorical(LABELS, 3)
    history = tapeworks.Trainer(model, jit_compile=False).fit(X, onehot, verbose=0)
    assert np.shape(history.history["f1_score"][0]) == (3,)


def test_ema_weights_are_copied_in_at_the_end_of_fit_as_keras_does():
    weights = []
    for use_trainer in (False, True):
        model = one_input()
        model.compile(keras.optimizers.SGD(0.1, use_ema=True, ema_momentum=0.5),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        if use_trainer:
            tapeworks.Trainer(model, jit_compile=False, steps_per_call=1).fit(
                X, LABELS, batch_size=8, shuffle=False, verbose=0)
        else:
            model.fit(X, LABELS, batch_size=8, shuffle=False, verbose=0)
        weights.append(model.get_weights())
    for mine, theirs in zip(*weights):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)


def test_stopping_mid_epoch_still_validates_that_epoch():
    class StopAfterFirstBatch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.model.stop_training = True

    model = compiled(one_input)
    history = tapeworks.Trainer(model, jit_compile=False, steps_per_call=1).fit(
        X, LABELS, batch_size=8, epochs=3, validation_data=(X, LABELS),
        callbacks=[StopAfterFirstBatch()], verbose=0)
    assert len(history.history["val_loss"]) == 1


@pytest.mark.parametrize("use_trainer", [False, True], ids=["keras", "tapeworks"])
def test_backup_and_restore_resumes_where_keras_resumes(tmp_path, use_trainer):
    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("killed")

    epochs_run = []
    record = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: epochs_run.append(epoch))
    backup = str(tmp_path / "backup")

    def fit(callbacks):
        model = compiled(one_input)
        if use_trainer:
            return tapeworks.Trainer(model, jit_compile=False).fit(
                X, LABELS, epochs=4, verbose=0, callbacks=callbacks)
        return model.fit(X, LABELS, epochs=4, verbose=0, callbacks=callbacks)

    with pytest.raises(RuntimeError, match="killed"):
        fit([keras.callbacks.BackupAndRestore(backup), Interrupt(), record])
    history = fit([keras.callbacks.BackupAndRestore(backup), record])
    # The backup was written at the end of epoch 1, before the interruption.
    assert epochs_run == [0, 1, 2, 3]
    assert len(history.history["loss"]) == 2


def test_test_batch_hooks_see_every_batch_when_a_callback_implements_them():
    seen = []
    hook = keras.callbacks.LambdaCallback(on_test_batch_end=lambda batch, logs: seen.append(batch))
    model = compiled(one_input)
    tapeworks.Trainer(model).evaluate(X, LABELS, batch_size=4, callbacks=[hook], verbose=0)
    assert seen == list(range(10))


def test_no_unmatched_batch_begin_when_steps_per_epoch_equals_the_data_length():
    events = []
    hook = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda batch, logs: events.append(("begin", batch)),
        on_train_batch_end=lambda batch, logs: events.append(("end", batch)))
    model = compiled(one_input)
    tapeworks.Trainer(model, jit_compile=False, steps_per_call=5).fit(
        X, LABELS, batch_size=8, epochs=2, steps_per_epoch=5, callbacks=[hook], verbose=0)
    assert events == [("begin", 0), ("end", 4)] * 2


def test_verbose_one_shows_progress_for_evaluate_and_predict(capsys):
    model = compiled(one_input)
    trainer = tapeworks.Trainer(model, jit_compile=False)
    trainer.evaluate(X, LABELS, verbose=1)
    trainer.predict(X, verbose=1)
    out = capsys.readouterr().out
    assert "loss" in out and out.count("2/2") >= 2


def test_progress_line_rounds_samples_per_second_and_shows_the_learning_rate(capsys):
    model = compiled(one_input)
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=0, min_delta=10.0)
    tapeworks.Trainer(model, jit_compile=False).fit(X, LABELS, epochs=2, verbose=2,
                                                    callbacks=[plateau])
    lines = [line for line in capsys.readouterr().out.splitlines() if "samples/s" in line]
    assert len(lines) == 2
    rate = lines[0].split(" samples/s")[0].rsplit(" ", 1)[-1]
    assert rate.replace(",", "").isdigit(), lines[0]
    assert "learning_rate" in lines[1]


def test_compiling_again_after_creating_the_trainer_is_explained():
    model = compiled(one_input)
    trainer = tapeworks.Trainer(model, jit_compile=False)
    trainer.fit(X, LABELS, verbose=0)
    model.compile("adam", "sparse_categorical_crossentropy")
    with pytest.raises(tapeworks.ConfigError, match="compiled again"):
        trainer.fit(X, LABELS, verbose=0)
    tapeworks.Trainer(model, jit_compile=False).fit(X, LABELS, verbose=0)


def test_an_endpoint_model_with_add_loss_trains_on_inputs_alone_as_in_keras():
    # Keras' "endpoint layer" pattern: the loss comes from `add_loss`, the
    # model is compiled without one and fitted on a dict of inputs, no `y`.
    class Endpoint(keras.layers.Layer):
        def call(self, targets, predictions):
            self.add_loss(keras.ops.mean(keras.ops.square(targets - predictions)))
            return predictions

    def build():
        keras.utils.set_random_seed(3)
        x = keras.Input((4,), name="x")
        t = keras.Input((1,), name="t")
        out = Endpoint()(t, keras.layers.Dense(1)(x))
        model = keras.Model({"x": x, "t": t}, out)
        model.compile(keras.optimizers.SGD(0.1))
        return model

    rng = np.random.default_rng(0)
    inputs = {"x": rng.normal(size=(32, 4)).astype("float32"),
              "t": rng.normal(size=(32, 1)).astype("float32")}
    reference = build()
    expected = reference.fit(inputs, batch_size=8, epochs=2, shuffle=False, verbose=0)
    model = build()
    history = tapeworks.Trainer(model, jit_compile=False, steps_per_call=2,
                                plan_cache=False).fit(inputs, batch_size=8, epochs=2,
                                                      shuffle=False, verbose=0)
    assert sorted(history.history) == sorted(expected.history)
    np.testing.assert_allclose(history.history["loss"], expected.history["loss"], rtol=1e-4)
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


class _BatchEnds(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches = []

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append(batch)


def test_the_models_compile_jit_compile_and_steps_per_execution_are_kept():
    # As the guide says: arguments the Trainer is not given keep the model's
    # compile settings. They were replaced by "auto".
    model = one_input()
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=True, steps_per_execution=4)
    trainer = tapeworks.Trainer(model, plan_cache=False)
    assert (trainer.jit_compile, trainer.steps_per_call) == (True, 4)
    ends = _BatchEnds()
    trainer.fit(X, LABELS, batch_size=6, epochs=1, shuffle=False, verbose=0, callbacks=[ends])
    # 7 batches in calls of 4: one hook a call, at its last batch.
    assert ends.batches == [3, 6]
    # The Trainer's own arguments win.
    given = tapeworks.Trainer(model, jit_compile=False, steps_per_call=2, plan_cache=False)
    assert (given.jit_compile, given.steps_per_call) == (False, 2)


def test_a_model_compiled_to_run_eagerly_gets_every_batch_hook_as_in_keras():
    model = one_input()
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  run_eagerly=True)
    ends = _BatchEnds()
    trainer = tapeworks.Trainer(model, plan_cache=False)
    trainer.fit(X, LABELS, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[ends])
    assert ends.batches == [0, 1, 2, 3, 4] * 2
    assert trainer.steps_per_call == 1
