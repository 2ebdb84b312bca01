"""Measure int8-vs-fp32 parity through the task's own pre/post-processing.

Both models see exactly the tensors the runtime would feed them (same
tokenizer, buckets, image normalisation), and both outputs go through the
same ``finish``; the task's ``compare`` turns the pairs into one figure.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np

from edge_runtime.errors import EdgeRuntimeError
from edge_runtime.limits import DEFAULT_LIMITS

# detection_f1: int8 detections matched to fp32 ones by class at IoU >= 0.5 (F1); keypoint_pck: the share of
# keypoints within 5% of the image diagonal of the reference; pixel_agreement: the share of equal class pixels
DEFAULT_BUDGETS = {"top1_agreement": 0.99, "cosine_mean": 0.99, "detection_f1": 0.90, "keypoint_pck": 0.95,
                   "pixel_agreement": 0.97}


def measure(task_ref, sessions_ref, task_cand, sessions_cand, samples, limits=DEFAULT_LIMITS) -> dict:
    refs, cands, buckets, run_ms = [], [], [], []
    skipped = 0
    for raw in samples:
        try:
            prepared = task_ref.prepare(raw, limits)
        except EdgeRuntimeError:
            skipped += 1          # e.g. an empty line: not a parity sample
            continue
        ref = task_ref.finish(sessions_ref[prepared.bucket].run(prepared.feeds), prepared)
        cand_prep = task_cand.prepare(raw, limits)
        t0 = time.perf_counter()
        cand_out = sessions_cand[cand_prep.bucket].run(cand_prep.feeds)
        run_ms.append((time.perf_counter() - t0) * 1000)
        cand = task_cand.finish(cand_out, cand_prep)
        refs.append(ref)
        cands.append(cand)
        buckets.append(task_ref.buckets[prepared.bucket]["name"])
    if not refs:
        raise ValueError("no usable parity samples")
    overall = task_ref.compare(refs, cands)
    per_bucket = {}
    groups = defaultdict(list)
    for i, b in enumerate(buckets):
        groups[b].append(i)
    for b, idx in sorted(groups.items()):
        per_bucket[b] = task_ref.compare([refs[i] for i in idx], [cands[i] for i in idx])
    overall["per_bucket"] = per_bucket
    overall["device_ms_median"] = round(float(np.median(run_ms)), 3)
    if skipped:
        overall["skipped_samples"] = skipped
    return overall


def budget_for(metric: str, min_parity: float | None) -> float:
    if min_parity is not None:
        return float(min_parity)
    return DEFAULT_BUDGETS.get(metric, 0.99)
