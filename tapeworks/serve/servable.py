"""One loaded model version: its SavedModel's signatures, called with checked inputs.

Only SavedModel graphs are loaded (`tf.saved_model.load`: no pickles, no
Python code from the model folder), Keras exports and TF1-style graphs alike
(signature input keys such as `x` over tensors named `x:0`). The signature
definitions are read from `saved_model.pb` itself, so `metadata` answers
exactly what TensorFlow Serving answers for the same folder. A graph with
ops that act on files, processes or the network is refused before it is
loaded, unless the server allows them (`tapeworks.deploy.graph_ops`).
"""

import os

import numpy as np

PREDICT = "tensorflow/serving/predict"
CLASSIFY = "tensorflow/serving/classify"
REGRESS = "tensorflow/serving/regress"
DEFAULT_SIGNATURE = "serving_default"


class RequestError(Exception):
    """A request TensorFlow Serving answers with an error; `status` is the HTTP code."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


class InputSpec:
    def __init__(self, name, dtype, shape, tensor_name):
        self.name, self.dtype, self.shape, self.tensor_name = name, dtype, shape, tensor_name

    @property
    def is_string(self):
        return self.dtype.name == "string"

    def describe(self):
        shape = "unknown rank" if self.shape is None else \
            "[" + ", ".join("-1" if d is None else str(d) for d in self.shape) + "]"
        return f"{self.dtype.name} of shape {shape}"


def _meta_graph(path):
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    for graph in saved.meta_graphs:
        if "serve" in graph.meta_info_def.tags:
            return graph
    raise RequestError(f"{path} has no MetaGraph tagged 'serve'.", 500)


class IntegrityError(Exception):
    pass


def _check_recorded_hash(path):
    """A version the registry published must still be what it published (its content hash)."""
    from tapeworks.deploy.registry import content_hash, recorded as record_of

    # Nothing to compare in a folder the registry did not publish (TF Serving's way).
    recorded = record_of(path).get("sha256")
    if recorded and content_hash(path) != recorded:
        raise IntegrityError(
            f"{path} no longer matches the content hash recorded when it was published "
            f"({recorded[:12]}...): a file was changed or damaged since. Not loaded. Fix: "
            "publish the model again.")


class Servable:
    """A SavedModel version, loaded and ready to call."""

    def __init__(self, name, version, path, allow_ops=()):
        import tensorflow as tf

        from tapeworks.deploy.graph_ops import check_ops

        self.name, self.version, self.path = name, version, path
        _check_recorded_hash(path)
        # Before anything runs: a graph that acts on files, processes or the
        # network is not loaded (graph_ops: the trust model).
        check_ops(path, allow_ops)
        self.meta_graph = _meta_graph(path)
        self.loaded = tf.saved_model.load(path, tags=["serve"])
        self.functions = dict(self.loaded.signatures)
        # A TF2 SavedModel's signatures are functions with input signatures,
        # which refuse other shapes: checked first, for a message that names
        # the input. A TF1 graph's are not (TensorFlow Serving feeds any
        # shape the graph's ops accept, and so does this): TF1 SavedModels
        # carry no object graph.
        self.checks_shapes = len(self.meta_graph.object_graph_def.nodes) > 0
        self.specs = {}
        for key, signature in self.meta_graph.signature_def.items():
            self.specs[key] = {
                k: InputSpec(k, tf.dtypes.as_dtype(info.dtype),
                             None if info.tensor_shape.unknown_rank else
                             [None if d.size < 0 else d.size for d in info.tensor_shape.dim],
                             info.name)
                for k, info in signature.inputs.items()}
        # Read per request on the serving path: decided once, from the signature defs.
        self._batchable = {}
        for key, signature in self.meta_graph.signature_def.items():
            infos = list(signature.inputs.values()) + list(signature.outputs.values())
            self._batchable[key] = bool(signature.inputs) and all(
                not i.tensor_shape.unknown_rank and i.tensor_shape.dim
                and i.tensor_shape.dim[0].size < 0 for i in infos)

    # What a signature is -------------------------------------------------

    def signature(self, name, method=None):
        """(signature_def, function) for `name` ("" means serving_default); checks its method."""
        key = name or DEFAULT_SIGNATURE
        if key not in self.meta_graph.signature_def or key not in self.functions:
            raise RequestError(f"Serving signature name: \"{key}\" not found in signature def")
        signature = self.meta_graph.signature_def[key]
        if method is not None and signature.method_name != method:
            kind = {CLASSIFY: "classification", REGRESS: "regression"}[method]
            raise RequestError(f"Expected {kind} signature method_name to be {method}. Was: "
                               f"{signature.method_name}")
        return signature, self.functions[key]

    def example_signature(self, name, method):
        """The key of signature `name` for classify/regress, checked to take serialized Examples."""
        self.signature(name, method)
        key = name or DEFAULT_SIGNATURE
        specs = self.specs[key]
        if list(specs) != ["inputs"] or not specs["inputs"].is_string:
            verb = "classify" if method == CLASSIFY else "regress"
            raise RequestError(
                f"Signature '{key}' cannot take {verb} requests: expected one input Tensor "
                f"named 'inputs' of serialized tf.Examples (string); it has "
                f"{', '.join(f'{k} ({s.describe()})' for k, s in specs.items())}. Fix: "
                "call :predict with this signature.")
        return key

    def batchable(self, key):
        """Whether requests to signature `key` can be stacked along a leading batch dimension."""
        return self._batchable[key]

    def metadata(self):
        """TF Serving's GetModelMetadataResponse, as its REST API writes it."""
        from google.protobuf import json_format

        signatures = {k: json_format.MessageToDict(v, preserving_proto_field_name=True,
                                                   always_print_fields_with_no_presence=True)
                      for k, v in self.meta_graph.signature_def.items()}
        return {"model_spec": {"name": self.name, "signature_name": "",
                               "version": str(self.version)},
                "metadata": {"signature_def": {"signature_def": signatures}}}

    # Calling ---------------------------------------------------------------

    def run(self, key, inputs):
        """Calls signature `key` on {input name: numpy array}; returns {output name: numpy}."""
        import tensorflow as tf

        function = self.functions[key]
        outputs = function(**{k: tf.constant(v, dtype=self.specs[key][k].dtype)
                              for k, v in inputs.items()})
        return {k: v.numpy() for k, v in outputs.items()}

    def warm_up(self, batch_sizes=(1,)):
        """Replays the version's TF Serving warm-up requests, or feeds zeros; returns which.

        With `assets.extra/tf_serving_warmup_requests` (TF Serving's format),
        each of its requests runs once, as TF Serving does. Without, every
        numeric, batchable signature runs once per batch size on zeros of its
        shape (TensorFlow's and oneDNN's per-shape caches).
        """
        from tapeworks.serve import warmup

        requests = warmup.read(self.path)
        if requests:
            for _, signature, inputs in requests:
                key = signature or DEFAULT_SIGNATURE
                if key not in self.functions:
                    raise ValueError(f"warm-up request for signature {key!r}, which the model "
                                     "does not have")
                self.run(key, inputs)
            return f"{len(requests)} TF Serving warm-up request(s)"
        for key, specs in self.specs.items():
            if key not in self.functions or not self.batchable(key):
                continue
            if any(s.is_string or s.shape is None or None in s.shape[1:]
                   for s in specs.values()):
                continue
            for size in batch_sizes:
                self.run(key, {k: np.zeros([size] + s.shape[1:], s.dtype.as_numpy_dtype)
                               for k, s in specs.items()})
        return "zeros of each signature's shape"
