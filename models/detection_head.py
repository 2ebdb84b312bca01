"""Whether a detector's graph shows the head its family decodes (checked at ``import``).

``converters.onnx_head`` reads, from an ONNX graph, which branch writes each column
of the output (``converters.tflite_head`` from a TFLite graph, by the same walk);
:func:`head_mismatch` compares that with the family the import resolved. The shapes
alone cannot tell the heads apart: YOLOX's ``[1, N, 85]`` (raw
box offsets, an objectness column, 80 classes) read as ``yolo`` gives 81 "classes"
and garbage boxes; a YOLOv8 head (boxes decoded in the graph) read as ``yolox`` is
decoded twice.
"""

from __future__ import annotations


def _head_evidence(segments: list) -> dict | None:
    """What a head's column segments (``converters.onnx_head``: ``[[width, kind(, cut)], ...]``) show:
    ``boxes`` raw/decoded (the branch that writes columns 0..3, its own), ``objectness`` True
    (column 4 its own one-column branch, classes after it; or, ``shared``, the columns after the
    boxes cut at offset 4 out of one branch as wide as the head: YOLOv5's one Sigmoid over
    box, objectness and classes), False (one branch of its own for every column after the boxes:
    YOLOv8's classes) or None (cannot tell: a piece cut elsewhere out of a wider branch, say).
    None where the boxes are not a branch of their own."""
    edges, at = [], 0
    for seg in segments:
        at += int(seg[0])
        edges.append(at)
    if 4 not in edges or edges[-1] <= 5:
        return None
    k = edges.index(4) + 1
    kinds = {seg[1] for seg in segments[:k]}
    boxes = "raw" if kinds == {"raw"} else "decoded" if kinds == {"decoded"} else None
    rest = segments[k:]
    shared = False
    if len(rest) == 1 and len(rest[0]) > 2:     # cut out of a wider branch: not a branch of its own
        whole, offset = (int(v) for v in rest[0][2])
        shared = whole == edges[-1] and offset == 4
        objectness = True if shared else None
    else:
        objectness = (True if len(rest) > 1 and int(rest[0][0]) == 1 and rest[0][1] in ("sigmoid", "raw")
                      else False if len(rest) == 1 else None)
    return {"boxes": boxes, "objectness": objectness, "shared": shared, "width": edges[-1]}


def head_mismatch(family: str, params: dict, columns: dict | None) -> str | None:
    """Why the graph's head is not ``family``'s (its resolved ``params``), or None where it fits or
    the graph shows nothing. ``columns``: the decoded output's segments per axis (``{axis: segments}``).
    The shapes cannot tell these apart: a YOLOX ``[1, N, 85]`` (raw box offsets, an objectness
    column, 80 classes) read as ``yolo`` gives 81 "classes" and garbage boxes; a YOLOv8-style head
    (boxes decoded in the graph, no objectness) read as ``yolox`` is decoded twice."""
    if family not in ("yolo", "yolox") or not columns:
        return None
    axis = 1 if family == "yolo" and params.get("layout") == "channels_first" else 2
    ev = _head_evidence(columns.get(axis) or [])
    if ev is None:
        return None
    width, out = ev["width"], params.get("output")
    where = f"output {out!r}: the graph writes"
    if family == "yolo":
        if ev["boxes"] == "raw" and ev["objectness"] and not ev["shared"]:
            return (f"{where} raw box offsets (a Conv, not decoded in the graph), then an objectness column "
                    f"of its own, then class scores: this looks like a YOLOX head (objectness column / "
                    f"{width} = 5 + {width - 5}); the yolo decoder would read the offsets as boxes"
                    f"{'' if params.get('objectness') else f' and the objectness as a class ({width - 4} classes)'}"
                    f": use --family yolox")
        if ev["boxes"] == "raw":
            return (f"{where} raw box outputs (a Conv, not decoded in the graph); the yolo decoder reads "
                    f"decoded cx, cy, w, h: export the model with its box decoding, or use the family whose "
                    f"decoder this is (--family yolox for a YOLOX head)")
        if ev["objectness"] and not params.get("objectness"):
            what = (f"then objectness and class scores cut from the one branch its boxes are decoded from, "
                    f"columns 4..{width} (a YOLOv5-style head: {width} = 4 + 1 objectness + {width - 5} classes)"
                    if ev["shared"] else
                    f"then an objectness column of its own, then class scores ({width} = 5 + {width - 5})")
            return (f"{where} decoded boxes, {what}; the yolo decoder would read the objectness as a class "
                    f"({width - 4} classes): state --postprocess '{{\"objectness\": true}}'")
        if ev["objectness"] is False and params.get("objectness"):
            return (f"{where} boxes, then one branch of {width - 4} class scores: no objectness column "
                    f"(postprocess objectness true would read the first class as one): drop objectness")
        return None
    if ev["boxes"] == "decoded":
        fix = ("--family yolo --postprocess '{\"objectness\": true}'" if ev["objectness"] else "--family yolo")
        return (f"{where} boxes decoded already (the yolox decoder would decode them again)"
                + (", then class scores with no objectness column: this looks like a YOLOv8 head "
                   f"({width} = 4 + {width - 4})" if ev["objectness"] is False else "")
                + f": use {fix}")
    if ev["objectness"] is False:
        return (f"{where} boxes, then one branch of {width - 4} class scores: no objectness column, "
                f"{width} = 4 + {width - 4} (yolox would read the first class as one): not a YOLOX head")
    return None


