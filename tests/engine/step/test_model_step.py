"""A model's own `train_step`/`test_step`/`predict_step` through `Trainer`, against `model.fit`.

Twin models with the same fixed initial weights train once with Keras'
`fit` and once with `tapeworks.Trainer(model).fit` on the same unshuffled
data; History, the final weights, `evaluate` and `predict` must agree.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks
from tapeworks.engine.checks.nonfinite import NonFiniteError
from tapeworks.errors import ConfigError

X = np.linspace(-1.0, 1.0, 48, dtype="float32").reshape(24, 2)
Y = (X @ np.array([[0.5], [-0.25]], "float32") + 0.1).astype("float32")


class Regressor(keras.Model):
    """A custom train_step as Keras documents it: tape, optimizer, a tracker, metric logs."""

    def __init__(self, returns="metrics"):
        super().__init__()
        self.dense = keras.layers.Dense(1, kernel_initializer="ones", bias_initializer="zeros")
        self.tracker = keras.metrics.Mean(name="total")
        self.returns = returns

    @property
    def metrics(self):
        return [self.tracker]

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self(x, training=True) - y))
        gradients = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_weights))
        self.tracker.update_state(loss)
        if self.returns == "raw":
            # Keys that are not the metrics': Keras reports the last step's values.
            return {"step_loss": loss, "twice": 2.0 * loss}
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        x, y = data
        self.tracker.update_state(tf.reduce_mean(tf.abs(self(x) - y)))
        return {m.name: m.result() for m in self.metrics}

    def predict_step(self, data):
        return {"doubled": 2.0 * self(data)}


def regressor(returns="metrics"):
    model = Regressor(returns)
    model.compile(keras.optimizers.SGD(0.1))
    return model


def weights(model):
    return [w.numpy() for w in model.weights]


def assert_history_equal(keras_history, tapeworks_history, rtol=1e-5):
    assert sorted(keras_history.history) == sorted(tapeworks_history.history)
    for key, values in keras_history.history.items():
        np.testing.assert_allclose(tapeworks_history.history[key], values, rtol=rtol,
                                   atol=1e-6, err_msg=key)


@pytest.mark.parametrize("jit_compile", [False, True], ids=["tf_function", "xla"])
@pytest.mark.parametrize("returns", ["metrics", "raw"])
def test_own_train_step_runs_in_the_multi_step_loop_as_model_fit_runs_it(jit_compile, returns):
    reference, model = regressor(returns), regressor(returns)
    expected = reference.fit(X, Y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    trainer = tapeworks.Trainer(model, jit_compile=jit_compile, steps_per_call=4)
    history = trainer.fit(X, Y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    assert_history_equal(expected, history, rtol=1e-6 if not jit_compile else 1e-4)
    for got, want in zip(weights(model), weights(reference)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # One trace of the step, run 6 times an epoch in calls of 4 steps.
    assert trainer.traces["train_step"] == 1
    assert int(model.optimizer.iterations.numpy()) == 12


def test_auto_chooses_among_tf_function_and_xla_for_an_own_train_step():
    reference, model = regressor(), regressor()
    expected = reference.fit(X, Y, batch_size=2, epochs=3, shuffle=False, verbose=0)
    trainer = tapeworks.Trainer(model)
    history = trainer.fit(X, Y, batch_size=2, epochs=3, shuffle=False, verbose=0)
    assert_history_equal(expected, history, rtol=1e-4)
    # Its update is its own: the XLA-fused update is never a candidate.
    measured_or_waiting = list(trainer.tuning["measured"]) + trainer.plan.planner.untried
    assert not [mode for mode in measured_or_waiting if "update" in str(mode)]
    assert trainer.jit_compile in (False, True)


def test_evaluate_and_predict_use_the_models_own_test_and_predict_steps():
    reference, model = regressor(), regressor()
    trainer = tapeworks.Trainer(model, jit_compile=False)
    trainer.fit(X, Y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    reference.fit(X, Y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    got = trainer.evaluate(X, Y, batch_size=5, verbose=0, return_dict=True)
    want = reference.evaluate(X, Y, batch_size=5, verbose=0, return_dict=True)
    assert sorted(got) == sorted(want) == ["total"]
    np.testing.assert_allclose(got["total"], want["total"], rtol=1e-6)
    predicted = trainer.predict(X, batch_size=5, verbose=0)
    np.testing.assert_allclose(predicted["doubled"],
                               reference.predict(X, batch_size=5, verbose=0)["doubled"],
                               rtol=1e-6)


def test_validation_reads_the_own_test_step():
    reference, model = regressor(), regressor()
    expected = reference.fit(X, Y, batch_size=4, epochs=2, shuffle=False, verbose=0,
                             validation_data=(X[:8], Y[:8]))
    history = tapeworks.Trainer(model, jit_compile=False, steps_per_call=3).fit(
        X, Y, batch_size=4, epochs=2, shuffle=False, verbose=0, validation_data=(X[:8], Y[:8]))
    assert_history_equal(expected, history)


class Autoencoder(keras.Model):
    """The VAE's shape: two sub-models, no `call`, its own trackers, fitted on x alone."""

    def __init__(self):
        super().__init__()
        self.encoder = keras.Sequential([keras.Input((2,)), keras.layers.Dense(
            1, kernel_initializer="ones")])
        self.decoder = keras.Sequential([keras.Input((1,)), keras.layers.Dense(
            2, kernel_initializer=keras.initializers.Constant(0.5))])
        self.total = keras.metrics.Mean(name="total_loss")
        self.size = keras.metrics.Mean(name="code_size")

    @property
    def metrics(self):
        return [self.total, self.size]

    def train_step(self, data):
        with tf.GradientTape() as tape:
            code = self.encoder(data)
            reconstruction = self.decoder(code)
            size = tf.reduce_mean(tf.square(code))
            loss = tf.reduce_mean(tf.square(reconstruction - data)) + 0.01 * size
        gradients = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_weights))
        self.total.update_state(loss)
        self.size.update_state(size)
        return {"total_loss": self.total.result(), "code_size": self.size.result()}


