"""`tapeworks serve` over real HTTP on loopback, started as its own process.

One server (module fixture) serves TF Serving's way: `--model_config_file`
with a TF1 graph as `default` at version 00000123 (TF Serving's half_plus_two,
rebuilt), and a TF2 model `scaled` at versions 1 and 0002 with version labels.
TensorFlow Serving's own REST test cases (tensorflow_model_server_test.py:
testClassifyREST, testRegressREST, testPredictREST, testPredictColumnarREST,
testGetStatusREST, testGetModelMetadataREST, with their expected bodies) run
against it as a held-out check.
"""

import base64
import json
import os
import threading

import pytest

from tests.serve.saved_models import half_plus_two, scaled
from tests.serve.server_process import Server

# One xdist worker takes the whole module: its server fixture starts once.
pytestmark = [pytest.mark.multiprocess, pytest.mark.xdist_group("server")]
HERE = os.path.dirname(__file__)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    half_plus_two(str(base / "half_plus_two" / "00000123"))
    scaled(str(base / "scaled" / "1"), 1)
    scaled(str(base / "scaled" / "0002"), 2)
    config = base / "models.config"
    config.write_text(f"""
model_config_list {{
  config {{ name: "default" base_path: "{base / 'half_plus_two'}" model_platform: "tensorflow"
           version_labels {{ key: "Version_Label" value: 123 }} }}
  config {{
    name: "scaled" base_path: "{base / 'scaled'}" model_platform: "tensorflow"
    model_version_policy {{ all {{}} }}
    version_labels {{ key: "stable" value: 1 }}
    version_labels {{ key: "canary" value: 2 }}
  }}
}}""")
    running = Server(f"--model_config_file={config}", "--max-body-mb", "0.05",
                     "--max-batch-size", "8", grpc=True)
    yield running
    running.stop()


