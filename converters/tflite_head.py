"""Which branch of a TFLite graph writes each column of a detector's output (for ``import``).

The TFLite counterpart of :mod:`.onnx_head`: the same walk (:class:`.onnx_head.HeadGraph`)
over the graph the interpreter lists (``_get_ops_details``, ``get_tensor_details``; no
tensors allocated), its ops mapped onto ONNX's names. A YOLOX exported to TFLite (onnx2tf:
per level ``CONCATENATION`` of a box ``CONV_2D``, a ``LOGISTIC`` objectness and ``LOGISTIC``
classes, ``TRANSPOSE``/``RESHAPE``, the levels concatenated) shows its objectness column as
the ONNX graph did; Ultralytics' YOLOv8 TFLite its boxes decoded (``SOFTMAX``, slices
subtracted and added) and ``LOGISTIC`` classes.

What the interpreter does not list (the builtin options) is read from the shapes: a
``CONCATENATION``'s axis is the one along which its inputs add up to its output; a
``STRIDED_SLICE``/``SLICE`` cuts, along each axis whose size it changes, the columns its
constant begin (or end) and the output's width place, taken only where one placement fits
(a mask that hides begin/end leaves one); a ``SPLIT``/``SPLIT_V`` output's columns follow
the outputs before it. Anything else (a custom op: ``edgetpu-custom-op``, a rank-changing
slice) is not followed: no evidence, nothing refused.
"""

from __future__ import annotations

import numpy as np

from .onnx_head import HeadGraph

