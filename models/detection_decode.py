"""Detector output decoding, one entry per family, and class-wise NMS (pure numpy).

A family turns a model's (dequantized) outputs into candidate boxes in
model-input pixels, ``x1, y1, x2, y2``, with one score and class each. The
manifest's ``postprocess`` names the family and its parameters; there is no
per-model code. Each family's ``resolve(outputs, post, input_hw)`` checks the
output specs against what it decodes (``TaskMismatch`` naming the tensor) and
returns the parameters filled in from the shapes (tensor names, layout, grid
sizes); ``decode(arrays, params, input_hw)`` does the arithmetic.

- ``yolo`` (Ultralytics v8/v11; v5-style with ``objectness``): one
  ``[1, 4+C, N]`` (``layout`` ``channels_first``) or ``[1, N, 4+C]`` output,
  cx, cy, w, h then C class scores (sigmoid applied, else ``class_activation``
  ``sigmoid``, which ``objectness`` gets too); ``box_units`` ``pixels`` (ONNX exports) or ``normalized``
  (TFLite exports: 0..1 of the input size).
- ``yolox``: ``[1, N, 5+C]``, N = sum over ``strides`` of the grid cells; per
  cell dx, dy, log w, log h, objectness, C classes: ``xy = (d + grid)·stride``,
  ``wh = exp(·)·stride``, score = obj·cls.
- ``gfl`` (NanoDet): per stride one class-score map ``[1, N, C]`` and one box
  distribution ``[1, N, 4·(reg_max+1)]``: softmax over the bins, projected on
  0..reg_max, ×stride, around the centre ``(idx + center_offset)·stride``
  (``center_offset`` 0.5 by default, NanoDet's; 0 for NanoDet-Plus exports).
  Outputs are matched to strides by their cell count and to cls/reg by their
  width, never by name (exports name them out of order).
- ``ssd-postprocess``: the four outputs of ``TFLite_Detection_PostProcess``:
  boxes ``[1, K, 4]`` (ymin, xmin, ymax, xmax, normalised), classes ``[1, K]``,
  scores ``[1, K]``, count ``[1]``; NMS already ran in the graph (at the op's own IoU): the
  runtime's NMS runs again only where asked (``nms_in_graph``).
"""

from __future__ import annotations

import functools
import numbers

import numpy as np

from .base import TaskMismatch

