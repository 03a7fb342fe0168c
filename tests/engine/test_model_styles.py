"""Keras' other documented ways to write and feed a model, through `Trainer` against `model.fit`.

`compute_loss` overrides (with and without Keras 3.3's `training`), a model's own
`metrics` property (a loss tracker of its own, no loss tracker) and `compute_metrics`
overrides (other keys, the same keys), `add_loss`
models fitted on a dataset without targets, multi-output models with a loss
dict that leaves an output without a loss, `keras.utils.PyDataset` and
Python generators, a model built under Keras' mixed_float16 policy. Twin models
with the same fixed initial weights; the same unshuffled batches; History keys
and values and the final weights compared.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks

RNG = np.random.default_rng(7)
X = RNG.normal(size=(24, 3)).astype("float32")
Y = (X @ np.array([[0.5], [-0.25], [1.0]], "float32")).astype("float32")
LABELS = (X[:, 0] > 0).astype("int32")


def fit_both(build, arguments):
    """(Keras' History, tapeworks' History, Keras' model, tapeworks' model) on twin models.

    `arguments(model)`: fit's arguments (a fresh generator or dataset for each).
    """
    reference, model = build(), build()
    expected = reference.fit(verbose=0, shuffle=False, **arguments(reference))
    trainer = tapeworks.Trainer(model, jit_compile=False, steps_per_call=2)
    got = trainer.fit(verbose=0, shuffle=False, **arguments(model))
    return expected, got, reference, model


def assert_same_training(expected, got, reference, model):
    assert sorted(got.history) == sorted(expected.history)
    for key, values in expected.history.items():
        np.testing.assert_allclose(got.history[key], values, rtol=1e-5, atol=1e-6,
                                   err_msg=key)
    for mine, theirs in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)


class HuberByHand(keras.Model):
    """A `compute_loss` override with Keras 3.3's signature: its loss, not the compiled one."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1, kernel_initializer="ones")

    def call(self, x):
        return self.dense(x)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        error = tf.abs(y - y_pred)
        # `training` is honoured: a different loss outside training shows it was passed.
        scale = 1.0 if training else 10.0
        return scale * tf.reduce_mean(tf.where(error < 0.5, 0.5 * error ** 2, error - 0.125))


class OldSignature(HuberByHand):
    """An override written before Keras 3.3: no `training` argument."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
        return tf.reduce_mean(tf.abs(y - y_pred)) + 0.1 * tf.reduce_mean(tf.square(y_pred))


@pytest.mark.parametrize("model_class", [HuberByHand, OldSignature])
def test_a_compute_loss_override_is_honoured_as_model_fit_honours_it(model_class):
    def build():
        model = model_class()
        # The compiled loss is not the one used: the override decides.
        model.compile(keras.optimizers.SGD(0.05), loss="mse")
        return model

    assert_same_training(*fit_both(build, arguments=lambda _: dict(
        x=X, y=Y, batch_size=6, epochs=2, validation_data=(X[:6], Y[:6]))))


class OwnLossTracker(HuberByHand):
    """Keras' masked-language-model example: `compute_loss` returns the summed loss and
    updates a tracker of its own named "loss" (the per-sample mean), which its `metrics`
    property lists and its `compute_metrics` returns: the History's "loss" is that tracker's."""

    def __init__(self):
        super().__init__()
        self.tracker = keras.metrics.Mean(name="loss")

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
        per_sample = tf.reduce_mean(tf.square(y - y_pred), axis=-1)
        self.tracker.update_state(per_sample)
        return tf.reduce_sum(per_sample)

    def compute_metrics(self, x, y, y_pred, sample_weight):
        return {"loss": self.tracker.result()}

    @property
    def metrics(self):
        return [self.tracker]


class MetricsWithoutLoss(HuberByHand):
    """A `metrics` property that lists only a metric of its own: Keras logs no "loss"."""

    def __init__(self):
        super().__init__()
        self.error = keras.metrics.MeanAbsoluteError(name="error")

    def compute_metrics(self, x, y, y_pred, sample_weight):
        self.error.update_state(y, y_pred)
        return self.get_metrics_result()

    @property
    def metrics(self):
        return [self.error]


class BatchStatistics(HuberByHand):
    """A `compute_metrics` override that returns other keys: Keras logs them, last batch's."""

    def compute_metrics(self, x, y, y_pred, sample_weight):
        super().compute_metrics(x, y, y_pred, sample_weight)
        error = tf.abs(y - y_pred)
        return {"largest_error": tf.reduce_max(error), "error": {"smallest": tf.reduce_min(error)}}


