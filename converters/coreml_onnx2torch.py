"""A small ONNX → PyTorch translator for the Core ML target (coremltools 9 reads no ONNX).

Accepted: single-graph ONNX models (no subgraphs / control flow) with static
input shapes, built only from the ops in ``SUPPORTED`` below — the op set of
plain CNNs and MLPs (conv / pool / dense / elementwise / activations /
softmax / reshape with constant shapes). Weights must be initializers or
``Constant`` nodes. Anything else raises ``ConversionFailed`` naming the
first unsupported op (and its node), so nothing is translated by guesswork.
Transformers come from a PyTorch source instead (``ConvertRequest.torch_source``).

The translation is a ``torch.fx.GraphModule`` with one node per ONNX node and
``nn.Conv2d`` / ``nn.Linear`` modules for Conv and Gemm, so coremltools.optimize.torch's
(FX-based) quantizers can prepare it.
"""

from __future__ import annotations

from pathlib import Path

from .registry import ConversionFailed

SUPPORTED = ("Conv", "Gemm", "MatMul", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "MaxPool", "AveragePool",
             "GlobalAveragePool", "Flatten", "Reshape", "Add", "Sub", "Mul", "Div", "Softmax", "BatchNormalization",
             "Identity", "Dropout", "Concat", "Transpose")


def _attrs(node) -> dict:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _pads2d(pads, what):
    if not pads:
        return (0, 0)
    if len(pads) != 4 or pads[0] != pads[2] or pads[1] != pads[3]:
        raise ConversionFailed(f"{what}: asymmetric pads {list(pads)} are not supported")
    return (int(pads[0]), int(pads[1]))


def check_supported(model) -> None:
    for node in model.graph.node:
        if node.op_type not in SUPPORTED:
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
