"""A small ONNX → PyTorch translator for the Core ML target (coremltools 9 reads no ONNX).

Accepted: single-graph ONNX models (no subgraphs / control flow) with static
input shapes, built only from the ops in ``SUPPORTED`` below — the op set of
plain CNNs and MLPs (conv / pool / dense / elementwise / activations /
softmax / reshape with constant shapes) and of the detectors' necks (Slice with
constant bounds, Split, Resize nearest/linear with constant scales or sizes). Weights must be initializers or
``Constant`` nodes. Anything else raises ``ConversionFailed`` naming the
first unsupported op (and its node), so nothing is translated by guesswork.
Transformers come from a PyTorch source instead (``ConvertRequest.torch_source``).

The translation is a ``torch.fx.GraphModule`` with one node per ONNX node and
``nn.Conv2d`` / ``nn.Linear`` modules for Conv and Gemm, so coremltools.optimize.torch's
(FX-based) quantizers can prepare it.
"""

from __future__ import annotations

import operator
from pathlib import Path

from .registry import ConversionFailed

SUPPORTED = ("Conv", "Gemm", "MatMul", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "MaxPool", "AveragePool",
             "GlobalAveragePool", "Flatten", "Reshape", "Add", "Sub", "Mul", "Div", "Softmax", "BatchNormalization",
             "Identity", "Dropout", "Concat", "Transpose", "Slice", "Split", "Resize")


def _attrs(node) -> dict:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _pads2d(pads, what):
    if not pads:
        return (0, 0)
    if len(pads) != 4 or pads[0] != pads[2] or pads[1] != pads[3]:
        raise ConversionFailed(f"{what}: asymmetric pads {list(pads)} are not supported")
    return (int(pads[0]), int(pads[1]))


def _slice(x, starts, ends, axes, steps):
    # one getitem per axis, with no use of x's rank: torch.fx re-traces this with a Proxy x
    for s, e, a, st in zip(starts, ends, axes, steps):
        where = (slice(None),) * a + (slice(s, e, st),) if a >= 0 else \
            (Ellipsis, slice(s, e, st)) + (slice(None),) * (-a - 1)
        x = x[where]
    return x


def _resize(x, size, mode):
    import torch

    if mode == "nearest":
        return torch.nn.functional.interpolate(x, size=size, mode="nearest")
    return torch.nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=False)


