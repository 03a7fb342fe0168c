"""TensorFlow Serving's SavedModel warm-up file: `assets.extra/tf_serving_warmup_requests`.

A TFRecord of `PredictionLog`s (TF Serving's own message, from the optional
`tensorflow-serving-api`): requests replayed once when a version loads, so
the first real request does not pay TensorFlow's lazy initialisation. TF
Serving refuses more than 1,000 records, and so does this. `write` makes the
file from example inputs (the registry does, when it exports a Keras model
with a `sample`), so TF Serving and `tapeworks serve` warm up on real inputs.
"""

import os

import numpy as np

FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
MAX_RECORDS = 1000


def available():
    try:
        from tensorflow_serving.apis import prediction_log_pb2  # noqa: F401
    except ImportError:
        return False
    return True


def write(saved_model_dir, inputs, signature="serving_default", rows=1):
    """Writes one predict request per group of `rows` examples of `inputs` ({name: array})."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    path = os.path.join(saved_model_dir, FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    count = len(next(iter(inputs.values())))
    written = 0
    with tf.io.TFRecordWriter(path) as writer:
        for start in range(0, count, rows):
            request = predict_pb2.PredictRequest()
            request.model_spec.signature_name = signature
            for name, array in inputs.items():
                request.inputs[name].CopyFrom(tf.make_tensor_proto(array[start:start + rows]))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
            written += 1
            if written == MAX_RECORDS:
                break
    return written


def read(saved_model_dir):
    """[(method, signature name, inputs)] of the file's requests; [] when there is none.

    Raises ValueError for a file over 1,000 records, or one that cannot be
    read without `tensorflow-serving-api` (TF Serving would not load it).
    """
    path = os.path.join(saved_model_dir, FILE)
    if not os.path.isfile(path):
        return []
    if not available():
        raise ValueError(f"{path} holds TF Serving warm-up requests; reading them needs "
                         "tensorflow-serving-api. Fix: pip install 'tapeworks[grpc]'.")
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    requests = []
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        if len(requests) == MAX_RECORDS:
            raise ValueError(f"{path} has more than {MAX_RECORDS} warm-up records "
                             "(TF Serving's limit).")
        log = prediction_log_pb2.PredictionLog.FromString(record)
        kind = log.WhichOneof("log_type")
        if kind == "predict_log":
            request = log.predict_log.request
            requests.append(("predict", request.model_spec.signature_name,
                             {k: tf.make_ndarray(v) for k, v in request.inputs.items()}))
        elif kind in ("classify_log", "regress_log"):
            request = getattr(log, kind).request
            listed = request.input.example_list.examples or \
                request.input.example_list_with_context.examples
            requests.append((kind.split("_")[0], request.model_spec.signature_name,
                             {"inputs": np.array([e.SerializeToString() for e in listed],
                                                 dtype=object)}))
        else:
            raise ValueError(f"{path}: warm-up record of kind {kind!r} is not replayed "
                             "(predict, classify and regress are).")
    return requests