# the postprocess key that applies a sigmoid to each family's scores (detection_decode)
ACTIVATION_KEYS = {"yolo": "class_activation", "yolox": "activation", "gfl": "activation"}


def score_kind(family: str, params: dict, columns: dict) -> str | None:
    """What the graph writes into a detector's score columns (``columns``: every output's segments,
    ``{output: {axis: segments}}``): ``sigmoid`` where a Sigmoid writes every one of them (objectness
    too), ``raw`` where a Conv or MatMul does (logits), None where the graph does not show one kind."""
    if family == "gfl":
        kinds: set = set()
        for name in params.get("cls_outputs") or []:
            segs = (columns.get(name) or {}).get(2)
            if not segs:
                return None
            kinds |= {seg[1] for seg in segs}
    elif family in ("yolo", "yolox"):
        axis = 1 if family == "yolo" and params.get("layout") == "channels_first" else 2
        segs = (columns.get(params.get("output")) or {}).get(axis) or []
        if _head_evidence(segs) is None:
            return None
        at, kinds = 0, set()
        for seg in segs:
            if at >= 4:
                kinds.add(seg[1])
            at += int(seg[0])
    else:
        return None
    return next(iter(kinds)) if len(kinds) == 1 and kinds <= {"sigmoid", "raw"} else None


def activation_mismatch(family: str, params: dict, columns: dict) -> str | None:
    """Why the family's score activation (``class_activation`` / ``activation``, resolved in ``params``)
    contradicts the graph, or None: scores written by a Conv (logits) read with no activation are
    negative or past 1 and every threshold means nothing; a Sigmoid in the graph and ``sigmoid`` stated
    squeeze every score into 0.5..0.73. None where the graph shows neither (:func:`score_kind`)."""
    key = ACTIVATION_KEYS.get(family)
    kind = score_kind(family, params, columns) if key else None
    act = params.get(key) if key else None
    if kind == "raw" and act == "none":
        return (f"the graph writes the scores straight from a convolution (no Sigmoid: logits); read with {key} "
                f"none they would be negative or past 1 and no threshold would mean what it says: state "
                f"--postprocess '{{\"{key}\": \"sigmoid\"}}'")
    if kind == "sigmoid" and act == "sigmoid":
        return (f"the graph applies a Sigmoid to the scores already; {key} sigmoid would apply it twice (every "
                f"score between 0.5 and 0.73): drop {key}")
    return None
