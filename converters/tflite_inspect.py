"""Static inspection of a ``.tflite`` flatbuffer (no interpreter, no TensorFlow).

:func:`inspect_tflite` reads a model with the pure-python ``tflite`` schema
package and reports, per subgraph, its inputs/outputs (dtype, shape,
``shape_signature`` with ``-1`` dims flagged dynamic, quantization) and the
operators in execution order with their tensors' dtypes and shapes; plus a
summary: op counts, activation and constant dtypes, dynamic dims, custom and
Flex ops, whether the graph is all-int8, per-channel quantization parameters
TFLite's loader would reject, parameter bytes (constants stored
inline in ``Buffer.data`` *or* by ``Buffer.offset/size``) and whether the
model is already compiled for the Edge TPU (``edgetpu-custom-op``).

The file is untrusted: it is size-capped, every vector length is bounded by
the file size and fixed limits, and any malformed or truncated input raises
:class:`edge_runtime.errors.ArtifactError` (never an ``IndexError`` or
``struct.error``).
"""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError, EdgeRuntimeError

MAX_FILE_BYTES = 512 * 1024 * 1024
MAX_SUBGRAPHS = 1024
MAX_OPERATORS = 131_072
MAX_TENSORS = 262_144
MAX_RANK = 16
MAX_OP_IO = 4096
MAX_NAME = 256
MAX_LISTED = 50  # offending tensors listed in the summary

_CUSTOM = 32  # BuiltinOperator.CUSTOM
_INT8 = ("int8", "uint8")

_DTYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 5: "string", 6: "bool",
           7: "int16", 8: "complex64", 9: "int8", 10: "float64", 11: "complex128", 12: "uint64",
           13: "resource", 14: "variant", 15: "uint32", 16: "uint16", 17: "int4", 18: "bfloat16"}

# Exceptions the flatbuffers accessors raise on malformed input.
_PARSE_ERRORS = (IndexError, struct.error, ValueError, TypeError, OverflowError, AttributeError,
                 UnicodeDecodeError, KeyError, RecursionError)


def _schema():
    try:
        from tflite.BuiltinOperator import BuiltinOperator
        from tflite.Model import Model
    except ImportError:  # pragma: no cover - depends on the environment
        raise EdgeRuntimeError("the `tflite` flatbuffer package is not installed (pip install tflite)",
                               code=ec.DEPENDENCY_MISSING) from None
    names = {v: k for k, v in vars(BuiltinOperator).items() if not k.startswith("_") and isinstance(v, int)}
    return Model, names


def _read(path_or_bytes) -> tuple[bytes, str | None]:
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        buf = bytes(path_or_bytes)
        if len(buf) > MAX_FILE_BYTES:
            raise ArtifactError(f"model is {len(buf)} bytes, over the {MAX_FILE_BYTES} byte cap",
                                code=ec.ARTIFACT_TOO_LARGE)
        return buf, None
    p = Path(path_or_bytes)
    name = str(p)
    try:
        size = p.stat().st_size
        if not p.is_file():
            raise ArtifactError("not a regular file (a .tflite model file is wanted)", file=name,
                                code=ec.ARTIFACT_FILE_INVALID)
        if size > MAX_FILE_BYTES:
            raise ArtifactError(f"model is {size} bytes, over the {MAX_FILE_BYTES} byte cap", file=name,
                                code=ec.ARTIFACT_TOO_LARGE)
        with p.open("rb") as fh:
            buf = fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ArtifactError("no such file", file=name, code=ec.ARTIFACT_MISSING) from None
    except OSError as exc:
        raise ArtifactError(f"cannot read: {exc.strerror or exc}", file=name, code=ec.ARTIFACT_UNREADABLE) from None
    if len(buf) > MAX_FILE_BYTES:
        raise ArtifactError("model grew over the size cap while reading", file=name, code=ec.ARTIFACT_TOO_LARGE)
    return buf, name


class _Limits:
    """The file size and a budget of elements read from it.

    Each vector element takes at least 4 bytes in a well-formed file, so more
    than ``size / 2`` elements in total means vectors are aliased to amplify work.
    """

    def __init__(self, size: int):
        self.size = size
        self.left = size // 2 + 65536


