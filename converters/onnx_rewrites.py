"""Graph rewrites and node finders used by the ONNX int8 recipes.

Node finders (GELU-fed matmuls, activation-by-activation matmuls, the
classifier head), a numpy SmoothQuant, and the MatMulInteger rewrite that
keeps quantized matmul outputs in float. Split out of ``onnx_quant`` so the
recipe/driver module stays small. onnx is imported inside functions.
"""

from __future__ import annotations

import copy

import numpy as np

_GELU_OPS = ("Erf", "Gelu", "FastGelu", "BiasGelu")
_PASS_THROUGH = ("Add", "Mul", "Div", "Sub", "Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")


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


def head_nodes(model) -> list[str]:
    """Nodes downstream of the last LayerNormalization in graph order (the
    head of an encoder: pooling, normalisation, classifier matmul)."""
    nodes = list(model.graph.node)
    last = max((k for k, n in enumerate(nodes) if n.op_type == "LayerNormalization"), default=None)
    if last is None:
        return []
    live, out = set(nodes[last].output), []
    for n in nodes[last + 1:]:
        if any(i in live for i in n.input):
            live.update(n.output)
            out.append(n.name)
    return sorted(out)


_COMPUTE = {"Conv", "ConvTranspose", "Gemm", "MatMul"}


def output_tail_nodes(model) -> list[str]:
    """The nodes between the last compute nodes (Conv/Gemm/MatMul) and the graph outputs: a
    detector's decode tail (Sigmoid, Split, Reshape, Transpose, Concat of boxes with scores).
    Quantized, a Concat of box offsets (tens of pixels) with sigmoid scores (0..1) shares one
    scale, and the scores keep a few levels; kept in float, every output stays exact."""
    producer = {o: n for n in model.graph.node for o in n.output}
    out, stack, seen = set(), [o.name for o in model.graph.output], set()
    while stack:
        t = stack.pop()
        n = producer.get(t)
        if n is None or n.name in seen or n.op_type in _COMPUTE:
            continue
        seen.add(n.name)
        out.add(n.name)
        stack.extend(n.input)
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
    amax: dict[str, np.ndarray | None] = {n: None for n in names}
    for feed in feeds:
        for name, x in zip(names, sess.run(names, feed)):
            m = np.abs(x.reshape(-1, x.shape[-1])).max(0)
            prev = amax[name]
            amax[name] = m if prev is None else np.maximum(prev, m)
    del sess
    done = []
    for k, (xname, nodes) in enumerate(groups.items()):
        ws = [numpy_helper.to_array(inits[n.input[1]]) for n, _ in nodes]
        wmax = np.max([np.abs(w.T if tb else w).max(1) for w, (_, tb) in zip(ws, nodes)], axis=0)
        xmax = amax[xname]
        if xmax is None or xmax.shape != wmax.shape:   # None: no calibration feed measured it
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


def matmul_integer(model) -> int:
    """Rewrite ``DequantizeLinear(x_q) , DequantizeLinear(W_q) -> MatMul`` with a
    float output (no Q after it) into standard ONNX integer ops:
    ``MatMulInteger(x_q, W_q, zp_x, zp_W) -> Cast -> Mul(s_x * s_W) [-> Add(bias)]``.

    Why: with float matmul outputs (much more accurate than re-quantizing
    every matmul output), ORT's MatMulAddFusion turns DQ->MatMul->Add into a
    float Gemm that dequantizes the weights on every run (slower than fp32).
    Written out as MatMulInteger, the int8 GEMM runs as it does in dynamic
    quantization. Needs a per-tensor activation scale; weights per tensor or
    per output column. Edits ``model`` in place; returns how many were rewritten."""
    import onnx
    from onnx import helper, numpy_helper

    g = model.graph
    prod = {o: n for n in g.node for o in n.output}
    cons: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            cons.setdefault(i, []).append(n)
    inits = {i.name: i for i in g.initializer}
    graph_outs = {o.name for o in g.output}
    replace, drop, k = {}, set(), 0
    for n in g.node:
        if n.op_type != "MatMul" or n.domain not in ("", "ai.onnx"):
            continue
        da, db = prod.get(n.input[0]), prod.get(n.input[1])
        if da is None or db is None or da.op_type != "DequantizeLinear" or db.op_type != "DequantizeLinear":
            continue
        if len(da.input) < 3 or len(db.input) < 3 or db.input[0] not in inits or da.input[1] not in inits \
                or db.input[1] not in inits:
            continue
        a_scale = numpy_helper.to_array(inits[da.input[1]])
        b_scale = numpy_helper.to_array(inits[db.input[1]])
        w = inits[db.input[0]]
        b_axis = next((helper.get_attribute_value(a) for a in db.attribute if a.name == "axis"), 1)
        if a_scale.size != 1 or len(w.dims) != 2 or w.data_type not in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8):
            continue
        if b_scale.size not in (1, w.dims[1]) or (b_scale.size > 1 and b_axis not in (1, -1)):
            continue
        k += 1
        out = n.output[0]
        bias = None
        users = cons.get(out, [])
        if len(users) == 1 and users[0].op_type == "Add" and out not in graph_outs:
            add = users[0]
            other = add.input[1] if add.input[0] == out else add.input[0]
            if other in inits and len(inits[other].dims) == 1 and inits[other].dims[0] == w.dims[1]:
                bias, out = other, add.output[0]
                drop.add(id(add))
        scale = numpy_helper.from_array((a_scale.reshape(()) * b_scale.reshape(-1)).astype(np.float32),
                                        f"{n.name}_int_scale")
        g.initializer.append(scale)
        base = f"{n.name}_int"
        nodes = [
            helper.make_node("MatMulInteger", [da.input[0], db.input[0], da.input[2], db.input[2]], [f"{base}_i32"],
                             name=f"{n.name}/MatMulInteger"),
            helper.make_node("Cast", [f"{base}_i32"], [f"{base}_f32"], to=onnx.TensorProto.FLOAT,
                             name=f"{n.name}/Cast"),
            helper.make_node("Mul", [f"{base}_f32", scale.name], [out if bias is None else f"{base}_scaled"],
                             name=f"{n.name}/Scale"),
        ]
        if bias is not None:
            nodes.append(helper.make_node("Add", [f"{base}_scaled", bias], [out], name=f"{n.name}/Bias"))
        replace[id(n)] = nodes
    if not k:
        return 0
    new = []
    for n in g.node:
        if id(n) not in drop:
            new.extend(replace.get(id(n), [n]))
    used = {i for n in new for i in n.input} | graph_outs
    new = [n for n in new if not (n.op_type == "DequantizeLinear" and n.output[0] not in used)]
    del g.node[:]
    g.node.extend(new)
    used = {i for n in new for i in n.input}
    keep = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    return k


def _prune_opsets(model) -> None:
    """Drop the opset imports ORT's optimizer adds for domains no node uses."""
    used = {n.domain or "" for n in model.graph.node}
    keep = [o for o in model.opset_import if (o.domain or "") in used or (o.domain or "") in ("", "ai.onnx")]
    del model.opset_import[:]
    model.opset_import.extend(keep)
