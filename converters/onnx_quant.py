"""ONNX Runtime static int8 (QDQ) quantization with recipes per model family.

Default ``quantize_static`` settings destroy a transformer (cosine 0.33 vs
fp32 on MiniLM, see TOOLCHAINS): the ``transformer`` recipe quantizes only
MatMul/Gemm/Gather, per channel, uint8 activations, and keeps each layer's
second feed-forward matmul (the one fed by GELU, whose activations have huge
outliers) in float. Recipes are plain data; users override any key.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

RECIPES: dict[str, dict] = {
    "cnn": {
        "per_channel": True,
        "weights": "int8",
        "activations": "uint8",
        "calibrate_method": "MinMax",
        "op_types_to_quantize": None,          # all supported ops
        "exclude_after_gelu": False,
        "nodes_to_exclude": [],
        "reduce_range": False,
        "extra_options": {},
    },
    "transformer": {
        "per_channel": True,
        "weights": "int8",
        "activations": "uint8",
        "calibrate_method": "MinMax",
        "op_types_to_quantize": ["MatMul", "Gemm", "Gather"],
        "exclude_after_gelu": True,
        "nodes_to_exclude": [],
        "reduce_range": False,
        "extra_options": {},
    },
}


class _Reader:
    def __init__(self, feeds):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)


def _gelu_fed_matmuls(model) -> list[str]:
    """MatMul/Gemm nodes whose input comes from a GELU (Erf-based or fused)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    out = []
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        src = producers.get(node.input[0])
        # exact GELU as exported: x * 0.5 * (1 + erf(x / sqrt 2)) -> the last op is Mul
        seen, frontier = set(), [src] if src is not None else []
        for _ in range(4):
            nxt = []
            for n in frontier:
                if n is None or n.name in seen:
                    continue
                seen.add(n.name)
                if n.op_type in ("Erf", "Gelu", "FastGelu", "BiasGelu"):
                    out.append(node.name)
                    nxt = []
                    break
                if n.op_type in ("Mul", "Add", "Div"):
                    nxt.extend(producers.get(i) for i in n.input)
            else:
                frontier = nxt
                continue
            break
    return sorted(set(out))


def resolve(recipe: str, overrides: dict | None) -> dict:
    if recipe not in RECIPES:
        raise ValueError(f"unknown quantization recipe {recipe!r} (known: {', '.join(RECIPES)})")
    cfg = {k: (list(v) if isinstance(v, list) else (dict(v) if isinstance(v, dict) else v))
           for k, v in RECIPES[recipe].items()}
    for key, value in (overrides or {}).items():
        if key not in cfg:
            raise ValueError(f"unknown recipe key {key!r} (keys: {', '.join(cfg)})")
        cfg[key] = value
    return cfg


def quantize(src_path, dst_path, calibration_feeds: list[dict], recipe: str = "cnn",
             overrides: dict | None = None) -> dict:
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    cfg = resolve(recipe, overrides)
    if not calibration_feeds:
        raise ValueError("no calibration samples")
    qtype = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
    with tempfile.TemporaryDirectory() as tmp:
        pre = Path(tmp) / "pre.onnx"
        quant_pre_process(str(src_path), str(pre), skip_symbolic_shape=False)
        model = onnx.load(str(pre))
        exclude = list(cfg["nodes_to_exclude"])
        if cfg["exclude_after_gelu"]:
            exclude += _gelu_fed_matmuls(model)
        quantize_static(
            str(pre), str(dst_path), _Reader(calibration_feeds),
            quant_format=QuantFormat.QDQ,
            per_channel=cfg["per_channel"],
            weight_type=qtype[cfg["weights"]],
            activation_type=qtype[cfg["activations"]],
            calibrate_method=getattr(CalibrationMethod, cfg["calibrate_method"]),
            op_types_to_quantize=cfg["op_types_to_quantize"],
            nodes_to_exclude=exclude,
            reduce_range=cfg["reduce_range"],
            extra_options=cfg["extra_options"],
        )
    onnx.checker.check_model(str(dst_path), full_check=True)
    return {
        "scheme": "static-qdq",
        "weights": cfg["weights"],
        "activations": cfg["activations"],
        "per_channel": cfg["per_channel"],
        "calibrate_method": cfg["calibrate_method"],
        "op_types_to_quantize": cfg["op_types_to_quantize"],
        "nodes_excluded": sorted(set(exclude)),
        "reduce_range": cfg["reduce_range"],
        "extra_options": cfg["extra_options"],
        "recipe": recipe,
        "overrides": dict(overrides or {}),
        "calibration_samples": len(calibration_feeds),
    }