def test_a_vae_shaped_model_without_call_trains_on_x_alone_as_in_keras():
    reference, model = Autoencoder(), Autoencoder()
    reference.compile(keras.optimizers.Adam(0.01))
    model.compile(keras.optimizers.Adam(0.01))
    expected = reference.fit(X, batch_size=6, epochs=2, shuffle=False, verbose=0)
    history = tapeworks.Trainer(model, jit_compile=False, steps_per_call=2).fit(
        X, batch_size=6, epochs=2, shuffle=False, verbose=0)
    assert_history_equal(expected, history)
    for got, want in zip(weights(model), weights(reference)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class TwoOptimizers(keras.Model):
    """A GAN's shape: two sub-models, each with its own optimizer built in the first step.

    `built=False`: two unbuilt Dense layers, which the first trace builds.
    """

    def __init__(self, built=True):
        super().__init__()
        first = keras.layers.Dense(1, kernel_initializer="ones")
        second = keras.layers.Dense(1, kernel_initializer="zeros")
        if built:
            first = keras.Sequential([keras.Input((2,)), first])
            second = keras.Sequential([keras.Input((2,)), second])
        self.first, self.second = first, second

    def compile(self, first_optimizer, second_optimizer):
        super().compile()
        self.first_optimizer, self.second_optimizer = first_optimizer, second_optimizer

    def train_step(self, data):
        x, y = data
        with tf.GradientTape(persistent=True) as tape:
            first_loss = tf.reduce_mean(tf.square(self.first(x) - y))
            second_loss = tf.reduce_mean(tf.abs(self.second(x) + self.first(x) - y))
        self.first_optimizer.apply_gradients(zip(
            tape.gradient(first_loss, self.first.trainable_weights),
            self.first.trainable_weights))
        self.second_optimizer.apply_gradients(zip(
            tape.gradient(second_loss, self.second.trainable_weights),
            self.second.trainable_weights))
        return {"first_loss": first_loss, "second_loss": second_loss}


def test_a_step_applying_two_optimizers_of_its_own_trains_as_in_keras():
    def make():
        model = TwoOptimizers()
        model.compile(keras.optimizers.SGD(0.05), keras.optimizers.Adam(0.01))
        return model

    reference, model = make(), make()
    expected = reference.fit(X, Y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    history = tapeworks.Trainer(model, jit_compile=False, steps_per_call=3).fit(
        X, Y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    assert_history_equal(expected, history)
    for got, want in zip(weights(model), weights(reference)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert int(model.second_optimizer.iterations.numpy()) == 12


@pytest.mark.parametrize("option, value, way_out", [
    ("accumulate", 2, "gradient_accumulation_steps"),
    ("clip_norm", 1.0, "global_clipnorm"),
    ("clip_value", 1.0, "clipvalue"),
    ("monitor_every", 10, "tapeworks.Task"),
    ("jit_compile", "update", "jit_compile=True"),
    ("on_nonfinite", "skip", "on_nonfinite=\"raise\""),
    ("precision", "mixed_float16", "scale_loss"),
])
def test_options_that_need_tapeworks_own_step_are_refused_with_the_way_out(
        option, value, way_out):
    with pytest.raises(ConfigError) as raised:
        tapeworks.Trainer(regressor(), **{option: value})
    assert "custom `train_step`" in str(raised.value)
    assert way_out in str(raised.value)


class Exploding(Regressor):
    def train_step(self, data):
        logs = super().train_step(data)
        # The third step's loss is non-finite.
        bad = tf.equal(self.optimizer.iterations, 3)
        return {"loss": tf.where(bad, np.float32("nan"), logs["total"])}


def test_a_non_finite_loss_log_stops_after_that_step_and_says_the_update_was_applied(
        tmp_path):
    model = Exploding()
    model.compile(keras.optimizers.SGD(0.1))
    trainer = tapeworks.Trainer(model, jit_compile=False, steps_per_call=4,
                                nonfinite_dir=str(tmp_path))
    with pytest.raises(NonFiniteError) as raised:
        trainer.fit(X, Y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    message = str(raised.value)
    assert "step 2 " in message and "custom `train_step`" in message
    assert "loss=nan" in message and "could not withhold" in message
    assert int(model.optimizer.iterations.numpy()) == 3   # stopped right after it
    assert list(tmp_path.iterdir())   # the batch is saved


def test_a_finite_own_step_gets_no_warning(recwarn):
    tapeworks.Trainer(regressor(), jit_compile=False).fit(
        X, Y, batch_size=4, epochs=2, verbose=0)
    assert [str(w.message) for w in recwarn if "tapeworks" in str(w.message)] == []


class OwnEvaluation(keras.Model):
    """Keras' train_step, its own test_step and predict_step."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1, kernel_initializer="ones")
        self.error = keras.metrics.Mean(name="abs_error")

    def call(self, x):
        return self.dense(x)

    def test_step(self, data):
        x, y = data
        self.error.update_state(tf.reduce_mean(tf.abs(self(x) - y)))
        return {"abs_error": self.error.result()}

    def predict_step(self, data):
        return self(data) + 100.0


def test_own_test_and_predict_steps_with_keras_train_step_keep_tapeworks_step():
    def make():
        model = OwnEvaluation()
        model.compile(keras.optimizers.SGD(0.1), loss="mse")
        return model

    reference, model = make(), make()
    expected = reference.fit(X, Y, batch_size=4, epochs=2, shuffle=False, verbose=0,
                             validation_data=(X[:8], Y[:8]))
    # tapeworks' own step trains (its options apply); evaluation is the model's.
    trainer = tapeworks.Trainer(model, jit_compile=False, steps_per_call=2, clip_norm=100.0)
    history = trainer.fit(X, Y, batch_size=4, epochs=2, shuffle=False, verbose=0,
                          validation_data=(X[:8], Y[:8]))
    assert_history_equal(expected, history)
    np.testing.assert_allclose(trainer.evaluate(X, Y, verbose=0),
                               reference.evaluate(X, Y, verbose=0), rtol=1e-6)
    np.testing.assert_allclose(trainer.predict(X, verbose=0), reference.predict(X, verbose=0),
                               rtol=1e-6)


class PerSampleLogs(Regressor):
    """Logs Keras' fit passes on as they are: a constant and a per-sample vector."""

    def train_step(self, data):
        super().train_step(data)
        x, y = data
        return {"constant": 10.0, "errors": tf.reshape(tf.abs(self(x) - y), [-1])}


def test_logs_of_any_shape_are_the_last_steps_as_in_keras():
    def make():
        model = PerSampleLogs()
        model.compile(keras.optimizers.SGD(0.1))
        return model

    reference, model = make(), make()
    expected = reference.fit(X[:22], Y[:22], batch_size=4, epochs=1, shuffle=False, verbose=0)
    history = tapeworks.Trainer(model, jit_compile=False, steps_per_call=3).fit(
        X[:22], Y[:22], batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert history.history["constant"] == expected.history["constant"] == [10.0]
    # The last batch has 2 samples: its errors, as Keras reports them.
    np.testing.assert_allclose(history.history["errors"][0], expected.history["errors"][0],
                               rtol=1e-5)
    assert np.shape(history.history["errors"][0]) == (2,)


def test_warn_counts_a_non_finite_loss_of_an_own_step_and_trains_on():
    model = Exploding()
    model.compile(keras.optimizers.SGD(0.1))
    trainer = tapeworks.Trainer(model, jit_compile=False, steps_per_call=4, on_nonfinite="warn")
    with pytest.warns(tapeworks.CorrectnessWarning, match="1 non-finite step"):
        history = trainer.fit(X, Y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert history.history["nonfinite_steps"] == [1]
    assert int(model.optimizer.iterations.numpy()) == 6


def test_an_uncompiled_own_step_model_takes_an_optimizer_alone_as_keras_compile_does():
    reference, model = Autoencoder(), Autoencoder()
    reference.compile(keras.optimizers.SGD(0.1))
    expected = reference.fit(X, batch_size=6, epochs=1, shuffle=False, verbose=0)
    history = tapeworks.Trainer(model, keras.optimizers.SGD(0.1), jit_compile=False).fit(
        X, batch_size=6, epochs=1, shuffle=False, verbose=0)
    assert_history_equal(expected, history)


class GuideStep(keras.Sequential):
    """Keras' guide's custom step: compute_loss, optimizer.apply, every metric of the model."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        # The compiled metrics' result is a dict inside the dict: Keras flattens it.
        return {m.name: m.result() for m in self.metrics}


@pytest.mark.parametrize("jit_compile", [False, True], ids=["tf_function", "xla"])
def test_keras_guides_custom_step_with_compiled_loss_and_metrics(jit_compile):
    def make():
        model = GuideStep([keras.Input((2,)), keras.layers.Dense(1, kernel_initializer="ones")])
        model.compile(keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
        return model

    reference, model = make(), make()
    expected = reference.fit(X, Y, batch_size=4, epochs=2, shuffle=False, verbose=0,
                             validation_data=(X[:8], Y[:8]))
    history = tapeworks.Trainer(model, jit_compile=jit_compile, steps_per_call=2).fit(
        X, Y, batch_size=4, epochs=2, shuffle=False, verbose=0, validation_data=(X[:8], Y[:8]))
    assert sorted(history.history) == ["loss", "mae", "val_loss", "val_mae"]
    assert_history_equal(expected, history, rtol=1e-5 if not jit_compile else 1e-4)


class BranchesOnATensor(Regressor):
    """A step with an `if` over a tensor, which Keras 3 does not convert (`do_not_convert`)."""

    def train_step(self, data):
        if tf.reduce_sum(data[0]) > 0:
            return {"never": 0.0}
        return super().train_step(data)


@pytest.mark.parametrize("fit", ["keras", "tapeworks"])
def test_an_if_over_a_tensor_in_an_own_step_fails_as_in_keras(fit):
    # AutoGraph made it a tf.cond in tapeworks, and cost a second of tracing on a GAN.
    model = BranchesOnATensor()
    model.compile(keras.optimizers.SGD(0.1))
    model(X[:1])
    before = weights(model)
    with pytest.raises(tf.errors.OperatorNotAllowedInGraphError, match="Python `bool`"):
        if fit == "keras":
            model.fit(X, Y, batch_size=4, epochs=1, verbose=0)
        else:
            tapeworks.Trainer(model).fit(X, Y, batch_size=4, epochs=1, verbose=0)
    for got, want in zip(weights(model), before):
        np.testing.assert_array_equal(got, want)
