"""ONNX Runtime static int8 (QDQ) quantization with named recipes per model family.

``quantize(src, dst, calibration_feeds, recipe, overrides)``: ``quant_pre_process``
(to a temp file) -> optional SmoothQuant -> ``quantize_static`` (QDQ) ->
optional MatMulInteger rewrite -> ``onnx.checker`` (full) -> must load in ORT.

Default ``quantize_static`` settings destroy a transformer (cosine 0.33 vs
fp32 on MiniLM, see TOOLCHAINS). The ``transformer`` recipe (measured on
all-MiniLM-L6-v2, see models/zoo/minilm/README.md):

- quantizes only MatMul/Gemm/Gather, per channel, int8 weights, uint8 activations;
- keeps in float: each layer's second feed-forward matmul (fed by GELU; found
  by walking forward from Erf/Gelu, not by name), the attention matmuls with
  no constant input (QK^T, PV), and the head after the last LayerNorm;
- SmoothQuant (alpha 0.7, implemented here with numpy; ORT's own needs
  neural-compressor) moves activation outlier channels into the weights;
- leaves matmul outputs in float instead of re-quantizing them (the largest
  single error source) and writes those matmuls as standard
  MatMulInteger+Cast+Mul, because ORT's MatMulAddFusion would otherwise turn
  them into float Gemms that dequantize the weights on every run.

Recipes are plain, JSON-able data; ``overrides`` changes any key (unknown
keys and bad values raise ValueError). Only numpy/stdlib at import time.
"""

from __future__ import annotations

import copy
import re
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from .onnx_rewrites import (_prune_opsets, activation_matmuls, gelu_fed_matmuls, head_nodes, matmul_integer,
                            output_tail_nodes, smooth_quant)

_BASE = {
    "per_channel": True,
    "weights": "int8",                 # int8 | uint8
    "activations": "uint8",            # uint8 | int8 (int8 ran no faster than fp32 here)
    "calibrate_method": "MinMax",      # MinMax | Entropy | Percentile | Distribution
    "percentile": None,                # Percentile only (ORT default 99.999)
    "op_types_to_quantize": None,      # None: every op type ORT can quantize
    "exclude_gelu_matmuls": False,     # keep MatMul/Gemm fed by GELU (FFN2) in float
    "exclude_activation_matmuls": False,  # keep MatMuls with no constant input (attention QK^T, PV) in float
    "exclude_head": False,             # keep nodes after the last LayerNormalization (pooling/label head) in float
    "exclude_output_tail": False,      # keep the nodes after the last Conv/Gemm/MatMul of each output in float
    "nodes_to_exclude": [],            # node names, or "re:<pattern>" matched against node names
    "reduce_range": False,
    "matmul_float_output": False,      # leave MatMul/Gemm outputs in float and run MatMuls as MatMulInteger
    "smooth_quant_alpha": None,        # float in [0, 1]: SmoothQuant the quantized MatMul/Gemm inputs (None: off)
    "extra_options": {},               # passed to quantize_static (ActivationSymmetric, ...)
}

# Weights uint8 (U8U8 MatMulInteger), not int8: on x86 without VNNI (AVX2 only)
# ORT's U8S8 kernel sums u8*s8 pairs into int16 (vpmaddubsw), which saturates.
# On a 2-core AMD EPYC with AVX2 only, U8S8 gave the MiniLM classifier top-1
# agreement 0.982 (0.984 with reduce_range); U8U8 has no saturating path on
# any CPU: 0.990 at alpha 0.7, 0.992 at 0.8 (0.987 at 0.5); embedding cosine
# 0.9991 mean / 0.9961 min. An artifact's parity must hold on the device it
# runs on, not only on the build machine's ISA.
_TRANSFORMER = dict(
    _BASE,
    op_types_to_quantize=["MatMul", "Gemm", "Gather"],  # torch exports MatMul+Add; Gemm after quant_pre_process
    weights="uint8",
    exclude_gelu_matmuls=True,
    exclude_activation_matmuls=True,
    exclude_head=True,
    matmul_float_output=True,
    smooth_quant_alpha=0.8,
)

RECIPES: dict[str, dict] = {
    # CNNs: every op type ORT can quantize, QDQ, per channel, MinMax
    "cnn": dict(_BASE),
    # BERT-like encoders (MiniLM embedding and its zero-shot classifier).
    # all-MiniLM-L6-v2 (models/zoo/minilm/README.md): int8-weight U8S8 at alpha 0.7
    # measured cosine 0.9993 / 0.9984 and SST-2 agreement 0.991 on an AVX-512 VNNI
    # host; this U8U8 form: 0.9991 / 0.9961 and 0.992 on an AVX2-only host
    "transformer": dict(_TRANSFORMER),
    # also quantizes the GELU-fed FFN2 matmuls (smoothed): 2x fp32 speed, but
    # cosine 0.998 / 0.996 and classifier agreement 0.985-0.989 (< 0.99)
    "transformer-fast": dict(_TRANSFORMER, exclude_gelu_matmuls=False, smooth_quant_alpha=0.8),
    # the TOOLCHAINS.md recipe as first measured (cosine 0.993 / 0.985), for comparison
    "transformer-basic": dict(_BASE, op_types_to_quantize=["MatMul", "Gemm", "Gather"], exclude_gelu_matmuls=True),
}

