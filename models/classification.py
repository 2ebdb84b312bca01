"""Classification math: softmax, label keys, ranking and top-1 parity.

Classification results carry the class *index*, not only its label text:
labels files repeat names (ImageNet's has ``crane`` twice), so a label is not
a key. ``rank_classes`` returns the prediction's label and ``class_id``, the
ordered top-k as ``[{"index", "label", "score"}]`` and the ``scores`` dict,
whose key is the label itself for a unique label and ``"label#index"`` for
every label the file repeats (both entries kept). ``scores`` is a
:class:`Scores` (a ``dict``) that also carries ``class_id`` and ``top_k``, so
code that only passes ``scores`` along keeps the indices.
"""

from __future__ import annotations

import array
import math

import numpy as np

from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError

from .results import Scores, TaskOutput


def softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)         # a new array: the steps below work in place on it
    x -= x.max()
    np.exp(x, out=x)
    x /= x.sum()
    return x.astype(np.float32)


def duplicate_labels(labels: list[str]) -> dict[str, list[int]]:
    """``{label: [index, ...]}`` for every label that occurs more than once."""
    if len(set(labels)) == len(labels):     # the common case, one C pass (ImageNet's 1001: 0.3 -> 0.02 ms)
        return {}
    seen: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        seen.setdefault(label, []).append(i)
    return {label: idx for label, idx in seen.items() if len(idx) > 1}


def describe_duplicates(dup: dict[str, list[int]], offset: int = 0) -> str:
    shown = "; ".join(f"{label!r} at classes {', '.join(str(i + offset) for i in idx)}"
                      for label, idx in list(dup.items())[:5])
    more = f" and {len(dup) - 5} more" if len(dup) > 5 else ""
    return (f"{len(dup)} duplicate label(s): {shown}{more}; each class keeps its own entry "
            f"(scores keys 'label#index' for these)")


def score_keys(labels: list[str]) -> list[str]:
    """The ``scores`` key of each class: the label, or ``"label#index"`` when the label repeats."""
    dup = duplicate_labels(labels)
    if not dup:
        return list(labels)
    return [f"{label}#{i}" if label in dup else label for i, label in enumerate(labels)]


def top_indices(probs: np.ndarray, k: int | None) -> list[int]:
    """The indices of the ``k`` best scores, best first, ties by the lower index: exactly
    ``np.argsort(-probs, kind="stable")[:k].tolist()``, without sorting every class past 64 of
    them: for k <= 8, k ``argmax`` passes (each returns the first of equal maxima, so ties keep
    index order); for a larger k, a partition that keeps every score tied with the k-th, then a
    stable sort of those. Anything not a plain finite ranking (NaN, -inf) takes the full sort."""
    n = probs.shape[0]
    if n <= 64 and probs.dtype.kind == "f":
        # a few classes: Python's sort (stable, and stable under reverse=True too) on the
        # values, cheaper than four numpy calls; only for finite values (a NaN sum says not)
        values = probs.tolist()
        if math.isfinite(sum(values)):
            ranked = sorted(range(n), key=values.__getitem__, reverse=True)
            return ranked[:k] if k else ranked
    if not k or k >= n or n <= 64 or probs.dtype.kind != "f":
        order = np.argsort(-probs, kind="stable")
        return (order[:k] if k else order).tolist()
    if k <= 8:
        work = probs.copy()
        out = []
        for _ in range(k):
            i = int(work.argmax())
            if not work[i] > -np.inf:       # NaN or -inf reached: the sort defines their order
                return np.argsort(-probs, kind="stable")[:k].tolist()
            out.append(i)
            work[i] = -np.inf
        return out
    neg = -probs
    kth = neg[np.argpartition(neg, k - 1)[k - 1]]         # the k-th best score (negated)
    if kth != kth:
        return np.argsort(neg, kind="stable")[:k].tolist()
    cand = np.flatnonzero(neg <= kth)                     # ascending indices: ties stay in index order
    return cand[np.argsort(neg[cand], kind="stable")[:k]].tolist()


def rank_classes(probs: np.ndarray, labels: list[str], k: int | None, keys: list[str] | None = None):
    """``(label, class_id, scores, top_k)`` for a 1-D score vector, best first.

    ``keys`` are :func:`score_keys` of ``labels`` (pass them precomputed when
    ranking many times); ``scores`` is a :class:`Scores` carrying ``class_id``
    and ``top_k``. Only the top ``k`` are ranked and converted (:func:`top_indices`).
    """
    if keys is None:
        keys = score_keys(labels)
    order = top_indices(probs, k)
    values = probs[order].tolist()       # python floats, only for the k ranked
    if probs.dtype.kind != "f":
        values = [float(v) for v in values]
    top = [{"index": i, "label": labels[i], "score": v} for i, v in zip(order, values)]
    class_id = order[0]
    scores = Scores(zip([keys[i] for i in order], values), class_id=class_id, top_k=top)
    return labels[class_id], class_id, scores, top


def classify(vals: np.ndarray, labels: list[str], k: int | None, keys: list[str], apply_softmax: bool):
    """:func:`rank_classes` of ``softmax(vals)`` (or of ``vals``), a 1-D float32 vector. Up to 64
    classes, the softmax runs on Python floats in float64 and is rounded to float32, as
    :func:`softmax` does, without numpy's per-call cost (about half of it on 10 classes)."""
    n = vals.shape[0]
    if apply_softmax and 0 < n <= 64:
        out = _softmax_ranked(vals.tolist(), labels, k, keys)
        if out is not None:
            return out
    return rank_classes(softmax(vals) if apply_softmax else vals, labels, k, keys)