def test_tf_serving_rest_test_cases_held_out(server):
    """TF Serving's own REST tests, their requests and expected bodies as written there."""
    assert server.post("/v1/models/default:classify", {
        "signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]})[1] == {
        "results": [[["", 3.0]]]}
    assert server.post("/v1/models/default:regress", {
        "signature_name": "regress_x_to_y", "examples": [{"x": 2.0}]})[1] == {"results": [3.0]}
    assert server.post("/v1/models/default:predict", {"instances": [2.0, 3.0, 4.0]})[1] == {
        "predictions": [3.0, 3.5, 4.0]}
    assert server.post("/v1/models/default:predict", {"inputs": [2.0, 3.0, 4.0]})[1] == {
        "outputs": [3.0, 3.5, 4.0]}
    assert server.get("/v1/models/default")[1] == {"model_version_status": [{
        "version": "123", "state": "AVAILABLE",
        "status": {"error_code": "OK", "error_message": ""}}]}
    with open(os.path.join(HERE, "tf_serving_half_plus_two_metadata.json")) as f:
        expected = json.load(f)
    assert server.get("/v1/models/default/metadata")[1] == expected


def test_tf_serving_handler_test_cases_held_out(server):
    """TF Serving's http_rest_api_handler_test.cc: its paths, bodies and expected statuses.

    Its model is half_plus_two with version 123 labelled Version_Label; its
    status substrings are checked in the error messages.
    """
    malformed = [("GET", "/v1/foo"), ("POST", "/v1/foo"), ("GET", "/v1/models/debug/model_name"),
                 ("POST", "/v1/models"), ("GET", "/v1/models/foo:predict"),
                 ("GET", "/v1/models/foo/version/50:predict"),
                 ("POST", "/v1/models/foo/version/50:regress"),
                 ("POST", "/v1/models/foo/versions/HELLO:regress"),
                 ("POST", "/v1/models/foo/metadata"),
                 ("POST", "/v1/models/foo/label/some_label:regress"),
                 ("POST", "/v1/models/foo/versions/50/labels/some_label:regress"),
                 ("POST", "/v1/models/foo/versions/some_label:regress")]
    for method, path in malformed:
        status, body, _ = server.request(method, path, raw=b"" if method == "POST" else None)
        assert status == 400 and "Malformed request" in body["error"], (path, body)
    status, body, _ = server.get("/v1/models")
    assert status == 400 and "Missing model name" in body["error"]
    status, body, _ = server.post(f"/v1/models/foo/versions/{2 ** 64 - 1}:regress", raw=b"")
    assert status == 400 and "Failed to convert version" in body["error"]
    for path in ("/v1/models/foo:predict", "/v1/models/foo/versions/50:predict",
                 "/v1/models/default99:predict"):
        assert server.post(path, {"instances": [1]})[0] == 404
    predict = "/v1/models/default:predict"
    for raw, expected in ((b"", "JSON Parse error: The document is empty"),
                          (b"instances = [1, 2]", "JSON Parse error: Invalid value"),
                          (b'{ "instances": ["x", "y"] }', "not of expected type: float"),
                          (b'{ "signature_name": 100 }',
                           "'signature_name' key must be a string value.")):
        status, body, _ = server.post(predict, raw=raw)
        assert status == 400 and expected in body["error"], (raw, body)
    status, body, _ = server.post("/v1/models/default/labels/Version_Nonexistent:predict",
                                  raw=b'{ "instances": ["x", "y"] }')
    assert status == 400 and "Unrecognized servable version label" in body["error"]
    assert server.post(predict, {"instances": [[1.0, 2.0], [3.0, 4.0]]})[1] == {
        "predictions": [[2.5, 3.0], [3.5, 4.0]]}
    assert server.post("/v1/models/default/versions/123:predict",
                       {"instances": [1.0, 2.0]})[1] == {"predictions": [2.5, 3.0]}
    assert server.post("/v1/models/default/labels/Version_Label:predict",
                       {"instances": [1.0, 2.0]})[1] == {"predictions": [2.5, 3.0]}
    assert server.post("/v1/models/default/versions/123:predict", {
        "signature_name": "serving_default", "inputs": [3.0, 4.0]})[1] == {
        "outputs": [3.5, 4.0]}
    regress = {"signature_name": "regress_x_to_y", "examples": [{"x": 80.0}]}
    assert server.post("/v1/models/default:regress", regress)[1] == {"results": [42]}
    assert server.post("/v1/models/default/labels/Version_Label:regress", regress)[1] == {
        "results": [42]}
    assert server.post("/v1/models/default:classify", {
        "signature_name": "classify_x_to_y", "examples": [{"x": 20.0}]})[1] == {
        "results": [[["", 12]]]}


def test_rows_columns_b64_and_named_signatures(server):
    tag = base64.b64encode(b"\xffbin").decode()
    status, body, headers = server.post("/v1/models/scaled:predict", {
        "signature_name": "two",
        "instances": [{"a": [1, 2], "tag": "foo"}, {"a": [3, 4.5], "tag": {"b64": tag}}]})
    assert status == 200 and headers["X-Model-Version"] == "2"   # the latest, by default
    # Several outputs: one object per instance; `*_bytes` outputs come back as b64.
    assert body == {"predictions": [
        {"total": 6.0, "tag_bytes": {"b64": base64.b64encode(b"foo\x00!").decode()}},
        {"total": 15.0, "tag_bytes": {"b64": base64.b64encode(b"\xffbin\x00!").decode()}}]}
    status, body, _ = server.post("/v1/models/scaled:predict", {
        "signature_name": "two", "inputs": {"a": [[1, 2]], "tag": ["x"]}})
    assert body == {"outputs": {"total": [6.0],
                                "tag_bytes": [{"b64": base64.b64encode(b"x\x00!").decode()}]}}
    # float32 outputs written with their own shortest digits: 0.1 * 2 + 2.
    assert server.post("/v1/models/scaled:predict", {"inputs": [[0.1, 0.2, 0.3]]})[1] == {
        "outputs": [[2.2, 2.4, 2.6]]}


def test_versions_labels_and_what_is_not_there(server):
    def answer(path):
        status, body, headers = server.post(path, {"instances": [[1, 1, 1]]})
        return status, body, headers.get("X-Model-Version")

    assert answer("/v1/models/scaled/versions/1:predict") == (
        200, {"predictions": [[3.0, 3.0, 3.0]]}, "1")
    assert answer("/v1/models/scaled/labels/canary:predict")[2] == "2"
    assert answer("/v1/models/scaled/labels/stable:predict")[2] == "1"
    assert answer("/v1/models/scaled/versions/3:predict")[:2] == (
        404, {"error": "Servable not found for request: Specific(scaled, 3)"})
    assert answer("/v1/models/scaled/labels/beta:predict")[:2] == (
        400, {"error": "Unrecognized servable version label: beta"})
    assert answer("/v1/models/nope:predict")[:2] == (
        404, {"error": "Servable not found for request: Latest(nope)"})
    status = server.get("/v1/models/scaled")[1]["model_version_status"]
    assert [(s["version"], s["state"]) for s in status] == [
        ("2", "AVAILABLE"), ("1", "AVAILABLE")]
    assert server.get("/v1/models/scaled/versions/1/metadata")[1]["model_spec"] == {
        "name": "scaled", "signature_name": "", "version": "1"}


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, "JSON Parse error"),
    (b"", 400, "JSON Parse error: The document is empty"),
    (b"[1, 2]", 400, "Is not object"),
    (b'{"instances": [[1,1,1]], "inputs": [[1,1,1]]}', 400, "only one of 'inputs' or "
                                                            "'instances'"),
    (b'{"signature_name": "two", "inputs": {"a": [[1, 2]]}}', 400,
     "Missing named input: tag in 'inputs' object."),
    (b'{"signature_name": "two", "instances": [{"a": [1, 2]}]}', 400,
     "keys must be equal to: a,tag (missing: tag)"),
    (b'{"instances": [["1", 1, 1]]}', 400, "input 'x' expects float32 values; received a "
                                           "string: JSON Value: [\"1\", 1, 1] Type: String is "
                                           "not of expected type: float"),
    (b'{"instances": [[1, 1]]}', 400, "input 'x' has shape [1, 2]; expected float32 of shape "
                                      "[-1, 3]"),
    (b'{"instances": [[1, true, 1]]}', 400, "JSON Value: true Type: Bool is not of expected "
                                            "type: float"),
    (b'{"instances": [[1, null, 1]]}', 400, "JSON Value: null Type: Null is not of expected "
                                            "type: float"),
    (b'{"instances": [[1, 1, 1], [1, 1]]}', 400, "every instance must have the same shape"),
    (b'{"signature_name": "nope", "instances": [[1, 1, 1]]}', 400,
     'Serving signature name: "nope" not found'),
    (b'{"instances": [[1, 1, 1]]}' + b" " * 60000, 413, "over the limit of 52,428 bytes"),
])
def test_bad_requests_get_tf_servings_status_and_say_what_was_wrong(
        server, body, status, message):
    code, answer, _ = server.post("/v1/models/scaled:predict", raw=body)
    assert code == status and message in answer["error"], answer


