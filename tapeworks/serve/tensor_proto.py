"""A gRPC request's `TensorProto`, checked before it becomes an array.

`tf.make_ndarray` trusts its proto: a shape that disagrees with the values
given raises a bare `ValueError` (which gRPC answered as UNKNOWN), a negative
dimension a `TypeError`, and one value with a shape of 2^40 elements is
broadcast into an allocation of terabytes. TF Serving answers each with
INVALID_ARGUMENT ("tensor parsing error: <alias>", from `Tensor::FromProto`
returning false); so does this, with what was wrong and what was expected.

What a proto may hold (TensorFlow's `Tensor::FromProto` rules): `tensor_content`
of exactly elements x item size bytes; or, in the value field of its dtype, at
most one value per element (complex: two): none gives zeros, fewer than the
elements repeat the last. The tensor may take at most `max_bytes` once built
(the server's request size limit): a proto is small, the array it describes
need not be.
"""

import math

import numpy as np

from tapeworks.serve.servable import RequestError

# The repeated field that holds each dtype's values (tensor.proto), and how many of
# its entries make one element.
_VALUE_FIELDS = {
    "float16": ("half_val", 1), "bfloat16": ("half_val", 1), "float32": ("float_val", 1),
    "float64": ("double_val", 1), "int8": ("int_val", 1), "int16": ("int_val", 1),
    "int32": ("int_val", 1), "uint8": ("int_val", 1), "uint16": ("int_val", 1),
    "uint32": ("uint32_val", 1), "uint64": ("uint64_val", 1), "int64": ("int64_val", 1),
    "bool": ("bool_val", 1), "string": ("string_val", 1), "complex64": ("scomplex_val", 2),
    "complex128": ("dcomplex_val", 2),
}
# A string element's bytes beyond its text: numpy's object array holds a reference.
_STRING_ITEM_BYTES = 8


def to_array(proto, name, max_bytes):
    """The array `proto` (the request's input `name`) describes; RequestError if it is invalid."""
    import tensorflow as tf

    def invalid(what, expected):
        return RequestError(f"tensor parsing error: {name}: {what}; expected {expected}.")

    try:
        dtype = tf.dtypes.as_dtype(proto.dtype)
    except TypeError:
        raise invalid(f"dtype {proto.dtype} is not a TensorFlow data type",
                      "one of DT_FLOAT, DT_INT32, DT_STRING, ...") from None
    if dtype.name not in _VALUE_FIELDS:
        raise invalid(f"dtype {dtype.name} cannot be sent in a request",
                      "a number, bool or string type")
    if proto.tensor_shape.unknown_rank:
        raise invalid("the shape has an unknown rank", "every dimension given")
    dims = [d.size for d in proto.tensor_shape.dim]
    if any(d < 0 for d in dims):
        raise invalid(f"shape {dims} has a negative dimension", "sizes >= 0")
    elements = math.prod(dims)
    item = _STRING_ITEM_BYTES if dtype == tf.string else np.dtype(dtype.as_numpy_dtype).itemsize
    if elements * item > max_bytes:
        raise invalid(f"shape {dims} makes {elements:,} elements ({elements * item:,} bytes)",
                      f"at most {max_bytes:,} bytes, the server's request limit "
                      "(--max-body-bytes)")
    field, per_element = _VALUE_FIELDS[dtype.name]
    if proto.tensor_content and dtype != tf.string:
        if len(proto.tensor_content) != elements * item:
            raise invalid(f"tensor_content has {len(proto.tensor_content):,} bytes for shape "
                          f"{dims} of {dtype.name}", f"{elements * item:,} bytes")
    else:
        values = len(getattr(proto, field))
        if values > elements * per_element:
            raise invalid(f"{values:,} values in {field} for shape {dims} ({elements:,} "
                          "elements)", f"at most {elements * per_element:,}")
        if per_element == 2 and values % 2:
            raise invalid(f"{values:,} values in {field}", "a real and an imaginary part each")
    try:
        return tf.make_ndarray(proto)
    except (ValueError, TypeError) as error:
        raise invalid(str(error).splitlines()[0][:200], "a tensor TensorFlow can read") \
            from None