class Percentages(HuberByHand):
    """The same keys as the metrics' (scaled): Keras reads the metrics, not the scaled values."""

    def compute_metrics(self, x, y, y_pred, sample_weight):
        results = super().compute_metrics(x, y, y_pred, sample_weight)
        return {name: 100 * value for name, value in results.items()}


@pytest.mark.parametrize("model_class",
                         [OwnLossTracker, MetricsWithoutLoss, BatchStatistics, Percentages])
def test_the_models_own_metrics_decide_the_logs_as_in_keras(model_class):
    def build():
        model = model_class()
        model.compile(keras.optimizers.SGD(0.01), metrics=["mae"])
        return model

    expected, got, reference, model = fit_both(build, arguments=lambda _: dict(
        x=X, y=Y, batch_size=5, epochs=2, validation_data=(X[:7], Y[:7])))
    assert_same_training(expected, got, reference, model)
    assert ("loss" in got.history) == (model_class in (OwnLossTracker, Percentages))
    if model_class is BatchStatistics:
        assert sorted(got.history) == ["largest_error", "smallest", "val_largest_error",
                                       "val_smallest"]
    # evaluate reports by the same rule.
    np.testing.assert_allclose(
        tapeworks.Trainer(model, jit_compile=False).evaluate(X, Y, batch_size=5, verbose=0),
        reference.evaluate(X, Y, batch_size=5, verbose=0), rtol=1e-5)


def endpoint_model():
    class Endpoint(keras.layers.Layer):
        def call(self, targets, predictions):
            self.add_loss(keras.ops.mean(keras.ops.square(targets - predictions)))
            return predictions

    x = keras.Input((3,), name="x")
    t = keras.Input((1,), name="t")
    out = Endpoint()(t, keras.layers.Dense(1, kernel_initializer="ones")(x))
    model = keras.Model({"x": x, "t": t}, out)
    model.compile(keras.optimizers.SGD(0.1))
    return model


def test_an_add_loss_model_trains_on_a_dataset_without_targets_as_in_keras():
    def arguments(_):
        dataset = tf.data.Dataset.from_tensor_slices({"x": X, "t": Y}).batch(6)
        return dict(x=dataset, epochs=2)

    assert_same_training(*fit_both(endpoint_model, arguments=arguments))


def two_heads():
    x = keras.Input((3,))
    hidden = keras.layers.Dense(4, kernel_initializer=keras.initializers.Constant(0.1))(x)
    value = keras.layers.Dense(1, name="value", kernel_initializer="ones")(hidden)
    label = keras.layers.Dense(2, name="label", kernel_initializer="ones")(hidden)
    aside = keras.layers.Dense(1, name="aside", kernel_initializer="zeros")(hidden)
    model = keras.Model(x, {"value": value, "label": label, "aside": aside})
    # "aside" has no loss: Keras trains the other two heads and ignores it.
    model.compile(keras.optimizers.SGD(0.05),
                  loss={"value": "mse",
                        "label": keras.losses.SparseCategoricalCrossentropy(from_logits=True)},
                  loss_weights={"value": 1.0, "label": 0.5})
    return model


