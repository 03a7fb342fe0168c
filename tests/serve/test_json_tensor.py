"""TF Serving's json_tensor_test.cc, ported: the same request bodies and expected tensors or
message substrings, through our REST layer's reading (rest.parse_body, rest.predict_inputs)
and writing (rest.predict_response, json_tensor.encode). Plus the body reader's limits:
nesting, NaN/Infinity, UTF-8."""

import json
import math

import numpy as np
import pytest
import tensorflow as tf

from tapeworks.serve import json_body, rest
from tapeworks.serve.json_tensor import encode, format_floats
from tapeworks.serve.servable import InputSpec, RequestError


def specs(**dtypes):
    """Input specs of unknown shape (TF Serving's test tensorinfo maps give only dtypes)."""
    return {name: InputSpec(name, dtype, None, f"{name}:0") for name, dtype in dtypes.items()}


def read(body, inputs):
    document, _ = rest.parse_body(body.encode() if isinstance(body, str) else body)
    return rest.predict_inputs(document, inputs, check_shapes=False)


def refused(body, inputs):
    with pytest.raises(RequestError) as caught:
        read(body, inputs)
    assert caught.value.status == 400
    return str(caught.value)


def test_single_unnamed_tensor_row_format():
    arrays, format = read('{"instances": [[1,2],[3,4],[5,6]]}', specs(default=tf.int32))
    assert format == rest.ROW and arrays["default"].dtype == np.int32
    assert arrays["default"].tolist() == [[1, 2], [3, 4], [5, 6]]


def test_deeply_nested_well_formed_and_malformed():
    # DeeplyNestedWellFormed: 500,000 levels under a key TF Serving does not read parse.
    body = '{"instances":[1], "nested":' + "[" * 500000 + "]" * 500000 + "}"
    assert read(body, specs(default=tf.int32))[0]["default"].tolist() == [1]
    # DeeplyNestedMalformed: the signature name nested that deep.
    body = '{"signature_name":' + "[" * 500000 + "]" * 500000 + "}"
    assert "key must be a string value" in refused(body, specs(default=tf.int32))


@pytest.mark.parametrize("depth", [900, 100000])
def test_deep_nesting_in_a_member_that_is_read_is_a_400_naming_it(depth):
    message = refused('{"instances": ' + "[" * depth + "]" * depth + "}",
                      specs(default=tf.float32))
    assert f"'instances' is nested {depth} levels deep" in message
    message = refused("[" * depth + "]" * depth, specs(default=tf.float32))
    assert "Is not object" in message


def test_mixed_ints_and_floats_for_float_and_double_tensors():
    arrays, _ = read('{"instances": [1, 2.0, 3, 4, 5.003, 0.007, 0.0]}', specs(default=tf.float32))
    np.testing.assert_array_equal(arrays["default"],
                                  np.array([1, 2, 3, 4, 5.003, 0.007, 0], np.float32))
    arrays, _ = read('{"instances": [1.0, 2, 3, 4, 0.662, 0, 0.0]}', specs(default=tf.float64))
    assert arrays["default"].dtype == np.float64
    assert arrays["default"].tolist() == [1, 2, 3, 4, 0.662, 0, 0]


def test_float_precision_loss_out_of_range_and_non_finite():
    # FloatTensorWithPrecisionLoss: 1435774380 and 1435774380.0 read alike.
    whole = read('{"instances": [1435774380]}', specs(default=tf.float32))[0]["default"]
    decimal = read('{"instances": [1435774380.0]}', specs(default=tf.float32))[0]["default"]
    assert whole.tolist() == decimal.tolist() == [np.float32(1435774380)]
    # FloatTensorThatExceedsMaxReturnsInf / ExceedsMinReturnsZero, and 1e39.
    body = json.dumps({"instances": [1.7976931348623157e308, -1.7976931348623157e308, 1e39,
                                     2.2250738585072014e-308, -2.2250738585072014e-308]})
    values = read(body, specs(default=tf.float32))[0]["default"].tolist()
    assert values[:3] == [math.inf, -math.inf, math.inf] and values[3:] == [0.0, 0.0]
    assert math.copysign(1, values[4]) == -1
    # MultipleNamedTensor's NaN and Infinity tokens.
    arrays, _ = read('{"instances": [{"float_tensor": [1.0, NaN], "dbl_tensor": [NaN]},'
                     '{"float_tensor": [2.0, Infinity], "dbl_tensor": [-Infinity]}]}',
                     specs(float_tensor=tf.float32, dbl_tensor=tf.float64))
    assert np.isnan(arrays["float_tensor"][0, 1]) and arrays["float_tensor"][1, 1] == np.inf
    assert np.isnan(arrays["dbl_tensor"][0, 0]) and arrays["dbl_tensor"][1, 0] == -np.inf


