"""Hostile requests to a real `tapeworks serve` process: every one gets the right status.

gRPC (TF Serving's own client library, tensorflow-serving-api) and REST on
loopback. A body that is not a protobuf, a tensor whose shape disagrees with
its content, oversized headers, and a seeded fuzz of both predict paths: no
UNKNOWN, INTERNAL or 5xx answer, and the server never exits.
"""

import json
import random
import socket

import pytest

from tests.serve.saved_models import half_plus_two, scaled
from tests.serve.server_process import Server

pytestmark = [pytest.mark.multiprocess, pytest.mark.xdist_group("hostile")]
PREDICT = "/tensorflow.serving.PredictionService/Predict"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    scaled(str(base / "scaled" / "1"), 1)
    half_plus_two(str(base / "half_plus_two" / "1"))
    config = base / "models.config"
    config.write_text(f"""
model_config_list {{
  config {{ name: "scaled" base_path: "{base / 'scaled'}" model_platform: "tensorflow" }}
  config {{ name: "default" base_path: "{base / 'half_plus_two'}" model_platform: "tensorflow" }}
}}""")
    running = Server(f"--model_config_file={config}", "--max-body-mb", "1", grpc=True)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def channel(server):
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    yield channel
    channel.close()


def raw_call(channel, method, body):
    """(status code, details) of a unary call whose request bytes are `body` as given."""
    import grpc

    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    try:
        call(body, timeout=30)
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as error:
        return error.code(), error.details()


def predict_request(proto=None):
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = "scaled"
    request.inputs["x"].CopyFrom(
        proto if proto is not None else tf.make_tensor_proto([[1.0, 2.0, 3.0]], tf.float32))
    return request


def test_a_body_that_is_not_a_protobuf_is_invalid_argument(channel):
    import grpc

    for body in (b"\xff\xff\xff\xff", b"\x0a\x80", b"\x0a\x05ab"):
        code, details = raw_call(channel, PREDICT, body)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (body, code, details)
        assert "Could not parse the PredictRequest" in details
    code, details = raw_call(channel, "/tensorflow.serving.ModelService/GetModelStatus",
                             b"\x0a\x03\x0a\x01")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "GetModelStatusRequest" in details


def _tensor(dtype="DT_FLOAT", dims=(1, 3), **content):
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2

    proto = tensor_pb2.TensorProto(dtype=types_pb2.DataType.Value(dtype) if isinstance(
        dtype, str) else dtype)
    proto.tensor_shape.CopyFrom(tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in dims]))
    for field, value in content.items():
        if field == "tensor_content":
            proto.tensor_content = value
        else:
            getattr(proto, field).extend(value)
    return proto


@pytest.mark.parametrize("proto, says", [
    (_tensor(float_val=[1.0] * 4), "4 values in float_val for shape [1, 3]"),
    (_tensor(tensor_content=b"\x00" * 11), "tensor_content has 11 bytes"),
    (_tensor(dims=(-1, 3), float_val=[1.0]), "negative dimension"),
    (_tensor(dims=(1 << 40,), float_val=[1.0]), "1,099,511,627,776 elements"),
    (_tensor(dtype=9999, float_val=[1.0]), "dtype 9999 is not a TensorFlow data type"),
    (_tensor(dtype="DT_RESOURCE"), "cannot be sent in a request"),
    (_tensor(dtype="DT_COMPLEX64", dims=(1,), scomplex_val=[1.0]), "a real and an imaginary"),
])
def test_a_tensor_whose_shape_disagrees_with_its_content_is_invalid_argument(
        channel, proto, says):
    import grpc

    code, details = raw_call(channel, PREDICT, predict_request(proto).SerializeToString())
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert details.startswith("tensor parsing error: x:") and says in details


def test_fewer_values_than_elements_repeat_the_last_as_tensorflow_does(channel):
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    code, _ = raw_call(channel, PREDICT, predict_request(_tensor(float_val=[2.0]))
                       .SerializeToString())
    assert code == grpc.StatusCode.OK
    stub = channel.unary_unary(PREDICT, request_serializer=None,
                               response_deserializer=predict_pb2.PredictResponse.FromString)
    response = stub(predict_request(_tensor(float_val=[2.0])).SerializeToString(), timeout=30)
    assert tf.make_ndarray(response.outputs["y"]).tolist() == [[4.0, 4.0, 4.0]]