class Family:
    """A decode family: ``resolve`` checks and completes the parameters, ``decode`` does the arithmetic."""

    name = ""
    # the graph ran NMS already (TFLite_Detection_PostProcess): the runtime does not run it again
    # unless asked (postprocess ``rerun_nms``, or a per-call ``iou_threshold``)
    nms_in_graph = False

    @staticmethod
    def resolve(outputs: list[dict], post: dict, input_hw) -> dict:
        raise NotImplementedError

    @staticmethod
    def decode(arrays: dict, p: dict, input_hw, floor: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Candidates ``(boxes [N, 4], scores [N], class ids [N])``; a family may leave out boxes
        whose score is certainly under ``floor`` (the caller filters by score anyway)."""
        raise NotImplementedError


FAMILIES: dict[str, type[Family]] = {}


def _family(cls):
    FAMILIES[cls.name] = cls
    return cls


def _shape(spec: dict) -> list[int]:
    return [int(d) for d in spec.get("shape", [])]


def _show(outputs: list[dict]) -> str:
    return ", ".join(f"{o['name']!r} {_shape(o)}" for o in outputs)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _one_output(outputs: list[dict], post: dict, family: str) -> dict:
    name = post.get("output")
    if name is not None:
        found = [o for o in outputs if o["name"] == name]
        if not found:
            raise TaskMismatch(f"{family}: the model has no output {name!r} (it has "
                               f"{', '.join(repr(o['name']) for o in outputs)})")
        return found[0]
    if len(outputs) != 1:
        raise TaskMismatch(f"{family} decodes one output, this model has {len(outputs)} "
                           f"({_show(outputs)}): name it in postprocess "
                           f"'output' or choose another --family")
    return outputs[0]


def _cells(strides, input_hw) -> list[int]:
    h, w = input_hw
    return [int(np.ceil(h / s)) * int(np.ceil(w / s)) for s in strides]


def _yolo_layout(s: list[int], input_hw, objectness: bool) -> str:
    """Which axis of a ``[1, a, b]`` yolo output holds the anchors: the one whose length is the
    anchor count of the input (one per cell over strides 8/16/32, three for v5-style anchors).
    Only where neither or both are does the shorter axis count as the box values and classes
    (``[1, 4+C, N]``, Ultralytics'): a 601-class head at 160x160, ``[1, 605, 525]``, read
    channels last had 521 "classes" and lost every box."""
    cells = sum(_cells((8, 16, 32), input_hw))
    anchors = {cells, 3 * cells}
    if (s[2] in anchors) != (s[1] in anchors):
        return "channels_first" if s[2] in anchors else "channels_last"
    return "channels_first" if s[1] < s[2] or (s[1] == s[2] and not objectness) else "channels_last"


ACTIVATIONS = ("none", "sigmoid")


# Parameter values, checked: before, "Sigmoid"/"softmax" read as none (logits reported as scores), "false" as
# true, strides 32.5 as 32 and reg_max 7.5 as 7, exit 0; strides 8 or 0 crashed with a bare TypeError/ZeroDivision
def _activation(post: dict, key: str, family: str) -> str:
    value = post.get(key, "none")
    if value not in ACTIVATIONS:
        raise TaskMismatch(f"{family}: {key} must be one of {', '.join(ACTIVATIONS)}, got {value!r}")
    return value


def _flag(post: dict, key: str, family: str) -> bool:
    value = post.get(key, False)
    if not isinstance(value, (bool, np.bool_)):
        raise TaskMismatch(f"{family}: {key} must be true or false, got {value!r}")
    return bool(value)


def _strides(post: dict, family: str) -> list[int]:
    value = post.get("strides", [8, 16, 32])
    if (not isinstance(value, (list, tuple)) or not value
            or not all(not isinstance(v, bool) and isinstance(v, numbers.Integral) and int(v) > 0 for v in value)):
        raise TaskMismatch(f"{family}: strides must be a list of positive integers (8, 16, 32), got {value!r}")
    return [int(v) for v in value]


def _reg_max(post: dict) -> int:
    value = post.get("reg_max", 7)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise TaskMismatch(f"gfl: reg_max must be an integer >= 0 (7: 8 bins per side), got {value!r}")
    return int(value)


@_family
class Yolo(Family):
    name = "yolo"

    @staticmethod
    def resolve(outputs, post, input_hw) -> dict:
        spec = _one_output(outputs, post, "yolo")
        s = _shape(spec)
        obj = _flag(post, "objectness", "yolo")
        extra = 5 if obj else 4
        if len(s) != 3 or s[0] != 1:
            raise TaskMismatch(f"yolo: output {spec['name']!r} has shape {s}; it needs [1, {extra}+C, N] or "
                               f"[1, N, {extra}+C]")
        layout = post.get("layout") or _yolo_layout(s, input_hw, obj)
        width = s[1] if layout == "channels_first" else s[2]
        if layout not in ("channels_first", "channels_last") or width <= extra:
            raise TaskMismatch(f"yolo: output {spec['name']!r} has shape {s}: no room for {extra} box values and "
                               f"class scores ({layout})")
        units = post.get("box_units", "pixels")
        if units not in ("pixels", "normalized"):
            raise TaskMismatch(f"yolo: box_units {units!r}: need pixels or normalized")
        return {"output": spec["name"], "layout": layout, "objectness": obj, "box_units": units,
                "class_activation": _activation(post, "class_activation", "yolo"), "classes": width - extra}

    @staticmethod
    def decode(arrays, p, input_hw, floor=0.0):
        a = arrays[p["output"]][0]
        a = a.T if p["layout"] == "channels_first" else a            # [N, 4(+1)+C]
        extra = 5 if p["objectness"] else 4
        cls = a[:, extra:]
        if p["class_activation"] == "sigmoid":
            cls = _sigmoid(cls)
        ids = cls.argmax(1)
        scores = cls[np.arange(len(ids)), ids]
        if p["objectness"]:     # a raw v5 head's objectness is a logit too (its Detect sigmoids the whole row):
            scores = scores * (_sigmoid(a[:, 4]) if p["class_activation"] == "sigmoid" else a[:, 4])    # not >1
        cx, cy, w, h = a[:, 0], a[:, 1], a[:, 2], a[:, 3]
        boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
        if p["box_units"] == "normalized":
            boxes = boxes * np.array([input_hw[1], input_hw[0]] * 2, dtype=np.float32)
        return boxes, scores, ids


@_family
class Yolox(Family):
    name = "yolox"

    @staticmethod
    def resolve(outputs, post, input_hw) -> dict:
        spec = _one_output(outputs, post, "yolox")
        s = _shape(spec)
        strides = _strides(post, "yolox")
        n = sum(_cells(strides, input_hw))
        if len(s) != 3 or s[0] != 1 or s[1] != n or s[2] <= 5:
            raise TaskMismatch(f"yolox: output {spec['name']!r} has shape {s}; with strides {strides} on a "
                               f"{input_hw[0]}x{input_hw[1]} input it needs [1, {n}, 5+C]")
        return {"output": spec["name"], "strides": strides, "activation": _activation(post, "activation", "yolox"),
                "classes": s[2] - 5}

    @staticmethod
    def decode(arrays, p, input_hw, floor=0.0):
        a = arrays[p["output"]][0]
        grid, stride = _grid(tuple(p["strides"]), *input_hw)
        obj = a[:, 4]
        if p["activation"] == "sigmoid":
            obj = _sigmoid(obj)
        if floor > 0:       # score = obj * cls <= obj: most cells are out before the class argmax
            keep = np.flatnonzero(obj >= floor)
            a, obj, grid, stride = a[keep], obj[keep], grid[keep], stride[keep]
        cls = a[:, 5:]
        if p["activation"] == "sigmoid":
            cls = _sigmoid(cls)
        xy = (a[:, :2] + grid) * stride
        wh = np.exp(np.minimum(a[:, 2:4], 20.0)) * stride
        ids = cls.argmax(1)
        scores = cls[np.arange(len(ids)), ids] * obj
        boxes = np.concatenate([xy - wh / 2, xy + wh / 2], 1)
        return boxes, scores, ids


@functools.lru_cache(maxsize=16)
def _grid(strides: tuple, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """YOLOX's cell (x, y) per anchor row and its stride, row-major per stride level."""
    grids, steps = [], []
    for s in strides:
        gh, gw = int(np.ceil(h / s)), int(np.ceil(w / s))
        yv, xv = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
        grids.append(np.stack([xv, yv], -1).reshape(-1, 2))
        steps.append(np.full((gh * gw, 1), s, dtype=np.float32))
    grid, stride = np.concatenate(grids).astype(np.float32), np.concatenate(steps)
    grid.flags.writeable = stride.flags.writeable = False
    return grid, stride


GFL_CENTER_OFFSET = 0.5


def _center_offset(post: dict) -> float:
    """The gfl cell centre ``(idx + center_offset)·stride``: 0.5 by default, where NanoDet's GFL head
    places it (``get_single_level_center_point``: ``(arange + 0.5) * stride``); NanoDet-Plus
    (``get_single_level_center_priors``: ``arange * stride``) dropped the half: state 0 for its exports."""
    value = post.get("center_offset", GFL_CENTER_OFFSET)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(float(value)):
        raise TaskMismatch(f"gfl: center_offset must be a number (0.5 NanoDet, 0 NanoDet-Plus), got {value!r}")
    return float(value)


@_family
class Gfl(Family):
    name = "gfl"

    @staticmethod
    def resolve(outputs, post, input_hw) -> dict:
        strides = _strides(post, "gfl")
        reg_max = _reg_max(post)
        bins = 4 * (reg_max + 1)
        cells = _cells(strides, input_hw)
        cls_names, reg_names, classes = [], [], None
        for n, s in zip(cells, strides):
            here = [o for o in outputs if (lambda sh: len(sh) >= 2 and sh[-2] == n and all(d == 1 for d in sh[:-2]))
                    (_shape(o))]
            reg = [o for o in here if _shape(o)[-1] == bins]
            cls = [o for o in here if _shape(o)[-1] != bins]
            if len(reg) != 1 or len(cls) != 1:
                shown = _show(outputs)
                raise TaskMismatch(f"gfl: stride {s} on a {input_hw[0]}x{input_hw[1]} input needs one class map "
                                   f"[1, {n}, C] and one box distribution [1, {n}, {bins}] (reg_max {reg_max}); "
                                   f"the outputs are {shown}")
            c = _shape(cls[0])[-1]
            if classes is not None and c != classes:
                raise TaskMismatch(f"gfl: output {cls[0]['name']!r} has {c} classes, another stride {classes}")
            classes = c
            cls_names.append(cls[0]["name"])
            reg_names.append(reg[0]["name"])
        return {"cls_outputs": cls_names, "reg_outputs": reg_names, "strides": strides, "reg_max": reg_max,
                "center_offset": _center_offset(post), "activation": _activation(post, "activation", "gfl"),
                "classes": classes}

    @staticmethod
    def decode(arrays, p, input_hw, floor=0.0):
        h, w = input_hw
        proj = np.arange(p["reg_max"] + 1, dtype=np.float32)
        all_boxes, all_scores, all_ids = [], [], []
        for cname, rname, s in zip(p["cls_outputs"], p["reg_outputs"], p["strides"]):
            cls = arrays[cname].reshape(-1, p["classes"])
            if p["activation"] == "sigmoid":
                cls = _sigmoid(cls)
            ids = cls.argmax(1)
            scores = cls[np.arange(len(ids)), ids]
            idx = np.flatnonzero(scores >= floor) if floor > 0 else np.arange(len(ids))
            ids, scores = ids[idx], scores[idx]     # the box distributions only where a box may be kept
            reg = arrays[rname].reshape(-1, 4, p["reg_max"] + 1)[idx]
            reg = np.exp(reg - reg.max(-1, keepdims=True))
            dist = (reg / reg.sum(-1, keepdims=True)) @ proj * s              # [N, 4]: left, top, right, bottom
            gw = int(np.ceil(w / s))
            cx = (idx % gw + p["center_offset"]) * s
            cy = (idx // gw + p["center_offset"]) * s
            all_boxes.append(np.stack([cx - dist[:, 0], cy - dist[:, 1], cx + dist[:, 2], cy + dist[:, 3]], 1))
            all_scores.append(scores)
            all_ids.append(ids)
        return np.concatenate(all_boxes), np.concatenate(all_scores), np.concatenate(all_ids)


@_family
class SsdPostprocess(Family):
    name = "ssd-postprocess"
    nms_in_graph = True

    @staticmethod
    def resolve(outputs, post, input_hw) -> dict:
        names = post.get("outputs")
        if names and (not isinstance(names, dict) or sorted(names) != ["boxes", "classes", "count", "scores"]):
            raise TaskMismatch(f"ssd-postprocess: postprocess 'outputs' must name boxes, classes, scores and count "
                               f"(each an output name), got {names!r}")     # was a bare AttributeError/KeyError
        if names:
            by = {o["name"]: o for o in outputs}
            missing = [v for v in names.values() if v not in by]
            if missing:
                raise TaskMismatch(f"ssd-postprocess: the model has no output {missing[0]!r}")
            picked = {k: by[v] for k, v in names.items()}
        else:
            boxes = [o for o in outputs if len(_shape(o)) == 3 and _shape(o)[-1] == 4]
            rows = [o for o in outputs if len(_shape(o)) == 2]
            count = [o for o in outputs if _shape(o) in ([1], [])]
            if len(outputs) != 4 or len(boxes) != 1 or len(rows) != 2 or len(count) != 1:
                shown = _show(outputs)
                raise TaskMismatch(f"ssd-postprocess needs the 4 outputs of TFLite_Detection_PostProcess (boxes "
                                   f"[1, K, 4], classes [1, K], scores [1, K], count [1]); the outputs are {shown}")
            # classes and scores have one shape: their place tells them apart (pycoral's get_objects). The
            # op's own order (TF1 exports, Coral's) ends with the count; TF2 exports (EfficientDet-Lite,
            # Model Maker) list their signature's order: scores, boxes, count, classes
            order = ["boxes" if o is boxes[0] else "count" if o is count[0] else "row" for o in outputs]
            if order == ["boxes", "row", "row", "count"]:
                classes, scores = rows
            elif order == ["row", "boxes", "count", "row"]:
                scores, classes = rows
            else:
                raise TaskMismatch(f"ssd-postprocess: cannot tell the classes output from the scores output in "
                                   f"this order ({_show(outputs)}): name them in postprocess 'outputs' "
                                   f"({{\"boxes\": ..., \"classes\": ..., \"scores\": ..., \"count\": ...}})")
            picked = {"boxes": boxes[0], "classes": classes, "scores": scores, "count": count[0]}
        k = _shape(picked["boxes"])[1] if len(_shape(picked["boxes"])) == 3 else 0
        for key in ("classes", "scores"):
            if _shape(picked[key]) != [1, k]:
                raise TaskMismatch(f"ssd-postprocess: {key} output {picked[key]['name']!r} has shape "
                                   f"{_shape(picked[key])}, boxes {picked['boxes']['name']!r} need [1, {k}]")
        return {"outputs": {key: o["name"] for key, o in picked.items()}, "classes": None}

    @staticmethod
    def decode(arrays, p, input_hw, floor=0.0):
        names = p["outputs"]
        n = int(np.clip(np.asarray(arrays[names["count"]]).reshape(-1)[0], 0, arrays[names["scores"]].shape[1]))
        b = arrays[names["boxes"]][0, :n]
        h, w = input_hw
        boxes = np.stack([b[:, 1] * w, b[:, 0] * h, b[:, 3] * w, b[:, 2] * h], 1)
        ids = np.rint(arrays[names["classes"]][0, :n]).astype(np.int64)
        return boxes, arrays[names["scores"]][0, :n], ids


def nms(boxes: np.ndarray, scores: np.ndarray, ids: np.ndarray, iou: float, limit: int) -> np.ndarray:
    """Indices kept by class-wise greedy NMS, best first, at most ``limit``. Classes never
    suppress each other: each class's boxes are shifted into their own region first."""
    if len(scores) == 0:
        return np.zeros(0, dtype=np.int64)
    span = float(np.abs(boxes).max()) + 1.0     # float64: in float32 one 5e6-pixel junk box made class 79's
    b = boxes.astype(np.float64) + (ids.astype(np.float64) * 2 * span)[:, None]     # offsets eat the boxes
    area = np.maximum(b[:, 2] - b[:, 0], 0) * np.maximum(b[:, 3] - b[:, 1], 0)
    order = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    while order.size and len(keep) < limit:
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        xx1 = np.maximum(b[i, 0], b[rest, 0])
        yy1 = np.maximum(b[i, 1], b[rest, 1])
        xx2 = np.minimum(b[i, 2], b[rest, 2])
        yy2 = np.minimum(b[i, 3], b[rest, 3])
        inter = np.maximum(xx2 - xx1, 0) * np.maximum(yy2 - yy1, 0)
        union = area[i] + area[rest] - inter
        order = rest[inter <= iou * np.maximum(union, 1e-12)]
    return np.asarray(keep, dtype=np.int64)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[len(a), len(b)]`` IoU of x1, y1, x2, y2 boxes."""
    a, b = np.asarray(a, dtype=np.float64).reshape(-1, 4), np.asarray(b, dtype=np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), -1)
    area = lambda x: np.prod(np.clip(x[:, 2:] - x[:, :2], 0, None), -1)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    same = (a[:, None, :] == b[None, :, :]).all(-1)          # a degenerate box still matches itself
    return np.where(union > 0, inter / np.maximum(union, 1e-12), same.astype(np.float64))