RAW = {"CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "CONV_3D", "FULLY_CONNECTED", "BATCH_MATMUL"}
SAME = {"LOGISTIC": "Sigmoid", "EXP": "Exp", "SOFTMAX": "Softmax", "LOG_SOFTMAX": "Softmax",
        "POW": "Pow", "SQRT": "Sqrt", "SQUARE": "Pow", "LOG": "Log", "QUANTIZE": "Identity",
        "DEQUANTIZE": "Identity", "CAST": "Identity", "RESHAPE": "Reshape", "SQUEEZE": "Reshape",
        "EXPAND_DIMS": "Reshape", "ADD": "Add", "SUB": "Sub", "MUL": "Mul", "DIV": "Div"}


class _Node:
    __slots__ = ("op_type", "input", "output", "attrs")

    def __init__(self, op_type: str, inputs: list[str], outputs: list[str], attrs: dict | None = None):
        self.op_type, self.input, self.output, self.attrs = op_type, inputs, outputs, attrs or {}


class _TfliteGraph(HeadGraph):
    """The interpreter's op and tensor listing as a :class:`HeadGraph` (tensors named by index)."""

    def __init__(self, interp):
        tensors = {int(d["index"]): d for d in interp.get_tensor_details()}
        ops = interp._get_ops_details()
        shapes: dict[str, list[int] | None] = {str(i): [int(x) for x in d["shape"]] for i, d in tensors.items()}
        produced = {int(o) for op in ops for o in op["outputs"]}
        data = {str(int(d["index"])) for d in interp.get_input_details()}
        changed = True
        while changed:          # ops are listed in execution order; the loop only guards against one that is not
            changed = False
            for op in ops:
                if any(str(int(i)) in data for i in op["inputs"] if int(i) >= 0):
                    new = {str(int(o)) for o in op["outputs"]} - data
                    changed = changed or bool(new)
                    data |= new
        consts: dict[str, np.ndarray] = {}
        for i, d in tensors.items():
            if i not in produced and str(i) not in data and np.dtype(d["dtype"]).kind in "iu" \
                    and len(d["shape"]) <= 1 and int(np.prod(d["shape"])) <= 16:
                try:        # the small integer constants: perms, begins, ends, strides, axes, sizes
                    consts[str(i)] = np.asarray(interp.get_tensor(i)).copy()
                except Exception:  # noqa: BLE001 - not readable before allocation: left unknown
                    pass
        self.raw_consts = consts
        producer: dict = {}
        super().__init__(shapes, consts, producer, data)
        for op in ops:
            node = self._as_node(op)
            if node is not None:
                for o in node.output:
                    producer[o] = node

    def _ints(self, name: str) -> list[int] | None:
        v = self.raw_consts.get(name)
        return None if v is None else [int(x) for x in v.reshape(-1)]

    def _as_node(self, op) -> _Node | None:
        name = op["op_name"]
        ins = [str(int(i)) for i in op["inputs"]]
        outs = [str(int(o)) for o in op["outputs"]]
        if name in RAW:
            return _Node("Conv", ins[:1], outs)
        if SAME.get(name):
            return _Node(str(SAME[name]), ins[:2] if SAME[name] in ("Add", "Sub", "Mul", "Div") else ins[:1], outs)
        if name == "TRANSPOSE" and len(ins) >= 2:
            perm = self._ints(ins[1])
            return None if perm is None else _Node("Transpose", ins[:1], outs, {"perm": perm})
        if name == "CONCATENATION":
            axis = self._concat_axis(ins, outs[0])
            return None if axis is None else _Node("Concat", ins, outs, {"axis": axis})
        if name in ("SPLIT", "SPLIT_V") and len(ins) >= 2:      # SPLIT: axis, tensor; SPLIT_V: tensor, sizes, axis
            at, src = (0, 1) if name == "SPLIT" else (2, 0)
            split_axis = self._ints(ins[at]) if len(ins) > at else None
            return None if not split_axis else _Node("Split", [ins[src]], outs, {"axis": split_axis[0]})
        if name in ("STRIDED_SLICE", "SLICE") and len(ins) >= 3:
            return self._as_slice(name, ins, outs[0])
        return None

    def _concat_axis(self, ins: list[str], out: str) -> int | None:
        """The axis along which the inputs' sizes add up to the output's, every other size equal."""
        o = self.shapes.get(out)
        shapes = [self.shapes.get(i) for i in ins]
        if o is None or any(s is None or len(s) != len(o) for s in shapes):
            return None
        fits = [a for a in range(len(o))
                if sum(s[a] for s in shapes if s is not None) == o[a]
                and all(s[b] == o[b] for s in shapes if s is not None for b in range(len(o)) if b != a)]
        return fits[0] if len(fits) == 1 else None

    def _as_slice(self, name: str, ins: list[str], out: str) -> _Node | None:
        """A same-rank slice as ``Slice`` attributes: along each axis whose size it changes, the one
        placement of the output's width its constants allow (a STRIDED_SLICE's masks, which the
        interpreter does not list, may hide its begin or its end); else not followed."""
        i, o = self.shapes.get(ins[0]), self.shapes.get(out)
        begin, other = self._ints(ins[1]), self._ints(ins[2])      # other: STRIDED_SLICE's end, SLICE's size
        steps = self._ints(ins[3]) if name == "STRIDED_SLICE" and len(ins) > 3 else None
        if i is None or o is None or len(i) != len(o) or begin is None or len(begin) != len(i) \
                or other is None or len(other) != len(i):
            return None
        starts, ends, axes = [], [], []
        for a, (n, w) in enumerate(zip(i, o)):
            if n == w:
                continue
            b = begin[a] + n if begin[a] < 0 else begin[a]
            if name == "SLICE":
                fits = {b} if other[a] in (-1, w) else set()
            else:
                if steps is None or len(steps) != len(i) or steps[a] != 1:
                    return None
                e = min(other[a] + n if other[a] < 0 else other[a], n)
                fits = ({b} if e - b == w else set()) | ({b} if b + w == n else set()) | ({0} if e == w else set())
            fits = {lo for lo in fits if 0 <= lo and lo + w <= n}
            if len(fits) != 1:
                return None
            lo = fits.pop()
            starts.append(lo)
            ends.append(lo + w)
            axes.append(a)
        return _Node("Slice", ins[:1], [out], {"starts": starts, "ends": ends, "axes": axes})


def head_columns(interp) -> dict:
    """``{output name: {axis: [[width, kind], ...]}}`` for each 3-D output of the TFLite model the
    interpreter ``interp`` holds (not allocated), as :func:`.onnx_head.head_columns`; ``{}`` where none
    or the graph cannot be read."""
    try:
        outputs = interp.get_output_details()
        if not any(len(d["shape"]) == 3 for d in outputs):
            return {}
        graph = _TfliteGraph(interp)
    except Exception:  # noqa: BLE001 - evidence only: a graph that cannot be read gives none
        return {}
    found: dict = {}
    for d in outputs:
        shape = [int(x) for x in d["shape"]]
        if len(shape) != 3:
            continue
        per_axis = {}
        for axis in (1, 2):
            try:
                cols = graph.columns(str(int(d["index"])), axis)
            except Exception:  # noqa: BLE001 - as above
                cols = None
            if cols and sum(seg[0] for seg in cols) == shape[axis]:
                per_axis[axis] = cols
        if per_axis:
            found[d["name"]] = per_axis
    return found
