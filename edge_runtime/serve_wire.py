"""The KServe v2 HTTP/REST body, both ways: JSON tensors and the binary tensor extension.

A request body is a JSON document, optionally followed by binary tensor data:
the ``Inference-Header-Content-Length`` header gives the JSON part's length,
and each input carried in binary says its ``binary_data_size`` (in order;
their sum must be the rest of the body, exactly). A ``BYTES`` tensor in binary
is a 4-byte little-endian length before each element. Numeric binary data is
little-endian, ``prod(shape) * itemsize`` bytes exactly.

Everything a client sends is checked before it is used: JSON that does not
parse or nests too deep, unknown datatypes, negative or non-integer shapes,
shapes no array can have (``serve_tensors.shape_count``), shapes whose element
count does not match the data, JSON numbers outside their datatype (INT8 300,
FP16 1e5), binary BOOL bytes other than 0 / 1, binary sizes beyond the body or
not adding up to it. Each is a ``ServeError`` ``bad_request``.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from . import error_codes as ec
from . import serve_json
from .serve_output_params import HTTP_OUTPUT_PARAMETERS, classification_count, refuse_shared_memory
from .serve_tensors import bad, shape_count
from .serve_types import (BYTES, DATATYPES, InferRequest, InferResponse, ServeError, Tensor, bytes_elements,
                          list_values, numeric_bytes)

HEADER_LENGTH = "inference-header-content-length"
# BYTES elements are items (texts, images): far more than any batch limit is refused before it is parsed
MAX_BYTES_ELEMENTS = 65_536
_LEN = struct.Struct("<I")


def decode_request(body: bytes, header_length: str | None, model: str, version: str | None
                   ) -> tuple[InferRequest, bool, dict[str, bool]]:
    """(the request, binary outputs for every output? (``binary_data_output``), ``{output: binary?}`` of the
    outputs whose own ``binary_data`` says, which overrides the request's)."""
    if header_length is not None:
        try:
            hl = int(header_length)
        except ValueError:
            raise bad(f"Inference-Header-Content-Length is not an integer: {header_length[:40]!r}") from None
        if not 0 <= hl <= len(body):
            raise bad(f"Inference-Header-Content-Length is {hl}, but the body has {len(body)} bytes")
        head, binary = body[:hl], memoryview(body)[hl:]
    else:
        head, binary = body, memoryview(b"")
    doc = _json(head)
    if not isinstance(doc, dict):
        raise bad("the request body is not a JSON object")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise bad("the request has no 'inputs' list")
    inputs, offset = [], 0
    for i, spec in enumerate(raw_inputs):
        tensor, used = _input(spec, i, binary, offset)
        inputs.append(tensor)
        offset += used
    if offset != len(binary):
        raise bad(f"the binary part is {len(binary)} bytes, but the inputs' binary_data_size add up to {offset}")
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise bad("'parameters' is not a JSON object")
    binary_all = _flag(params.pop("binary_data_output", False), "parameters.binary_data_output")
    outputs, binary_named, classification = _outputs(doc.get("outputs"))
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise bad("'id' is not a string")
    req = InferRequest(model=model, version=version, inputs=inputs, id=rid, outputs=outputs, parameters=params,
                       received_bytes=len(body), classification=classification)
    return req, binary_all, binary_named


def _json(head: bytes | memoryview) -> Any:
    try:
        doc = serve_json.loads(bytes(head))
    except RecursionError:
        raise bad("the request JSON nests too deep") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(f"the request body is not valid JSON: {str(exc)[:200]}") from None
    return doc


def _input(spec: Any, i: int, binary: memoryview, offset: int) -> tuple[Tensor, int]:
    if not isinstance(spec, dict):
        raise bad(f"inputs[{i}] is not a JSON object")
    name, datatype, shape = spec.get("name"), spec.get("datatype"), spec.get("shape")
    where = f"input {name!r}" if isinstance(name, str) else f"inputs[{i}]"
    if not isinstance(name, str) or not name:
        raise bad(f"{where} has no name")
    if datatype != BYTES and datatype not in DATATYPES:
        raise bad(f"{where}: unknown datatype {str(datatype)[:40]!r} (one of {', '.join([*DATATYPES, BYTES])})")
    if not isinstance(shape, list) or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
        raise bad(f"{where}: shape must be a list of non-negative integers, got {str(shape)[:80]}")
    count = shape_count(where, shape)
    if datatype == BYTES and count > MAX_BYTES_ELEMENTS:
        raise bad(f"{where}: {count} BYTES elements, over the server's {MAX_BYTES_ELEMENTS}")
    params = spec.get("parameters") or {}
    if not isinstance(params, dict):
        raise bad(f"{where}: 'parameters' is not a JSON object")
    refuse_shared_memory(where, params)
    size = params.get("binary_data_size")
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise bad(f"{where}: binary_data_size must be a non-negative integer, got {size!r}")
        if offset + size > len(binary):
            raise bad(f"{where}: binary_data_size {size} reaches past the body "
                      f"({len(binary) - offset} binary bytes left)")
        data = _from_binary(where, datatype, shape, count, binary[offset:offset + size])
        return Tensor(name, datatype, list(shape), data), size
    if "data" not in spec:
        raise bad(f"{where} has neither 'data' nor a binary_data_size")
    return Tensor(name, datatype, list(shape), _from_json(where, datatype, shape, count, spec["data"])), 0


def _from_binary(where: str, datatype: str, shape: list[int], count: int, chunk: memoryview) -> Any:
    if datatype == BYTES:
        out, at = [], 0
        while at < len(chunk):
            if at + 4 > len(chunk):
                raise bad(f"{where}: a BYTES element's 4-byte length is cut off")
            (n,) = _LEN.unpack_from(chunk, at)
            at += 4
            if at + n > len(chunk):
                raise bad(f"{where}: a BYTES element of {n} bytes reaches past its binary_data_size")
            out.append(bytes(chunk[at:at + n]))
            at += n
            if len(out) > count:
                break
        if len(out) != count:
            raise bad(f"{where}: shape {shape} holds {count} element(s), the binary data {len(out)}")
        return out
    dtype = np.dtype(DATATYPES[datatype]).newbyteorder("<")
    if count * dtype.itemsize != len(chunk):
        raise bad(f"{where}: shape {shape} x {datatype} is {count * dtype.itemsize} bytes, "
                  f"binary_data_size is {len(chunk)}")
    if datatype == "BOOL":
        check_bool_bytes(where, chunk)
    return np.frombuffer(chunk, dtype=dtype).astype(dtype.newbyteorder("="), copy=True).reshape(shape)


def _flat(where: str, shape: list[int], count: int, data: Any) -> list:
    """``data`` as a flat row-major list: given flat (``count`` elements) or nested exactly as ``shape``
    (each level a list of that dimension's length), as the protocol allows; anything else is refused.
    Flat data is taken as it is (a list among its elements fails the datatype's check after this);
    nested data is flattened a level at a time with ``list.extend``, each list's length checked: one
    ``len`` per inner list, not a Python step per element."""
    if not isinstance(data, list):
        if not shape:                            # a 0-d tensor nested as its shape: the bare value
            return [data]
        raise bad(f"{where}: 'data' must be a list, got {type(data).__name__}")
    if not data or not isinstance(data[0], list):
        if len(data) != count:
            raise bad(f"{where}: shape {shape} holds {count} element(s), 'data' {len(data)}")
        return data                              # flat (for a 1-d shape also nested as it)
    level = [data]
    for depth, n in enumerate(shape):
        out: list = []
        for x in level:
            if not isinstance(x, list) or len(x) != n:
                raise bad(f"{where}: 'data' is neither flat ({count} element(s)) nor nested as shape {shape}: "
                          f"{_what(x)} at depth {depth}, where a list of {n} belongs")
            out.extend(x)
        level = out
    if level and isinstance(level[0], list):
        raise bad(f"{where}: 'data' nests deeper than shape {shape}")
    return level


def _what(x: Any) -> str:
    return f"a list of {len(x)}" if isinstance(x, list) else f"a {type(x).__name__}"


def _from_json(where: str, datatype: str, shape: list[int], count: int, data: Any) -> Any:
    flat = _flat(where, shape, count, data)
    if datatype == BYTES:
        if not all(isinstance(x, str) for x in flat):
            raise bad(f"{where}: BYTES data in JSON must be strings")
        return [x.encode("utf-8", "surrogatepass") for x in flat]
    dtype = np.dtype(DATATYPES[datatype])
    if datatype == "BOOL":
        if not all(isinstance(x, bool) for x in flat):
            raise bad(f"{where}: BOOL data must be true or false")
        return np.array(flat, dtype=dtype).reshape(shape)
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in flat):
        raise bad(f"{where}: {datatype} data must be numbers")
    if dtype.kind in "iu":
        if not all(isinstance(x, int) for x in flat):
            raise bad(f"{where}: {datatype} data must be integers")
        info = np.iinfo(dtype)
        if flat and (min(flat) < info.min or max(flat) > info.max):
            raise bad(f"{where}: values outside {datatype}")
        return np.array(flat, dtype=dtype).reshape(shape)
    with np.errstate(over="ignore"):
        arr = np.array(flat, dtype=dtype)
    # JSON holds finite numbers only: a non-finite value here is one past the datatype's range (FP16 1e5,
    # FP32 1e300), which was taken as infinity, or a NaN literal the standard library's json let through
    if not np.isfinite(arr).all():
        raise bad(f"{where}: values outside {datatype} (finite, within ±{float(np.finfo(dtype).max):.6g})")
    return arr.reshape(shape)


