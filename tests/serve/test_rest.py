"""TF Serving's JSON rules, in-process: value kinds per dtype, float digits, row/column shapes."""

import json

import numpy as np
import pytest
import tensorflow as tf

from tapeworks.serve import rest
from tapeworks.serve.json_tensor import encode, to_array
from tapeworks.serve.servable import InputSpec, RequestError


@pytest.mark.parametrize("dtype, value, taken", [
    (tf.int32, [[1, 2]], [[1, 2]]), (tf.float32, [[1, 2.5]], [[1.0, 2.5]]),
    (tf.bool, [True, False], [True, False]), (tf.int64, [[1, 2.5]], None),
    (tf.float32, [[True, 1]], None), (tf.bool, [1, 0], None), (tf.float32, [None], None),
])
def test_each_dtype_takes_only_its_own_json_kind(dtype, value, taken):
    spec = InputSpec("x", dtype, [None, None] if isinstance(value[0], list) else [None], "x:0")
    if taken is None:
        with pytest.raises(RequestError, match=f"input 'x' expects {dtype.name} values.*is not "
                                               "of expected type"):
            to_array(value, spec, "'inputs'")
    else:
        assert to_array(value, spec, "'inputs'").tolist() == taken


def test_floats_are_written_as_tf_serving_writes_them():
    """TF Serving's WriteDecimal: six digits when they read back, else max_digits10; `.0`."""
    assert encode("y", np.array([0.1, 1 / 3, 2.5], np.float32)) == "[0.1,0.333333343,2.5]"
    assert encode("y", np.array([[1, 2]], np.int64)) == "[[1,2]]"
    assert encode("tag_bytes", np.array([b"\x00a"], dtype=object)) == '[{"b64": "AGE="}]'


def test_row_and_columnar_requests_become_the_same_tensors():
    specs = {"a": InputSpec("a", tf.float32, [None, 2], "a:0"),
             "tag": InputSpec("tag", tf.string, [None], "tag:0")}
    rows, kind = rest.predict_inputs(
        {"instances": [{"a": [1, 2], "tag": "p"}, {"a": [3, 4], "tag": {"b64": "cQ=="}}]},
        specs)
    columns, other = rest.predict_inputs({"inputs": {"a": [[1, 2], [3, 4]], "tag": ["p", "q"]}},
                                         specs)
    assert (kind, other) == (rest.ROW, rest.COLUMNAR)
    for name in specs:
        np.testing.assert_array_equal(rows[name], columns[name])
    assert json.loads(rest.predict_response({"y": np.array([[1.5], [2.5]], np.float32)},
                                            rest.ROW)) == {"predictions": [[1.5], [2.5]]}
