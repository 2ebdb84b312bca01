"""Fix dynamic input dimensions to static values (one model per bucket)."""

from __future__ import annotations


def dynamic_inputs(path) -> dict:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    return {i.name: [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                     for d in i.type.tensor_type.shape.dim] for i in m.graph.input if i.name not in inits}


def fix_input_dims(src_path, dst_path, dims: dict) -> None:
    import onnx

    m = onnx.load(str(src_path))
    by_name = {i.name: i for i in m.graph.input}
    for name, shape in dims.items():
        if name not in by_name:
            raise ValueError(f"model has no input {name!r} (inputs: {sorted(by_name)})")
        tdims = by_name[name].type.tensor_type.shape.dim
        if len(tdims) != len(shape):
            raise ValueError(f"input {name!r} has rank {len(tdims)}, got shape {shape}")
        for d, v in zip(tdims, shape):
            d.Clear()
            d.dim_value = int(v)
    del m.graph.value_info[:]
    for out in m.graph.output:
        for d in out.type.tensor_type.shape.dim:
            d.Clear()
    m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, str(dst_path))
