"""Checks on the data's values at fit's start (issue 37): a majority class behind accuracy,
validation inputs on another scale, probability targets outside [0, 1] in a pipeline."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from sklearn import datasets, model_selection, preprocessing

from tapeworks import CorrectnessWarning, DataSpecError, Trainer
from tapeworks.engine.checks import value_checks


def features(n, seed=0):
    return np.random.default_rng(seed).random((n, 4)).astype("float32")


def labels(n, positives):
    """n labels, the first `positives` of class 1: a known majority share."""
    return (np.arange(n) < positives).astype("int64")


def classifier(units=1, metrics=("accuracy",), loss="binary_crossentropy"):
    activation = "sigmoid" if units == 1 else "softmax"
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(units, activation=activation)])
    model.compile("adam", loss, metrics=list(metrics))
    return model


def fit_messages(model, x, y=None, epochs=1, **fit):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(model, jit_compile=False).fit(x, y, epochs=epochs, verbose=0, **fit)
    return [str(w.message) for w in caught if issubclass(w.category, CorrectnessWarning)]


def about(found, phrase):
    return [m for m in found if phrase in m]


# A majority class behind accuracy --------------------------------------------------

def test_a_majority_class_with_accuracy_alone_is_named_with_its_share_and_weights():
    found = about(fit_messages(classifier(), features(200), labels(200, 10), batch_size=50),
                  "accuracy is the only metric")
    assert len(found) == 1
    assert "95.0% of the labels `y` are class 0 (190 of 200)" in found[0]
    assert "scores 0.950" in found[0]
    # Balanced weights: 200 / (2 x 190) and 200 / (2 x 10).
    assert "class_weight={0: 0.526, 1: 10}" in found[0]
    assert "keras.metrics.AUC()" in found[0]


@pytest.mark.parametrize("metrics,fit", [
    (("accuracy",), {"class_weight": {0: 1.0, 1: 19.0}}),
    (("accuracy", keras.metrics.AUC()), {}),
    (("accuracy", "recall"), {}),
    ((keras.metrics.Precision(),), {}),
    ((), {}),
    (("accuracy",), {"sample_weight": np.ones(200, "float32")}),
])
def test_no_majority_warning_with_weights_or_a_metric_that_sees_the_rare_class(metrics, fit):
    found = fit_messages(classifier(metrics=metrics), features(200), labels(200, 10),
                         batch_size=50, **fit)
    assert about(found, "accuracy is the only metric") == []


@pytest.mark.parametrize("positives,named", [(100, False), (21, False), (20, True)])
def test_the_majority_threshold_is_ninety_percent(positives, named):
    # 179/200 = 89.5% is below it; 180/200 = 90% is at it.
    found = fit_messages(classifier(), features(200), labels(200, positives), batch_size=50)
    assert bool(about(found, "accuracy is the only metric")) == named


def test_one_hot_labels_of_three_classes_are_counted_by_class():
    ids = np.array([2] * 27 + [0, 1, 1])
    found = about(fit_messages(classifier(3, loss="categorical_crossentropy"), features(30),
                               keras.utils.to_categorical(ids, 3), batch_size=10),
                  "accuracy is the only metric")
    assert len(found) == 1 and "90.0% of the labels `y` are class 2 (27 of 30)" in found[0]
    assert "the other classes" in found[0]


def test_class_counts_refuse_what_is_not_single_label_classes():
    assert value_checks.class_counts(np.array([0, 1, 1, 2])) == {0: 1, 1: 2, 2: 1}
    assert value_checks.class_counts(np.array([[1.0], [0.0], [1.0]])) == {0: 1, 1: 2}
    assert value_checks.class_counts(np.array([0.5, 1.0])) is None            # values
    assert value_checks.class_counts(np.array([[1, 1], [0, 1]])) is None      # multi-label
    assert value_checks.class_counts(np.zeros((2, 4, 4))) is None             # per pixel


def test_an_in_memory_pipeline_is_read_from_its_graph_and_a_mapped_one_is_not():
    x, y = features(200), labels(200, 10)
    sliced = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(200, seed=1).batch(50)
    found = about(fit_messages(classifier(), sliced), "accuracy is the only metric")
    assert len(found) == 1 and "95.0% of the labels in `x` are class 0" in found[0]
    mapped = tf.data.Dataset.from_tensor_slices((x, y)).map(lambda a, b: (a * 2, b)).batch(50)
    assert about(fit_messages(classifier(), mapped), "accuracy is the only metric") == []


def test_reading_a_pipeline_from_its_graph_leaves_its_shuffle_order_alone():
    x, y = features(64), labels(64, 32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64, seed=3).batch(64)
    untouched = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64, seed=3).batch(64)
    Trainer(classifier(), jit_compile=False).fit(dataset, epochs=0, verbose=0)
    np.testing.assert_array_equal(next(iter(dataset))[1], next(iter(untouched))[1])


def test_the_majority_warning_is_given_once_per_trainer():
    trainer = Trainer(classifier(), jit_compile=False)
    x, y = features(200), labels(200, 10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(x, y, epochs=1, batch_size=50, verbose=0)
        trainer.fit(x, y, epochs=1, batch_size=50, verbose=0)
    assert len([w for w in caught if "accuracy is the only metric" in str(w.message)]) == 1


# Validation inputs on another scale ---------------------------------------------------

def test_raw_validation_inputs_against_scaled_training_inputs_are_named():
    pixels = np.random.default_rng(0).integers(0, 256, (200, 4)).astype("float32")
    y = labels(200, 100)
    found = about(fit_messages(classifier(), pixels / 255.0, y, batch_size=50,
                               validation_data=(pixels, y)), "prepared differently")
    assert len(found) == 1
    assert "255x as wide" in found[0] and "`validation_data`" in found[0]
    assert "x_val / 255.0" in found[0]


def test_validation_inputs_moved_far_from_the_training_inputs_are_named():
    x, y = features(200), labels(200, 100)
    found = about(fit_messages(classifier(), x, y, batch_size=50,
                               validation_data=(x[:100] + 100.0, y[:100])),
                  "prepared differently")
    assert len(found) == 1 and "training spreads away" in found[0]


def test_a_validation_pipeline_in_memory_is_compared_too():
    pixels = np.random.default_rng(0).integers(0, 256, (200, 4)).astype("float32")
    y = labels(200, 100)
    validation = tf.data.Dataset.from_tensor_slices((pixels, y)).batch(50)
    found = fit_messages(classifier(), pixels / 255.0, y, batch_size=50,
                         validation_data=validation)
    assert len(about(found, "255x as wide")) == 1


def sklearn_splits():
    for load in (datasets.load_digits, datasets.load_breast_cancer, datasets.load_wine):
        x, y = load(return_X_y=True)
        x = x.astype("float32")
        cut = int(0.8 * len(x))
        order = np.argsort(y, kind="stable")
        parts = [model_selection.train_test_split(x, y, test_size=0.2, random_state=seed)[:2]
                 for seed in range(3)]
        parts += [(x[:cut], x[cut:]), (x[order][:cut], x[order][cut:])]
        for train, validation in parts:
            yield load.__name__, train, validation
            scaler = preprocessing.StandardScaler().fit(train)
            yield load.__name__, scaler.transform(train), scaler.transform(validation)


def test_ordinary_splits_of_one_data_set_are_not_named():
    for name, train, validation in sklearn_splits():
        message = value_checks.scale_message(value_checks.Values(x=[train]),
                                             value_checks.Values(x=[validation]), "`x`", "v")
        assert message is None, (name, message)


def test_the_same_splits_with_raw_validation_inputs_are_named():
    named = 0
    for name, train, validation in sklearn_splits():
        if train.min() < 0:   # the standardised copies: compare them with the raw inputs
            continue
        scaled = train / train.max()
        named += value_checks.scale_message(value_checks.Values(x=[scaled]),
                                            value_checks.Values(x=[validation]),
                                            "`x`", "v") is not None
    assert named == 15   # 3 data sets x 5 splits


def test_a_validation_split_of_the_same_arrays_is_not_compared():
    pixels = np.random.default_rng(0).integers(0, 256, (200, 4)).astype("float32")
    found = fit_messages(classifier(), pixels, labels(200, 100), batch_size=50,
                         validation_split=0.2)
    assert about(found, "prepared differently") == []


# Probability targets in a pipeline ------------------------------------------------------

def test_masks_of_0_and_255_in_an_in_memory_pipeline_are_refused_before_training():
    x = features(64)
    masks = np.where(x[:, :1] > 0.5, 255.0, 0.0).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, masks)).batch(16)
    model = classifier(metrics=())
    before = [w.numpy() for w in model.weights]
    with pytest.raises(DataSpecError, match=r"range from 0 to 255.*`y / 255`"):
        Trainer(model, jit_compile=False).fit(dataset, epochs=1, verbose=0)
    for was, now in zip(before, model.weights):
        np.testing.assert_array_equal(was, now.numpy())
    # The same masks in [0, 1] train.
    Trainer(classifier(metrics=()), jit_compile=False).fit(
        tf.data.Dataset.from_tensor_slices((x, masks / 255.0)).batch(16), epochs=1, verbose=0)


# In `explain` ------------------------------------------------------------------------

def test_explain_lists_what_the_fits_found_in_the_data():
    trainer = Trainer(classifier(), jit_compile=False)
    x, y = features(200), labels(200, 10)
    quiet = Trainer(classifier(), jit_compile=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(x, y, epochs=1, batch_size=50, verbose=0)
        quiet.fit(x, labels(200, 100), epochs=1, batch_size=50, verbose=0)
    explanation = trainer.explain((x, y), steps=2, batch_size=50, try_xla=False)
    assert len(explanation.correctness) == 1
    assert "accuracy is the only metric" in explanation.correctness[0]
    assert "Found while fitting" in str(explanation)
    assert "95.0% of the labels `y`" in str(explanation)
    assert quiet.explain((x, y), steps=2, batch_size=50, try_xla=False).correctness == []


def masks_pipeline(scale):
    """Masks read through a map (not in memory: nothing is read before training)."""
    x = features(128)
    masks = np.where(x[:, :1] > 0.5, 255.0, 0.0).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, masks)).map(
        lambda a, b: (a, b / scale)).batch(16)


def mask_model(regularised=False):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(
        1, activation="sigmoid", kernel_regularizer="l2" if regularised else None)])
    model.compile(keras.optimizers.Adam(0.1), "binary_crossentropy")
    return model


def test_a_cross_entropy_below_zero_after_an_epoch_names_targets_outside_0_1():
    keras.utils.set_random_seed(0)
    trainer = Trainer(mask_model(), jit_compile=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(masks_pipeline(1.0), epochs=4, verbose=0)
    found = about([str(w.message) for w in caught], "below 0")
    assert len(found) == 1   # once, at the first epoch whose mean is below 0
    assert "over epoch" in found[0] and "labels in `x` hold values outside [0, 1]" in found[0]
    assert "y / 255" in found[0]
    # Kept with the data's findings, which `explain` lists.
    # The warning ends with its pointer to the guide; explain lists the finding itself.
    assert [f"{text} (see docs: warnings#negative-cross-entropy)"
            for text in trainer.data_stage.value_findings.values()] == [found[0]]


@pytest.mark.parametrize("scale,regularised", [(255.0, False), (1.0, True)])
def test_no_negative_loss_warning_for_targets_in_0_1_or_a_regularised_model(scale, regularised):
    keras.utils.set_random_seed(0)
    assert about(fit_messages(mask_model(regularised), masks_pipeline(scale), epochs=4),
                 "below 0") == []


def test_pipelines_of_ragged_or_sparse_tensors_are_not_read_and_still_train():
    ragged = tf.ragged.constant([[1.0], [2.0, 3.0], [4.0], [5.0, 6.0]])
    sliced = tf.data.Dataset.from_tensor_slices((ragged, np.array([0, 1, 0, 1])))
    assert value_checks.Values.of_elements(sliced.element_spec, [None, None, None]) is None
    sparse = tf.sparse.from_dense(np.eye(4, dtype="float32"))
    dataset = tf.data.Dataset.from_tensor_slices((sparse, np.arange(4.0)[:, None])).batch(2)
    model = keras.Sequential([keras.Input((4,), sparse=True), keras.layers.Dense(1)])
    Trainer(model, "sgd", "mse", jit_compile=False).fit(dataset, epochs=1, verbose=0)
