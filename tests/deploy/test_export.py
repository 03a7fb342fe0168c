"""`tapeworks.deploy.export`: verified artefacts in a fresh process, and clear refusals.

Each export loads its artefact in a fresh Python process (the verification),
so the round-trip tests are marked multiprocess.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tapeworks import ConfigError
from tapeworks.deploy import ExportError, export
from tests.deploy import custom_layers


def sequential():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,), name="features"),
                             keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])


def two_inputs():
    keras.utils.set_random_seed(0)
    a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
    joined = keras.layers.Concatenate()([a, b])
    return keras.Model([a, b], [keras.layers.Dense(2, name="score")(joined),
                                keras.layers.Dense(1, name="value")(a)])


def served(path, **inputs):
    signature = tf.saved_model.load(path).signatures["serving_default"]
    return {k: v.numpy() for k, v in signature(**{k: tf.constant(v) for k, v in inputs.items()})
            .items()}


@pytest.mark.multiprocess
def test_a_sequential_and_a_two_input_model_round_trip_in_both_formats(tmp_path):
    x = np.random.default_rng(0).standard_normal((5, 4)).astype("float32")
    model = sequential()
    report = export(model, tmp_path / "seq",
                    signatures={"probabilities": lambda t: tf.nn.softmax(model(t))})
    assert report.verified_in == "a fresh process"
    assert (report.inputs, report.outputs, report.batch_size) == (["features"], ["output_0"], 32)
    assert report.signatures == ["serving_default", "probabilities"]
    assert "signature/probabilities/output_0" in report.max_difference
    probabilities = tf.saved_model.load(str(tmp_path / "seq")).signatures["probabilities"]
    np.testing.assert_allclose(probabilities(features=tf.constant(x))["output_0"],
                               tf.nn.softmax(model(x)), rtol=1e-5, atol=1e-6)
    assert report.size_bytes > 0 and report.load_seconds > 0 and report.batch_seconds > 0
    np.testing.assert_allclose(served(str(tmp_path / "seq"), features=x)["output_0"],
                               model(x), rtol=1e-5, atol=1e-6)

    model = two_inputs()
    a = np.ones((2, 3), "float32")
    b = np.full((2, 2), 2.0, "float32")
    report = export(model, tmp_path / "two")
    assert (report.inputs, report.outputs) == (["a", "b"], ["score", "value"])
    outputs = served(str(tmp_path / "two"), a=a, b=b)
    expected = model([a, b])
    np.testing.assert_allclose(outputs["score"], expected[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outputs["value"], expected[1], rtol=1e-5, atol=1e-6)
    assert export(model, tmp_path / "two.keras", format="keras").outputs == ["score", "value"]
    loaded = keras.saving.load_model(tmp_path / "two.keras", safe_mode=True)
    for got, want in zip(loaded([a, b]), expected):
        np.testing.assert_array_equal(got, want)


@pytest.mark.multiprocess
def test_a_subclassed_model_with_a_registered_custom_layer(tmp_path):
    model = custom_layers.TwoLayerNet()
    sample = np.random.default_rng(1).standard_normal((6, 3)).astype("float32")
    model(sample)
    with pytest.raises(ConfigError, match="no fixed inputs"):
        export(model, tmp_path / "no-sample")
    # (As a SavedModel it is a traced graph like any other: the round trips above.)
    report = export(model, tmp_path / "net.keras", format="keras", sample=sample)
    # Loaded without custom_objects= in a process that imported only the
    # classes' module (their registration).
    assert report.verified_in == "a fresh process"
    assert report.batch_size == 6 and max(report.max_difference.values()) <= 1e-5


@pytest.mark.multiprocess
def test_preprocessing_inside_the_signature_equals_preprocessing_outside(tmp_path):
    raw = np.random.default_rng(2).integers(0, 255, (16, 4)).astype("float32")
    normalization = keras.layers.Normalization()
    normalization.adapt(raw)
    model = sequential()
    expected = model(normalization(raw))
    # A function of TensorFlow ops is traced the same way as the layer here.
    export(model, tmp_path / "with-fn", preprocessing=lambda t: normalization(t), sample=raw)
    np.testing.assert_allclose(served(str(tmp_path / "with-fn"), features=raw)["output_0"],
                               expected, rtol=1e-5, atol=1e-5)
    export(model, tmp_path / "pre.keras", format="keras", preprocessing=normalization,
           sample=raw)
    loaded = keras.saving.load_model(tmp_path / "pre.keras", safe_mode=True)
    np.testing.assert_allclose(loaded(raw), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.multiprocess
def test_an_artefact_that_differs_from_the_model_leaves_nothing_and_keeps_the_old_one(tmp_path):
    keras.utils.set_random_seed(0)
    good = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    forgetful = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2),
                                  custom_layers.ForgetfulScale(3.0)])
    path = tmp_path / "model.keras"
    export(good, path, format="keras")
    before = path.read_bytes()
    with pytest.raises(ExportError, match="differs by up to .*get_config"):
        export(forgetful, path, format="keras", overwrite=True)
    assert path.read_bytes() == before                       # the old one, untouched
    assert sorted(os.listdir(tmp_path)) == ["model.keras"]   # no partial left
    # overwrite=True replaces it once the new artefact is verified.
    export(good, path, format="keras", overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["model.keras"]


def test_bad_input_is_refused_before_anything_is_written(tmp_path):
    model = sequential()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    cases = [
        (dict(path=tmp_path / "taken"), "already exists.*overwrite=True"),
        (dict(path=tmp_path / "m", format="onnx"), "must be one of 'saved_model', 'keras'"),
        (dict(path=tmp_path / "m.h5", format="keras"), "must end in \".keras\""),
        (dict(path=tmp_path / "m", preprocessing=keras.layers.Rescaling(0.5)),
         "`preprocessing` needs `sample`"),
        (dict(path=tmp_path / "m.keras", format="keras", preprocessing=lambda t: t,
              sample=np.zeros((2, 4), "float32")), "not a Python function"),
        (dict(path=tmp_path / "m.keras", format="keras", signatures={"p": lambda t: t}),
         "Extra `signatures` are a SavedModel's"),
        (dict(path=tmp_path / "m", signatures={"serving_default": lambda t: t}),
         "`signatures` must map names"),
    ]
    for arguments, message in cases:
        with pytest.raises(ConfigError, match=message):
            export(model, **arguments)
    lambda_model = keras.Sequential([keras.Input((4,)), keras.layers.Lambda(lambda t: t * 2)])
    with pytest.raises(ConfigError, match="Lambda layer.*safe_mode=False.*register_keras_ser"):
        export(lambda_model, tmp_path / "lambda.keras", format="keras")
    unregistered = keras.Sequential([keras.Input((4,)), custom_layers.Unregistered()])
    with pytest.raises(ConfigError, match=r"custom_layers\.Unregistered .* is not registered"):
        export(unregistered, tmp_path / "u.keras", format="keras")
    dynamic = keras.Sequential([keras.Input((None, 3), name="sequence"),
                                keras.layers.GlobalAveragePooling1D()])
    with pytest.raises(ConfigError, match=r"'sequence' has shape \(None, None, 3\).*sample="):
        export(dynamic, tmp_path / "dynamic")
    assert sorted(os.listdir(tmp_path)) == ["taken"]
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"


def digits_classifier():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x, y = (x / 16.0).astype("float32"), y.astype("int32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,), name="pixels"),
                              keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    model.compile(keras.optimizers.Adam(1e-2),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x[:1400], y[:1400], epochs=5, batch_size=64, verbose=0)
    return model, x, y


@pytest.mark.multiprocess
def test_litert_float32_and_full_int8_are_verified_with_the_task_metric(tmp_path):
    from ai_edge_litert.interpreter import Interpreter

    model, x, y = digits_classifier()
    reports = {}
    for quantize in (None, "int8"):
        path = tmp_path / f"digits-{quantize}.tflite"
        reports[quantize] = export(
            model, path, format="tflite", quantize=quantize, sample=x[:32],
            representative_data=tf.data.Dataset.from_tensor_slices((x[:256], y[:256])).batch(32)
            if quantize else None, validation_data=(x[1400:], y[1400:]))
        runner = Interpreter(model_path=str(path)).get_signature_runner("serving_default")
        got = runner(pixels=x[1400:1408])["output_0"]
        bound = 1e-5 if quantize is None else 0.1 * float(np.ptp(model(x[1400:1408])))
        assert np.max(np.abs(got - model(x[1400:1408]))) <= bound + 1e-4 * np.abs(got).max()
    floating, integer = reports[None], reports["int8"]
    assert floating.metric["name"] == "accuracy"
    assert floating.metric["model"] == floating.metric["artefact"] == integer.metric["model"]
    # The held-out accuracy, measured: within a point after int8 quantisation.
    assert abs(integer.metric["artefact"] - integer.metric["model"]) <= 0.01
    # 2,378 weights: 9.3 KiB in float32, a quarter in int8, plus the file's
    # fixed overhead (measured: 11,164 bytes against 5,624).
    assert integer.size_bytes < 0.6 * floating.size_bytes
    assert "int8" in str(integer) and "accuracy" in str(integer)
    # Quantised as a whole: nothing needed keeping in float.
    assert integer.kept_float == [] and integer.metric["tolerance"] == "at most 1 point of " \
        "accuracy lost"


def test_an_op_litert_cannot_convert_is_named_and_nothing_is_written(tmp_path):
    class Singular(keras.layers.Layer):
        def call(self, x):
            return tf.linalg.svd(tf.reshape(x, (-1, 2, 2)), compute_uv=False)

    model = keras.Sequential([keras.Input((4,), name="f"), Singular()])
    with pytest.raises(ConfigError, match="LiteRT cannot convert op.*Svd.*SELECT_TF_OPS"):
        export(model, tmp_path / "m.tflite", format="tflite")
    with pytest.raises(ConfigError, match="needs `representative_data`"):
        export(sequential(), tmp_path / "q.tflite", format="tflite", quantize="int8")
    with pytest.raises(ConfigError, match="with format=\"tflite\""):
        export(sequential(), tmp_path / "q", quantize="float16")
    with pytest.raises(ConfigError, match="must end in \".tflite\""):
        export(sequential(), tmp_path / "q.lite", format="tflite")
    assert os.listdir(tmp_path) == []
