"""Static input shapes for ONNX models (one fp32 model per bucket).

``fix_input_dims`` replaces the symbolic (or unknown) dims of named graph
inputs by fixed values, drops the stale intermediate/output shape
annotations, re-runs ONNX shape inference and checks the result with
``onnx.checker.check_model(full_check=True)``. ``dynamic_inputs`` lists
the real graph inputs (initializers excluded) with symbolic dims as strings.

onnx is imported inside the functions so that importing this module costs
nothing.
"""

from __future__ import annotations

from pathlib import Path


def _dims(value_info) -> list:
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return []
    out: list[int | str] = []
    for d in t.shape.dim:
        if d.HasField("dim_value"):
            out.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            out.append(d.dim_param)
        else:
            out.append("?")
    return out


def _graph_inputs(model) -> list:
    inits = {i.name for i in model.graph.initializer} | {i.name for i in model.graph.sparse_initializer}
    return [i for i in model.graph.input if i.name not in inits]


def dynamic_inputs(path) -> dict[str, list[int | str]]:
    """``{input name: dims}`` for every graph input, dims as ints or, when
    symbolic, as their dim_param string (``"?"`` for an unnamed unknown dim).
    Inputs that are also initializers are left out."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    return {i.name: _dims(i) for i in _graph_inputs(m)}


def fix_input_dims(src_path, dst_path, dims: dict[str, list[int]]) -> None:
    """Write ``src_path`` to ``dst_path`` with the listed inputs' dims fixed.

    ``dims`` maps input names to the full static shape (one positive int per
    dim). Raises ValueError for an unknown input, a rank mismatch, a
    non-positive value, or a dim that is already static with another value.
    Inputs not listed keep their shapes (and must already be static for the
    result to be fully static)."""
    import onnx

    src_path, dst_path = Path(src_path), Path(dst_path)
    m = onnx.load(str(src_path))
    inputs = {i.name: i for i in _graph_inputs(m)}
    for name, shape in dims.items():
        if name not in inputs:
            raise ValueError(f"{src_path.name}: model has no input {name!r} (inputs: {', '.join(sorted(inputs))})")
        t = inputs[name].type.tensor_type
        have = _dims(inputs[name])
        shape = list(shape)
        if not t.HasField("shape"):
            raise ValueError(f"{src_path.name}: input {name!r} has no shape (unknown rank); cannot fix it to {shape}")
        if len(have) != len(shape):
            raise ValueError(f"{src_path.name}: input {name!r} has rank {len(have)} {have}, "
                             f"got {len(shape)} dims {shape}")
        for k, (old, new) in enumerate(zip(have, shape)):
            if isinstance(new, bool) or not isinstance(new, int) or new < 1:
                raise ValueError(f"{src_path.name}: input {name!r} dim {k}: need a positive int, got {new!r}")
            if isinstance(old, int) and old != new:
                raise ValueError(f"{src_path.name}: input {name!r} dim {k} is fixed to {old} in the model, "
                                 f"cannot set it to {new}")
    # old exports list every initializer as a graph input too (NanoDet): then each is an input a
    # caller might override, so no optimiser or quantizer may treat it as a constant. A
    # static-shape artifact has no such inputs: they go.
    inits = {i.name for i in m.graph.initializer} | {i.name for i in m.graph.sparse_initializer}
    kept = [i for i in m.graph.input if i.name not in inits]
    if len(kept) != len(m.graph.input):
        del m.graph.input[:]
        m.graph.input.extend(kept)
    params: dict[str, int] = {}  # dim_param -> value, to carry over to the outputs
    for name, shape in dims.items():
        for k, (d, v) in enumerate(zip(inputs[name].type.tensor_type.shape.dim, shape)):
            if d.HasField("dim_param") and d.dim_param:
                if params.setdefault(d.dim_param, int(v)) != int(v):
                    raise ValueError(f"{src_path.name}: dim {d.dim_param!r} is shared by several inputs but given "
                                     f"two values ({params[d.dim_param]} and {v}, at input {name!r} dim {k})")
            d.Clear()
            d.dim_value = int(v)
    # stale annotations: intermediate shapes were computed for the symbolic
    # inputs; drop them and let inference recompute them. Output dims named
    # like an input dim take its value (ONNX inference alone loses some, e.g.
    # through Slice with computed ends); other symbolic output dims are cleared.
    del m.graph.value_info[:]
    for out in m.graph.output:
        t = out.type.tensor_type
        if t.HasField("shape"):
            for d in t.shape.dim:
                p = d.dim_param if d.HasField("dim_param") else None
                if d.HasField("dim_value"):
                    continue
                d.Clear()
                if p in params:
                    d.dim_value = params[p]
    try:
        m = onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True, data_prop=True)
    except Exception as exc:  # onnx raises InferenceError / ValidationError
        raise ValueError(f"{src_path.name}: shape inference failed with dims {dims}: {exc}") from exc
    onnx.checker.check_model(m, full_check=True)
    dst_path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(dst_path))
