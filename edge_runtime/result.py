"""The structured result of one inference.

Classifiers' results carry the class index: ``class_id`` (the prediction's)
and ``top_k``, the ranked ``[{"index", "label", "score"}, ...]``. ``prediction``
stays the label text and ``scores`` a ``{key: score}`` dict, whose key is the
label, or ``"label#index"`` for a label the labels file repeats (so two
classes named alike never overwrite each other). When the runtime does not
pass ``class_id``/``top_k``/``raw_outputs`` they are taken from what the task
returned (``scores.class_id``, ``scores.top_k``, ``outputs.raw``).

``outputs`` (tensors task) are the model's outputs dequantized to float32 with
its own scale and zero point; ``raw_outputs`` are the quantized arrays as the
model returned them, for the outputs that were dequantized.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import numpy as np

from .value import Frozen


class _TraceIds:
    """Trace ids: 32 hex digits, a random 64-bit prefix per process and a 64-bit counter,
    unique within the process (the counter: ``next()`` on an ``itertools.count`` is atomic
    under the GIL) and across processes and runs (the prefix; a forked child draws its own).
    ~0.3 µs against ~3 µs for ``uuid4().hex``. Not secret: never use one as a token."""

    def __init__(self):
        self._reset()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._count = itertools.count()

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._count) & 0xFFFFFFFFFFFFFFFF:016x}"


new_trace_id = _TraceIds()

MAX_TRACE_ID = 256


def check_trace_id(trace_id) -> str:
    """A caller's trace id: a printable, non-blank string of at most ``MAX_TRACE_ID`` characters (a W3C
    traceparent is 55).
    Before 2026-12-07 an int came back as the result's ``trace_id`` (``"trace_id": 5`` in JSON, not a string)
    and a 10,000-character one was carried into every log line and record."""
    from . import error_codes as ec
    from .errors import InputError

    if type(trace_id) is not str or len(trace_id) > MAX_TRACE_ID or not trace_id.isprintable():
        shown = repr(trace_id) if len(repr(trace_id)) <= 60 else f"{repr(trace_id)[:57]}..."
        raise InputError(f"trace_id must be a printable string of at most {MAX_TRACE_ID} characters, got "
                         f"{type(trace_id).__name__} {shown}", code=ec.INPUT_INVALID)
    if not trace_id.strip():        # "" correlates nothing (before 2026-12-07 it got one of ours, silently)
        raise InputError(f"trace_id {trace_id!r} is blank: give an id, or None for ours", code=ec.INPUT_INVALID)
    return trace_id


class InferenceResult(Frozen):
    prediction: Any                      # label, or None for embeddings / raw tensors
    scores: dict[str, float]             # key (label, or "label#index" if repeated) -> probability (top-k)
    embedding: np.ndarray | None         # text-embedding only
    latency_ms: float                    # raw input in -> result out
    device: str                          # where it actually ran, e.g. "onnxruntime:cpu"
    target: str                          # artifact variant, e.g. "onnx-int8"
    model: str
    version: str
    trace_id: str
    bucket: str                          # static-shape bucket used, e.g. "seq64"
    truncated: bool                      # input longer than the largest bucket
    input_length: int | None             # tokens before truncation / decoded pixels (the drift signal)
    outputs: dict[str, np.ndarray] | None  # tensors task (dequantized)
    class_id: int | None                 # classifiers: the prediction's class index
    top_k: list[dict] | None             # classifiers: [{"index", "label", "score"}], best first
    raw_outputs: dict[str, np.ndarray] | None  # tensors: quantized, as returned
    detections: list[dict] | None        # object-detection: [{"label", "class_id", "score", "box"}], best first
    keypoints: list[dict] | None         # pose-estimation: [{"name", "x", "y", "score"}]

    HIDDEN = ("outputs", "raw_outputs")

    def __init__(self, prediction: Any, scores: dict[str, float], embedding: np.ndarray | None, latency_ms: float,
                 device: str, target: str, model: str, version: str, trace_id: str, bucket: str,
                 truncated: bool = False, input_length: int | None = None,
                 outputs: dict[str, np.ndarray] | None = None, class_id: int | None = None,
                 top_k: list[dict] | None = None, raw_outputs: dict[str, np.ndarray] | None = None,
                 detections: list[dict] | None = None, keypoints: list[dict] | None = None) -> None:
        self.__dict__.update(
            prediction=prediction, scores=scores, embedding=embedding, latency_ms=latency_ms, device=device,
            target=target, model=model, version=version, trace_id=trace_id, bucket=bucket, truncated=truncated,
            input_length=input_length, outputs=outputs,
            class_id=getattr(scores, "class_id", None) if class_id is None else class_id,
            top_k=getattr(scores, "top_k", None) if top_k is None else top_k,
            raw_outputs=getattr(outputs, "raw", None) if raw_outputs is None else raw_outputs,
            detections=detections, keypoints=keypoints)

    @classmethod
    def _make(cls, fields: dict) -> "InferenceResult":
        """The runtime's constructor: ``fields`` names every field, already of the right types
        (what ``__init__`` would store), set in one dict update. The instance is the same as
        ``InferenceResult(**fields)``'s (equal, same repr, same ``to_dict``)."""
        if fields["class_id"] is None:
            fields["class_id"] = getattr(fields["scores"], "class_id", None)
        if fields["top_k"] is None:
            fields["top_k"] = getattr(fields["scores"], "top_k", None)
        if fields["raw_outputs"] is None:
            fields["raw_outputs"] = getattr(fields["outputs"], "raw", None)
        obj = object.__new__(cls)
        obj.__dict__.update(fields)
        return obj

    def to_dict(self) -> dict:
        out = {
            "prediction": self.prediction,
            "class_id": None if self.class_id is None else int(self.class_id),
            "scores": {str(k): float(v) for k, v in self.scores.items()},
            "top_k": None if self.top_k is None else [
                {"index": int(t["index"]), "label": str(t["label"]), "score": float(t["score"])} for t in self.top_k],
            # one C pass (the same Python floats as float() of each element; 5 µs, not 20, for 384)
            "embedding": None if self.embedding is None else np.asarray(self.embedding, dtype=np.float64).tolist(),
            "latency_ms": round(float(self.latency_ms), 3),
            "device": self.device,
            "target": self.target,
            "model": self.model,
            "version": self.version,
            "trace_id": self.trace_id,
            "bucket": self.bucket,
            "truncated": bool(self.truncated),
            "input_length": None if self.input_length is None else int(self.input_length),
        }
        if self.detections is not None:
            out["detections"] = [{"label": str(d["label"]), "class_id": int(d["class_id"]), "score": float(d["score"]),
                                  "box": [float(v) for v in d["box"]]} for d in self.detections]
        if self.keypoints is not None:
            out["keypoints"] = [{"name": str(k["name"]), "x": float(k["x"]), "y": float(k["y"]),
                                 "score": float(k["score"])} for k in self.keypoints]
        if self.outputs is not None:
            out["outputs"] = _arrays(self.outputs)
        if self.raw_outputs:
            out["raw_outputs"] = _arrays(self.raw_outputs)
        if isinstance(out["prediction"], (np.generic,)):
            out["prediction"] = out["prediction"].item()
        return out


def _arrays(arrays: dict) -> dict:
    return {k: {"dtype": str(v.dtype), "shape": list(v.shape), "data": np.asarray(v).tolist()}
            for k, v in arrays.items()}
