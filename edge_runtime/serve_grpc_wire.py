"""The KServe v2 gRPC messages <-> the protocol-neutral records (``serve_types``) of ``serve_grpc``:
a ``ModelInferRequest``'s tensors (``raw_input_contents`` or typed contents, BYTES length-prefixed)
to an ``InferRequest``, an ``InferResponse`` to ``raw_output_contents``, parameters both ways. Every
malformed message is a ``bad_request`` (``serve_request_malformed``), never a crash."""

from __future__ import annotations

import json
import struct
from typing import Any, Final

import numpy as np

from . import error_codes as ec
from . import serve_proto as sp
from .serve_output_params import GRPC_OUTPUT_PARAMETERS, classification_count, refuse_shared_memory
from .serve_tensors import MAX_DIMS, shape_count
from .serve_types import (BYTES, DATATYPES, InferRequest, InferResponse, ServeError, Tensor, bytes_elements,
                          numeric_bytes)
from .serve_wire import MAX_BYTES_ELEMENTS, check_bool_bytes

# datatype -> the InferTensorContents field that carries it (FP16 has none: raw only)
_CONTENTS_FIELD: Final[dict[str, str]] = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", BYTES: "bytes_contents",
}
_ALL_CONTENTS: Final = tuple(sorted(set(_CONTENTS_FIELD.values())))
# datatypes narrower than their contents field (int32 / uint32): range-checked, never wrapped
_NARROW: Final = frozenset({"INT8", "INT16", "UINT8", "UINT16"})
_LEN: Final = struct.Struct("<I")


def _bad(message: str) -> ServeError:
    return ServeError("bad_request", message, ec.SERVE_REQUEST_MALFORMED)


# -- wire -> records ---------------------------------------------------------------------------------

def param_value(p: Any) -> Any:
    """An ``InferParameter`` as a Python value (None when unset)."""
    which = p.WhichOneof("parameter_choice")
    return getattr(p, which) if which else None


def _set_param(p: Any, value: Any) -> None:
    if isinstance(value, (bool, np.bool_)):
        p.bool_param = bool(value)
    elif isinstance(value, (int, np.integer)):
        v = int(value)
        if v >= 2 ** 63:
            p.uint64_param = v
        else:
            p.int64_param = v
    elif isinstance(value, (float, np.floating)):
        p.double_param = float(value)
    elif isinstance(value, str):
        p.string_param = value
    else:                                    # lists, dicts (top_k, boxes...): JSON text
        p.string_param = json.dumps(value, default=_json_default, separators=(",", ":"))


def _json_default(o: Any) -> Any:
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, bytes):
        return o.decode("utf-8", "replace")
    return str(o)


def _shape(t: Any) -> list[int]:
    shape = [int(d) for d in t.shape]
    if len(shape) > MAX_DIMS or any(d < 0 for d in shape):
        raise _bad(f"input {t.name!r}: shape {shape} is not a static non-negative shape of <= {MAX_DIMS} dims")
    return shape


def split_bytes(raw: bytes, count: int, name: str) -> list[bytes]:
    """A raw BYTES tensor (4-byte LE length + data per element) as ``count`` elements."""
    out: list[bytes] = []
    pos, end = 0, len(raw)
    view = memoryview(raw)
    while pos < end:
        if end - pos < 4 or len(out) >= count:
            raise _bad(f"input {name!r}: BYTES data does not hold {count} length-prefixed element(s)")
        (n,) = _LEN.unpack_from(raw, pos)
        pos += 4
        if n > end - pos:
            raise _bad(f"input {name!r}: a BYTES element's length {n} runs past the data")
        out.append(bytes(view[pos:pos + n]))
        pos += n
    if len(out) != count:
        raise _bad(f"input {name!r}: {len(out)} BYTES element(s) for a shape of {count}")
    return out


