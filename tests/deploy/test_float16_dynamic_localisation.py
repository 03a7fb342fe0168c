"""A float16 or dynamic-range model that fails its verification: where it departs, named.

Neither has the int8 calibration TensorFlow's QuantizationDebugger measures,
so each layer's output in the quantised LiteRT model is compared with the
float32 LiteRT model's (`litert.activation_drift`). The broken models are
built, not trained.
"""

import keras
import numpy as np
import pytest

from tapeworks.deploy import ExportError, export


def three_layers(middle=32, classes=10):
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((64,), name="x"),
                             keras.layers.Dense(64, activation="relu", name="first"),
                             keras.layers.Dense(middle, activation="relu", name="breaks"),
                             keras.layers.Dense(classes, name="head")])


def listed_layers(message):
    """The layer names of the refusal's list, in its order."""
    return [line.strip()[2:].split(":")[0].split(",")[0]
            for line in message.splitlines() if line.startswith("  - ")]


def test_a_weight_beyond_float16s_range_is_named_with_its_layer(tmp_path):
    model = three_layers()
    kernel = model.get_layer("breaks").kernel.numpy()
    kernel[0, 0] = 1e5                  # float16 holds at most 65,504
    model.get_layer("breaks").kernel.assign(kernel)
    with pytest.raises(ExportError) as raised:
        export(model, tmp_path / "m.tflite", format="tflite", quantize="float16")
    message = raised.value.message
    assert "Where it departs from the float32 model" in message
    # Only the layer that adds the departure; the head downstream inherits it.
    assert listed_layers(message) == ["breaks"]
    assert "beyond float16's range (65,504)" in message
    assert not (tmp_path / "m.tflite").exists()


def test_input_features_of_very_different_scales_name_the_first_layer_for_dynamic(tmp_path):
    # Dynamic-range kernels quantise each layer's inputs to int8 as they
    # run: feature 0 a thousand times the rest leaves the rest no steps.
    # (Kernels under 1,024 weights are not quantised: 64 x 64 are.)
    model = three_layers(middle=64, classes=4)
    x = np.random.default_rng(1).normal(size=(256, 64)).astype("float32")
    x[:, 0] *= 1000.0
    labels = np.asarray(model(x)).argmax(axis=1)
    with pytest.raises(ExportError) as raised:
        export(model, tmp_path / "m.tflite", format="tflite", quantize="dynamic",
               sample=x[:32], validation_data=(x, labels))
    message = raised.value.message
    assert "accuracy" in message and "on the validation data" in message
    assert listed_layers(message)[0] == "first"
    assert "normalise them first" in message and '"float16" (closer to float)' in message


def test_an_ordinary_model_exports_as_float16_and_dynamic(tmp_path):
    model = three_layers()
    for quantize in ("float16", "dynamic"):
        report = export(model, tmp_path / f"{quantize}.tflite", format="tflite",
                        quantize=quantize)
        assert report.quantize == quantize and report.kept_float == []
