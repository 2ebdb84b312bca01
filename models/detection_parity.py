"""The object-detection task's parity metric: F1 of one side's detections against the other's, matched by
class at IoU >= ``MATCH_IOU``, a box just under the threshold on the other side (``near_detections``,
within ``SCORE_MARGIN``) counted as matched."""

from __future__ import annotations

import numpy as np

from .base import TaskOutput
from .detection_decode import box_iou

MATCH_IOU = 0.5
SCORE_MARGIN = 0.05             # parity: a box this close under the threshold on the other side still matches


def _match(dets: list[dict], pool: list[dict], used: set[int]) -> list[tuple[int, int, float]]:
    """Greedy (``dets`` best first) one-to-one matches ``(det index, pool index, IoU)`` by class at
    IoU >= MATCH_IOU, skipping pool entries in ``used`` (updated)."""
    out = []
    for k, d in enumerate(dets):
        same = [i for i, p in enumerate(pool) if p["class_id"] == d["class_id"] and i not in used]
        if not same:
            continue
        iou = box_iou(np.array([d["box"]]), np.array([pool[i]["box"] for i in same]))[0]
        j = int(iou.argmax())
        if iou[j] >= MATCH_IOU:
            used.add(same[j])
            out.append((k, same[j], float(iou[j])))
    return out


def detection_parity(reference: list[TaskOutput], candidate: list[TaskOutput]) -> dict:
    """F1 of the candidate's detections against the reference's (matched by class at IoU >= 0.5);
    a detection whose twin on the other side is under the threshold by at most SCORE_MARGIN
    (``near_detections``) counts as matched: its score drifted, the object is the same.
    ``samples_compared``: the samples with a detection on either side, the only ones the F1 is over
    (``samples`` counted every one, the empty ones too: "1.0 on 8 samples" was 1.0 on one image)."""
    tp = fp = fn = near = compared = 0
    ious: list[float] = []
    for ref, cand in zip(reference, candidate):
        r, c = ref.detections or [], cand.detections or []
        compared += bool(r or c)        # a sample with no box on either side adds nothing to the F1
        used: set[int] = set()
        pairs = _match(c, r, used)
        tp += len(pairs)
        ious += [p[2] for p in pairs]
        c_left = [d for k, d in enumerate(c) if k not in {p[0] for p in pairs}]
        r_left = [d for i, d in enumerate(r) if i not in used]
        saved_c = _match(c_left, ref.near_detections or [], set())        # the reference had it, just under
        saved_r = _match(r_left, cand.near_detections or [], set())       # the candidate had it, just under
        near += len(saved_c) + len(saved_r)
        tp += len(saved_c) + len(saved_r)
        ious += [p[2] for p in saved_c + saved_r]
        fp += len(c_left) - len(saved_c)
        fn += len(r_left) - len(saved_r)
    f1 = 1.0 if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)
    return {"metric": "detection_f1", "value": round(f1, 6), "samples": len(reference), "samples_compared": compared,
            "matched": tp,
            "matched_across_threshold": near, "score_margin": SCORE_MARGIN, "unmatched_reference": fn,
            "unmatched_candidate": fp, "mean_iou": round(float(np.mean(ious)), 6) if ious else None}