def join_bytes(items: list[Any]) -> bytes:
    """BYTES elements (bytes or str) in Triton's raw form."""
    parts: list[bytes] = []
    for item in items:
        b = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts.append(_LEN.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


def _tensor(t: Any, raw: bytes | None) -> Tensor:
    name, datatype = t.name, t.datatype
    shape = _shape(t)
    count = shape_count(f"input {name!r}", shape)
    if datatype == BYTES and count > MAX_BYTES_ELEMENTS:   # as over HTTP: before a Python loop splits them
        raise _bad(f"input {name!r}: {count} BYTES elements, over the server's {MAX_BYTES_ELEMENTS}")
    params = {k: param_value(v) for k, v in t.parameters.items()}
    refuse_shared_memory(f"input {name!r}", params)
    if datatype != BYTES and datatype not in DATATYPES:
        raise _bad(f"input {name!r}: unknown datatype {datatype!r}")
    if raw is None:
        field = _CONTENTS_FIELD.get(datatype)
        if field is None:
            raise _bad(f"input {name!r}: {datatype} data must come in raw_input_contents")
        values = getattr(t.contents, field)
        if len(values) != count:
            raise _bad(f"input {name!r}: {len(values)} element(s) in contents for shape {shape}")
        other = [f for f in _ALL_CONTENTS if f != field and len(getattr(t.contents, f))]
        if other:                  # as Triton: data in another datatype's field is never dropped in silence
            raise _bad(f"input {name!r}: {datatype} data goes in contents.{field}, not {', '.join(other)}")
        if datatype == BYTES:
            return Tensor(name, datatype, shape, list(values), params)
        if datatype in _NARROW:   # int_contents / uint_contents are 32-bit: INT8 300 is no INT8 (was a 500)
            wide = np.asarray(values, dtype=np.int64)
            info = np.iinfo(DATATYPES[datatype])
            if wide.size and (int(wide.min()) < info.min or int(wide.max()) > info.max):
                raise _bad(f"input {name!r}: values outside {datatype} in contents.{field}")
            return Tensor(name, datatype, shape, wide.astype(DATATYPES[datatype]).reshape(shape), params)
        return Tensor(name, datatype, shape, np.asarray(values, dtype=DATATYPES[datatype]).reshape(shape), params)
    if t.HasField("contents") and t.contents.ByteSize():
        # as Triton: the data comes in one place; the typed contents were ignored for the raw bytes
        raise _bad(f"input {name!r}: data in both contents and raw_input_contents; give one")
    if datatype == BYTES:
        return Tensor(name, datatype, shape, split_bytes(raw, count, name), params)
    dtype = np.dtype(DATATYPES[datatype]).newbyteorder("<")
    if count * dtype.itemsize != len(raw):
        raise _bad(f"input {name!r}: {len(raw)} bytes for shape {shape} of {datatype} "
                   f"({count * dtype.itemsize} expected)")
    if datatype == "BOOL":
        check_bool_bytes(f"input {name!r}", raw)
    arr = np.frombuffer(raw, dtype=dtype).reshape(shape)
    return Tensor(name, datatype, shape, arr.astype(arr.dtype.newbyteorder("="), copy=False), params)


def to_request(msg: Any, received_bytes: int) -> InferRequest:
    """A ``ModelInferRequest`` message as the core's :class:`InferRequest`."""
    raws = list(msg.raw_input_contents)
    if raws and len(raws) != len(msg.inputs):
        raise _bad(f"{len(raws)} raw_input_contents for {len(msg.inputs)} input(s): give one per input, or none")
    inputs = [_tensor(t, raws[i] if raws else None) for i, t in enumerate(msg.inputs)]
    classes = {}
    for o in msg.outputs:
        count = classification_count(f"output {o.name!r}", {k: param_value(v) for k, v in o.parameters.items()},
                                     GRPC_OUTPUT_PARAMETERS)
        if count:
            classes[o.name] = count
    return InferRequest(
        model=msg.model_name, version=msg.model_version or None, inputs=inputs, id=msg.id or None,
        outputs=[o.name for o in msg.outputs] or None,
        parameters={k: param_value(v) for k, v in msg.parameters.items()},
        received_bytes=received_bytes, classification=classes)


# -- a refused message's model -------------------------------------------------------------------------
# The metrics label of a ModelInfer refused before it is parsed (unauthorized, over the cap, unparsable):
# its model_name (field 1) and model_version (field 2) read from the raw bytes, never a parse of the
# message. Only the fields that lead it (protobuf serializers write fields in number order: tritonclient's
# name and version come first), at most _LEAD_FIELDS of them, a name of at most _NAME_MAX bytes, so the
# read is a few bytes whatever the message's size; anything else reads as no name ("").
_LEAD_FIELDS: Final = 4
_NAME_MAX: Final = 1024


def _varint(raw: bytes, pos: int) -> tuple[int, int]:
    value = 0
    for shift in range(0, 70, 7):
        if pos >= len(raw):
            raise ValueError("truncated varint")
        b = raw[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
    raise ValueError("varint over 10 bytes")


def named_model(raw: bytes) -> tuple[str, str | None]:
    """The ``model_name`` and ``model_version`` (None: none) that lead a raw ``ModelInferRequest``, as
    a bounded read of its first fields (``_LEAD_FIELDS``); ``("", None)`` where they cannot be read so.
    For a metrics label only: the core counts a name it does not serve as ``""``."""
    found: dict[int, str] = {}
    pos = 0
    try:
        for _ in range(_LEAD_FIELDS):
            try:
                key, pos = _varint(raw, pos)
            except ValueError:                  # the end, or bytes after the leading fields that are no tag
                break
            if key >> 3 not in (1, 2) or key & 7 != 2:       # not a leading name or version: stop there
                break
            size, pos = _varint(raw, pos)
            if size > _NAME_MAX or pos + size > len(raw):
                return "", None
            found[key >> 3] = bytes(raw[pos:pos + size]).decode("utf-8")
            pos += size
    except (ValueError, UnicodeDecodeError):
        return "", None
    return found.get(1, ""), found.get(2) or None


# -- records -> wire ---------------------------------------------------------------------------------

def to_message(resp: InferResponse) -> Any:
    """The core's :class:`InferResponse` as a ``ModelInferResponse`` (outputs raw)."""
    msg = sp.message_class("ModelInferResponse")(
        model_name=resp.model_name, model_version=str(resp.model_version), id=resp.id or "")
    for k, v in resp.parameters.items():
        if v is not None:
            _set_param(msg.parameters[k], v)
    for t in resp.outputs:
        if t.datatype == BYTES:
            items = bytes_elements(t.data)
            raw = join_bytes(items)
            shape = list(t.shape) if t.shape else [len(items)]
        else:
            raw = numeric_bytes(t.datatype, t.data)
            shape = list(t.shape) if t.shape or np.ndim(t.data) == 0 else list(np.shape(t.data))
        out = msg.outputs.add(name=t.name, datatype=t.datatype, shape=[int(d) for d in shape])
        for k, v in t.parameters.items():
            if v is not None:
                _set_param(out.parameters[k], v)
        msg.raw_output_contents.append(raw)
    return msg
