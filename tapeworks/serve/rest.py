"""TensorFlow Serving's REST bodies: predict (row and columnar), classify, regress.

The rules and the error texts follow TF Serving's `util/json_tensor.cc`: a
request has `instances` (rows: one value per instance for a single input,
or one object per instance with every named input) or `inputs` (columns: a
value, or an object of named inputs), never both; `{"b64": "..."}` is
binary data for string inputs; a response answers in the request's format,
without names when there is one output; outputs named `*_bytes` are
base64-encoded. Classify and regress take `examples` (and an optional
`context` merged into each) as tf.train.Example features: whole numbers are
int64, decimals float, strings and b64 objects bytes.
"""

import json

import numpy as np

from tapeworks.serve import json_body
from tapeworks.serve.json_tensor import (check_shape, decode_strings, encode, encode_rows,
                                         format_floats, json_type, short, stack_instances,
                                         to_array)
from tapeworks.serve.servable import CLASSIFY, RequestError

ROW, COLUMNAR = "row", "columnar"


def parse_body(body):
    """(document, signature name) of a request body: TF Serving's ParseJson and FillSignature."""
    document = json_body.parse(body)
    signature = document.get("signature_name", "")
    if not isinstance(signature, str):
        raise RequestError(f"JSON Value: {json_body.snippet(body)} not formatted correctly. "
                           "'signature_name' key must be a string value.")
    return document, signature


def predict_inputs(document, specs, check_shapes=True):
    """({input name: array}, format, rows or None) of a predict request, checked against `specs`."""
    if not specs:
        raise RequestError("Failed to get input map for signature")
    has_rows, has_columns = "instances" in document, "inputs" in document
    if has_rows and has_columns:
        raise RequestError(f"JSON Value: {short(document)} Not formatted correctly expecting "
                           "only one of 'inputs' or 'instances' keys to exist ")
    if has_rows:
        return _rows(document["instances"], specs, document, check_shapes), ROW
    if has_columns:
        return _columns(document["inputs"], specs, check_shapes), COLUMNAR
    raise RequestError("Missing 'inputs' or 'instances' key")


def _is_object(value):
    return isinstance(value, dict) and set(value) != {"b64"}


def _rows(instances, specs, document, check_shapes):
    if not isinstance(instances, list):
        raise RequestError(f"JSON Value: {short(document)} Expecting 'instances' to be an "
                           "list/array")
    if not instances:
        raise RequestError(f"JSON Value: {short(document)} No values in 'instances' array")
    objects = _is_object(instances[0])
    if not objects and len(specs) > 1:
        raise RequestError(
            "instances is a plain list, but expecting list of objects as multiple input "
            f"tensors required as per tensorinfo_map (inputs: {', '.join(sorted(specs))})")
    names = sorted(specs)
    if not objects:
        # One input's values, one per instance: no object may be among them.
        # The types are gathered at C speed; the loop that names the item
        # runs only when there is one (a Python step per row was a quarter
        # of a 250,000-row request's conversion).
        if dict in set(map(type, instances)):
            for index, item in enumerate(instances):
                if _is_object(item):
                    raise RequestError(f"Expecting value/list but got object at item {index} "
                                       "of input list")
        columns = {names[0]: instances}
    else:
        columns = {name: [] for name in names}
        for index, item in enumerate(instances):
            if not _is_object(item):
                raise RequestError(
                    f"Expecting object but got list at item {index} of input list")
            if sorted(item) != names:
                missing = sorted(set(names) - set(item))
                extra = sorted(set(item) - set(names))
                raise RequestError(
                    f"Failed to process element: {index} of 'instances' list. JSON object: "
                    f"{short(item)} keys must be equal to: {','.join(names)}"
                    + (f" (missing: {', '.join(missing)})" if missing else "")
                    + (f" (unknown: {', '.join(extra)})" if extra else ""))
            for name in names:
                columns[name].append(item[name])
    arrays = {}
    for name in names:
        arrays[name] = stack_instances(columns[name], specs[name], name)
        if check_shapes:
            check_shape(arrays[name], specs[name], "'instances'")
    return arrays


def _columns(inputs, specs, check_shapes):
    if not _is_object(inputs):
        if len(specs) > 1:
            raise RequestError(
                "inputs is a plain value/list, but expecting an object as multiple input "
                f"tensors required as per tensorinfo_map (inputs: {', '.join(sorted(specs))})")
        name = next(iter(specs))
        array = to_array(inputs, specs[name], "'inputs'")
        if check_shapes:
            check_shape(array, specs[name], "'inputs'")
        return {name: array}
    arrays = {}
    for name in sorted(specs):
        if name not in inputs:
            raise RequestError(f"Missing named input: {name} in 'inputs' object.")
        arrays[name] = to_array(inputs[name], specs[name], "'inputs'")
        if check_shapes:
            check_shape(arrays[name], specs[name], "'inputs'")
    unknown = sorted(set(inputs) - set(specs))
    if unknown:
        raise RequestError(f"Unknown named input(s): {', '.join(unknown)} in 'inputs' object. "
                           f"Expected: {', '.join(sorted(specs))}.")
    return arrays