def test_several_outputs_with_a_loss_dict_and_one_output_without_a_loss():
    assert_same_training(*fit_both(two_heads, arguments=lambda _: dict(
        x=X, y={"value": Y, "label": LABELS}, batch_size=6, epochs=2)))


def regression():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, kernel_initializer="ones")])
    model.compile(keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    return model


class Batches(keras.utils.PyDataset):
    def __init__(self):
        super().__init__()

    def __len__(self):
        return 4

    def __getitem__(self, index):
        part = slice(index * 6, (index + 1) * 6)
        return X[part], Y[part]


def test_a_py_dataset_trains_as_in_keras():
    assert_same_training(*fit_both(regression, arguments=lambda _: dict(x=Batches(), epochs=2)))


def test_a_generator_trains_as_in_keras():
    def batches():
        for start in range(0, 24, 6):
            yield X[start:start + 6], Y[start:start + 6]

    # One pass each: a generator is read once (as in Keras).
    assert_same_training(*fit_both(regression, arguments=lambda _: dict(
        x=batches(), epochs=1)))


def test_an_endless_generator_object_validates_every_epoch_going_on_where_it_stopped():
    # Keras reads validation_data's generator on from where the last epoch
    # stopped. tapeworks validated the first epoch only: the generator was
    # closed when that pass ended, and later epochs had no val_loss.
    x_val, y_val = X[:20], Y[:20]
    drawn = []

    def endless():
        while True:
            for start in range(0, 20, 5):
                drawn.append(start)
                yield x_val[start:start + 5], y_val[start:start + 5]

    class ValueAtEpochEnd(keras.callbacks.Callback):
        expected = []

        def on_epoch_end(self, epoch, logs=None):
            # 4 batches of 5 cover the 20 rows once, in whatever order: their mean.
            kernel, bias = (w.numpy() for w in self.model.weights)
            self.expected.append(float(np.mean((x_val @ kernel + bias - y_val) ** 2)))

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((X.shape[1],)), keras.layers.Dense(1)])
    history = tapeworks.Trainer(model, "sgd", "mse", jit_compile=False).fit(
        X, Y, batch_size=8, epochs=3, shuffle=False, verbose=0, validation_data=endless(),
        validation_steps=4, callbacks=[ValueAtEpochEnd()])
    np.testing.assert_allclose(history.history["val_loss"], ValueAtEpochEnd.expected,
                               rtol=1e-5)
    assert len(drawn) >= 12


