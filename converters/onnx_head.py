"""Which branch of an ONNX graph writes each column of a detector's output (for ``import``).

A one-output detector head, ``[1, N, K]`` or ``[1, K, N]``, is put together by a
``Concat`` of branches along its K axis, and the branches say what the columns
are where the shapes cannot: YOLOX (exported with ``decode_in_inference=False``)
concatenates a box ``Conv`` (4 raw columns: grid offsets and log sizes), a
``Sigmoid`` objectness (1) and ``Sigmoid`` class scores (C); Ultralytics YOLOv8
concatenates boxes decoded in the graph (DFL: ``Softmax``, slices subtracted and
added, × a per-anchor stride) and ``Sigmoid`` class scores. ``[1, N, 85]`` and
``[1, N, 84]`` alone do not say which: read as ``yolo`` the YOLOX head gives 81
"classes" and garbage boxes.

:func:`head_columns` follows each 3-D output back through ``Transpose``,
``Reshape``/``Flatten``/``Squeeze``/``Unsqueeze`` (the axis mapped by the inferred
shapes), ``Concat`` (along the axis: the inputs' columns in turn; along another:
the levels, which must agree), ``Slice`` along the axis, casts and
(de)quantization, and per-channel scales and biases, and returns per axis the
column segments ``[[width, kind], ...]``, kind one of ``raw`` (a convolution's or
matmul's output, nothing decoded), ``sigmoid``, ``decoded`` (``Exp``/``Softmax``,
arithmetic between two data tensors, or with a constant that varies along the
anchors: grids, strides) or ``other``. Where the graph cannot be followed the
axis is left out: no evidence, nothing refused.
"""

from __future__ import annotations

import math

RAW_OPS = {"Conv", "ConvInteger", "QLinearConv", "ConvTranspose", "MatMul", "MatMulInteger", "QLinearMatMul",
           "Gemm", "QGemm"}
SIGMOID_OPS = {"Sigmoid", "QLinearSigmoid", "HardSigmoid"}
DECODE_OPS = {"Exp", "Softmax", "Pow", "Sqrt", "Log"}
PASS_OPS = {"Identity", "Cast", "QuantizeLinear", "DequantizeLinear"}
RESHAPE_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}
ARITH_OPS = {"Add", "Sub", "Mul", "Div"}
MAX_DEPTH = 48