def test_base64_scalars_lists_and_named():
    arrays, _ = read('{"instances": [{"b64": "aGVsbG8="}, {"b64": "d29ybGQ="}]}',
                     specs(default=tf.string))
    assert arrays["default"].tolist() == [b"hello", b"world"]
    arrays, _ = read('{"instances": [[{"b64": "aGVsbG8="}, {"b64": "d29ybGQ="}],'
                     '[{"b64": "aGk="}, {"b64": "YnllIQ=="}]]}', specs(default=tf.string))
    assert arrays["default"].tolist() == [[b"hello", b"world"], [b"hi", b"bye!"]]
    assert "Unable to base64 decode" in refused('{"instances": [{"b64": "!!"}]}',
                                                specs(default=tf.string))


def test_columnar_single_and_named():
    arrays, format = read('{"inputs": [[[1,2],[3,4]],[[5,6],[7,8]]]}', specs(default=tf.int32))
    assert format == rest.COLUMNAR and arrays["default"].shape == (2, 2, 2)
    arrays, _ = read('{"inputs": {"int_tensor": [[1,2],[3,4]], "str_tensor": ["a", "b"]}}',
                     specs(int_tensor=tf.int32, str_tensor=tf.string))
    assert arrays["str_tensor"].tolist() == [b"a", b"b"]
    assert arrays["int_tensor"].tolist() == [[1, 2], [3, 4]]


def test_single_unnamed_tensor_errors():
    inputs = specs(default=tf.int32)
    assert "document is empty" in refused("", inputs)
    assert "must be a string value" in refused(
        '{"signature_name": 5, "instances": [[1,2],[3,4],[5,6,7]]}', inputs)
    assert "Not formatted correctly" in refused(
        '{"instances": [[1,2],[3,4],[5,6,7]], "inputs": [[1,2],[3,4],[5,6,7]]}', inputs)
    assert "Expecting tensor size: 2 but got: 3" in refused(
        '{"instances": [[1,2],[3,4],[5,6,7]]}', inputs)
    assert "Expecting shape [2] but got: [1,2]" in refused(
        '{"instances": [[1,2],[3,4],[[5,6]]]}', inputs)
    assert "Expecting shape" in refused('{"instances": [1, [1]]}', inputs)
    assert "not of expected type" in refused('{"instances": [[1,2],["a", "b"]]}', inputs)
    # Whole numbers only, in the dtype's range.
    assert "Type: Number is not of expected type: int32" in refused(
        '{"instances": [[1, 2.5]]}', inputs)
    assert "not of expected type: int32" in refused('{"instances": [4294967296]}', inputs)


def test_multiple_named_tensor_errors():
    inputs = specs(int_tensor=tf.int32, str_tensor=tf.string)
    assert "Expecting shape" in refused(
        '{"instances": [{"int_tensor": [[1,2],[3,4],[5,6]], "str_tensor": ["foo", "bar"]},'
        '{"int_tensor": [[[7,8],[9,0],[1,2]]], "str_tensor": ["baz", "bat"]}]}', inputs)
    assert "Expecting tensor size" in refused(
        '{"instances": [{"int_tensor": [[1,2],[3,4],[5,6],[7,8]], "str_tensor": ["foo", "bar"]},'
        '{"int_tensor": [[7,8],[9,0],[1,2]], "str_tensor": ["baz", "bat"]}]}', inputs)
    assert "Expecting object but got list" in refused(
        '{"instances": [{"int_tensor": [[1,2]], "str_tensor": ["foo"]}, [1, 20, 30]]}', inputs)
    assert "Expecting value/list but got object" in refused(
        '{"instances": [["baz", "bar"], {"str_tensor": ["baz", "bat"]}]}',
        specs(str_tensor=tf.string))