def test_a_dict_of_features_with_a_key_that_names_no_input_trains_as_keras_reads_it():
    # The preprocessing-layers tutorial's dataset also carries its target
    # column; Keras reads a dict by the inputs' names and leaves that key out.
    # Inputs declared in an order other than the keys' sorted one, of other
    # widths, so a positional comparison would refuse them.
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    wide, narrow = keras.Input((3,), name="wide"), keras.Input((1,), name="age")
    # A list of named inputs: Keras reads a dict by those names. (A model
    # built on a dict of inputs flattens a received dict by its sorted keys,
    # an extra key included: Keras refuses or misreads that one itself.)
    model = keras.Model([wide, narrow],
                        keras.layers.Dense(1)(keras.layers.Concatenate()([wide, narrow])))
    rng = np.random.default_rng(0)
    features = {"wide": rng.normal(size=(32, 3)).astype("float32"),
                "age": rng.normal(size=(32, 1)).astype("float32"),
                "target": rng.normal(size=(32, 1)).astype("float32")}
    y = features["wide"].sum(axis=1, keepdims=True)
    data = tf.data.Dataset.from_tensor_slices((features, y)).batch(8)
    trainer = tapeworks.Trainer(model, "sgd", "mse", jit_compile=False, steps_per_call=2)
    history = trainer.fit(data, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2


def test_a_model_built_under_keras_mixed_float16_policy_keeps_keras_history_keys():
    # Keras' mixed precision guide: the global policy, a float32 output layer,
    # and fit (Keras wraps the optimizer in a LossScaleOptimizer, which logs
    # nothing). tapeworks scales the loss itself and keeps its figures aside.
    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((3,))
        hidden = keras.layers.Dense(4, activation="relu")(inputs)
        outputs = keras.layers.Activation("linear", dtype="float32")(
            keras.layers.Dense(1)(hidden))
        model = keras.Model(inputs, outputs)
        model.compile(keras.optimizers.SGD(0.05), "mse")
        return model

    before = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        expected, got, reference, model = fit_both(
            build, lambda m: dict(x=X, y=Y, batch_size=8, epochs=2))
    finally:
        keras.mixed_precision.set_global_policy(before)
    assert model.layers[1].compute_dtype == "float16"
    assert sorted(got.history) == sorted(expected.history) == ["loss"]
    np.testing.assert_allclose(got.history["loss"], expected.history["loss"], rtol=1e-3)


class _EndpointLoss(keras.layers.Layer):
    """An `add_loss` endpoint: the model's only loss, so it is fitted on x alone."""

    def call(self, inputs, prediction):
        self.add_loss(keras.ops.mean(keras.ops.square(inputs[:, :1] - prediction)))
        return prediction


def test_validation_split_of_x_alone_for_an_add_loss_model_validates_as_keras():
    # It was refused: the split's (x_val, None, None) was read as a
    # `validation_data` tuple of 3 items.
    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((X.shape[1],))
        model = keras.Model(inputs, _EndpointLoss()(inputs, keras.layers.Dense(1)(inputs)))
        model.compile("sgd", loss=None)
        return model

    reference, model = build(), build()
    arguments = dict(batch_size=8, epochs=2, shuffle=False, verbose=0, validation_split=0.25)
    expected = reference.fit(X, **arguments)
    history = tapeworks.Trainer(model, jit_compile=False).fit(X, **arguments)
    assert sorted(history.history) == sorted(expected.history) == ["loss", "val_loss"]
    for key, values in expected.history.items():
        np.testing.assert_allclose(history.history[key], values, rtol=1e-5, err_msg=key)


class _Rotating(keras.utils.PyDataset):
    """A PyDataset whose `on_epoch_end` rotates the order of its batches."""

    def __init__(self):
        super().__init__()
        self.order, self.ends = list(range(4)), 0

    def __len__(self):
        return 4

    def __getitem__(self, index):
        start = self.order[index] * 6
        return X[start:start + 6], Y[start:start + 6]

    def on_epoch_end(self):
        self.ends += 1
        self.order = self.order[1:] + self.order[:1]


def test_a_py_datasets_on_epoch_end_runs_before_the_first_epoch_as_in_keras():
    # Keras' fit and evaluate reset their epoch iterator first, which calls it.
    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((X.shape[1],)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        return model

    reference, model = build(), build()
    keras_data, tapeworks_data = _Rotating(), _Rotating()
    expected = reference.fit(keras_data, epochs=3, verbose=0, shuffle=False)
    trainer = tapeworks.Trainer(model, jit_compile=False)
    history = trainer.fit(tapeworks_data, epochs=3, verbose=0, shuffle=False)
    assert tapeworks_data.ends == keras_data.ends == 4
    np.testing.assert_allclose(history.history["loss"], expected.history["loss"], rtol=1e-5)
    reference.evaluate(keras_data, verbose=0)
    trainer.evaluate(tapeworks_data, verbose=0)
    assert tapeworks_data.ends == keras_data.ends
    # As validation_data too: Keras resets it before each pass.
    keras_validation, tapeworks_validation = _Rotating(), _Rotating()
    reference.fit(X, Y, epochs=2, verbose=0, validation_data=keras_validation)
    trainer.fit(X, Y, epochs=2, verbose=0, validation_data=tapeworks_validation)
    assert tapeworks_validation.ends == keras_validation.ends