def check_bool_bytes(where: str, raw: Any) -> None:
    """Binary BOOL data is one byte an element, 0 or 1: any other byte was taken as a numpy bool holding
    it, fed to the model as is (undefined for a runtime's bool; printed ``True``)."""
    if len(raw) and int(np.frombuffer(raw, dtype=np.uint8).max()) > 1:
        raise bad(f"{where}: BOOL data holds a byte other than 0 or 1")


def _outputs(raw: Any) -> tuple[list[str] | None, dict[str, bool], dict[str, int]]:
    """(the requested names, ``{name: binary?}`` of those whose ``binary_data`` says, ``{name: classes}``
    of those asked as classifications)."""
    if raw is None:
        return None, {}, {}
    if not isinstance(raw, list):
        raise bad("'outputs' is not a list")
    names: list[str] = []
    binary: dict[str, bool] = {}
    classes: dict[str, int] = {}
    for o in raw:
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise bad("each of 'outputs' must be an object with a 'name'")
        names.append(o["name"])
        params = o.get("parameters")
        if params is None:
            continue
        where = f"output {o['name']!r}"
        if not isinstance(params, dict):
            raise bad(f"{where}: 'parameters' is not a JSON object")
        count = classification_count(where, params, HTTP_OUTPUT_PARAMETERS)
        if count:
            classes[o["name"]] = count
        if "binary_data" in params:
            binary[o["name"]] = _flag(params["binary_data"], f"{where}: parameters.binary_data")
    return names, binary, classes