def test_six_digit_precision_and_non_finite_output():
    """FromJsonSingleFloatTensorSixDigitPrecision and ...NonFinite, compared as text."""
    values = np.array([[9000000, 999999, 0.5], [.0003, .00003, 555557.5]], np.float32)
    assert rest.predict_response({"float_tensor": values}, rest.ROW) == (
        '{"predictions": [[9e+06,999999.0,0.5],[0.0003,3e-05,555557.5]]}')
    values = np.array([[np.nan, np.inf], [3, -np.inf]], np.float32)
    assert rest.predict_response({"float_tensor": values}, rest.ROW) == (
        '{"predictions": [[NaN,Infinity],[3.0,-Infinity]]}')
    assert format_floats(np.array([0.1, 1 / 3, 1e300]), 17) == [
        "0.1", "0.33333333333333331", "1e+300"]


def test_every_float32_reads_back_as_itself():
    rng = np.random.default_rng(0)
    values = (rng.normal(size=20000) * 10.0 ** rng.integers(-38, 38, 20000)).astype(np.float32)
    values = values[np.isfinite(values)]
    np.testing.assert_array_equal(np.array(json.loads(encode("y", values)), np.float32), values)


def test_multiple_outputs_row_and_columnar_and_batch_checks():
    outputs = {"a": np.array([[1, 2], [3, 4]], np.int64),
               "b_bytes": np.array([b"x", b"y"], dtype=object)}
    assert json.loads(rest.predict_response(outputs, rest.ROW)) == {"predictions": [
        {"a": [1, 2], "b_bytes": {"b64": "eA=="}}, {"a": [3, 4], "b_bytes": {"b64": "eQ=="}}]}
    assert json.loads(rest.predict_response(outputs, rest.COLUMNAR)) == {"outputs": {
        "a": [[1, 2], [3, 4]], "b_bytes": [{"b64": "eA=="}, {"b64": "eQ=="}]}}
    with pytest.raises(RequestError, match="inconsistent batch size"):
        rest.predict_response({"a": np.zeros(2), "b": np.zeros(3)}, rest.ROW)
    with pytest.raises(RequestError, match="no shape information"):
        rest.predict_response({"a": np.float32(1)}, rest.ROW)


def test_regression_and_classification_results_with_non_finite():
    """JsonFromRegressionResultWithNonFinite."""
    text = rest.regress_response({"outputs": np.array([0.2, np.inf, 1, -np.inf, np.nan])})
    assert text == '{"results": [0.2,Infinity,1.0,-Infinity,NaN]}'
    text = rest.classify_response({"classes": np.array([[b"a", b"b"]], dtype=object),
                                   "scores": np.array([[0.25, np.nan]], np.float32)})
    assert text == '{"results": [[["a", 0.25], ["b", NaN]]]}'


def test_classify_regress_json_errors():
    def refused_examples(body):
        document, _ = rest.parse_body(body.encode())
        with pytest.raises(RequestError) as caught:
            rest.examples(document, rest.CLASSIFY)
        return str(caught.value)

    with pytest.raises(RequestError, match="'signature_name' key must be a string"):
        rest.parse_body(b'{"signature_name": ["hello"], "examples": [{"names": ["foo"]}]}')
    assert "Example must be JSON object" in refused_examples(
        '{"context": [{"names": ["foo", "bar"]}], "examples": [{}]}')
    assert "list/array" in refused_examples('{"examples": {"names": ["foo", "bar"]}}')
    assert "Example must be JSON object" in refused_examples(
        '{"examples": [[{"names": ["foo", "bar"]}]]}')
    assert "names has element with unexpected JSON type: Null" in refused_examples(
        '{"examples": [{"names": [10, null]}]}')
    assert "names has element with unexpected JSON type: Object" in refused_examples(
        '{"examples": [{"names": [10, {"test": 10}]}]}')
    assert "names has element with unexpected JSON type: Array" in refused_examples(
        '{"examples": [{"names": [[10], 20]}]}')


