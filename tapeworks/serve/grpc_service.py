"""TensorFlow Serving's gRPC API (`PredictionService`, `ModelService`) over the same models.

The messages and service stubs are TF Serving's own, from the
`tensorflow-serving-api` package, so existing gRPC clients work unchanged:
Predict (with `output_filter`), Classify, Regress, GetModelMetadata and
GetModelStatus. Requests go through the REST side's manager and batchers
(`ServingApp.run_model`): a gRPC and a REST request to the same signature
share batches. Errors carry TF Serving's status codes (INVALID_ARGUMENT,
NOT_FOUND, UNAVAILABLE when a queue is full); the version that answered is
in the response's `model_spec`, as TF Serving does.
"""

import grpc
import numpy as np

from tapeworks.serve import rest, tensor_proto
from tapeworks.serve.batching import QueueFull
from tapeworks.serve.json_tensor import check_shape
from tapeworks.serve.servable import CLASSIFY, DEFAULT_SIGNATURE, REGRESS, RequestError

_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
          413: grpc.StatusCode.RESOURCE_EXHAUSTED, 500: grpc.StatusCode.INTERNAL,
          503: grpc.StatusCode.UNAVAILABLE}


def _spec(model_spec):
    version = model_spec.version.value if model_spec.HasField("version") else None
    return model_spec.name, version, model_spec.version_label or None


async def _abort(context, error):
    await context.abort(_CODES.get(error.status, grpc.StatusCode.UNKNOWN), str(error))


def build_services(serving):
    """(PredictionService servicer, ModelService servicer) for a `ServingApp`."""
    import tensorflow as tf
    from google.protobuf import any_pb2
    from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2,
                                         get_model_status_pb2, model_service_pb2_grpc,
                                         predict_pb2, prediction_service_pb2_grpc,
                                         regression_pb2)

    manager = serving.manager

    def resolve(model_spec):
        name, version, label = _spec(model_spec)
        if not name:
            raise RequestError("Missing model name in request.")
        return manager.get(name).resolve(version, label)

    def answered_spec(response, servable, signature):
        response.model_spec.name = servable.name
        response.model_spec.version.value = servable.version
        response.model_spec.signature_name = signature

    async def guarded(context, call):
        try:
            return await call()
        except RequestError as error:
            await _abort(context, error)
        except QueueFull:
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"The queue is full ({serving.settings.max_queue} requests "
                                "waiting). Retry after a moment.")

    async def examples_call(request, context, method):
        servable = resolve(request.model_spec)
        key = servable.example_signature(request.model_spec.signature_name, method)
        which = request.input.WhichOneof("kind")
        if which == "example_list_with_context":
            listed = request.input.example_list_with_context
            serialized = []
            for example in listed.examples:
                merged = tf.train.Example()
                merged.CopyFrom(example)
                merged.MergeFrom(listed.context)
                serialized.append(merged.SerializeToString())
        elif which == "example_list":
            serialized = [e.SerializeToString() for e in request.input.example_list.examples]
        else:
            raise RequestError("Input is empty: expected example_list or "
                               "example_list_with_context.")
        if not serialized:
            raise RequestError("Input is empty: no examples.")
        outputs = await serving.run_model(servable, key,
                                          {"inputs": np.array(serialized, dtype=object)})
        return servable, key, outputs

    class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
        async def Predict(self, request, context):
            async def call():
                servable = resolve(request.model_spec)
                key = request.model_spec.signature_name or DEFAULT_SIGNATURE
                servable.signature(key)
                specs = servable.specs[key]
                missing = sorted(set(specs) - set(request.inputs))
                unknown = sorted(set(request.inputs) - set(specs))
                if missing or unknown:
                    raise RequestError(
                        f"input tensor alias not found in signature: "
                        f"{', '.join(unknown) or '-'}; missing: {', '.join(missing) or '-'}. "
                        f"Inputs requested must be: {', '.join(sorted(specs))}.")
                inputs = {}
                for name, proto in request.inputs.items():
                    array = tensor_proto.to_array(proto, name, serving.settings.max_body_bytes)
                    if tf.dtypes.as_dtype(proto.dtype) != specs[name].dtype:
                        raise RequestError(
                            f"Expects arg[{name}] to be {specs[name].dtype.name} but "
                            f"{tf.dtypes.as_dtype(proto.dtype).name} is provided")
                    if servable.checks_shapes:
                        check_shape(array, specs[name], "request")
                    inputs[name] = array
                outputs = await serving.run_model(servable, key, inputs)
                wanted = list(request.output_filter) or sorted(outputs)
                bad = sorted(set(wanted) - set(outputs))
                if bad:
                    raise RequestError(f"output tensor alias not found in signature: "
                                       f"{', '.join(bad)}")
                response = predict_pb2.PredictResponse()
                answered_spec(response, servable, key)
                for name in wanted:
                    response.outputs[name].CopyFrom(tf.make_tensor_proto(outputs[name]))
                return response

            return await guarded(context, call)

        async def Classify(self, request, context):
            async def call():
                servable, key, outputs = await examples_call(request, context, CLASSIFY)
                response = classification_pb2.ClassificationResponse()
                answered_spec(response, servable, key)
                for row in rest.classifications(outputs):
                    classification = response.result.classifications.add()
                    for label, score in row:
                        item = classification.classes.add(label=label)
                        if score is not None:
                            item.score = float(score)
                return response

            return await guarded(context, call)

        async def Regress(self, request, context):
            async def call():
                servable, key, outputs = await examples_call(request, context, REGRESS)
                response = regression_pb2.RegressionResponse()
                answered_spec(response, servable, key)
                for value in rest.regressions(outputs):
                    response.result.regressions.add().value = float(value)
                return response

            return await guarded(context, call)

        async def GetModelMetadata(self, request, context):
            async def call():
                if list(request.metadata_field) != ["signature_def"]:
                    raise RequestError("Metadata field(s) other than signature_def are not "
                                       f"supported: {list(request.metadata_field)}")
                servable = resolve(request.model_spec)
                response = get_model_metadata_pb2.GetModelMetadataResponse()
                answered_spec(response, servable, "")
                signatures = get_model_metadata_pb2.SignatureDefMap()
                for key, definition in servable.meta_graph.signature_def.items():
                    signatures.signature_def[key].CopyFrom(definition)
                packed = any_pb2.Any()
                packed.Pack(signatures)
                response.metadata["signature_def"].CopyFrom(packed)
                return response

            return await guarded(context, call)

        async def MultiInference(self, request, context):
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                "MultiInference is not served by tapeworks serve.")

    class ModelService(model_service_pb2_grpc.ModelServiceServicer):
        async def GetModelStatus(self, request, context):
            async def call():
                name, version, label = _spec(request.model_spec)
                status = manager.status(name, version, label)
                response = get_model_status_pb2.GetModelStatusResponse()
                states = get_model_status_pb2.ModelVersionStatus.State
                for entry in status["model_version_status"]:
                    item = response.model_version_status.add()
                    item.version = int(entry["version"])
                    item.state = states.Value(entry["state"])
                    ok = entry["status"]["error_code"] == "OK"
                    item.status.error_code = 0 if ok else 2   # OK, or UNKNOWN
                    item.status.error_message = entry["status"]["error_message"]
                return response

            return await guarded(context, call)

        async def HandleReloadConfigRequest(self, request, context):
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                "Reload the config by editing it (the server polls it) or by "
                                "promoting in the registry.")

    return PredictionService(), ModelService()