def classify_values(values: list[float], labels: list[str], k: int | None, keys: list[str], apply_softmax: bool):
    """:func:`classify` of a vector given as Python floats, each a float32 value (the list path of
    small outputs: :func:`code_table`'s dequantized codes, or ``float32_array.tolist()``)."""
    if apply_softmax and 0 < len(values) <= 64:
        out = _softmax_ranked(values, labels, k, keys)
        if out is not None:
            return out
    return classify(np.array(values, dtype=np.float32), labels, k, keys, apply_softmax)


def _softmax_ranked(values: list[float], labels: list[str], k: int | None, keys: list[str]):
    """:func:`classify`'s small-vector path on Python floats; None when a value is not finite
    (the numpy path defines what NaN and infinities give)."""
    top = max(values)
    if not (math.isfinite(top) and math.isfinite(sum(values))):
        return None
    e = [math.exp(x - top) for x in values]
    total = sum(e)
    probs = array.array("f", [x / total for x in e]).tolist()      # float32, as softmax() returns
    order = sorted(range(len(probs)), key=probs.__getitem__, reverse=True)  # stable: ties by the lower index
    if k:
        order = order[:k]
    ranked = [probs[i] for i in order]
    class_id = order[0]
    top_k = [{"index": i, "label": labels[i], "score": v} for i, v in zip(order, ranked)]
    scores = Scores(zip([keys[i] for i in order], ranked), class_id=class_id, top_k=top_k)
    return labels[class_id], class_id, scores, top_k


def code_table(dtype, zero_point: float, scale: float) -> list[float] | None:
    """``(code - zero_point) * scale`` of every code of an 8-bit output, as Python floats holding
    the float32 values that numpy's ``(arr.astype(np.float32) - zero_point) * scale`` gives
    (computed by that very expression, element by element the same IEEE operations), indexed by
    the code itself: an int8 code's negative value indexes the list from its end. A 10-class
    int8 output dequantizes through it in ~0.5 µs against ~3 µs for the three numpy calls.
    None for any other dtype."""
    dt = np.dtype(dtype)
    if dt not in (np.uint8, np.int8):
        return None
    codes = np.arange(256, dtype=np.uint8).view(dt)     # int8: 0..127 then -128..-1
    return ((codes.astype(np.float32) - zero_point) * scale).tolist()


def top_k_scores(probs: np.ndarray, labels: list[str], k: int | None) -> tuple[str, dict[str, float]]:
    """``(label, scores)``; ``scores`` is a :class:`Scores` (see :func:`rank_classes`)."""
    label, _, scores, _ = rank_classes(probs, labels, k)
    return label, scores


def _class_of(out: TaskOutput):
    return out.class_id if out.class_id is not None else out.prediction


def classification_parity(reference: list[TaskOutput], candidate: list[TaskOutput]) -> dict:
    """Top-1 agreement by class index (label text where a result has no index:
    duplicated labels must not make two classes agree)."""
    agree = [_class_of(r) == _class_of(c) for r, c in zip(reference, candidate)]
    diffs = []
    for r, c in zip(reference, candidate):
        rs, cs = _scores_by_class(r), _scores_by_class(c)
        keys = set(rs) & set(cs)
        diffs.append(max((abs(rs[k] - cs[k]) for k in keys), default=0.0))
    return {
        "metric": "top1_agreement",
        "value": float(np.mean(agree)) if agree else None,
        "samples": len(agree),
        "max_score_diff": float(max(diffs)) if diffs else None,
    }


def _scores_by_class(out: TaskOutput) -> dict:
    if out.top_k:
        return {t["index"]: t["score"] for t in out.top_k}
    return dict(out.scores)


def source_softmax_outputs(source) -> list[str]:
    """The source ONNX graph's outputs that a ``Softmax`` writes (``onnx_import.softmax_outputs``,
    what import reads), read by the classifiers' convert: a model exported with its softmax outputs
    probabilities, which a second softmax would flatten (0.986 became 0.725). External data files
    are not read; none if the source cannot be read (not ONNX, say)."""
    try:
        import onnx

        from edge_runtime.converters.onnx_import import softmax_outputs

        return softmax_outputs(onnx.load(str(source), load_external_data=False).graph)
    except Exception:
        return []


def check_ranking(top_k, apply_softmax) -> None:
    """``postprocess.top_k`` (absent or 0: every class) and ``softmax`` as the ranking reads them.
    A top_k of -1 ranked all classes but the last (``order[:-1]``), "false" softmaxed the
    probabilities again (a non-empty string is true) and "3" failed every call as
    ``inference_failed``: a manifest's value, refused at load."""
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise ArtifactError(f"postprocess.top_k must be a whole number >= 0 (0: every class), not {top_k!r}",
                            file="manifest.json", code=ec.MANIFEST_FIELD_INVALID)
    if not isinstance(apply_softmax, bool):
        raise ArtifactError(f"postprocess.softmax must be true or false, not {apply_softmax!r}",
                            file="manifest.json", code=ec.MANIFEST_FIELD_INVALID)
