"""JSON values <-> tensors, as TF Serving's `util/json_tensor.cc` converts them.

Reading: a numeric input takes JSON numbers (an integer input whole
numbers in its range, a bool input true/false), converted with numpy in one
pass over the values (a million float32 values in tens of milliseconds);
out-of-range numbers become +-inf in a float32 tensor (rapidjson's
`GetFloat`), `NaN`/`Infinity` are read. A string input takes strings and
`{"b64": ...}` objects. What does not fit is found by a second, slower walk
that says where, with TF Serving's messages ("Expecting tensor size: 3 but
got: 2", "Expecting shape [2] but got: [1,2]", "... is not of expected
type: float").

Writing: `encode` writes a tensor as JSON text directly: floats as TF
Serving's `WriteDecimal` prints them (six significant digits, `%g`, when
those read back as the same value, else `%.9g` for float32 and `%.17g` for
float64; `.0` after whole numbers: `9e+06`, `999999.0`, `0.333333343`),
`NaN`, `Infinity` and `-Infinity` as rapidjson writes them, outputs named
`*_bytes` as `{"b64": ...}`. The text is built from per-element strings with
one `%` format per piece of `PIECE_VALUES` values, so no call holds the GIL
long.
"""

import base64
import json
import math

import numpy as np

from tapeworks.serve.servable import RequestError

PIECE_VALUES = 1 << 16
# TensorFlow's DataTypeString names, which TF Serving's messages use.
TF_TYPE_NAMES = {"float32": "float", "float64": "double"}


def short(value):
    """A JSON value as TF Serving's messages quote it (cut at 80 characters)."""
    text = json.dumps(value, allow_nan=True)
    return text if len(text) <= 80 else text[:77] + "..."


def json_type(value):
    return {bool: "Bool", int: "Number", float: "Number", str: "String", list: "Array",
            dict: "Object", type(None): "Null"}.get(type(value), type(value).__name__)


def decode_strings(value):
    """A JSON value of strings / {"b64": ...} objects as (nested lists of) bytes."""
    if isinstance(value, dict):
        return _decode_b64(value)
    if isinstance(value, str):
        return value.encode()
    if not isinstance(value, list):
        raise RequestError(f"JSON Value: {short(value)} Type: {json_type(value)} is not of "
                           "expected type: string")
    # Iterative: the nesting is bounded by the body's parser, but no recursion anyway.
    result = []
    stack = [(value, result)]
    while stack:
        items, out = stack.pop()
        for item in items:
            if isinstance(item, list):
                inner = []
                out.append(inner)
                stack.append((item, inner))
            elif isinstance(item, dict):
                out.append(_decode_b64(item))
            elif isinstance(item, str):
                out.append(item.encode())
            else:
                raise RequestError(f"JSON Value: {short(item)} Type: {json_type(item)} is not "
                                   "of expected type: string")
    return result


def _decode_b64(value):
    if set(value) != {"b64"} or not isinstance(value["b64"], str):
        raise RequestError(f"JSON Value: {short(value)} not formatted correctly for "
                           "base64 data")
    try:
        return base64.b64decode(value["b64"], validate=True)
    except ValueError:
        raise RequestError("Unable to base64 decode") from None


def _allowed(dtype):
    if dtype.is_bool:
        return {bool}
    if dtype.is_integer:
        return {int}
    return {int, float}