def _handlers(service, servicer, methods):
    """A generic handler of `service` whose methods parse their own request bytes.

    The generated `add_*Servicer_to_server` hands gRPC each request class's
    `FromString`, and a body that does not parse then fails inside gRPC as
    UNKNOWN with protobuf's `DecodeError` text. Here the bytes come to the
    method as they are, and a body that does not parse is INVALID_ARGUMENT,
    as every other bad request.
    """
    from google.protobuf import message

    def handler(name, request_class, response_class):
        method = getattr(servicer, name)

        async def parse_then_call(raw, context):
            try:
                request = request_class.FromString(raw)
            except (message.DecodeError, RecursionError) as error:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"Could not parse the {request_class.__name__} ({error}). Expected the "
                    f"serialized {request_class.DESCRIPTOR.full_name} of TF Serving's API.")
            return await method(request, context)

        return grpc.unary_unary_rpc_method_handler(
            parse_then_call, request_deserializer=None,
            response_serializer=response_class.SerializeToString)

    return grpc.method_handlers_generic_handler(
        service, {name: handler(name, *classes) for name, classes in methods.items()})


async def start(serving, host, port):
    """A started grpc.aio server on host:port with both services."""
    from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2,
                                         get_model_status_pb2, inference_pb2,
                                         model_management_pb2, predict_pb2, regression_pb2)

    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", serving.settings.max_body_bytes)])
    prediction, models = build_services(serving)
    server.add_generic_rpc_handlers((
        _handlers("tensorflow.serving.PredictionService", prediction, {
            "Classify": (classification_pb2.ClassificationRequest,
                         classification_pb2.ClassificationResponse),
            "Regress": (regression_pb2.RegressionRequest, regression_pb2.RegressionResponse),
            "Predict": (predict_pb2.PredictRequest, predict_pb2.PredictResponse),
            "MultiInference": (inference_pb2.MultiInferenceRequest,
                               inference_pb2.MultiInferenceResponse),
            "GetModelMetadata": (get_model_metadata_pb2.GetModelMetadataRequest,
                                 get_model_metadata_pb2.GetModelMetadataResponse)}),
        _handlers("tensorflow.serving.ModelService", models, {
            "GetModelStatus": (get_model_status_pb2.GetModelStatusRequest,
                               get_model_status_pb2.GetModelStatusResponse),
            "HandleReloadConfigRequest": (model_management_pb2.ReloadConfigRequest,
                                          model_management_pb2.ReloadConfigResponse)}),
    ))
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"cannot listen for gRPC on {host}:{port}")
    await server.start()
    return server