class _Graph:
    def __init__(self, model):
        import onnx

        from .onnx_import import _constants

        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception:  # noqa: BLE001 - an odd graph: its shapes are not known, nothing is read
            inferred = model
        g = inferred.graph
        self.shapes: dict[str, list[int] | None] = {}
        for v in list(g.input) + list(g.value_info) + list(g.output):
            dims = v.type.tensor_type.shape.dim     # a symbolic first (batch) dimension is run as 1
            known = v.type.tensor_type.HasField("shape") and all(
                d.HasField("dim_value") or j == 0 for j, d in enumerate(dims))
            self.shapes[v.name] = [int(d.dim_value) if d.HasField("dim_value") else 1 for d in dims] if known else None
        for t in g.initializer:
            self.shapes[t.name] = [int(d) for d in t.dims]
        self.consts = _constants(model.graph)
        for name, value in self.consts.items():
            self.shapes.setdefault(name, list(value.shape))
        self.producer = {o: n for n in g.node for o in n.output}
        # the tensors that depend on the graph's inputs (the rest are constants, however computed)
        inits = {t.name for t in g.initializer}
        data = {v.name for v in g.input if v.name not in inits}
        for node in g.node:          # nodes are topologically sorted in a valid graph
            if any(i in data for i in node.input if i):
                data.update(node.output)
        self.data = data
        self.memo: dict[tuple[str, int], list | None] = {}

    def shape(self, name: str) -> list[int] | None:
        return self.shapes.get(name)

    def width(self, name: str, axis: int) -> int | None:
        s = self.shape(name)
        return s[axis] if s is not None and 0 <= axis < len(s) else None

    def columns(self, name: str, axis: int, depth: int = 0) -> list | None:
        key = (name, axis)
        if key not in self.memo:
            self.memo[key] = None if depth > MAX_DEPTH else self._columns(name, axis, depth + 1)
        return self.memo[key]

    def _whole(self, name: str, axis: int, kind: str) -> list | None:
        w = self.width(name, axis)
        return [[w, kind]] if w else None

    def _columns(self, name: str, axis: int, depth: int) -> list | None:
        node = self.producer.get(name)
        width = self.width(name, axis)
        if node is None or width is None or name not in self.data:
            return None
        op, ins = node.op_type, [i for i in node.input]
        if op in RAW_OPS:
            return [[width, "raw"]]
        if op in DECODE_OPS:
            return [[width, "decoded"]]
        if op in SIGMOID_OPS:
            inner = self.columns(ins[0], axis, depth)
            return [[w, "sigmoid"] for w, _ in inner] if inner else [[width, "sigmoid"]]
        if op in PASS_OPS:
            return self.columns(ins[0], axis, depth)
        if op == "Transpose":
            rank = len(self.shape(name) or [])
            perm = _attr(node, "perm") or list(reversed(range(rank)))
            return self.columns(ins[0], int(perm[axis]), depth)
        if op in RESHAPE_OPS:
            src = self._reshaped_axis(ins[0], name, axis)
            return None if src is None else self.columns(ins[0], src, depth)
        if op == "Concat":
            return self._concat(node, name, axis, depth)
        if op == "Slice":
            return self._slice(node, name, axis, depth)
        if op in ARITH_OPS:
            return self._arith(node, name, axis, depth)
        return None

    def _reshaped_axis(self, src: str, out: str, axis: int) -> int | None:
        """The axis of ``src`` that is ``out``'s ``axis`` after a reshape: the same size after the
        same number of elements."""
        i, o = self.shape(src), self.shape(out)
        if i is None or o is None:
            return None
        before = math.prod(o[:axis])
        found = [j for j in range(len(i)) if i[j] == o[axis] and math.prod(i[:j]) == before]
        return found[0] if found else None

    def _concat(self, node, name: str, axis: int, depth: int) -> list | None:
        rank = len(self.shape(name) or [])
        cat = int(_attr(node, "axis") or 0)
        cat = cat + rank if cat < 0 else cat
        parts = [i for i in node.input if i]
        if cat == axis:
            out: list = []
            for part in parts:
                inner = self.columns(part, axis, depth) or self._whole(part, axis, "other")
                if inner is None:
                    return None
                out += inner
            return out
        found = [self.columns(part, axis, depth) for part in parts]     # the levels: one layout for all
        return found[0] if found and all(f is not None and f == found[0] for f in found) else None

    def _slice(self, node, name: str, axis: int, depth: int) -> list | None:
        shape = self.shape(node.input[0])
        if shape is None:
            return None
        if len(node.input) >= 3:            # opset 10+: starts, ends, axes, steps as inputs
            vals = [self.consts.get(node.input[k]) if len(node.input) > k and node.input[k] else None
                    for k in range(1, 5)]
            if vals[0] is None or vals[1] is None or (len(node.input) > 3 and node.input[3] and vals[2] is None) \
                    or (len(node.input) > 4 and node.input[4] and vals[3] is None):
                return None
            starts, ends = [int(v) for v in vals[0].reshape(-1)], [int(v) for v in vals[1].reshape(-1)]
            axes = [int(v) for v in vals[2].reshape(-1)] if vals[2] is not None else list(range(len(starts)))
            steps = [int(v) for v in vals[3].reshape(-1)] if vals[3] is not None else [1] * len(starts)
        else:
            starts, ends = list(_attr(node, "starts") or []), list(_attr(node, "ends") or [])
            axes = list(_attr(node, "axes") or range(len(starts)))
            steps = [1] * len(starts)
        axes = [a + len(shape) if a < 0 else a for a in axes]
        if axis not in axes:
            return self.columns(node.input[0], axis, depth)
        k = axes.index(axis)
        if steps[k] != 1:
            return None
        dim = shape[axis]
        lo, hi = (max(0, min(dim, v + dim if v < 0 else v)) for v in (starts[k], ends[k]))
        inner = self.columns(node.input[0], axis, depth)
        return None if inner is None else _cut(inner, lo, hi)

    def _arith(self, node, name: str, axis: int, depth: int) -> list | None:
        out_shape = self.shape(name)
        width = self.width(name, axis)
        if out_shape is None or width is None:
            return None
        operands = [i for i in node.input[:2]]
        data = [i for i in operands if i in self.data and (self.shape(i) is None or math.prod(self.shape(i) or []) > 1)]
        if len(data) != 1:      # two data tensors combined (slices of a distribution, say): decoded
            return [[width, "decoded"]] if len(data) == 2 else None
        other = operands[1] if operands[0] == data[0] else operands[0]
        s = self.shape(other)
        if s is None:
            return None
        aligned = [1] * (len(out_shape) - len(s)) + list(s)
        if any(d > 1 for j, d in enumerate(aligned) if j not in (0, axis)):
            return [[width, "decoded"]]         # varies along the anchors: a grid or the strides
        return self.columns(data[0], axis, depth)       # a per-channel scale or bias: the same columns


def _attr(node, name: str):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return None


def _cut(segments: list, lo: int, hi: int) -> list:
    out, at = [], 0
    for w, kind in segments:
        a, b = max(at, lo), min(at + w, hi)
        if b > a:
            out.append([b - a, kind])
        at += w
    return out


def head_columns(model) -> dict:
    """``{output name: {axis: [[width, kind], ...]}}`` for each 3-D graph output, the axes 1 and 2
    whose columns the graph shows (see the module's doc); ``{}`` where none."""
    if not any(len(o.type.tensor_type.shape.dim) == 3 for o in model.graph.output):
        return {}
    try:
        graph = _Graph(model)
    except Exception:  # noqa: BLE001 - evidence only: a graph that cannot be read gives none
        return {}
    found: dict = {}
    for out in model.graph.output:
        shape = graph.shape(out.name)
        if shape is None or len(shape) != 3:
            continue
        per_axis = {}
        for axis in (1, 2):
            try:
                cols = graph.columns(out.name, axis)
            except Exception:  # noqa: BLE001 - as above
                cols = None
            if cols and sum(w for w, _ in cols) == shape[axis]:
                per_axis[axis] = cols
        if per_axis:
            found[out.name] = per_axis
    return found
