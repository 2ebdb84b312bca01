"""ONNX Runtime static int8 (QDQ) quantization with named recipes per model family.

Default ``quantize_static`` settings destroy a transformer (cosine 0.33 vs
fp32 on MiniLM, see TOOLCHAINS). The ``transformer`` recipe quantizes only
MatMul/Gemm/Gather, per channel, uint8 activations / int8 weights, and keeps
each layer's second feed-forward matmul (the one fed by GELU, whose input has
huge outliers) in float. Those nodes are found from the graph (the matmul
reached forward from an Erf/Gelu through elementwise ops), not by name.

Recipes are plain, JSON-able data; ``quantize(..., overrides={...})`` changes
any key (unknown keys are refused). onnx / onnxruntime are imported inside
the functions.
"""

from __future__ import annotations

import copy
import re
import tempfile
import time
from pathlib import Path

import numpy as np

_BASE = {
    "per_channel": True,
    "weights": "int8",                 # int8 | uint8
    "activations": "uint8",            # uint8 | int8 (int8 ran no faster than fp32 here)
    "calibrate_method": "MinMax",      # MinMax | Entropy | Percentile | Distribution
    "percentile": None,                # Percentile only (ORT default 99.999)
    "op_types_to_quantize": None,      # None: every op type ORT can quantize
    "exclude_gelu_matmuls": False,     # keep MatMul/Gemm fed by GELU (FFN2) in float
    "exclude_activation_matmuls": False,  # keep MatMuls with no constant input (attention QK^T, PV) in float
    "nodes_to_exclude": [],            # node names, or "re:<pattern>" matched against node names
    "reduce_range": False,
    "smooth_quant_alpha": None,        # float in [0, 1]: SmoothQuant the quantized MatMul/Gemm inputs (None: off)
    "extra_options": {},               # passed to quantize_static (ActivationSymmetric, ...)
}

RECIPES: dict[str, dict] = {
    # CNNs: everything ORT can quantize, QDQ per channel
    "cnn": dict(_BASE),
    # BERT-like encoders (MiniLM): TOOLCHAINS' recipe
    "transformer": dict(_BASE, op_types_to_quantize=["MatMul", "Gemm", "Gather"], exclude_gelu_matmuls=True),
    # transformer encoder with a small head (pooling, normalise, label matmul):
    # quantize only the matmuls that have a constant weight and are not the
    # head, i.e. the encoder's dense layers
    "transformer-head": dict(_BASE, op_types_to_quantize=["MatMul", "Gemm", "Gather"], exclude_gelu_matmuls=True),
}

_QTYPES = ("int8", "uint8")
_CALIB = ("MinMax", "Entropy", "Percentile", "Distribution")
_GELU_OPS = ("Erf", "Gelu", "FastGelu", "BiasGelu")
_PASS_THROUGH = ("Add", "Mul", "Div", "Sub", "Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")


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
    for key in ("per_channel", "exclude_gelu_matmuls", "exclude_activation_matmuls", "reduce_range"):
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


def gelu_fed_matmuls(model) -> list[str]:
    """Names of MatMul/Gemm nodes whose first input comes from a GELU: walk
    forward from each Erf / Gelu / FastGelu / BiasGelu through elementwise
    and reshaping ops (at most 6 steps) to the first MatMul/Gemm reached."""
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    found = set()
    for start in (n for n in model.graph.node if n.op_type in _GELU_OPS):
        frontier, seen = [start], set()
        for _ in range(6):
            nxt = []
            for n in frontier:
                for out in n.output:
                    for c in consumers.get(out, []):
                        if id(c) in seen:
                            continue
                        seen.add(id(c))
                        if c.op_type in ("MatMul", "Gemm"):
                            if c.input[0] == out:
                                found.add(c.name)
                        elif c.op_type in _PASS_THROUGH:
                            nxt.append(c)
            frontier = nxt
    return sorted(found)


def activation_matmuls(model) -> list[str]:
    """MatMul nodes with no constant input (attention scores and context)."""
    consts = {i.name for i in model.graph.initializer}
    consts |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    return sorted(n.name for n in model.graph.node
                  if n.op_type == "MatMul" and not any(i in consts for i in n.input))


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
        elif pat in names:
            out.add(pat)
        else:
            raise ValueError(f"nodes_to_exclude: the model has no node {pat!r}")
    if cfg["exclude_gelu_matmuls"]:
        found = gelu_fed_matmuls(model)
        if not found:
            raise ValueError("exclude_gelu_matmuls: no MatMul/Gemm fed by a GELU (Erf/Gelu) found in the graph")
        out |= set(found)
    if cfg["exclude_activation_matmuls"]:
        out |= set(activation_matmuls(model))
    return sorted(out)


