"""Data mistakes get a tapeworks error naming the problem and the fix, before any weight changes."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tapeworks
from tapeworks import ConfigError, DataSpecError

X = np.random.default_rng(0).normal(size=(20, 4)).astype("float32")
LABELS = np.arange(20) % 3


def classifier(loss="sparse_categorical_crossentropy", units=3):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(units)])
    model.compile("sgd", loss)
    return model


def raises_and_keeps_weights(model, error, match, call):
    trainer = tapeworks.Trainer(model, jit_compile=False)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(error, match=match):
        call(trainer)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_string_labels():
    raises_and_keeps_weights(classifier(), DataSpecError, "dtype str.*np.unique",
                             lambda t: t.fit(X, np.array(["a", "b"] * 10), verbose=0))


def test_class_ids_out_of_range_for_a_sparse_loss():
    raises_and_keeps_weights(classifier(), DataSpecError, "from 0 to 7.*3 classes",
                             lambda t: t.fit(X, np.arange(20) % 8, verbose=0))


def test_non_integer_class_ids():
    raises_and_keeps_weights(classifier(), DataSpecError, "non-integer",
                             lambda t: t.fit(X, LABELS + 0.5, verbose=0))


def test_one_hot_labels_with_a_sparse_loss():
    onehot = keras.utils.to_categorical(LABELS, 3)
    raises_and_keeps_weights(classifier(), DataSpecError, "look one-hot.*categorical_crossentropy",
                             lambda t: t.fit(X, onehot, verbose=0))


def test_class_ids_with_a_dense_loss():
    raises_and_keeps_weights(classifier("categorical_crossentropy"), DataSpecError,
                             "one value per sample.*to_categorical",
                             lambda t: t.fit(X, LABELS, verbose=0))
    # mse would broadcast (20,) labels against (20, 3) outputs silently.
    raises_and_keeps_weights(classifier("mse"), DataSpecError, "broadcast",
                             lambda t: t.fit(X, LABELS.astype("float32"), verbose=0))


def test_labels_of_the_wrong_width():
    raises_and_keeps_weights(classifier("categorical_crossentropy"), DataSpecError,
                             "4 values|3 values per sample",
                             lambda t: t.fit(X, np.zeros((20, 4), "float32"), verbose=0))


def test_a_custom_loss_is_not_second_guessed():
    def custom(y_true, y_pred):
        return tf.reduce_mean(tf.square(y_pred - tf.cast(y_true[:, None], y_pred.dtype)))

    model = classifier(custom)
    history = tapeworks.Trainer(model, jit_compile=False).fit(X, LABELS, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_labels_in_a_dataset_are_checked_by_spec():
    dataset = tf.data.Dataset.from_tensor_slices((X, np.array(["a", "b"] * 10))).batch(4)
    raises_and_keeps_weights(classifier(), DataSpecError, "labels in `x`.*dtype string",
                             lambda t: t.fit(dataset, verbose=0))


def test_empty_arrays():
    raises_and_keeps_weights(classifier(), DataSpecError, "0 samples",
                             lambda t: t.fit(X[:0], LABELS[:0], verbose=0))


def test_a_pipeline_that_filters_out_everything():
    dataset = tf.data.Dataset.from_tensor_slices((X, LABELS)).filter(
        lambda x, y: y > 10).batch(4)
    raises_and_keeps_weights(classifier(), DataSpecError, "yielded no element.*filter",
                             lambda t: t.fit(dataset, verbose=0))


def test_unbatched_dataset_gets_the_batch_hint():
    dataset = tf.data.Dataset.from_tensor_slices((X, LABELS)).prefetch(2)
    raises_and_keeps_weights(classifier(), DataSpecError, r"forget `\.batch",
                             lambda t: t.fit(dataset, verbose=0))


def test_predict_on_one_sample_names_the_shape_passed():
    raises_and_keeps_weights(classifier(), DataSpecError, r"shape \(4,\).*x\[None\]",
                             lambda t: t.predict(X[0], verbose=0))


def test_arrays_of_the_wrong_width_name_the_shape_passed():
    raises_and_keeps_weights(classifier(), DataSpecError, r"shape \(20, 5\).*size 5 on axis 1",
                             lambda t: t.fit(np.zeros((20, 5), "float32"), LABELS, verbose=0))


def three_named_inputs():
    """The ticket model of Keras' functional API guide: inputs declared title, body, tags."""
    title = keras.Input((4,), name="title")
    body = keras.Input((6,), name="body")
    tags = keras.Input((12,), name="tags")
    joined = keras.layers.Concatenate()([title, body, tags])
    model = keras.Model([title, body, tags], keras.layers.Dense(1)(joined))
    model.compile("sgd", "mse")
    return model