def _scalars(value):
    """Every non-list value in `value`, in order (an explicit stack, no recursion)."""
    if not isinstance(value, list):
        yield value
        return
    stack = [iter(value)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            yield item
        else:
            stack.pop()


def dense_shape(value):
    """TF Serving's GetDenseTensorShape: the sizes along the first element at each level."""
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


def check_dense(value, shape):
    """TF Serving's FillTensorProto checks: every list of its level's size, values at the leaves."""
    rank = len(shape)
    stack = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if not isinstance(item, list):
            if level != rank:
                raise RequestError(f"JSON Value: {short(item)} found at incorrect level: "
                                   f"{level + 1} in the JSON DOM. Expected at level: {rank}")
            continue
        if level >= rank:
            raise RequestError(f"Encountered list at unexpected level: {level} expected < "
                               f"{rank}")
        if len(item) != shape[level]:
            raise RequestError(f"Encountered list at unexpected size: {len(item)} at level: "
                               f"{level} expected size: {shape[level]}")
        stack.extend((v, level + 1) for v in reversed(item))


def _type_error(value, spec, where, wrong):
    if isinstance(wrong, (str, dict)) and not spec.is_string:
        return RequestError(
            f"{where}: input '{spec.name}' expects {spec.dtype.name} values; received a "
            f"string: JSON Value: {short(value)} Type: String is not of expected type: "
            f"{TF_TYPE_NAMES.get(spec.dtype.name, spec.dtype.name)}. Expected "
            f"{spec.describe()}.")
    return RequestError(
        f"{where}: input '{spec.name}' expects {spec.dtype.name} values; received "
        f"{short(wrong)}: JSON Value: {short(wrong)} Type: {json_type(wrong)} is not of "
        f"expected type: {TF_TYPE_NAMES.get(spec.dtype.name, spec.dtype.name)}. "
        f"Expected {spec.describe()}.")


def _explain(value, spec, where):
    """The RequestError for a value the fast path refused: TF Serving's checks, in its order."""
    allowed = _allowed(spec.dtype)
    for scalar in _scalars(value):
        if spec.is_string:
            if not isinstance(scalar, (str, dict)):
                return _type_error(value, spec, where, scalar)
        elif type(scalar) not in allowed or (spec.dtype.is_integer and not (
                np.iinfo(spec.dtype.as_numpy_dtype).min <= scalar
                <= np.iinfo(spec.dtype.as_numpy_dtype).max)):
            return _type_error(value, spec, where, scalar)
    check_dense(value, dense_shape(value))
    return RequestError(f"{where}: input '{spec.name}' could not be read as "
                        f"{spec.dtype.name}. Expected {spec.describe()}.")


def _numeric(value, spec):
    """`value` as an array of the spec's numeric dtype, or None when it does not fit."""
    dtype = spec.dtype.as_numpy_dtype
    try:
        objects = np.array(value, dtype=object)
    except ValueError:
        return None
    kinds = set(map(type, objects.ravel().tolist()))
    if not kinds <= _allowed(spec.dtype):
        return None
    if spec.dtype.is_bool or not objects.size:
        return objects.astype(dtype)
    if spec.dtype.is_integer:
        try:
            wide = objects.astype(np.int64)
        except OverflowError:
            return None
        info = np.iinfo(dtype)
        if wide.size and (wide.min() < info.min or wide.max() > info.max):
            return None
        return wide.astype(dtype)
    with np.errstate(over="ignore"):
        try:
            return objects.astype(np.float64).astype(dtype)
        except OverflowError:
            # An integer beyond float64 (1e400 written out): +-inf, as strtod reads it.
            return np.array([float(str(v)) for v in objects.ravel().tolist()],
                            np.float64).reshape(objects.shape).astype(dtype)


def _strings(value, spec):
    try:
        array = np.array(decode_strings(value), dtype=object)
    except ValueError:
        return None
    if any(not isinstance(v, bytes) for v in array.ravel().tolist()):
        return None
    return array


def to_array(value, spec, where):
    """A JSON value as an array of the input's dtype; errors name the input and what was wrong."""
    array = _strings(value, spec) if spec.is_string else _numeric(value, spec)
    if array is None:
        raise _explain(value, spec, where)
    return array


def stack_instances(values, spec, name):
    """The `instances` values of one input (row format) as one array with a leading batch axis.

    Fast when they are alike; otherwise each instance is checked as TF Serving
    checks it, and the first that differs is named.
    """
    # In pieces of about PIECE_VALUES values: no one numpy call holds the GIL long.
    first = len(list(_scalars(values[0]))) if values else 1
    step = max(1, PIECE_VALUES // max(first, 1))
    try:
        pieces = [to_array(values[i:i + step], spec, "'instances'")
                  for i in range(0, len(values), step)]
        if len({p.shape[1:] for p in pieces}) == 1 and all(
                p.ndim >= 1 and p.shape[0] == len(values[i * step:(i + 1) * step])
                for i, p in enumerate(pieces)):
            return np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
    except RequestError:
        pass
    first = None
    for index, value in enumerate(values):
        try:
            to_array(value, spec, f"'instances' item {index}")
            check_dense(value, dense_shape(value))
        except RequestError as error:
            raise RequestError(f"Failed to process element: {index} of 'instances' list. "
                               f"Error: {error}") from None
        shape = dense_shape(value)
        size = int(np.prod(shape)) if shape else 1
        if first is None:
            first = (size, shape)
            continue
        if size != first[0]:
            problem = f"Expecting tensor size: {first[0]} but got: {size}"
        elif shape != first[1]:
            problem = (f"Expecting shape [{','.join(map(str, first[1]))}] but got: "
                       f"[{','.join(map(str, shape))}]")
        else:
            continue
        raise RequestError(
            f"Failed to process element: {index} of 'instances' list. Error: {problem} (input "
            f"'{name}': every instance must have the same shape; use the columnar 'inputs' "
            "format otherwise)")
    raise RequestError(f"'instances': input '{name}' could not be read as "
                       f"{spec.dtype.name}. Expected {spec.describe()}.")


def check_shape(array, spec, where):
    if spec.shape is None:
        return
    received = list(array.shape)
    if len(received) != len(spec.shape) or any(
            want is not None and want != got for want, got in zip(spec.shape, received)):
        raise RequestError(
            f"{where}: input '{spec.name}' has shape {received}; expected {spec.describe()} "
            "(-1: any size).")


# Tensors -> JSON text ------------------------------------------------------

# Per value: its printf format (TF Serving's WriteDecimal), by code.
_FLOAT_FORMATS = {9: np.array(["%g", "%g.0", "%.9g", "%.9g.0", "NaN", "Infinity", "-Infinity"]),
                  17: np.array(["%g", "%g.0", "%.17g", "%.17g.0", "NaN", "Infinity",
                                "-Infinity"])}


def _float_formats(values, digits):
    """The printf format of each value (flat float array), and the values the formats take.

    `%g` (six significant digits) where those digits read back as the same
    value, else `%.9g` / `%.17g`; `.0` after a whole number printed without
    an exponent; NaN, Infinity, -Infinity as literals.
    """
    double = values.astype(np.float64)
    finite = np.isfinite(double)
    magnitude = np.abs(np.where(finite, double, 1.0))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        exponent = np.floor(np.log10(np.where(magnitude > 0, magnitude, 1.0)))
        if digits == 9:
            # float32: six digits computed in float64 decide it, when the power
            # of ten is applied as an exact number (10**k, k >= 0: exact up to 1e22).
            up = 10.0 ** np.maximum(5 - exponent, 0)
            down = 10.0 ** np.maximum(exponent - 5, 0)
            six = np.rint(double * up / down) / up * down
            round_trips = (six.astype(values.dtype) == values) | (double == 0)
        else:
            round_trips = np.array([not math.isfinite(v) or float("%g" % v) == v
                                    for v in double.tolist()], bool)
    whole = finite & (np.floor(double) == double)
    plain = np.where(round_trips, magnitude < 1e6, magnitude < 10.0 ** digits)
    codes = np.where(round_trips, 0, 2) + (whole & plain)
    codes = np.where(finite, codes, np.where(np.isnan(double), 4,
                                             np.where(double > 0, 5, 6)))
    return _FLOAT_FORMATS[digits][codes], double[finite]


def format_floats(values, digits=9):
    """TF Serving's WriteDecimal of each value of a flat float array, as a list of texts.

    `digits`: the type's max_digits10 (9 for float32, 17 for float64).
    """
    if not len(values):
        return []
    formats, finite = _float_formats(np.asarray(values), digits)
    return ("\n".join(formats.tolist()) % tuple(finite.tolist())).split("\n")


def _closing_counts(shape):
    """For each value (row-major), how many dimensions end after it."""
    total = int(np.prod(shape))
    index = np.arange(1, total + 1)
    counts = np.zeros(total, np.int64)
    for size in np.cumprod(shape[::-1]):
        counts += index % size == 0
    return counts


def _interleave(formats, shape):
    """One %-template of a tensor: the values' formats between brackets and commas."""
    rank = len(shape)
    closing = _closing_counts(shape)
    separators = np.array(["]" * c + ("," + "[" * c) for c in range(rank + 1)])[closing]
    separators[-1] = "]" * rank
    merged = np.empty(2 * len(formats), dtype=object)
    merged[0::2], merged[1::2] = formats, separators
    return "[" * rank + "".join(merged.tolist())


SMALL_VALUES = 256   # up to this many values, Python formats them faster than numpy's setup
_LITERALS = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _small_numeric_text(array):
    """A small numeric tensor (rank >= 1) as JSON text, value by value (same rules)."""
    flat = array.reshape(-1)
    if array.dtype == np.bool_:
        texts = ["true" if v else "false" for v in flat.tolist()]
    elif array.dtype.kind in "iu":
        texts = [str(v) for v in flat.tolist()]
    else:
        kind = np.float64 if array.dtype == np.float64 else np.float32
        digits = "%.17g" if kind is np.float64 else "%.9g"
        texts = []
        for value in flat.astype(kind).tolist():
            text = "%g" % value
            if text in _LITERALS:
                texts.append(_LITERALS[text])
                continue
            if kind(float(text)) != kind(value):
                text = digits % value
            texts.append(text if "." in text or "e" in text else text + ".0")
    for size in reversed(array.shape):
        texts = ["[" + ",".join(texts[i:i + size]) + "]" for i in range(0, len(texts), size)]
    return texts[0]


def _numeric_text(array):
    """A numeric tensor (rank >= 1) as JSON text, built piece by piece of its leading axis."""
    if array.size <= SMALL_VALUES:
        return _small_numeric_text(array)
    rows = array.shape[0]
    per_row = max(int(np.prod(array.shape[1:])), 1)
    step = max(1, PIECE_VALUES // per_row)
    pieces = []
    for start in range(0, rows, step):
        piece = array[start:start + step]
        flat = piece.reshape(-1)
        if array.dtype == np.bool_:
            formats, values = np.where(flat, "true", "false"), ()
        elif array.dtype.kind in "iu":
            formats, values = np.full(len(flat), "%d"), tuple(flat.tolist())
        else:
            digits = 17 if array.dtype == np.float64 else 9
            formats, values = _float_formats(
                flat if array.dtype in (np.float32, np.float64) else flat.astype(np.float32),
                digits)
            values = tuple(values.tolist())
        # The piece as a list of rows: its outer brackets dropped.
        pieces.append(_interleave(formats, piece.shape)[1:-1] % values)
    return "[" + ",".join(pieces) + "]"


def _string_texts(name, array):
    flat = array.reshape(-1).tolist()
    if name.endswith("_bytes"):
        return ['{"b64": "%s"}' % base64.b64encode(v).decode() for v in flat]
    return [json.dumps(v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v)
            for v in flat]


def encode(name, array):
    """A whole tensor as JSON text (a scalar without brackets, as TF Serving writes it)."""
    array = np.asarray(array)
    if array.ndim == 0:
        return encode(name, array.reshape(1))[1:-1]
    if array.size == 0:
        return json.dumps(np.zeros(array.shape).tolist(), separators=(",", ":"))
    if array.dtype == object:
        texts = _string_texts(name, array)
        return _interleave(np.full(len(texts), "%s"), array.shape) % tuple(texts)
    return _numeric_text(array)


def encode_rows(name, array):
    """JSON texts of array[0], array[1], ... (TF Serving's row format, one per instance)."""
    array = np.asarray(array)
    if array.size == 0:
        empty = json.dumps(np.zeros(array.shape[1:]).tolist(), separators=(",", ":"))
        return [empty] * len(array)
    if array.dtype == object:
        texts = _string_texts(name, array)
        if array.ndim == 1:
            return texts
        per_row = int(np.prod(array.shape[1:]))
        template = _interleave(np.full(per_row, "%s"), array.shape[1:])
        return [template % tuple(texts[i:i + per_row]) for i in range(0, len(texts), per_row)]
    text = encode(name, array)[1:-1]
    if array.ndim == 1:
        return text.split(",")
    # Numbers hold no brackets or commas: rows end where every inner dimension closes.
    inner = array.ndim - 1
    return ["[" * inner + part + "]" * inner
            for part in text[inner:-inner].split("]" * inner + "," + "[" * inner)]
