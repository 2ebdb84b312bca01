"""The KServe v2 (Open Inference Protocol) gRPC messages, built at run time.

The messages of ``inference.GRPCInferenceService`` that ``serve_grpc`` serves
(ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata,
ModelInfer), with the package, names and field numbers of KServe's
``grpc_predict_v2.proto`` / Triton's ``grpc_service.proto``, so the real
``tritonclient.grpc`` talks to them unchanged.

They live in a PRIVATE ``descriptor_pool.DescriptorPool``, built from a
``FileDescriptorProto`` written here in code: no protoc, no generated module,
and no clash with ``tritonclient.grpc``'s own ``inference.*`` symbols in the
default pool (a second generated module fails with ``duplicate symbol
'inference.ServerLiveRequest'``).

Imported only by ``serve_grpc`` (``edge-infer serve --grpc-port``): protobuf
is an optional dependency (the ``grpc`` extra).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Final

PACKAGE: Final = "inference"
SERVICE: Final = "GRPCInferenceService"
SERVICE_FULL_NAME: Final = f"{PACKAGE}.{SERVICE}"
FILE_NAME: Final = "edge_runtime/grpc_predict_v2.proto"

# the RPCs we serve: method -> (request message, response message)
METHODS: Final[dict[str, tuple[str, str]]] = {
    "ServerLive": ("ServerLiveRequest", "ServerLiveResponse"),
    "ServerReady": ("ServerReadyRequest", "ServerReadyResponse"),
    "ModelReady": ("ModelReadyRequest", "ModelReadyResponse"),
    "ServerMetadata": ("ServerMetadataRequest", "ServerMetadataResponse"),
    "ModelMetadata": ("ModelMetadataRequest", "ModelMetadataResponse"),
    "ModelInfer": ("ModelInferRequest", "ModelInferResponse"),
}

# field spec: (name, number, type, repeated, message type name or "")
_F = tuple[str, int, str, bool, str]
_PARAMS_MAP: Final = "map<InferParameter>"      # a map<string, InferParameter> field

# message name -> (fields, nested messages); nested names are relative to their parent.
# Numbers from grpc_service.proto (Triton) = grpc_predict_v2.proto (KServe).
_MESSAGES: Final[dict[str, list[_F]]] = {
    "ServerLiveRequest": [],
    "ServerLiveResponse": [("live", 1, "bool", False, "")],
    "ServerReadyRequest": [],
    "ServerReadyResponse": [("ready", 1, "bool", False, "")],
    "ModelReadyRequest": [("name", 1, "string", False, ""), ("version", 2, "string", False, "")],
    "ModelReadyResponse": [("ready", 1, "bool", False, "")],
    "ServerMetadataRequest": [],
    "ServerMetadataResponse": [
        ("name", 1, "string", False, ""), ("version", 2, "string", False, ""),
        ("extensions", 3, "string", True, "")],
    "ModelMetadataRequest": [("name", 1, "string", False, ""), ("version", 2, "string", False, "")],
    "ModelMetadataResponse": [
        ("name", 1, "string", False, ""), ("versions", 2, "string", True, ""),
        ("platform", 3, "string", False, ""),
        ("inputs", 4, "message", True, ".inference.ModelMetadataResponse.TensorMetadata"),
        ("outputs", 5, "message", True, ".inference.ModelMetadataResponse.TensorMetadata")],
    "ModelMetadataResponse.TensorMetadata": [
        ("name", 1, "string", False, ""), ("datatype", 2, "string", False, ""),
        ("shape", 3, "int64", True, "")],
    "InferParameter": [  # all five in the oneof parameter_choice
        ("bool_param", 1, "bool", False, ""), ("int64_param", 2, "int64", False, ""),
        ("string_param", 3, "string", False, ""), ("double_param", 4, "double", False, ""),
        ("uint64_param", 5, "uint64", False, "")],
    "InferTensorContents": [
        ("bool_contents", 1, "bool", True, ""), ("int_contents", 2, "int32", True, ""),
        ("int64_contents", 3, "int64", True, ""), ("uint_contents", 4, "uint32", True, ""),
        ("uint64_contents", 5, "uint64", True, ""), ("fp32_contents", 6, "float", True, ""),
        ("fp64_contents", 7, "double", True, ""), ("bytes_contents", 8, "bytes", True, "")],
    "ModelInferRequest": [
        ("model_name", 1, "string", False, ""), ("model_version", 2, "string", False, ""),
        ("id", 3, "string", False, ""), ("parameters", 4, _PARAMS_MAP, True, ""),
        ("inputs", 5, "message", True, ".inference.ModelInferRequest.InferInputTensor"),
        ("outputs", 6, "message", True, ".inference.ModelInferRequest.InferRequestedOutputTensor"),
        ("raw_input_contents", 7, "bytes", True, "")],
    "ModelInferRequest.InferInputTensor": [
        ("name", 1, "string", False, ""), ("datatype", 2, "string", False, ""),
        ("shape", 3, "int64", True, ""), ("parameters", 4, _PARAMS_MAP, True, ""),
        ("contents", 5, "message", False, ".inference.InferTensorContents")],
    "ModelInferRequest.InferRequestedOutputTensor": [
        ("name", 1, "string", False, ""), ("parameters", 2, _PARAMS_MAP, True, "")],
    "ModelInferResponse": [
        ("model_name", 1, "string", False, ""), ("model_version", 2, "string", False, ""),
        ("id", 3, "string", False, ""), ("parameters", 4, _PARAMS_MAP, True, ""),
        ("outputs", 5, "message", True, ".inference.ModelInferResponse.InferOutputTensor"),
        ("raw_output_contents", 6, "bytes", True, "")],
    "ModelInferResponse.InferOutputTensor": [
        ("name", 1, "string", False, ""), ("datatype", 2, "string", False, ""),
        ("shape", 3, "int64", True, ""), ("parameters", 4, _PARAMS_MAP, True, ""),
        ("contents", 5, "message", False, ".inference.InferTensorContents")],
}


def _file_proto() -> Any:
    from google.protobuf import descriptor_pb2

    fdp = descriptor_pb2.FileDescriptorProto(name=FILE_NAME, package=PACKAGE, syntax="proto3")
    F = descriptor_pb2.FieldDescriptorProto
    built: dict[str, Any] = {}
    for full, fields in _MESSAGES.items():            # parents come before their nested messages
        parent, _, leaf = full.rpartition(".")
        msg = (built[parent].nested_type if parent else fdp.message_type).add(name=leaf)
        built[full] = msg
        if full == "InferParameter":
            msg.oneof_decl.add(name="parameter_choice")
        for name, number, ftype, repeated, type_name in fields:
            fld = msg.field.add(name=name, number=number, json_name=_camel(name),
                                label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
            if full == "InferParameter":
                fld.oneof_index = 0
            if ftype == _PARAMS_MAP:
                entry = msg.nested_type.add(name="ParametersEntry")
                entry.options.map_entry = True
                entry.field.add(name="key", number=1, json_name="key", type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
                entry.field.add(name="value", number=2, json_name="value", type=F.TYPE_MESSAGE,
                                label=F.LABEL_OPTIONAL, type_name=".inference.InferParameter")
                fld.type = F.TYPE_MESSAGE
                fld.type_name = f".{PACKAGE}.{full}.ParametersEntry"
            else:
                fld.type = getattr(F, "TYPE_" + ftype.upper())
                if type_name:
                    fld.type_name = type_name
    svc = fdp.service.add(name=SERVICE)
    for method, (req, resp) in METHODS.items():
        svc.method.add(name=method, input_type=f".{PACKAGE}.{req}", output_type=f".{PACKAGE}.{resp}")
    return fdp


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


@lru_cache(maxsize=1)
def _pool() -> Any:
    from google.protobuf import descriptor_pool

    pool = descriptor_pool.DescriptorPool()        # private: never the default pool
    pool.Add(_file_proto())
    return pool


@lru_cache(maxsize=None)
def message_class(name: str) -> Any:
    """The generated class of ``inference.<name>`` (e.g. ``"ModelInferRequest"``)
    from the private pool; nested messages as ``"ModelInferRequest.InferInputTensor"``."""
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(f"{PACKAGE}.{name}"))


def service_descriptor() -> Any:
    """The ``inference.GRPCInferenceService`` descriptor from the private pool."""
    return _pool().FindServiceByName(SERVICE_FULL_NAME)


def method_path(method: str) -> str:
    """The HTTP/2 path of an RPC, e.g. ``/inference.GRPCInferenceService/ModelInfer``."""
    return f"/{SERVICE_FULL_NAME}/{method}"