def test_a_dict_of_arrays_is_matched_to_the_inputs_by_name():
    # Sorted keys (body, tags, title) are not the declared order: Keras reads by name.
    x = {"title": np.ones((8, 4), "float32"), "body": np.ones((8, 6), "float32"),
         "tags": np.ones((8, 12), "float32")}
    trainer = tapeworks.Trainer(three_named_inputs(), jit_compile=False)
    history = trainer.fit(x, np.ones((8, 1), "float32"), batch_size=4, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    # A wrong width is named by the input's name.
    raises_and_keeps_weights(
        three_named_inputs(), DataSpecError, r"Input `tags` of `x` has shape \(8, 10\)",
        lambda t: t.fit(dict(x, tags=np.ones((8, 10), "float32")), np.ones((8, 1), "float32"),
                        verbose=0))


def test_features_without_the_inputs_last_axis_of_one_are_fed_as_keras_feeds_them():
    # Keras' structured-data example: a CSV's columns, each of shape (batch,), for
    # Inputs of shape (1,); Keras expands the last axis, and so is it checked.
    age, thal = keras.Input((1,), name="age"), keras.Input((1,), name="thal")
    model = keras.Model([age, thal], keras.layers.Dense(1)(
        keras.layers.Concatenate()([age, thal])))
    model.compile("sgd", "mse")
    columns = {"age": np.arange(8, dtype="float32"), "thal": np.ones(8, "float32")}
    dataset = tf.data.Dataset.from_tensor_slices((columns, np.ones(8, "float32"))).batch(4)
    trainer = tapeworks.Trainer(model, jit_compile=False)
    assert np.isfinite(trainer.fit(dataset, verbose=0).history["loss"][0])
    assert np.isfinite(trainer.fit(columns, np.ones(8, "float32"), batch_size=4,
                                   verbose=0).history["loss"][0])
    # Two axes short is still refused, by the input's name.
    with pytest.raises(DataSpecError, match="Input `age` of `x` does not fit"):
        tapeworks.Trainer(keras.Model(age, keras.layers.Dense(1)(age)), "sgd", "mse").fit(
            tf.data.Dataset.from_tensor_slices(({"age": np.ones((8, 1, 1, 1), "float32")},
                                                np.ones(8))).batch(4), verbose=0)


def test_a_generator_object_for_several_epochs_is_refused_before_training():
    def batches():
        for start in range(0, 20, 4):
            yield X[start:start + 4], LABELS[start:start + 4]

    raises_and_keeps_weights(classifier(), DataSpecError, "read only once.*generator \\*function",
                             lambda t: t.fit(batches(), epochs=2, verbose=0))
    # One epoch of it is fine, and a generator function is re-read every epoch.
    model = classifier()
    trainer = tapeworks.Trainer(model, jit_compile=False)
    trainer.fit(batches(), epochs=1, verbose=0)
    assert len(trainer.fit(batches, epochs=2, verbose=0).history["loss"]) == 2


def test_a_positional_epochs_mistake_is_explained():
    # fit(x, y, 32) in Keras' order is batch_size; an array where epochs is
    # expected (the old fit(data, epochs) order) is refused with the fix.
    with pytest.raises(ConfigError, match="by keyword"):
        tapeworks.Trainer(classifier()).fit(X, LABELS, 32, np.arange(3))


def test_validation_split_needs_arrays():
    dataset = tf.data.Dataset.from_tensor_slices((X, LABELS)).batch(4)
    raises_and_keeps_weights(classifier(), ConfigError, "only works with arrays",
                             lambda t: t.fit(dataset, validation_split=0.2, verbose=0))


def test_class_weight_with_sample_weight_is_refused():
    raises_and_keeps_weights(
        classifier(), ConfigError, "both given",
        lambda t: t.fit(X, LABELS, class_weight={0: 2.0}, sample_weight=np.ones(20), verbose=0))


def test_batch_size_with_a_dataset_is_ignored_with_a_warning():
    dataset = tf.data.Dataset.from_tensor_slices((X, LABELS)).batch(4)
    with pytest.warns(tapeworks.CorrectnessWarning, match="batch_size=8. is ignored"):
        tapeworks.Trainer(classifier(), jit_compile=False).fit(dataset, batch_size=8, verbose=0)


def test_arrays_without_targets():
    raises_and_keeps_weights(classifier(), DataSpecError, "without targets.*fit\\(x, y",
                             lambda t: t.fit(X, verbose=0))


def _dataset():
    return tf.data.Dataset.from_tensor_slices((X, LABELS)).batch(4)


def _batches():
    yield X[:4], LABELS[:4]


@pytest.mark.parametrize("call, match", [
    (lambda t: t.evaluate(X, LABELS, steps=0, verbose=0), r"`steps` must be None or an integer"),
    (lambda t: t.fit(X, LABELS, class_weight=[1.0, 2.0], verbose=0), r"must be a dict.*Fix"),
    (lambda t: t.fit(_dataset(), LABELS, verbose=0), r"`y` was given but .* Fix: yield"),
    (lambda t: t.fit(_batches(), class_weight={0: 2.0}, verbose=0), r"not supported for a generator"),
    (lambda t: t.fit("data.csv", verbose=0), r"cannot read: str.*Expected NumPy"),
    (lambda t: t.fit(X, LABELS, shuffle="sometimes", verbose=0), r"`shuffle` must be"),
    (lambda t: t.fit(X, LABELS, validation_data=(X,), verbose=0), r"Expected \(x_val, y_val\)"),
    (lambda t: t.fit(X, LABELS, validation_freq=0, verbose=0), r"`validation_freq` must be"),
])
def test_argument_mistakes_are_explained_before_training(call, match):
    raises_and_keeps_weights(classifier(), ConfigError, match, call)


def test_targets_outside_a_cross_entropys_domain_are_refused_before_any_step():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 4)).astype("float32")
    masks = (rng.random((16, 1)) > 0.5).astype("float32") * 255   # 0/255 masks
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(DataSpecError, match=r"range from 0 to 255.*\[0, 1\].*y / 255"):
        tapeworks.Trainer(model, "adam", "binary_crossentropy", plan_cache=False).fit(
            x, masks, verbose=0)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    # In range, it trains.
    tapeworks.Trainer(model, "adam", "binary_crossentropy", plan_cache=False,
                      jit_compile=False).fit(x, masks / 255, verbose=0)