def _bounded(n: int, limit: int, elem_bytes: int, lim: _Limits, what: str) -> int:
    """A vector length from the file, checked against a fixed limit, the file size and the budget."""
    if n < 0 or n > limit or n * elem_bytes > lim.size:
        raise ValueError(f"{what}: implausible count {n}")
    lim.left -= n
    if lim.left < 0:
        raise ValueError("the file references far more elements than it can hold (aliased vectors)")
    return n


def _text(raw) -> str | None:
    if raw is None:
        return None
    return bytes(raw[:MAX_NAME]).decode("utf-8", errors="replace")


def inspect_tflite(path_or_bytes) -> dict:
    """Parse a ``.tflite`` model (a path or its bytes) into a JSON-safe report; see the module doc."""
    buf, name = _read(path_or_bytes)
    Model, op_names = _schema()
    if len(buf) < 8:
        raise ArtifactError(f"{len(buf)} bytes is too short for a TFLite flatbuffer", file=name,
                            code=ec.ARTIFACT_NOT_TFLITE)
    if buf[4:8] != b"TFL3":
        raise ArtifactError("not a TFLite model (no TFL3 file identifier)", file=name, code=ec.ARTIFACT_NOT_TFLITE)
    try:
        return _inspect(Model, op_names, buf, name)
    except ArtifactError:
        raise
    except _PARSE_ERRORS as exc:
        raise ArtifactError(f"malformed or truncated TFLite flatbuffer ({type(exc).__name__}: {exc})", file=name,
                            code=ec.ARTIFACT_CORRUPT) from None


def _buffer_bytes(model, idx: int, size: int) -> int:
    """Bytes held by buffer ``idx``: inline ``data`` or an ``offset/size`` region past the flatbuffer."""
    b = model.Buffers(idx)
    n = b.DataLength()
    if n:
        tab = b._tab  # exact bounds of the inline vector
        start = tab.Vector(tab.Offset(4))
        if start < 0 or start + n > size:
            raise ValueError(f"buffer {idx}: data runs past the end of the file")
        return n
    off, length = b.Offset(), b.Size()
    if off > 1 and length:
        if off + length > size:
            raise ValueError(f"buffer {idx}: offset {off} + size {length} is past the end of the file ({size})")
        return length
    return 0


def _quant(t, lim: _Limits) -> dict | None:
    q = t.Quantization()
    if q is None:
        return None
    ns = _bounded(q.ScaleLength(), MAX_TENSORS, 4, lim, "quantization scales")
    nz = _bounded(q.ZeroPointLength(), MAX_TENSORS, 8, lim, "quantization zero points")
    if not ns and not nz:
        return None
    out = {"scale": [float(x) for x in q.ScaleAsNumpy()] if ns else [],
           "zero_point": [int(x) for x in q.ZeroPointAsNumpy()] if nz else []}
    if ns > 1:
        out["quantized_dimension"] = int(q.QuantizedDimension())
    return out


def _quant_error(t: dict) -> str | None:
    """The per-channel parameters TFLite's loader rejects (``quantized_dimension`` out of range, scale count)."""
    q = t.get("quantization")
    if not q or len(q["scale"]) <= 1:
        return None
    dim, shape = q.get("quantized_dimension", 0), t["shape"]
    if shape and not 0 <= dim < len(shape):
        return f"quantized_dimension {dim} is outside rank {len(shape)}"
    if shape and len(q["scale"]) != shape[dim]:
        return f"{len(q['scale'])} scales for dimension {dim} of size {shape[dim]}"
    return None