def _resize_args(node, a, ins, const, shape_of, what):
    """(size (H, W), mode) of a Resize whose scales or sizes are constants."""
    mode = a.get("mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    ctm = a.get("coordinate_transformation_mode", b"half_pixel")
    ctm = ctm.decode() if isinstance(ctm, bytes) else ctm
    nearest = a.get("nearest_mode", b"round_prefer_floor")
    nearest = nearest.decode() if isinstance(nearest, bytes) else nearest
    if mode == "nearest" and not (ctm == "asymmetric" and nearest == "floor"):
        raise ConversionFailed(f"{what}: nearest Resize needs asymmetric/floor (torch's nearest), got {ctm}/{nearest}")
    if mode == "linear" and ctm not in ("pytorch_half_pixel", "half_pixel"):
        raise ConversionFailed(f"{what}: linear Resize needs half_pixel coordinates, got {ctm}")
    if mode not in ("nearest", "linear"):
        raise ConversionFailed(f"{what}: Resize mode {mode} is not supported")
    if len(ins) > 3 and ins[3]:
        sizes = [int(v) for v in const(ins[3], what)]
        return (sizes[2], sizes[3]), mode
    scales = [float(v) for v in const(ins[2], what)]
    shape = shape_of(ins[0])
    if shape is None or len(scales) != 4 or scales[:2] != [1.0, 1.0]:
        raise ConversionFailed(f"{what}: Resize needs constant spatial scales and a known input shape")
    return (int(shape[2] * scales[2]), int(shape[3] * scales[3])), mode


def check_supported(model) -> None:
    for node in model.graph.node:
        if node.op_type not in SUPPORTED and node.op_type != "Constant":     # constants are folded
            raise ConversionFailed(f"ONNX op {node.op_type} (node {node.name or node.output[0]!r}) is not supported "
                                   f"by the ONNX → torch route of the coreml target (it accepts: "
                                   f"{', '.join(SUPPORTED)}); give a PyTorch source (torch_source) instead")
        if any(a.type in (5, 10) for a in node.attribute):      # GRAPH / GRAPHS: control flow
            raise ConversionFailed(f"ONNX op {node.op_type} has a subgraph: control flow is not supported")


def translate(onnx_path: Path):
    """(torch module in eval mode, input names, output names)."""
    import numpy as np
    import onnx
    import torch
    from onnx import numpy_helper

    model = onnx.load(str(onnx_path))
    check_supported(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - shapes are only needed by Resize with scales
        inferred = model
    shapes = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
        shapes[vi.name] = None if None in dims else dims
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":   # not in SUPPORTED: folded here when the exporter wrote any
            consts[node.output[0]] = numpy_helper.to_array(_attrs(node)["value"])
    inputs = [i.name for i in model.graph.input if i.name not in consts]
    outputs = [o.name for o in model.graph.output]

    root = torch.nn.Module()
    graph = torch.fx.Graph()
    env = {n: graph.placeholder(_ident(n)) for n in inputs}
    counter = iter(range(1 << 30))

    class _Builder:
        def add(self, mod, node, tensor_inputs):
            name = f"m{next(counter)}_{node.op_type.lower()}"
            root.add_module(name, mod)
            env[node.output[0]] = graph.call_module(name, tuple(env[i] for i in tensor_inputs))

        def call(self, fn, node, args):
            env[node.output[0]] = graph.call_function(fn, tuple(args))

        def method(self, meth, node, args):
            env[node.output[0]] = graph.call_method(meth, tuple(args))

    m = _Builder()

    def const(name, what):
        if name not in consts:
            raise ConversionFailed(f"{what}: input {name!r} must be a constant (initializer) for this route")
        return consts[name]

    def operand(name):
        if name not in consts:
            return env[name]
        buf = f"c{next(counter)}"
        arr = consts[name].astype(np.float32) if consts[name].dtype == np.float64 else consts[name]
        root.register_buffer(buf, torch.from_numpy(np.ascontiguousarray(arr)))
        return graph.get_attr(buf)

    for node in model.graph.node:
        op, a, ins = node.op_type, _attrs(node), [i for i in node.input]
        what = f"{op} (node {node.name or node.output[0]!r})"
        if op == "Constant":
            continue
        if op == "Conv":
            w = const(ins[1], what)
            if w.ndim != 4:
                raise ConversionFailed(f"{what}: only 2-D convolutions are supported")
            conv = torch.nn.Conv2d(w.shape[1] * int(a.get("group", 1)), w.shape[0], tuple(w.shape[2:]),
                                   stride=tuple(a.get("strides", (1, 1))), padding=_pads2d(a.get("pads"), what),
                                   dilation=tuple(a.get("dilations", (1, 1))), groups=int(a.get("group", 1)),
                                   bias=len(ins) > 2 and bool(ins[2]))
            if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
                raise ConversionFailed(f"{what}: auto_pad is not supported")
            conv.weight.data = torch.from_numpy(w.copy())
            if conv.bias is not None:
                conv.bias.data = torch.from_numpy(const(ins[2], what).copy())
            m.add(conv, node, ins[:1])
        elif op == "Gemm":
            if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
                raise ConversionFailed(f"{what}: only Gemm with transA=0, alpha=beta=1 is supported")
            w = const(ins[1], what)
            w = w if a.get("transB", 0) else w.T
            lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=len(ins) > 2 and bool(ins[2]))
            lin.weight.data = torch.from_numpy(np.ascontiguousarray(w))
            if lin.bias is not None:
                lin.bias.data = torch.from_numpy(const(ins[2], what).reshape(-1).copy())
            m.add(lin, node, ins[:1])
        elif op == "MatMul" and ins[1] in consts and consts[ins[1]].ndim == 2:
            w = consts[ins[1]]
            lin = torch.nn.Linear(w.shape[0], w.shape[1], bias=False)
            lin.weight.data = torch.from_numpy(np.ascontiguousarray(w.T))
            m.add(lin, node, ins[:1])
        elif op == "MatMul":
            m.call(torch.matmul, node, [operand(i) for i in ins])
        elif op in ("Relu", "Sigmoid", "Tanh"):
            m.add({"Relu": torch.nn.ReLU, "Sigmoid": torch.nn.Sigmoid, "Tanh": torch.nn.Tanh}[op](), node, ins)
        elif op == "LeakyRelu":
            m.add(torch.nn.LeakyReLU(float(a.get("alpha", 0.01))), node, ins)
        elif op == "Clip":
            lo = float(const(ins[1], what)) if len(ins) > 1 and ins[1] else float(a.get("min", -np.inf))
            hi = float(const(ins[2], what)) if len(ins) > 2 and ins[2] else float(a.get("max", np.inf))
            m.add(torch.nn.ReLU6() if (lo, hi) == (0.0, 6.0) else torch.nn.Hardtanh(lo, hi), node, ins[:1])
        elif op in ("MaxPool", "AveragePool"):
            if a.get("ceil_mode", 0) or any(d != 1 for d in a.get("dilations", (1, 1))):
                raise ConversionFailed(f"{what}: ceil_mode / dilations are not supported")
            kw = dict(kernel_size=tuple(a["kernel_shape"]), stride=tuple(a.get("strides", a["kernel_shape"])),
                      padding=_pads2d(a.get("pads"), what))
            if op == "AveragePool":
                kw["count_include_pad"] = bool(a.get("count_include_pad", 0))
            m.add((torch.nn.MaxPool2d if op == "MaxPool" else torch.nn.AvgPool2d)(**kw), node, ins)
        elif op == "GlobalAveragePool":
            m.add(torch.nn.AdaptiveAvgPool2d(1), node, ins)
        elif op == "Flatten":
            m.add(torch.nn.Flatten(int(a.get("axis", 1))), node, ins)
        elif op == "Reshape":
            shape = [int(d) for d in const(ins[1], what)]
            if 0 in shape:
                raise ConversionFailed(f"{what}: 0 (copy) dimensions are not supported")
            m.call(torch.reshape, node, [env[ins[0]], tuple(shape)])
        elif op in ("Add", "Sub", "Mul", "Div"):
            fn = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div}[op]
            m.call(fn, node, [operand(i) for i in ins])
        elif op == "Softmax":
            m.add(torch.nn.Softmax(int(a.get("axis", -1))), node, ins)
        elif op == "BatchNormalization":
            scale, bias, mean, var = (const(i, what) for i in ins[1:5])
            bn = torch.nn.BatchNorm2d(scale.shape[0], eps=float(a.get("epsilon", 1e-5)))
            for t, v in ((bn.weight, scale), (bn.bias, bias), (bn.running_mean, mean), (bn.running_var, var)):
                t.data = torch.from_numpy(v.astype(np.float32).copy())
            m.add(bn, node, ins[:1])
        elif op in ("Identity", "Dropout"):
            m.add(torch.nn.Identity(), node, ins[:1])
        elif op == "Concat":
            m.call(torch.cat, node, [tuple(operand(i) for i in ins), int(a["axis"])])
        elif op == "Transpose":
            m.method("permute", node, [env[ins[0]], *(int(d) for d in a["perm"])])
        elif op == "Slice":
            starts, ends = (const(i, what).tolist() for i in ins[1:3])
            axes = const(ins[3], what).tolist() if len(ins) > 3 and ins[3] else list(range(len(starts)))
            steps = const(ins[4], what).tolist() if len(ins) > 4 and ins[4] else [1] * len(starts)
            if any(st <= 0 for st in steps):
                raise ConversionFailed(f"{what}: only positive Slice steps are supported")
            m.call(_slice, node, [env[ins[0]], starts, ends, axes, steps])
        elif op == "Split":
            axis = int(a.get("axis", 0))
            sizes = a.get("split") if "split" in a else (const(ins[1], what).tolist() if len(ins) > 1 and ins[1]
                                                         else None)
            if sizes is None:
                raise ConversionFailed(f"{what}: Split needs its sizes (attribute or constant input)")
            parts = graph.call_function(torch.split, (env[ins[0]], [int(v) for v in sizes], axis))
            for k, name in enumerate(node.output):
                env[name] = graph.call_function(operator.getitem, (parts, k))
        elif op == "Resize":
            size, mode = _resize_args(node, a, ins, const, shapes.get, what)
            m.call(_resize, node, [env[ins[0]], size, mode])
        else:  # pragma: no cover - check_supported guards this
            raise ConversionFailed(f"ONNX op {op} is not supported")
    result = tuple(env[o] for o in outputs)
    graph.output(result[0] if len(result) == 1 else result)
    module = torch.fx.GraphModule(root, graph, class_name="TranslatedFromOnnx")
    return module.eval(), inputs, outputs


def _ident(name: str) -> str:
    import re

    out = re.sub(r"\W", "_", name)
    return out if out and not out[0].isdigit() else f"x_{out}"