def test_classify_on_a_predict_signature_and_bad_examples(server):
    code, answer, _ = server.post("/v1/models/default:classify", {"examples": [{"x": 2.0}]})
    assert (code, answer["error"]) == (400, "Expected classification signature method_name to "
                                            "be tensorflow/serving/classify. Was: "
                                            "tensorflow/serving/predict")
    code, answer, _ = server.post("/v1/models/default:regress", {
        "signature_name": "regress_x_to_y", "examples": [{"x": [2.0, "a"]}]})
    assert code == 400 and "feature: x" in answer["error"]
    code, answer, _ = server.post("/v1/models/default:regress", {
        "signature_name": "regress_x_to_y", "context": {"x": 1.0}, "examples": [{"x": 2.0}]})
    assert code == 400 and "context features must not appear in examples" in answer["error"]


def test_concurrent_requests_each_get_their_own_rows(server):
    """Batched across requests: every request gets back exactly its own rows."""
    results, errors = {}, []

    def client(i):
        for j in range(10):
            value = float(i * 100 + j)
            status, body, _ = server.post("/v1/models/scaled/versions/2:predict",
                                          {"instances": [[value, value, value]] * (1 + i % 3)})
            if status != 200 or body != {"predictions": [[2 * value + 2] * 3] * (1 + i % 3)}:
                errors.append((status, body))
        results[i] = True

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 16
    metrics = server.text("/metrics")
    assert 'tapeworks_requests_total{code="200",method="predict",model="scaled"}' in metrics
    # Names nobody serves share one label.
    assert server.post("/v1/models/made_up_name:predict", {"instances": [1]})[0] == 404
    metrics = server.text("/metrics")
    assert 'model="made_up_name"' not in metrics
    assert 'tapeworks_requests_total{code="404",method="predict",model="(unknown)"}' in metrics
    assert "tapeworks_batch_size_bucket" in metrics and "tapeworks_queue_depth" in metrics
    assert 'tapeworks_request_latency_seconds_bucket{le="0.001",method="predict"' in metrics