@pytest.mark.parametrize("body, message", [
    (b'{"signature_name": "\\ud800", "instances": [1]}', "surrogate pair in string is invalid"),
    (b'{"signature_name": "\xed\xa0\x80", "instances": [1]}', "Invalid encoding in string"),
    (b'{"signature_name": "\xff", "instances": [1]}', "Invalid encoding in string"),
    (b'{"instances": [1, 2', "JSON Parse error"),
    (b'{"instances": "abc', "Missing a closing quotation mark"),
])
def test_invalid_text_is_a_400(body, message):
    with pytest.raises(RequestError) as caught:
        json_body.parse(body)
    assert caught.value.status == 400 and message in str(caught.value)


def test_large_arrays_are_read_in_pieces_exactly():
    rows = np.random.default_rng(1).normal(size=(20000, 4)).astype(np.float32)
    body = json.dumps({"instances": rows.tolist(), "x": ["a\\\"]", {"k": [1, "]"]}]}).encode()
    assert len(body) > 2 * json_body.PIECE_BYTES
    assert json_body.parse(body) == json.loads(body)


def test_pieces_orjson_refuses_are_read_as_json_reads_them():
    # orjson decodes pieces; the tokens it refuses (NaN, Infinity, numbers
    # beyond a double) fall back to json.loads in that piece only, so a large
    # body mixing them reads as json reads it. Integers beyond 64 bits read as
    # doubles, as TF Serving's rapidjson reads them.
    rows = np.random.default_rng(2).normal(size=(30000, 4)).tolist()
    rows[5][0], rows[20000][1], rows[29999][3] = float("nan"), float("inf"), float("-inf")
    text = json.dumps({"instances": rows, "big": 2**70, "small": -2**70})
    text = text.replace("Infinity, ", "1e400, ", 1)
    body = text.encode()
    assert len(body) > 3 * json_body.PIECE_BYTES
    parsed, expected = json_body.parse(body), json.loads(body)
    assert parsed["big"] == 2**70 and parsed["small"] == -2**70
    assert isinstance(parsed["big"], float) and isinstance(parsed["small"], float)
    got, want = np.array(parsed["instances"]), np.array(expected["instances"])
    assert np.isnan(got[5, 0]) and np.isposinf(got[20000, 1]) and np.isneginf(got[29999, 3])
    assert np.array_equal(got, want, equal_nan=True)
    assert parsed["instances"][100] == expected["instances"][100]   # every digit of a double


def test_a_lone_surrogate_in_a_large_body_is_refused():
    body = json.dumps({"instances": [[0.5] * 4] * 40000, "signature_name": "\ud800"}).encode()
    assert len(body) > json_body.PIECE_BYTES
    with pytest.raises(RequestError, match="surrogate"):
        json_body.parse(body)


def test_an_element_larger_than_a_piece_is_read_in_its_own_pieces():
    big = np.random.default_rng(3).normal(size=(3, 20000)).tolist()   # each row > PIECE_BYTES / 2
    document = {"instances": [[1.5, 2.5], big, [[0.25]], big[0], 7]}
    body = json.dumps(document).encode()
    assert len(json.dumps(big).encode()) > json_body.PIECE_BYTES
    assert json_body.parse(body) == document


def test_rows_mixing_objects_and_values_name_the_item():
    # TF Serving's messages, whichever kind the first instance sets.
    assert refused('{"instances": [[1], [2], {"x": [3]}]}', specs(x=tf.int32)) == (
        "Expecting value/list but got object at item 2 of input list")
    assert refused('{"instances": [{"x": [1]}, [2]]}', specs(x=tf.int32)) == (
        "Expecting object but got list at item 1 of input list")
    # A {"b64": ...} object is a value, not an instance object.
    arrays, _ = read('{"instances": ["YQ==", {"b64": "Yg=="}]}', specs(x=tf.string))
    assert arrays["x"].tolist() == [b"YQ==", b"b"]
