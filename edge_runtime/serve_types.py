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

import array
import sys
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


# datatype -> the array-module typecode of the same size on this platform (array's "I"/"q" follow
# C's sizes; FP16 has none: it and any datatype left out go through numpy)
_PACK: Final[dict[str, str]] = {d: c for d, c in (
    ("BOOL", "B"), ("UINT8", "B"), ("UINT16", "H"), ("UINT32", "I"), ("UINT64", "Q"), ("INT8", "b"),
    ("INT16", "h"), ("INT32", "i"), ("INT64", "q"), ("FP32", "f"), ("FP64", "d"))
    if array.array(c).itemsize == np.dtype(DATATYPES[d]).itemsize}


def numeric_bytes(datatype: str, data: Any) -> bytes:
    """A numeric tensor's data, little-endian, row-major: a numpy array, or a flat list of Python
    numbers (what the server builds for a few scalars: no numpy array per output; a float list of
    FP32 holds float32 values, so the packing is exact)."""
    code = _PACK.get(datatype) if type(data) is list else None
    if code is not None:
        packed = array.array(code, [bool(x) for x in data] if datatype == "BOOL" else data)
        if sys.byteorder != "little":
            packed.byteswap()
        return packed.tobytes()
    arr = np.asarray(data, dtype=DATATYPES[datatype])
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def bytes_elements(data: Any) -> list[bytes]:
    """A BYTES tensor's elements, flat and row-major, each as bytes: a list of bytes (what the server
    builds) as it is; a numpy array of any shape (a model's text output: object, str or bytes elements)
    flattened, a str as its UTF-8. Iterating a 2-D object array gave rows, and ``bytes(row)`` the
    row's memory: pointers went out as an answer."""
    if type(data) is list and all(type(x) is bytes for x in data):
        return data
    out = []
    for x in (np.asarray(data, dtype=object).reshape(-1) if isinstance(data, np.ndarray) else data):
        if isinstance(x, str):
            out.append(x.encode("utf-8"))
        elif isinstance(x, (bytes, bytearray, memoryview)):
            out.append(bytes(x))
        else:
            raise TypeError(f"a BYTES element is {type(x).__name__}, not text or bytes")
    return out


def list_values(datatype: str, data: list) -> list:
    """A flat list's values as its datatype holds them (FP32: rounded to float32, as the binary form
    and a numpy array of the datatype would; FP16: through numpy), for the JSON form."""
    if datatype == "FP32":
        return array.array("f", data).tolist()
    if datatype == "FP16":
        return np.asarray(data, dtype=np.float16).tolist()
    return data


@dataclass
class Tensor:
    """One named tensor. ``data`` is, for numeric datatypes, a numpy array of ``shape`` or a flat
    list of Python numbers in row-major order (``numeric_bytes`` packs either); for BYTES, a flat
    list of ``bytes`` (one per element)."""

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
    classification: dict[str, int] = field(default_factory=dict)   # output -> classes asked (the extension)
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


def bearer_matches(given: bytes | str | None, token: bytes | None) -> bool:
    """Whether an ``Authorization`` value carries ``token`` as Bearer credentials (RFC 6750): the
    scheme's case is free (RFC 7235), the credentials are compared in constant time. ``token``
    None: no token is required."""
    import hmac

    if token is None:
        return True
    if isinstance(given, str):
        given = given.encode("latin-1", "replace")
    scheme, _, credentials = (given or b"").strip().partition(b" ")
    ok_scheme = scheme.lower() == b"bearer"
    return hmac.compare_digest(credentials.lstrip(b" "), token) and ok_scheme
