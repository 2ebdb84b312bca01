"""Read tensor specs (names, dtypes, shapes, quantization) from ONNX models."""

from __future__ import annotations

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