def _tensor(sg, i: int, model, lim: _Limits, n_buffers: int, buf_cache: dict) -> dict:
    t = sg.Tensors(i)
    rank = _bounded(t.ShapeLength(), MAX_RANK, 4, lim, f"tensor {i} rank")
    shape = [int(x) for x in t.ShapeAsNumpy()] if rank else []
    srank = _bounded(t.ShapeSignatureLength(), MAX_RANK, 4, lim, f"tensor {i} signature rank")
    sig = [int(x) for x in t.ShapeSignatureAsNumpy()] if srank else list(shape)
    bidx = int(t.Buffer())
    if bidx < 0 or (bidx > 0 and bidx >= n_buffers):
        raise ValueError(f"tensor {i}: buffer index {bidx} out of range ({n_buffers} buffers)")
    nbytes = 0
    if bidx > 0:
        if bidx not in buf_cache:
            buf_cache[bidx] = _buffer_bytes(model, bidx, lim.size)
        nbytes = buf_cache[bidx]
    variable = bool(t.IsVariable())
    const = nbytes > 0 and not variable
    dyn = [a for a, d in enumerate(sig) if d < 0]
    info: dict = {"index": i, "name": _text(t.Name()), "dtype": _DTYPES.get(int(t.Type()), f"type{int(t.Type())}"),
                  "shape": shape, "shape_signature": sig, "dynamic": bool(dyn), "constant": const}
    if variable:
        info["variable"] = True
    q = _quant(t, lim)
    if q is not None:
        info["quantization"] = q
    if dyn:
        info["dynamic_dims"] = dyn
    if const:
        info["nbytes"] = nbytes
        info["buffer"] = bidx
    return info


def _op_name(oc, op_names) -> tuple[str, int, str | None]:
    code = max(int(oc.BuiltinCode()), int(oc.DeprecatedBuiltinCode()))
    if code == _CUSTOM:
        custom = _text(oc.CustomCode())
        return (custom or "CUSTOM"), code, custom
    return op_names.get(code, f"UNKNOWN_{code}"), code, None