def _flag(value: Any, where: str) -> bool:
    """A JSON boolean, as the protocol has it: ``"false"``, ``0`` or ``null`` are refused, never
    read by truthiness (``bool("false")`` is True)."""
    if not isinstance(value, bool):
        raise bad(f"{where} must be true or false, got {value!r}"[:300])
    return value


def encode_response(resp: InferResponse, binary_all: bool, binary_named: dict[str, bool]
                    ) -> tuple[bytes, int | None]:
    """(body, JSON part length when binary data follows, else None). An output's own ``binary_data``
    overrides the request's ``binary_data_output`` (the protocol's rule), both ways."""
    outs, blobs = [], []
    for t in resp.outputs:
        o: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        if binary_named.get(t.name, binary_all):
            raw = _to_binary(t)
            o["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        elif t.datatype == BYTES:
            o["data"] = _json_texts(t)
        else:
            o["data"] = list_values(t.datatype, t.data) if type(t.data) is list else np.asarray(t.data).ravel().tolist()
        outs.append(o)
    doc: dict[str, Any] = {"model_name": resp.model_name, "model_version": resp.model_version, "outputs": outs}
    if resp.id is not None:
        doc["id"] = resp.id
    if resp.parameters:
        doc["parameters"] = resp.parameters
    head = serve_json.dumps(doc)
    if not blobs:
        return head, None
    return head + b"".join(blobs), len(head)


def _json_texts(t: Tensor) -> list[str]:
    """A BYTES output's elements as JSON strings: UTF-8 text only. Bytes that are not UTF-8 cannot be a
    JSON string unchanged (decoded with replacement they came back altered, with a 200): the binary
    extension carries them as they are."""
    out = []
    for i, x in enumerate(bytes_elements(t.data)):
        try:
            out.append(x.decode("utf-8"))
        except UnicodeDecodeError:
            raise ServeError("bad_request", f"output {t.name!r}: element {i} is not UTF-8 text, which a JSON "
                             "string cannot carry unchanged: request it with \"binary_data\": true",
                             ec.SERVE_REQUEST_MALFORMED) from None
    return out


def _to_binary(t: Tensor) -> bytes:
    if t.datatype == BYTES:
        return b"".join(_LEN.pack(len(x)) + x for x in bytes_elements(t.data))
    return numeric_bytes(t.datatype, t.data)
