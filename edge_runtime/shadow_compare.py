"""Per-task comparison of two results of the same input (``edge-infer shadow``).

``compare(task, a, b, agree_at)`` takes the two results as ``InferenceResult.to_dict()``
(full, before any summarising) and returns the task's own figures, always with:

- ``agree`` (bool): do the two sides give the same answer;
- ``badness`` (float): the ranking key of the summary's worst items (higher is worse).

Per task family:

- **classifiers** (``class_id``/``top_k``): ``top1_match``; ``margin``: B's probability of
  A's top-1 class minus B's best other class (> 0: B keeps A's answer, by that much;
  < 0: B flips, by that much; from B's top-k: A's class outside it counts as 0, and B's best
  other class, where B lists A's class alone, as min(p, 1 - p); ``margin_bound`` then says the
  figure is a lower bound); ``score_diff``: |A's probability
  of its top-1 − B's probability of the same class|. ``badness`` = −margin.
- **embeddings**: ``cosine``; agree when ≥ ``agree_at`` (default 0.99, the convert budget).
- **detections**: ``f1`` of B's detections against A's (matched by class at IoU ≥ 0.5,
  the parity layer's matching: ``models.object_detection.detection_parity``), ``mean_iou``
  of the matched pairs, both counts; agree when F1 ≥ ``agree_at`` (default 0.9).
- **segmentation** (a ``mask`` output): ``pixel_agreement``; agree when ≥ ``agree_at`` (0.97) and
  neither side mostly misses a class holding ≥ 1 % of the other's mask (``missed_class``).
- **tensors** (``outputs``): ``cosine`` of all outputs flattened; agree when ≥ ``agree_at`` (0.99).
- **keypoints**: ``pck``: the share of keypoints within 5% of the largest coordinate span of A's;
  agree when ≥ ``agree_at`` (0.95) and the mean keypoint score moved by at most 0.25 (``score_shift``).
- anything else: ``agree`` when the predictions are equal.

Two results that cannot be compared (embeddings of two sizes, a tensor or mask of another shape,
other output names, B's result of another kind than A's) disagree with ``mismatch`` saying why
and no figure. Where neither side found anything (no box, no keypoint) they agree with ``empty``:
an agreement over nothing, which the summary counts apart and leaves out of the figures.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

DEFAULT_AGREE_AT = {"embedding": 0.99, "detection": 0.9, "segmentation": 0.97, "tensors": 0.99, "keypoints": 0.95}


def kind_of(result: dict) -> str:
    """Which comparison a result takes (the task family, from what the result carries)."""
    if result.get("detections") is not None:
        return "detection"
    if result.get("keypoints") is not None:
        return "keypoints"
    outs = result.get("outputs") or {}
    if "mask" in outs:                  # before the classifier check: a segmentation names its main class too
        return "segmentation"
    if result.get("class_id") is not None or result.get("top_k"):
        return "classification"
    if result.get("embedding") is not None:
        return "embedding"
    if outs:
        return "tensors"
    return "other"


def _probs(result: dict) -> dict[int, float]:
    return {int(t["index"]): float(t["score"]) for t in result.get("top_k") or []}


def compare_classification(a: dict, b: dict) -> dict:
    ca, cb = a.get("class_id"), b.get("class_id")
    match = ca == cb if ca is not None and cb is not None else a.get("prediction") == b.get("prediction")
    pa, pb = _probs(a), _probs(b)
    p_b_of_a = pb.get(ca, 0.0) if ca is not None else 0.0
    others = [p for i, p in pb.items() if i != ca]
    # B's top-k lists what it lists: A's class outside it counts as 0, and where it lists A's class
    # alone (top_k 1) B's best other class is only known to be at most min(p, 1 - p): the margin is
    # then that lower bound, never p - 0 (a 0.51 against 0.49 read as a margin of 0.51)
    bound = ca not in pb or not others
    best_other = max(others) if others else min(p_b_of_a, 1.0 - p_b_of_a)
    margin = p_b_of_a - best_other
    top_a = pa.get(ca, 0.0) if ca is not None else 0.0
    return {"kind": "classification", "agree": bool(match), "top1_match": bool(match),
            "margin": _sig(margin), "margin_bound": bound, "score_a": _sig(top_a),
            "score_b": _sig(pb.get(cb, 0.0) if cb is not None else 0.0),
            "score_diff": _sig(abs(top_a - p_b_of_a)), "badness": _bad(-margin)}


def _sig(value: float, digits: int = 12) -> float:
    """``value`` to ``digits`` significant digits (as the summary's ``shadow_summary.sig``), never to
    fixed decimals: ``round(x, 6)`` wrote a score_diff of 4e-7 as 0.0 and a margin of -4e-7 (B flips)
    as -0.0, a difference reported as none. A non-zero value never becomes 0 and keeps its sign."""
    return float(f"{value:.{digits}g}")


def _bad(value: float) -> float:
    """The worst-N ranking key, unrounded (rounded, inputs 4e-7 apart tied and ranked by index); a
    zero is +0.0 (``-margin`` of a margin of 0 wrote "-0.0")."""
    return float(value) + 0.0


def _cut(value: float, digits: int = 6) -> float:
    """``value`` written to ``digits`` decimals, never rounded up: a cosine of 0.9899996 was written
    0.99 beside ``agree_at`` 0.99 and ``agree`` false (and the summary's min read 0.99): a figure at
    or above the threshold now always means the input agreed, one under it that it did not."""
    r = round(value, digits)
    return r if r <= value else round(r - 10 ** -digits, digits)


def _cosine(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x.astype(np.float64).ravel(), y.astype(np.float64).ravel()
    if x.size and np.array_equal(x, y):
        return 1.0          # the same values, all-zero ones included (0 / 0 read as "orthogonal")
    norm = float(np.linalg.norm(x)) * float(np.linalg.norm(y))
    return float(x @ y) / max(norm, 1e-12)


def _mismatch(kind: str, why: str, agree_at: float | None = None) -> dict:
    """Two results that cannot be compared (another embedding size, other output shapes, B without
    the output A's comparison reads): a disagreement with no figure, never a figure of 0 or 1."""
    out: dict = {"kind": kind, "agree": False, "mismatch": why, "badness": 1.0}
    if agree_at is not None:
        out["agree_at"] = agree_at
    return out


def compare_embedding(a: dict, b: dict, agree_at: float) -> dict:
    x, y = np.asarray(a["embedding"]), np.asarray(b["embedding"])
    if x.shape != y.shape:
        return _mismatch("embedding", f"embedding sizes differ: A {x.size}, B {y.size}", agree_at)
    cos = _cosine(x, y)
    return {"kind": "embedding", "agree": cos >= agree_at, "cosine": _cut(cos), "agree_at": agree_at,
            "badness": _bad(1.0 - cos)}


def compare_detection(a: dict, b: dict, agree_at: float) -> dict:
    from edge_runtime.models.object_detection import detection_parity

    # the parity matching reads .detections and .near_detections only
    ref: Any = SimpleNamespace(detections=a.get("detections") or [], near_detections=None)
    cand: Any = SimpleNamespace(detections=b.get("detections") or [], near_detections=None)
    r = detection_parity([ref], [cand])
    f1 = float(r["value"])
    miou = r.get("mean_iou")
    out = {"kind": "detection", "agree": f1 >= agree_at, "f1": _cut(f1), "mean_iou": miou,
           "detections_a": len(ref.detections), "detections_b": len(cand.detections), "matched": r["matched"],
           "agree_at": agree_at, "badness": _bad(1.0 - f1 + (0.0 if miou is None else (1.0 - miou) / 10))}
    if not ref.detections and not cand.detections:
        out["empty"] = True         # no box on either side: they agree, on nothing (the summary says so)
    return out


def _array(out: Any) -> np.ndarray:
    return np.asarray(out["data"] if isinstance(out, dict) and "data" in out else out)


def compare_segmentation(a: dict, b: dict, agree_at: float) -> dict:
    ma, mb = _array(a["outputs"]["mask"]), _array(b["outputs"]["mask"])
    if ma.shape != mb.shape or not ma.size:
        return _mismatch("segmentation", f"mask shapes differ: A {list(ma.shape)}, B {list(mb.shape)}", agree_at)
    from .models.semantic_segmentation import mask_defect

    share = float(np.mean(ma == mb))
    # a class one side gives >= 1 % of the pixels and the other mostly misses: no agreement, whatever the share
    # (B answering background everywhere agreed at 0.97 with A's 3 % object before 2026-12-07)
    missed = mask_defect(ma, mb) if ma.dtype == mb.dtype else None
    return {"kind": "segmentation", "agree": share >= agree_at and missed is None, "pixel_agreement": _cut(share),
            "agree_at": agree_at, "badness": _bad(1.0 - share) if missed is None else 1.0,
            **({"missed_class": missed} if missed is not None else {})}


def compare_tensors(a: dict, b: dict, agree_at: float) -> dict:
    oa, ob = a.get("outputs") or {}, b.get("outputs") or {}
    if sorted(oa) != sorted(ob):
        return _mismatch("tensors", f"output names differ: A {sorted(oa)}, B {sorted(ob)}", agree_at)
    xa, xb = {k: _array(oa[k]) for k in oa}, {k: _array(ob[k]) for k in ob}
    shapes = [k for k in sorted(xa) if xa[k].shape != xb[k].shape]
    if shapes:      # flattened together, other shapes of one total size lined up unrelated values
        k = shapes[0]
        return _mismatch("tensors", f"output {k!r} shapes differ: A {list(xa[k].shape)}, B {list(xb[k].shape)}",
                         agree_at)
    cos = _cosine(np.concatenate([xa[k].astype(np.float64).ravel() for k in sorted(xa)]),
                  np.concatenate([xb[k].astype(np.float64).ravel() for k in sorted(xb)]))
    return {"kind": "tensors", "agree": cos >= agree_at, "cosine": _cut(cos), "agree_at": agree_at,
            "badness": _bad(1.0 - cos)}


def compare_keypoints(a: dict, b: dict, agree_at: float) -> dict:
    ka, kb = a.get("keypoints") or [], b.get("keypoints") or []
    if not ka and not kb:
        return {"kind": "keypoints", "agree": True, "pck": 1.0, "agree_at": agree_at, "badness": 0.0,
                "empty": True}      # no keypoint on either side: they agree, on nothing (the summary says so)
    if len(ka) != len(kb):
        pck = 0.0
    else:
        pa = np.array([[k["x"], k["y"]] for k in ka], dtype=float)
        pb = np.array([[k["x"], k["y"]] for k in kb], dtype=float)
        span = float(np.max(pa.max(0) - pa.min(0))) or 1.0
        pck = float(np.mean(np.linalg.norm(pa - pb, axis=1) <= 0.05 * span))
    from .models.pose_estimation import PCK_SCORE_SHIFT, score_shift

    # the keypoints' scores moved as a whole (0.9 against 0.0: every keypoint hidden on one side): no agreement
    shift = score_shift(ka, kb) or 0.0
    moved = shift > PCK_SCORE_SHIFT
    return {"kind": "keypoints", "agree": pck >= agree_at and not moved, "pck": _cut(pck), "agree_at": agree_at,
            "badness": _bad(1.0 - pck) if not moved else 1.0, **({"score_shift": _cut(shift)} if moved else {})}


def compare(a: dict, b: dict, agree_at: float | None = None) -> dict:
    """The task's comparison of two results of one input (see the module doc)."""
    kind = kind_of(a)

    def at() -> float:
        return DEFAULT_AGREE_AT.get(kind, 1.0) if agree_at is None else float(agree_at)

    if kind != "other" and kind_of(b) != kind:       # B lacks what A's comparison reads: never "equal predictions"
        return _mismatch(kind, f"A's result is of kind {kind}, B's of kind {kind_of(b)}",
                         None if kind == "classification" else at())
    if kind == "classification":
        return compare_classification(a, b)
    if kind == "embedding":
        return compare_embedding(a, b, at())
    if kind == "detection":
        return compare_detection(a, b, at())
    if kind == "segmentation":
        return compare_segmentation(a, b, at())
    if kind == "tensors":
        return compare_tensors(a, b, at())
    if kind == "keypoints":
        return compare_keypoints(a, b, at())
    same = a.get("prediction") == b.get("prediction")
    return {"kind": "other", "agree": same, "badness": 0.0 if same else 1.0}


__all__ = ["compare", "kind_of", "DEFAULT_AGREE_AT"]