def predict_response(outputs, format):
    """The predict response as JSON text, in the request's format."""
    # TF Serving's MakeJsonFromTensors.
    names = sorted(outputs)
    if format == COLUMNAR:
        if len(names) == 1:
            return '{"outputs": %s}' % encode(names[0], outputs[names[0]])
        return '{"outputs": {%s}}' % ", ".join(
            f"{json.dumps(n)}: {encode(n, outputs[n])}" for n in names)
    sizes = {n: (outputs[n].shape[0] if outputs[n].ndim else None) for n in names}
    batch = None
    for name in names:
        if sizes[name] is None:
            raise RequestError(f"Tensor name: {name} has no shape information ")
        if batch is not None and sizes[name] != batch:
            raise RequestError(f"Tensor name: {name} has inconsistent batch size: "
                               f"{sizes[name]} expecting: {batch}")
        batch = sizes[name]
    if len(names) == 1:
        return '{"predictions": %s}' % encode(names[0], outputs[names[0]])
    rows = {n: encode_rows(n, outputs[n]) for n in names}
    keys = [json.dumps(n) for n in names]
    template = "{" + ", ".join(f"{k}: %s" for k in keys) + "}"
    return '{"predictions": [%s]}' % ", ".join(
        template % tuple(rows[n][i] for n in names) for i in range(batch))


# Classify and regress ------------------------------------------------------

def examples(document, method):
    """The request's tf.train.Examples, serialized (context features merged into each)."""
    import tensorflow as tf

    context = document.get("context")
    context_features = _features(context) if context is not None else {}
    if "examples" not in document:
        raise RequestError(f"JSON Value: {short(document)} When method is "
                           f"{'classify' if method == CLASSIFY else 'regress'}, key 'examples' "
                           "is expected and was not found")
    items = document["examples"]
    if not isinstance(items, list):
        raise RequestError(f"JSON Value: {short(document)} Expecting 'examples' value to be "
                           "an list/array")
    if not items:
        raise RequestError(f"JSON Value: {short(document)} 'examples' value is an empty array")
    serialized = []
    for item in items:
        features = _features(item)
        clash = sorted(set(features) & set(context_features))
        if clash:
            raise RequestError(f"Feature(s) {', '.join(clash)} appear in both 'context' and an "
                               "example; context features must not appear in examples.")
        features.update(context_features)
        serialized.append(tf.train.Example(
            features=tf.train.Features(feature=features)).SerializeToString())
    return np.array(serialized, dtype=object)


def _features(value):
    import tensorflow as tf

    if not isinstance(value, dict):
        raise RequestError(f"Example must be JSON object but got JSON {json_type(value)}")
    features = {}
    for name, content in value.items():
        values = content if isinstance(content, list) else [content]
        kinds = set()
        converted = []
        for v in values:
            if isinstance(v, bool):
                kinds.add("int64")
                converted.append(int(v))
            elif isinstance(v, int):
                kinds.add("int64")
                converted.append(v)
            elif isinstance(v, float):
                kinds.add("float")
                converted.append(v)
            elif isinstance(v, str):
                kinds.add("bytes")
                converted.append(v.encode())
            elif isinstance(v, dict) and set(v) == {"b64"}:
                kinds.add("bytes")
                converted.append(decode_strings(v))
            else:
                raise RequestError(f"Feature: {name} has element with unexpected JSON type: "
                                   f"{json_type(v)}")
        if len(kinds) > 1:
            raise RequestError(f"Unexpected element type in feature: {name} (mixed "
                               f"{' and '.join(sorted(kinds))} values)")
        kind = kinds.pop() if kinds else "float"
        features[name] = {
            "int64": lambda c: tf.train.Feature(int64_list=tf.train.Int64List(value=c)),
            "float": lambda c: tf.train.Feature(float_list=tf.train.FloatList(value=c)),
            "bytes": lambda c: tf.train.Feature(bytes_list=tf.train.BytesList(value=c)),
        }[kind](converted)
    return features


def classifications(outputs):
    """[[(label, score), ...] per example] of a classify signature's outputs (REST and gRPC).

    A label is "" without a `classes` output; a score is None without `scores`.
    """
    classes, scores = outputs.get("classes"), outputs.get("scores")
    if classes is None and scores is None:
        raise RequestError("Classification signature has neither 'classes' nor 'scores' "
                           "outputs", 500)
    result = []
    for i in range(len(classes if classes is not None else scores)):
        row_scores = [] if scores is None else np.reshape(scores[i], [-1])
        row_classes = [] if classes is None else np.reshape(classes[i], [-1])
        result.append([
            (row_classes[j].decode("utf-8", errors="replace") if classes is not None else "",
             np.float32(row_scores[j]) if scores is not None else None)
            for j in range(max(len(row_scores), len(row_classes)))])
    return result


def regressions(outputs):
    """A regress signature's values, one per example (its `outputs`: [batch] or [batch, 1])."""
    values = outputs.get("outputs")
    if values is None:
        raise RequestError("Regression signature has no 'outputs' output", 500)
    values = np.asarray(values)
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim != 1:
        raise RequestError(f"Expected output Tensor shape to be [batch_size] or "
                           f"[batch_size, 1] but got {list(values.shape)}", 400)
    return values.astype(np.float32)


def classify_response(outputs):
    """{"results": [[[label, score], ...] per example]} as JSON text (scores as TF Serving
    writes them)."""
    rows = classifications(outputs)
    scores = format_floats(np.array([0.0 if score is None else score for row in rows
                                     for _, score in row], np.float32), 9)
    texts, index = [], 0
    for row in rows:
        pairs = []
        for label, _ in row:
            pairs.append(f"[{json.dumps(label)}, {scores[index]}]")
            index += 1
        texts.append("[" + ", ".join(pairs) + "]")
    return '{"results": [%s]}' % ", ".join(texts)


def regress_response(outputs):
    return '{"results": %s}' % encode("outputs", regressions(outputs))