def smooth_quant(model, feeds: list[dict], alpha: float, exclude: set, op_types) -> list[dict]:
    """SmoothQuant (Xiao et al. 2023) without folding: for every activation
    X feeding MatMul/Gemm nodes with a constant 2-D weight that will be
    quantized, insert ``X * (1/s)`` (float Mul) and scale the weights' input
    rows by ``s``, ``s_j = max|X_j|^alpha / max|W_j|^(1-alpha)``, with
    ``max|X_j|`` measured on the calibration feeds. Exact in float; it moves
    activation outlier channels into the (per-channel quantized) weights.
    Edits ``model`` in place; returns the groups that were smoothed."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    types = set(op_types or ["MatMul", "Gemm"]) & {"MatMul", "Gemm"}
    inits = {i.name: i for i in model.graph.initializer}
    graph_inputs = {i.name for i in model.graph.input}
    uses: dict[str, int] = {}
    for n in model.graph.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1
    groups: dict[str, list] = {}
    for n in model.graph.node:
        if n.op_type not in types or n.name in exclude or len(n.input) < 2 or n.input[1] not in inits:
            continue
        if n.input[0] in inits or n.input[0] in graph_inputs:
            continue
        w = inits[n.input[1]]
        if len(w.dims) != 2 or w.data_type != onnx.TensorProto.FLOAT:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type == "Gemm" and (attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0):
            continue
        groups.setdefault(n.input[0], []).append((n, bool(attrs.get("transB", 0)) if n.op_type == "Gemm" else False))
    if not groups:
        return []
    probe = copy.deepcopy(model)
    del probe.graph.output[:]
    for name in groups:
        probe.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(probe.SerializeToString(), so, providers=["CPUExecutionProvider"])
    del probe
    names = list(groups)
    amax = {n: None for n in names}
    for feed in feeds:
        for name, x in zip(names, sess.run(names, feed)):
            m = np.abs(x.reshape(-1, x.shape[-1])).max(0)
            amax[name] = m if amax[name] is None else np.maximum(amax[name], m)
    del sess
    done = []
    for k, (xname, nodes) in enumerate(groups.items()):
        ws = [numpy_helper.to_array(inits[n.input[1]]) for n, _ in nodes]
        wmax = np.max([np.abs(w.T if tb else w).max(1) for w, (_, tb) in zip(ws, nodes)], axis=0)
        xmax = amax[xname]
        if xmax.shape != wmax.shape:
            continue
        s = np.power(np.maximum(xmax, 1e-5), alpha) / np.power(np.maximum(wmax, 1e-5), 1 - alpha)
        s = np.clip(s, 1e-4, 1e4).astype(np.float32)
        inv = numpy_helper.from_array((1.0 / s).astype(np.float32), f"{xname}_smooth_inv_scale")
        model.graph.initializer.append(inv)
        out = f"{xname}_smoothed"
        model.graph.node.append(onnx.helper.make_node("Mul", [xname, inv.name], [out], name=f"SmoothQuant_Mul_{k}"))
        for (n, tb), w in zip(nodes, ws):
            scaled = (w * s[None, :]) if tb else (w * s[:, None])
            wname = n.input[1]
            if uses.get(wname, 0) > 1:  # shared weight: give this node its own copy
                wname = f"{wname}_smooth_{k}"
                model.graph.initializer.append(numpy_helper.from_array(scaled.astype(np.float32), wname))
                n.input[1] = wname
            else:
                inits[wname].CopyFrom(numpy_helper.from_array(scaled.astype(np.float32), wname))
            n.input[0] = out
        done.append({"input": xname, "nodes": [n.name for n, _ in nodes],
                     "max_abs_in": round(float(xmax.max()), 3), "max_abs_in_after": round(float((xmax / s).max()), 3)})
    _toposort(model)
    return done


def _toposort(model) -> None:
    import onnx  # noqa: F401

    produced = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer} | {""}
    pending, ordered = list(model.graph.node), []
    while pending:
        rest = []
        for n in pending:
            if all(i in produced for i in n.input):
                ordered.append(n)
                produced.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            raise ValueError("graph has a cycle or a dangling input after smoothing")
        pending = rest
    nodes = [copy.deepcopy(n) for n in ordered]
    del model.graph.node[:]
    model.graph.node.extend(nodes)


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
    qtype = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
    extra = dict(cfg["extra_options"])
    if cfg["calibrate_method"] == "Percentile" and cfg["percentile"] is not None:
        extra["CalibPercentile"] = float(cfg["percentile"])
    with tempfile.TemporaryDirectory(prefix="edge-quant-") as tmp:
        pre = Path(tmp) / "pre.onnx"
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
            str(pre), str(dst_path), _Reader(calibration_feeds),
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
    onnx.checker.check_model(str(dst_path), full_check=True)
    _check_loads(dst_path)
    q = onnx.load(str(dst_path), load_external_data=False)
    n_quant = sum(1 for n in q.graph.node if n.op_type == "DequantizeLinear")
    return {
        "scheme": "static-qdq",
        "weights": cfg["weights"],
        "activations": cfg["activations"],
        "per_channel": cfg["per_channel"],
        "calibrate_method": cfg["calibrate_method"],
        "percentile": cfg["percentile"] if cfg["calibrate_method"] == "Percentile" else None,
        "op_types_to_quantize": cfg["op_types_to_quantize"],
        "nodes_to_exclude": exclude,
        "reduce_range": cfg["reduce_range"],
        "smooth_quant_alpha": cfg["smooth_quant_alpha"],
        "smoothed_inputs": len(smoothed),
        "extra_options": extra,
        "recipe": recipe,
        "overrides": copy.deepcopy(overrides or {}),
        "calibration_samples": len(calibration_feeds),
        "dequantize_nodes": n_quant,
        "seconds": round(time.perf_counter() - t0, 1),
    }
