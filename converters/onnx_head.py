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
the levels, which must agree), ``Slice`` and ``Split`` along the axis, casts and
(de)quantization, and per-channel scales and biases, and returns per axis the
column segments ``[[width, kind], ...]``, kind one of ``raw`` (a convolution's or
matmul's output, nothing decoded), ``sigmoid``, ``decoded`` (``Exp``/``Softmax``,
arithmetic between two data tensors, or with a constant that varies along the
anchors: grids, strides) or ``other``; a segment cut out of a wider branch carries
a third item, ``[branch width, offset]`` (YOLOv5 slices its objectness and classes,
``4..85``, out of the one Sigmoid its boxes are decoded from). Where the graph
cannot be followed the axis is left out: no evidence, nothing refused.

The walk (:class:`HeadGraph`) is the format's only in its reading of the graph:
``converters.tflite_head`` maps a TFLite graph's ops onto these names and walks it
the same way. :func:`check_source_head` is the check for ``convert``'s ONNX source.
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


class HeadGraph:
    """The walk over a graph in ONNX's op names (``converters.tflite_head`` maps TFLite's onto them):
    ``shapes`` (tensor -> static shape or None), ``consts`` (tensor -> numpy value), ``producer``
    (tensor -> the node writing it: ``op_type``, ``input``, ``output``), ``data`` (the tensors that
    depend on the graph's inputs). A format's graph says how a node's attributes are read (:meth:`attr`)."""

    def __init__(self, shapes: dict, consts: dict, producer: dict, data: set):
        self.shapes: dict[str, list[int] | None] = shapes
        self.consts = consts
        self.producer = producer
        self.data = data
        self.memo: dict[tuple[str, int], list | None] = {}

    def attr(self, node, name: str):
        return (getattr(node, "attrs", None) or {}).get(name)

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
            return [[seg[0], "sigmoid", *seg[2:]] for seg in inner] if inner else [[width, "sigmoid"]]
        if op in PASS_OPS:
            return self.columns(ins[0], axis, depth)
        if op == "Transpose":
            rank = len(self.shape(name) or [])
            perm = self.attr(node, "perm") or list(reversed(range(rank)))
            return self.columns(ins[0], int(perm[axis]), depth)
        if op in RESHAPE_OPS:
            src = self._reshaped_axis(ins[0], name, axis)
            if src is not None:
                return self.columns(ins[0], src, depth)
            split = self._factor_axis(ins[0], name, axis)        # [1, 3*85, h, w] -> [1, 3, 85, h, w]
            if split is None:
                return None
            inner = self.columns(ins[0], split[0], depth)
            return None if inner is None else _per_block(inner, width, split[1])
        if op == "Concat":
            return self._concat(node, name, axis, depth)
        if op == "Slice":
            return self._slice(node, name, axis, depth)
        if op == "Split":
            return self._split(node, name, axis, depth)
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

    def _factor_axis(self, src: str, out: str, axis: int) -> tuple[int, int] | None:
        """``(axis of src, blocks)`` where a reshape splits that axis into ``blocks`` blocks of ``out``'s
        ``axis`` (the inner factor: YOLOv5's one Conv of 3 anchors x 85 columns, reshaped to
        ``[.., 3, 85, ..]``)."""
        i, o = self.shape(src), self.shape(out)
        if i is None or o is None or not o[axis]:
            return None
        after, before = math.prod(o[axis + 1:]), math.prod(o[:axis])
        for j in range(len(i)):
            if i[j] > o[axis] and i[j] % o[axis] == 0 and math.prod(i[j + 1:]) == after \
                    and math.prod(i[:j]) * (i[j] // o[axis]) == before:
                return j, i[j] // o[axis]
        return None

    def _concat(self, node, name: str, axis: int, depth: int) -> list | None:
        rank = len(self.shape(name) or [])
        cat = int(self.attr(node, "axis") or 0)
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
            starts, ends = list(self.attr(node, "starts") or []), list(self.attr(node, "ends") or [])
            axes = list(self.attr(node, "axes") or range(len(starts)))
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

    def _split(self, node, name: str, axis: int, depth: int) -> list | None:
        """One output of a ``Split``: along the axis, the input's columns after the outputs before it
        (their widths from the shapes, whatever the sizes were given as)."""
        src = node.input[0]
        rank = len(self.shape(src) or [])
        cat = int(self.attr(node, "axis") or 0)
        cat = cat + rank if cat < 0 else cat
        if cat != axis:
            return self.columns(src, axis, depth)
        lo = 0
        for out in node.output:
            if out == name:
                break
            w = self.width(out, axis)
            if w is None:
                return None
            lo += w
        width = self.width(name, axis)
        inner = self.columns(src, axis, depth)
        return None if inner is None or width is None else _cut(inner, lo, lo + width)

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


class _OnnxGraph(HeadGraph):
    def __init__(self, model):
        import onnx

        from .onnx_import import _constants

        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception:  # noqa: BLE001 - an odd graph: its shapes are not known, nothing is read
            inferred = model
        g = inferred.graph
        shapes: dict[str, list[int] | None] = {}
        for v in list(g.input) + list(g.value_info) + list(g.output):
            dims = v.type.tensor_type.shape.dim     # a symbolic first (batch) dimension is run as 1
            known = v.type.tensor_type.HasField("shape") and all(
                d.HasField("dim_value") or j == 0 for j, d in enumerate(dims))
            shapes[v.name] = [int(d.dim_value) if d.HasField("dim_value") else 1 for d in dims] if known else None
        for t in g.initializer:
            shapes[t.name] = [int(d) for d in t.dims]
        consts = _constants(model.graph)
        for name, value in consts.items():
            shapes.setdefault(name, list(value.shape))
        producer = {o: n for n in g.node for o in n.output}
        # the tensors that depend on the graph's inputs (the rest are constants, however computed)
        inits = {t.name for t in g.initializer}
        data = {v.name for v in g.input if v.name not in inits}
        for node in g.node:          # nodes are topologically sorted in a valid graph
            if any(i in data for i in node.input if i):
                data.update(node.output)
        super().__init__(shapes, consts, producer, data)

    def attr(self, node, name: str):
        return _attr(node, name)


def _attr(node, name: str):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return None


def _cut(segments: list, lo: int, hi: int) -> list:
    """Columns ``lo..hi`` of ``segments``. A piece narrower than the branch it comes from says so:
    ``[width, kind, [branch width, offset in the branch]]`` (YOLOv5's objectness and classes, cut from
    the one Sigmoid its boxes are decoded from, are no branch of their own)."""
    out, at = [], 0
    for seg in segments:
        w, kind = seg[0], seg[1]
        whole, base = seg[2] if len(seg) > 2 else (w, 0)
        a, b = max(at, lo), min(at + w, hi)
        if b > a:
            out.append([b - a, kind] + ([[whole, base + a - at]] if b - a < whole else []))
        at += w
    return out


def _per_block(segments: list, width: int, blocks: int) -> list | None:
    """The columns of one of ``blocks`` equal blocks of ``width`` columns (a reshape's inner factor),
    the same in every block; None where the blocks differ or a segment crosses a block's edge. A
    segment over whole blocks is each block's own (one Conv for the 3 anchors' columns)."""
    found = None
    for k in range(blocks):
        lo, hi, at = k * width, (k + 1) * width, 0
        piece: list = []
        for seg in segments:
            a, b = at, at + int(seg[0])
            at = b
            if a <= lo and b >= hi:
                piece = [[width, seg[1]]]
            elif lo <= a and b <= hi:
                piece.append(list(seg))
            elif a < hi and b > lo:
                return None
        if found is None:
            found = piece
        elif piece != found:
            return None
    return found


def head_columns(model) -> dict:
    """``{output name: {axis: [[width, kind], ...]}}`` for each 3-D graph output, the axes 1 and 2
    whose columns the graph shows (see the module's doc); ``{}`` where none."""
    if not any(len(o.type.tensor_type.shape.dim) == 3 for o in model.graph.output):
        return {}
    try:
        graph = _OnnxGraph(model)
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
            if cols and sum(seg[0] for seg in cols) == shape[axis]:
                per_axis[axis] = cols
        if per_axis:
            found[out.name] = per_axis
    return found


def check_source_head(source, post: dict) -> None:
    """Refuse (``InputError`` ``convert_family_mismatch``) a ``post`` (an object detector's resolved
    ``postprocess``: ``family`` and its parameters, as ``Task.build_sections`` returns it) that does
    not fit the head of the ONNX model at ``source``:
    :func:`edge_runtime.models.detection_head.head_mismatch` and ``activation_mismatch`` (a stated score
    activation the graph contradicts) on the graph's columns, as ``import``
    checks them. For ``convert``, whose parity cannot catch a wrong family (the fp32 reference
    decodes the same wrong way). Nothing is refused where the graph shows nothing."""
    import onnx

    from edge_runtime import error_codes as ec
    from edge_runtime.errors import InputError
    from edge_runtime.models.detection_head import ACTIVATION_KEYS, activation_mismatch, head_mismatch

    family = post.get("family")
    if family not in ACTIVATION_KEYS:
        return
    try:
        model = onnx.load(str(source), load_external_data=False)
    except Exception:  # noqa: BLE001 - the source's own reading reports an unreadable model
        return
    params = {k: v for k, v in post.items() if k != "family"}
    columns = head_columns(model)
    why = (head_mismatch(str(family), params, columns.get(params.get("output")))
           or activation_mismatch(str(family), params, columns))
    if why:
        raise InputError(f"--family {family}: {why}", code=ec.CONVERT_FAMILY_MISMATCH, family=family)