_QTYPES = ("int8", "uint8", "int16", "uint16")
_CALIB = ("MinMax", "Entropy", "Percentile", "Distribution")


class _Reader:
    """CalibrationDataReader over a list of feeds (re-iterable copies)."""

    def __init__(self, feeds):
        self._feeds = feeds
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)

    def __iter__(self):
        return iter(self._feeds)

    def __len__(self):
        return len(self._feeds)


def resolve(recipe: str, overrides: dict | None = None) -> dict:
    """The recipe's settings with ``overrides`` applied and validated."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown quantization recipe {recipe!r} (known: {', '.join(RECIPES)})")
    cfg = copy.deepcopy(RECIPES[recipe])
    if overrides is not None and not isinstance(overrides, dict):
        raise ValueError(f"recipe overrides must be a JSON object, got {type(overrides).__name__}")
    for key, value in (overrides or {}).items():
        if key not in cfg:
            raise ValueError(f"unknown recipe key {key!r} (keys: {', '.join(cfg)})")
        cfg[key] = copy.deepcopy(value)
    _validate(cfg)
    return cfg


def _validate(cfg: dict) -> None:
    def bad(key, want):
        raise ValueError(f"recipe key {key!r}: expected {want}, got {cfg[key]!r}")

    for key in ("weights", "activations"):
        if cfg[key] not in _QTYPES:
            bad(key, " or ".join(_QTYPES))
    if cfg["calibrate_method"] not in _CALIB:
        bad("calibrate_method", " | ".join(_CALIB))
    for key in ("per_channel", "exclude_gelu_matmuls", "exclude_activation_matmuls", "exclude_head", "exclude_output_tail",
                "matmul_float_output", "reduce_range"):
        if not isinstance(cfg[key], bool):
            bad(key, "true or false")
    p = cfg["percentile"]
    if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 100):
        bad("percentile", "null or a number in (0, 100]")
    ops = cfg["op_types_to_quantize"]
    if ops is not None and (not isinstance(ops, list) or not all(isinstance(o, str) and o for o in ops)):
        bad("op_types_to_quantize", "null or a list of op type names")
    ex = cfg["nodes_to_exclude"]
    if not isinstance(ex, list) or not all(isinstance(n, str) and n for n in ex):
        bad("nodes_to_exclude", "a list of node names (or 're:<regex>')")
    for n in ex:
        if n.startswith("re:"):
            try:
                re.compile(n[3:])
            except re.error as exc:
                raise ValueError(f"recipe key 'nodes_to_exclude': bad pattern {n!r}: {exc}") from None
    a = cfg["smooth_quant_alpha"]
    if a is not None and (isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 <= a <= 1):
        bad("smooth_quant_alpha", "null or a number in [0, 1]")
    if not isinstance(cfg["extra_options"], dict):
        bad("extra_options", "a JSON object")
    if "SmoothQuant" in cfg["extra_options"]:
        raise ValueError("extra_options.SmoothQuant needs neural-compressor; use the recipe key smooth_quant_alpha")


def _name_nodes(model) -> None:
    used = {n.name for n in model.graph.node if n.name}
    for k, n in enumerate(model.graph.node):
        if not n.name:
            base = f"{n.op_type}_{k}"
            name, j = base, 0
            while name in used:
                j += 1
                name = f"{base}_{j}"
            n.name = name
            used.add(name)


def _excluded(model, cfg: dict) -> list[str]:
    names = [n.name for n in model.graph.node]
    out = set()
    for pat in cfg["nodes_to_exclude"]:
        if pat.startswith("re:"):
            rx = re.compile(pat[3:])
            out |= {n for n in names if rx.search(n)}
        else:
            # exact name, or a node that quant_pre_process derived from it
            # (e.g. ".../MatMul" fused into ".../MatMul/MatMulAddFusion")
            hit = {n for n in names if n == pat or n.startswith(pat + "/")}
            if not hit:
                raise ValueError(f"nodes_to_exclude: the model has no node {pat!r}")
            out |= hit
    if cfg["exclude_gelu_matmuls"]:
        found = gelu_fed_matmuls(model)
        if not found:
            raise ValueError("exclude_gelu_matmuls: no MatMul/Gemm fed by a GELU (Erf/Gelu) found in the graph; "
                             "override exclude_gelu_matmuls=false for a model without GELU")
        out |= set(found)
    if cfg["exclude_activation_matmuls"]:
        out |= set(activation_matmuls(model))
    if cfg["exclude_head"]:
        out |= set(head_nodes(model))
    if cfg["exclude_output_tail"]:
        out |= set(output_tail_nodes(model))
    return sorted(out)


def _check_feeds(model, feeds: list[dict]) -> None:
    inits = {i.name for i in model.graph.initializer}
    want = {i.name: [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
            for i in model.graph.input if i.name not in inits}
    for name, dims in want.items():
        if any(d is None for d in dims):
            raise ValueError(f"input {name!r} has dynamic dims {dims}: fix them first (onnx_shapes.fix_input_dims)")
    for k, feed in enumerate(feeds):
        if set(feed) != set(want):
            raise ValueError(f"calibration sample {k}: inputs {sorted(feed)} != model inputs {sorted(want)}")
        for name, arr in feed.items():
            if list(np.shape(arr)) != want[name]:
                raise ValueError(f"calibration sample {k}: {name!r} has shape {list(np.shape(arr))}, "
                                 f"model wants {want[name]}")


def _check_loads(path) -> None:
    """The quantized model must load in ONNX Runtime with its default graph
    optimisations (some exclusion patterns make ORT's optimiser fail)."""
    import onnxruntime as ort

    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ValueError(f"the quantized model does not load in ONNX Runtime: {str(exc).strip()[-300:]}") from exc


def quantize(src_path, dst_path, calibration_feeds: list[dict[str, np.ndarray]], recipe: str = "cnn",
             overrides: dict | None = None) -> dict:
    """Static QDQ int8 quantization of a static-shape fp32 ONNX model.

    ``calibration_feeds``: model inputs (batch 1), one dict per sample.
    Returns the JSON-able description of what was done (for the manifest)."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    t0 = time.perf_counter()
    cfg = resolve(recipe, overrides)
    if not calibration_feeds:
        raise ValueError("no calibration samples")
    qtype = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8, "int16": QuantType.QInt16, "uint16": QuantType.QUInt16}
    extra = dict(cfg["extra_options"])
    if cfg["calibrate_method"] == "Percentile" and cfg["percentile"] is not None:
        extra["CalibPercentile"] = float(cfg["percentile"])
    if cfg["matmul_float_output"]:
        extra["OpTypesToExcludeOutputQuantization"] = sorted(
            set(extra.get("OpTypesToExcludeOutputQuantization", [])) | {"MatMul", "Gemm"})
    with tempfile.TemporaryDirectory(prefix="edge-quant-") as tmp:
        pre, out = Path(tmp) / "pre.onnx", Path(tmp) / "int8.onnx"
        quant_pre_process(str(src_path), str(pre), skip_symbolic_shape=False)
        model = onnx.load(str(pre))
        _check_feeds(model, calibration_feeds)
        _name_nodes(model)
        exclude = _excluded(model, cfg)
        smoothed = []
        if cfg["smooth_quant_alpha"] is not None:
            smoothed = smooth_quant(model, calibration_feeds, float(cfg["smooth_quant_alpha"]), set(exclude),
                                    cfg["op_types_to_quantize"])
        onnx.save(model, str(pre))
        del model
        quantize_static(
            str(pre), str(out), _Reader(calibration_feeds),
            quant_format=QuantFormat.QDQ,
            per_channel=cfg["per_channel"],
            weight_type=qtype[cfg["weights"]],
            activation_type=qtype[cfg["activations"]],
            calibrate_method=getattr(CalibrationMethod, cfg["calibrate_method"]),
            op_types_to_quantize=cfg["op_types_to_quantize"],
            nodes_to_exclude=exclude,
            reduce_range=cfg["reduce_range"],
            extra_options=extra,
        )
        q = onnx.load(str(out))
        rewritten = matmul_integer(q) if cfg["matmul_float_output"] else 0
        _prune_opsets(q)
        onnx.save(q, str(out))
        del q
        onnx.checker.check_model(str(out), full_check=True)
        _check_loads(out)
        Path(dst_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(out), str(dst_path))
    q = onnx.load(str(dst_path), load_external_data=False)
    n_quant = sum(1 for n in q.graph.node if n.op_type == "DequantizeLinear")
    if n_quant == 0 and rewritten == 0:     # every node excluded or of another type: the "int8" model is float
        raise ValueError("ONNX Runtime quantized no node (no DequantizeLinear, no MatMulInteger): the model would "
                         "run in float; check op_types_to_quantize and nodes_to_exclude")
    return {
        "scheme": "static-qdq",
        "weights": cfg["weights"],
        "activations": cfg["activations"],
        "per_channel": cfg["per_channel"],
        "calibrate_method": cfg["calibrate_method"],
        # the percentile ORT calibrated at: ours, else extra_options' CalibPercentile, else ORT's 99.999
        "percentile": extra.get("CalibPercentile", 99.999) if cfg["calibrate_method"] == "Percentile" else None,
        "op_types_to_quantize": cfg["op_types_to_quantize"],
        "nodes_to_exclude": exclude,
        "reduce_range": cfg["reduce_range"],
        "smooth_quant_alpha": cfg["smooth_quant_alpha"],
        "smoothed_inputs": len(smoothed),
        "matmul_float_output": cfg["matmul_float_output"],
        "matmul_integer_nodes": rewritten,
        "extra_options": extra,
        "recipe": recipe,
        "overrides": copy.deepcopy(overrides or {}),
        "calibration_samples": len(calibration_feeds),
        "dequantize_nodes": n_quant,
        "seconds": round(time.perf_counter() - t0, 1),
    }