def _raw_http(server, head, body=b""):
    """The status line of a hand-written HTTP/1.1 request (None: the connection was closed)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        try:
            sock.sendall(head + body)
        except (BrokenPipeError, ConnectionResetError):
            pass   # the server answered and closed while we were still sending: read it
        reply = b""
        try:
            while b"\r\n" not in reply:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                reply += chunk
        except ConnectionResetError:
            pass
    return reply.split(b"\r\n", 1)[0].decode() if reply else None


@pytest.mark.parametrize("headers", [
    b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 80) for i in range(20_000)),   # 2 MB of fields
    b"x-big: " + b"a" * (4 << 20) + b"\r\n",                             # one 4 MB field
    b"".join(b"x-h%d: 1\r\n" % i for i in range(101)),                    # 101 small fields
], ids=["20000-fields-2MB", "one-4MB-field", "101-fields"])
def test_oversized_headers_are_refused_with_431(server, headers):
    body = b'{"instances": [[1, 2, 3]]}'
    head = (b"POST /v1/models/scaled:predict HTTP/1.1\r\nhost: x\r\n" + headers
            + b"content-length: %d\r\n\r\n" % len(body))
    status = _raw_http(server, head, body)
    refused = "HTTP/1.1 431 Request Header Fields Too Large"
    if len(head) < 1 << 20:
        assert status == refused, status
    else:
        # A client still sending megabytes when the server answers and closes may
        # see the connection reset before it reads the answer.
        assert status in (refused, None), status
    assert server.get("/healthz")[0] == 200


def test_headers_within_the_limits_and_a_large_body_in_one_write_are_served(server):
    body = json.dumps({"instances": [[1.0, 2.0, 3.0]] * 3000}).encode()   # ~50 KB
    head = (b"POST /v1/models/scaled:predict HTTP/1.1\r\nhost: x\r\n"
            + b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 500) for i in range(90))
            + b"content-length: %d\r\n\r\n" % len(body))
    assert _raw_http(server, head, body) == "HTTP/1.1 200 OK"


# Fuzz: random and mutated requests, seeded and bounded ---------------------------------


def _mutations(valid, rng, count):
    """`count` byte strings: `valid` with bytes flipped, cut, repeated or spliced."""
    for _ in range(count):
        data = bytearray(valid)
        kind = rng.randrange(5)
        if kind == 0 and data:
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 1:
            data = data[:rng.randrange(len(data) + 1)]
        elif kind == 2:
            data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 64)))
        elif kind == 3 and data:
            start = rng.randrange(len(data))
            data = data[:start] + data[start:start + rng.randint(1, 16)] * rng.randint(2, 50) \
                + data[start:]
        else:
            data = data + bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
        yield bytes(data)


@pytest.mark.slow
def test_fuzzing_the_grpc_predict_path_finds_no_unknown_or_internal(server, channel):
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import get_model_metadata_pb2, predict_pb2

    rng = random.Random(20261207)
    two = predict_pb2.PredictRequest()
    two.model_spec.name, two.model_spec.signature_name = "scaled", "two"
    two.inputs["a"].CopyFrom(tf.make_tensor_proto([[1.0, 2.0]], tf.float32))
    two.inputs["tag"].CopyFrom(tf.make_tensor_proto([b"t"]))
    metadata = get_model_metadata_pb2.GetModelMetadataRequest()
    metadata.model_spec.name = "scaled"
    metadata.metadata_field.append("signature_def")
    seeds = [(PREDICT, predict_request().SerializeToString()),
             (PREDICT, two.SerializeToString()),
             ("/tensorflow.serving.PredictionService/GetModelMetadata",
              metadata.SerializeToString())]
    seen = {}
    for method, valid in seeds:
        for body in _mutations(valid, rng, 150):
            code, details = raw_call(channel, method, body)
            seen[code] = seen.get(code, 0) + 1
            assert code not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL), (
                method, body, code, details)
    assert server.process.poll() is None
    assert seen.get(grpc.StatusCode.INVALID_ARGUMENT, 0) > 0


@pytest.mark.slow
def test_fuzzing_the_rest_predict_path_finds_no_5xx(server):
    rng = random.Random(7)
    valid = [json.dumps({"instances": [[1.0, 2.0, 3.0]]}).encode(),
             json.dumps({"signature_name": "two", "inputs": {
                 "a": [[1.0, 2.0]], "tag": [{"b64": "dA=="}]}}).encode()]
    statuses = {}
    for body in [m for v in valid for m in _mutations(v, rng, 150)]:
        status, payload, _ = server.post("/v1/models/scaled:predict", raw=body)
        statuses[status] = statuses.get(status, 0) + 1
        assert status < 500, (body, status, payload)
    assert server.process.poll() is None
    assert statuses.get(400, 0) > 0
