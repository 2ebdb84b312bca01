"""Read tensor specs (names, dtypes, shapes, quantization) from ONNX models."""

from __future__ import annotations

from edge_runtime import error_codes as ec

_ONNX_DTYPES = {1: "float32", 10: "float16", 3: "int8", 2: "uint8", 5: "int16", 6: "int32", 7: "int64", 9: "bool"}


def _spec(value_info) -> dict:
    t = value_info.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
    return {"name": value_info.name, "dtype": _ONNX_DTYPES.get(t.elem_type, f"onnx:{t.elem_type}"), "shape": dims}


def io_specs(path) -> tuple[list[dict], list[dict]]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    inputs = [_spec(v) for v in model.graph.input if v.name not in inits]
    outputs = [_spec(v) for v in model.graph.output]
    return inputs, outputs


def static_dims(inputs: list[dict], seq_len: int | None = None, overrides: dict | None = None) -> dict[str, list[int]]:
    """Fix dynamic dims: batch (first) → 1, a text model's second → seq_len."""
    overrides = overrides or {}
    out = {}
    for spec in inputs:
        if spec["name"] in overrides:
            out[spec["name"]] = list(overrides[spec["name"]])
            continue
        dims = []
        for axis, d in enumerate(spec["shape"]):
            if isinstance(d, int) and d > 0:
                dims.append(d)
            elif axis == 0:
                dims.append(1)
            elif axis == 1 and seq_len is not None:
                dims.append(seq_len)
            else:
                raise ValueError(f"input {spec['name']!r} has dynamic dimension {axis} ({d!r}); "
                                 f"give a static shape with --input-shape {spec['name']}=...")
        out[spec["name"]] = dims
    return out


# ops that mean the model is already quantized (ONNX standard and ORT's com.microsoft contrib ops)
QUANTIZED_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "ConvInteger", "MatMulInteger",
    "QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu",
    "QLinearConcat", "QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearSoftmax", "QLinearWhere",
    "QGemm", "QAttention", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "MatMulIntegerToFloat",
    "MatMulNBits", "QOrderedMatMul"})
QDQ_MIN_OPSET = 13   # QuantizeLinear/DequantizeLinear take ``axis`` (per-channel weights) from opset 13


def _all_nodes(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.g.node:
                yield from _all_nodes(attr.g)
            for g in attr.graphs:
                yield from _all_nodes(g)


def read_source(path) -> dict:
    """Check that ``path`` is a float ONNX model ``convert`` can take; ``{"opset": N}`` (the
    default domain's) if so. Raises InputError naming the file: a TFLite model (use
    ``edge-infer import``), anything that does not parse as ONNX, or an already-quantized model."""
    from pathlib import Path

    from edge_runtime.errors import InputError

    p = Path(path)
    with open(p, "rb") as f:
        head = f.read(8)
    if head[4:8] == b"TFL3":   # the TFLite flatbuffer's file identifier
        raise InputError(f"{p} is a TFLite model, not ONNX: convert takes a float ONNX model; wrap an existing "
                         f"quantized .tflite with `edge-infer import {p.name} -o DIR`", code=ec.CONVERT_SOURCE_TFLITE)
    import onnx

    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError, or a file onnx cannot read
        raise InputError(f"{p} is not a readable ONNX model ({type(exc).__name__}: {str(exc)[:200]}); "
                         "convert takes a float ONNX model", code=ec.CONVERT_SOURCE_UNREADABLE) from None
    if not model.ir_version or not model.graph.output or not model.opset_import:
        raise InputError(f"{p} is not an ONNX model (no IR version, graph outputs or opset); convert takes a "
                         "float ONNX model", code=ec.CONVERT_SOURCE_UNREADABLE)
    quantized = sorted({n.op_type for n in _all_nodes(model.graph) if n.op_type in QUANTIZED_OPS})
    if quantized:
        counts: dict[str, int] = {}
        for n in _all_nodes(model.graph):
            if n.op_type in QUANTIZED_OPS:
                counts[n.op_type] = counts.get(n.op_type, 0) + 1
        found = ", ".join(f"{op} x{counts[op]}" for op in quantized)
        raise InputError(f"{p} is already quantized ({found}); converting it again is refused. Convert the "
                         "float source model it was quantized from instead (edge-infer import takes "
                         "quantized .tflite models only)", code=ec.CONVERT_SOURCE_QUANTIZED, ops=quantized)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        raise InputError(f"{p} imports no default-domain (ai.onnx) opset; convert takes a float ONNX model",
                         code=ec.CONVERT_SOURCE_UNREADABLE)
    return {"opset": int(opset)}


def _empty_resize_scales(model) -> None:
    """Opset-11 exports give Resize an empty constant ``scales`` beside ``sizes``; the version
    converter keeps it, and from opset 13 on onnxruntime refuses a Resize with both (NanoDet's
    FPN): an empty ``scales`` becomes the absent input the newer opsets mean by it."""
    empty = {i.name for i in model.graph.initializer if 0 in list(i.dims)}
    for node in model.graph.node:
        if node.op_type == "Resize" and len(node.input) > 3 and node.input[3] and node.input[2] in empty:
            node.input[2] = ""


def upgrade_opset(src, dst, opset: int = QDQ_MIN_OPSET) -> None:
    """Write ``src`` converted to ``opset`` by ``onnx.version_converter`` (checked in full) to ``dst``.
    Raises ValueError when the converter cannot."""
    import onnx
    from onnx import version_converter

    model = onnx.load(str(src))
    try:
        up = version_converter.convert_version(model, opset)
        _empty_resize_scales(up)
        onnx.checker.check_model(up, full_check=True)
    except Exception as exc:  # the converter's own errors (RuntimeError, ValidationError, ...)
        raise ValueError(f"{type(exc).__name__}: {str(exc)[:300]}") from None
    onnx.save(up, str(dst))
