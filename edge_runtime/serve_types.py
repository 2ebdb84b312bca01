"""The serving seam: protocol-neutral Open Inference Protocol (KServe v2) records.

``serve_core`` turns an :class:`InferRequest` into an :class:`InferResponse`
(or raises :class:`ServeError`); ``serve_http`` (Starlette) and ``serve_grpc``
(grpcio) only translate their wire format to and from these records, and map
:attr:`ServeError.status` to their own status codes with the two tables below.
Neither front end runs a model or checks a limit itself.

Imports only the standard library and numpy: ``import edge_runtime`` stays
light, and the server's frameworks load in ``edge-infer serve`` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

# KServe v2 datatype -> numpy dtype; BYTES has none (a list of bytes objects)
DATATYPES: Final[dict[str, Any]] = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}
BYTES: Final = "BYTES"


def datatype_of(arr: np.ndarray) -> str:
    """The v2 datatype name of a numpy array (object/bytes arrays are BYTES)."""
    for name, dt in DATATYPES.items():
        if arr.dtype == np.dtype(dt):
            return name
    return BYTES


@dataclass
class Tensor:
    """One named tensor. ``data`` is a numpy array of ``shape`` for numeric
    datatypes, or a flat list of ``bytes`` (one per element) for BYTES."""

    name: str
    datatype: str
    shape: list[int]
    data: Any
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass
class InferRequest:
    model: str
    version: str | None
    inputs: list[Tensor]
    id: str | None = None
    outputs: list[str] | None = None          # requested output names; None = every output
    parameters: dict[str, Any] = field(default_factory=dict)   # e.g. "timeout" (µs, as tritonclient)
    received_bytes: int = 0                   # the request's size on the wire, for metrics


@dataclass
class InferResponse:
    model_name: str
    model_version: str
    outputs: list[Tensor]
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)   # the structured result's scalar fields


class ServeError(Exception):
    """A request the server refuses or could not answer.

    ``status`` is one of the keys of :data:`HTTP_STATUS`; ``code`` is an
    ``error_codes`` code (the runtime's typed error's code where it came from
    one); the wire body is ``{"error": message, "code": code}``.
    """

    def __init__(self, status: str, message: str, code: str):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code

    def body(self) -> dict[str, str]:
        return {"error": self.message, "code": self.code}


# ServeError.status -> HTTP status code
HTTP_STATUS: Final[dict[str, int]] = {
    "bad_request": 400,      # InputError, malformed request
    "unauthorized": 401,     # missing or wrong bearer token
    "not_found": 404,        # unknown model or version
    "request_timeout": 408,  # the body did not arrive within the read timeout (slow drip)
    "too_large": 413,        # body over the cap
    "overloaded": 429,       # in-flight and queue bounds full
    "internal": 500,         # ours: InferenceRuntimeError, anything unexpected
    "unavailable": 503,      # not ready, draining, device lost
    "timeout": 504,          # InferenceTimeout
}

# ServeError.status -> grpc.StatusCode member name
GRPC_STATUS: Final[dict[str, str]] = {
    "bad_request": "INVALID_ARGUMENT",
    "unauthorized": "UNAUTHENTICATED",
    "not_found": "NOT_FOUND",
    "request_timeout": "DEADLINE_EXCEEDED",
    "too_large": "RESOURCE_EXHAUSTED",
    "overloaded": "RESOURCE_EXHAUSTED",
    "internal": "INTERNAL",
    "unavailable": "UNAVAILABLE",
    "timeout": "DEADLINE_EXCEEDED",
}