def test_health_reports_what_is_loaded(server):
    status, body, _ = server.get("/healthz")
    assert status == 200
    assert body["models"]["scaled"] == {"default_version": 2, "versions": [1, 2],
                                        "failures": {}}
    assert body["models"]["default"]["versions"] == [123]


def test_tf_servings_grpc_clients_work_unchanged(server):
    """TF Serving's own stubs and messages (tensorflow-serving-api) against the gRPC port."""
    import grpc
    import numpy as np
    import tensorflow as tf
    from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2,
                                         get_model_status_pb2, model_service_pb2_grpc,
                                         predict_pb2, prediction_service_pb2_grpc,
                                         regression_pb2)

    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "default"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto([[2.0], [3.0]], dtype=tf.float32))
    response = stub.Predict(request, timeout=30)
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["y"]), [[3.0], [3.5]])
    assert (response.model_spec.name, response.model_spec.version.value) == ("default", 123)

    request = predict_pb2.PredictRequest()   # a version label, and only the outputs asked for
    request.model_spec.name, request.model_spec.version_label = "scaled", "stable"
    request.model_spec.signature_name = "two"
    request.inputs["a"].CopyFrom(tf.make_tensor_proto([[1.0, 2.0]], dtype=tf.float32))
    request.inputs["tag"].CopyFrom(tf.make_tensor_proto([b"t"]))
    request.output_filter.append("total")
    response = stub.Predict(request, timeout=30)
    assert list(response.outputs) == ["total"] and response.model_spec.version.value == 1
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["total"]), [3.0])

    example = tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[2.0]))}))
    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.name, classify.model_spec.signature_name = "default", "classify_x_to_y"
    classify.input.example_list.examples.add().CopyFrom(example)
    result = stub.Classify(classify, timeout=30).result
    assert [(c.label, c.score) for c in result.classifications[0].classes] == [("", 3.0)]
    regress = regression_pb2.RegressionRequest()
    regress.model_spec.name, regress.model_spec.signature_name = "default", "regress_x_to_y"
    regress.input.example_list.examples.add().CopyFrom(example)
    assert [r.value for r in stub.Regress(regress, timeout=30).result.regressions] == [3.0]

    metadata = get_model_metadata_pb2.GetModelMetadataRequest()
    metadata.model_spec.name = "default"
    metadata.metadata_field.append("signature_def")
    signatures = get_model_metadata_pb2.SignatureDefMap()
    stub.GetModelMetadata(metadata, timeout=30).metadata["signature_def"].Unpack(signatures)
    assert signatures.signature_def["serving_default"].inputs["x"].name == "x:0"

    models = model_service_pb2_grpc.ModelServiceStub(channel)
    status = get_model_status_pb2.GetModelStatusRequest()
    status.model_spec.name = "scaled"
    versions = models.GetModelStatus(status, timeout=30).model_version_status
    assert sorted((v.version, v.state) for v in versions) == [(1, 30), (2, 30)]   # AVAILABLE

    missing = predict_pb2.PredictRequest()
    missing.model_spec.name = "nope"
    with pytest.raises(grpc.RpcError) as caught:
        stub.Predict(missing, timeout=30)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    wrong = predict_pb2.PredictRequest()
    wrong.model_spec.name = "scaled"
    wrong.inputs["x"].CopyFrom(tf.make_tensor_proto([[1, 2, 3]], dtype=tf.int32))
    with pytest.raises(grpc.RpcError) as caught:
        stub.Predict(wrong, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Expects arg[x] to be float32 but int32 is provided" in caught.value.details()
    channel.close()
