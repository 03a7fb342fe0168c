"""An int8 model that fails its verification: the layer to blame, named; repaired or refused.

The broken model is built, not trained: one input feature a thousand times
the others (its kernel row a thousandth, so the float model is ordinary).
Per-tensor int8 gives that input 256 steps across the outlier's range, and
the other seven features round to nothing in the first layer.
"""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from tapeworks.deploy import ExportError, export


def outlier_model():
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).standard_normal((400, 8)).astype("float32")
    x[:, 7] *= 1000.0
    model = keras.Sequential([keras.Input((8,), name="features"),
                              keras.layers.Dense(16, activation="relu", name="wide"),
                              keras.layers.Dense(4, name="head")])
    kernel, bias = model.get_layer("wide").get_weights()
    kernel[7] /= 1000.0
    model.get_layer("wide").set_weights([kernel, bias])
    return model, x


def run_in_fresh_process(path, inputs, tmp_path):
    """The .tflite file's outputs, from `python -m tapeworks.deploy.verify` (ai-edge-litert)."""
    given, produced = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(given, **inputs)
    subprocess.run([sys.executable, "-m", "tapeworks.deploy.verify", "tflite", str(path),
                    str(given), str(produced)], check=True, capture_output=True,
                   env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
    with np.load(produced) as data:
        return {name: data[name] for name in data.files}


def agreement(a, b):
    return float(np.mean(np.argmax(a, -1) == np.argmax(b, -1)))


@pytest.mark.multiprocess
def test_the_outlier_layer_is_kept_in_float_and_the_rest_stays_int8(tmp_path):
    from ai_edge_litert.interpreter import Interpreter

    model, x = outlier_model()
    path = tmp_path / "m.tflite"
    report = export(model, path, format="tflite", quantize="int8", representative_data=x[:200])
    assert [layer.layer for layer in report.kept_float] == ["wide"]
    wide = report.kept_float[0]
    assert wide.op == "FULLY_CONNECTED" and not wide.preprocessing
    assert "wide (FULLY_CONNECTED)" in str(report) and report.advice == ""
    # On held-out rows, in a fresh process: the repaired model is the model.
    held_out = x[200:]
    produced = run_in_fresh_process(path, {"features": held_out}, tmp_path)["output_0"]
    assert agreement(produced, model(held_out)) >= 0.95
    assert report.agreement >= 0.95
    # The outlier's layer runs in float32; the head is still int8.
    dtypes = {d["name"]: d["dtype"] for d in Interpreter(model_path=str(path))
              .get_tensor_details()}
    assert dtypes[wide.tensor] == np.float32
    assert any("head" in name and dtype == np.int8 for name, dtype in dtypes.items())


@pytest.mark.multiprocess
def test_strict_refuses_and_names_the_layer_with_its_numbers(tmp_path):
    model, x = outlier_model()
    path = tmp_path / "m.tflite"
    labels = np.argmax(model(x[200:]), -1).astype("int32")
    with pytest.raises(ExportError) as raised:
        export(model, path, format="tflite", quantize="int8", representative_data=x[:200],
               validation_data=(x[200:], labels), strict=True)
    message = str(raised.value)
    # Judged by the task: accuracy against the model's, beside the elementwise difference.
    assert "accuracy" in message and "at most 1 point of accuracy lost" in message
    assert "largest output difference" in message
    first = message.split("The layers that lose the most in int8")[1].splitlines()[1]
    assert first.startswith("  - wide (FULLY_CONNECTED): int8 activations in [")
    assert "strict=True refuses" in message
    assert os.listdir(tmp_path) == []


@pytest.mark.multiprocess
def test_validation_data_judges_the_repair_by_accuracy(tmp_path):
    model, x = outlier_model()
    labels = np.argmax(model(x[200:]), -1).astype("int32")
    report = export(model, tmp_path / "m.tflite", format="tflite", quantize="int8",
                    representative_data=x[:200], validation_data=(x[200:], labels))
    assert report.metric["name"] == "accuracy" and report.metric["model"] == 1.0
    assert report.metric["artefact"] >= 0.99
    assert report.metric["tolerance"] == "at most 1 point of accuracy lost"
    assert [layer.layer for layer in report.kept_float] == ["wide"]
    assert report.max_difference["output_0"] > 0   # the elementwise difference, beside it


def digits_with_normalisation():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x, y = x.astype("float32"), y.astype("int32")
    normalisation = keras.layers.Normalization()
    normalisation.adapt(x[:1400])
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,), name="pixels"),
                              keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(normalisation(x[:1400]), y[:1400], epochs=10, batch_size=64, verbose=0)
    return model, normalisation, x


@pytest.mark.slow
@pytest.mark.multiprocess
def test_digits_with_in_graph_normalisation_exports_as_int8_with_no_extra_argument(tmp_path):
    import tensorflow as tf

    model, normalisation, x = digits_with_normalisation()
    path = tmp_path / "m.tflite"
    report = export(model, path, format="tflite", preprocessing=normalisation, quantize="int8",
                    representative_data=tf.data.Dataset.from_tensor_slices(x[:1400]).batch(32))
    produced = run_in_fresh_process(path, {"pixels": x}, tmp_path)["output_0"]
    assert agreement(produced, model(normalisation(x))) >= 0.95    # all 1,797 digits
    kept = report.kept_float
    assert kept and kept[0].layer == normalisation.name and kept[0].preprocessing
    assert "move it out of the quantised graph" in report.advice
    assert f"kept in float32: {normalisation.name} (" in str(report)


def test_a_converted_tensor_is_named_by_its_layer_whose_traced_scope_was_uniquified():
    from tapeworks.deploy.quantisation import layer_of

    names = {"sequential", "dense", "dense_1", "normalization"}
    assert layer_of("sequential_1/dense_1/MatMul;sequential_1/dense_1/Relu", names) == "dense"
    assert layer_of("sequential_1/dense_1_2/MatMul", names) == "dense_1"
    assert layer_of("normalization_1/truediv;normalization_1/Maximum1", names) == \
        "normalization"
    assert layer_of("Const_1", names) == "tensor Const_1"
