"""The raw inputs of an artefact with `preprocessing=`: read where fixed, asked for where not."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tapeworks import ConfigError
from tapeworks.deploy import export
from tapeworks.deploy.inputs import raw_specs


def model_on(width, name="features"):
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((width,), name=name), keras.layers.Dense(2)])


def test_a_built_layer_gives_the_raw_input_its_shape_dtype_and_the_models_input_name():
    normalisation = keras.layers.Normalization()
    normalisation.adapt(np.arange(40, dtype="float32").reshape(10, 4))
    assert raw_specs(model_on(4), normalisation) == [("features", (None, 4),
                                                      np.dtype("float32"))]


def test_a_sequential_built_by_a_call_gives_the_models_input_name_and_any_batch():
    preprocessing = keras.Sequential([keras.layers.Rescaling(1 / 16)])
    preprocessing(np.zeros((2, 4), "float32"))
    assert raw_specs(model_on(4), preprocessing) == [("features", (None, 4),
                                                      np.dtype("float32"))]


def test_a_functional_model_gives_each_raw_input():
    pixels = keras.Input((8, 8, 1), name="pixels")
    counts = keras.Input((3,), dtype="int32", name="counts")
    joined = keras.layers.Concatenate()([keras.layers.Flatten()(keras.layers.Rescaling(
        1 / 255)(pixels)), keras.layers.CategoryEncoding(4, output_mode="multi_hot")(counts)])
    preprocessing = keras.Model([pixels, counts], joined)
    assert raw_specs(model_on(68), preprocessing) == [
        ("pixels", (None, 8, 8, 1), np.dtype("float32")),
        ("counts", (None, 3), np.dtype("int32"))]


def test_a_function_or_an_unbuilt_layer_is_refused_naming_what_is_missing(tmp_path):
    with pytest.raises(ConfigError, match=r"`preprocessing` needs `sample`: a function \(a "
                                          r"Python function\).*raw input 'features'.*"
                                          r"sample=<a few raw examples>"):
        export(model_on(4), tmp_path / "m", preprocessing=lambda t: t / 255.0)
    with pytest.raises(ConfigError, match=r"the layer 'halve' \(Rescaling\) is not built "
                                          r"\(on one input\).*raw input 'features'.*sample="):
        export(model_on(4), tmp_path / "m",
               preprocessing=keras.layers.Rescaling(0.5, name="halve"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.multiprocess
def test_a_saved_model_with_an_adapted_normalisation_needs_no_sample(tmp_path):
    raw = np.random.default_rng(2).integers(0, 255, (16, 4)).astype("float32")
    normalisation = keras.layers.Normalization()
    normalisation.adapt(raw)
    model = model_on(4)
    report = export(model, tmp_path / "m", preprocessing=normalisation)
    assert report.inputs == ["features"] and report.verified_in == "a fresh process"
    serve = tf.saved_model.load(str(tmp_path / "m")).signatures["serving_default"]
    assert serve.structured_input_signature[1]["features"].shape.as_list() == [None, 4]
    np.testing.assert_allclose(serve(features=tf.constant(raw))["output_0"],
                               model(normalisation(raw)), rtol=1e-5, atol=1e-5)