def _inspect(Model, op_names, buf: bytes, name: str | None) -> dict:
    size = len(buf)
    lim = _Limits(size)
    model = Model.GetRootAs(buf, 0)
    n_sub = _bounded(model.SubgraphsLength(), MAX_SUBGRAPHS, 4, lim, "subgraphs")
    n_buf = _bounded(model.BuffersLength(), MAX_TENSORS, 4, lim, "buffers")
    n_codes = _bounded(model.OperatorCodesLength(), MAX_OPERATORS, 4, lim, "operator codes")
    codes = [_op_name(model.OperatorCodes(i), op_names) for i in range(n_codes)]
    if n_sub == 0:
        raise ArtifactError("model has no subgraphs", file=name, code=ec.ARTIFACT_CORRUPT)

    buf_cache: dict[int, int] = {}
    subgraphs = []
    op_counts: Counter = Counter()
    act_dtypes, const_dtypes = set(), set()
    custom_ops, flex_ops = set(), set()
    dynamic_tensors: list[dict] = []
    non_int8: list[dict] = []
    edgetpu = False
    payload = 0
    used_buffers: set[int] = set()
    quant_errors: list[dict] = []

    for s in range(n_sub):
        sg = model.Subgraphs(s)
        n_t = _bounded(sg.TensorsLength(), MAX_TENSORS, 4, lim, f"subgraph {s} tensors")
        n_ops = _bounded(sg.OperatorsLength(), MAX_OPERATORS, 4, lim, f"subgraph {s} operators")
        tensors: dict[int, dict] = {}

        def tensor(i: int) -> dict:
            if i < 0 or i >= n_t:
                raise ValueError(f"subgraph {s}: tensor index {i} out of range ({n_t} tensors)")
            if i not in tensors:
                tensors[i] = _tensor(sg, i, model, lim, n_buf, buf_cache)
            return tensors[i]

        def io(get_len, get_np, what) -> list[int]:
            n = _bounded(get_len(), MAX_OP_IO, 4, lim, what)
            return [int(x) for x in get_np()] if n else []

        inputs = [tensor(i) for i in io(sg.InputsLength, sg.InputsAsNumpy, f"subgraph {s} inputs")]
        outputs = [tensor(i) for i in io(sg.OutputsLength, sg.OutputsAsNumpy, f"subgraph {s} outputs")]
        ops = []
        for j in range(n_ops):
            op = sg.Operators(j)
            ci = int(op.OpcodeIndex())
            if ci < 0 or ci >= n_codes:
                raise ValueError(f"subgraph {s} op {j}: opcode index {ci} out of range ({n_codes} codes)")
            opname, code, custom = codes[ci]
            entry: dict = {"index": j, "op": opname, "builtin_code": code}
            if custom is not None:
                entry["custom_code"] = custom
                entry["custom_options_bytes"] = int(op.CustomOptionsLength() or op.LargeCustomOptionsSize())
                if entry["custom_options_bytes"] > size:
                    raise ValueError(f"op {j}: custom options larger than the file")
                payload += entry["custom_options_bytes"]
            ins = io(op.InputsLength, op.InputsAsNumpy, f"op {j} inputs")
            outs = io(op.OutputsLength, op.OutputsAsNumpy, f"op {j} outputs")
            entry["inputs"] = [_brief(tensor(i)) for i in ins if i >= 0]  # -1: optional input left out
            entry["outputs"] = [_brief(tensor(i)) for i in outs if i >= 0]
            ops.append(entry)
            op_counts[opname] += 1
            if custom is not None:
                if custom.startswith("Flex"):
                    flex_ops.add(custom)
                else:
                    custom_ops.add(custom)
                edgetpu = edgetpu or custom == "edgetpu-custom-op"

        for i in range(n_t):  # parameters and quantization: every tensor, referenced by an op or not
            t = tensors[i] if i in tensors else _tensor(sg, i, model, lim, n_buf, buf_cache)
            if t["constant"]:
                used_buffers.add(t["buffer"])
            why = _quant_error(t)
            if why and len(quant_errors) < MAX_LISTED:
                quant_errors.append({"subgraph": s, "tensor": i, "name": t["name"], "reason": why})
        for t in tensors.values():  # dtypes: every tensor an op or the subgraph touches
            if t["constant"]:
                const_dtypes.add(t["dtype"])
                ok = t["dtype"] in _INT8 or t["dtype"] == "int32"
            else:
                act_dtypes.add(t["dtype"])
                ok = t["dtype"] in _INT8
            if not ok and len(non_int8) < MAX_LISTED:
                non_int8.append({"subgraph": s, "tensor": t["index"], "name": t["name"], "dtype": t["dtype"],
                                 "constant": t["constant"], "variable": t.get("variable", False)})
            if t["dynamic"] and len(dynamic_tensors) < MAX_LISTED:
                dynamic_tensors.append({"subgraph": s, "tensor": t["index"], "name": t["name"],
                                        "shape_signature": t["shape_signature"]})
        subgraphs.append({"index": s, "name": _text(sg.Name()), "tensor_count": n_t, "inputs": inputs,
                          "outputs": outputs, "operators": ops})

    all_ok = not non_int8 and bool(act_dtypes) and act_dtypes <= set(_INT8)
    summary = {
        "subgraph_count": n_sub,
        "op_count": sum(op_counts.values()),
        "op_counts": dict(sorted(op_counts.items())),
        "activation_dtypes": sorted(act_dtypes),
        "constant_dtypes": sorted(const_dtypes),
        "dynamic": bool(dynamic_tensors),
        "dynamic_tensors": dynamic_tensors,
        "custom_ops": sorted(custom_ops),
        "flex_ops": sorted(flex_ops),
        "all_int8": all_ok,
        "non_int8_tensors": non_int8,
        "quantization_errors": quant_errors,
        "parameter_bytes": sum(buf_cache[b] for b in used_buffers),
        "custom_payload_bytes": payload,
        "edgetpu_compiled": edgetpu,
    }
    return {"file": name, "size_bytes": size, "schema_version": int(model.Version()),
            "subgraph_count": n_sub, "subgraphs": subgraphs, "summary": summary}


def _brief(t: dict) -> dict:
    out = {"tensor": t["index"], "name": t["name"], "dtype": t["dtype"], "shape": t["shape"],
           "constant": t["constant"]}
    if t["dynamic"]:
        out["shape_signature"] = t["shape_signature"]
    if t["constant"]:
        out["nbytes"] = t["nbytes"]
    if t.get("variable"):
        out["variable"] = True
    return out
