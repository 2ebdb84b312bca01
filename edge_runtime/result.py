"""The structured result of one inference."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class InferenceResult:
    prediction: Any                      # label, or None for embeddings / raw tensors
    scores: dict[str, float]             # label -> probability (top-k)
    embedding: np.ndarray | None         # text-embedding only
    latency_ms: float                    # raw input in -> result out
    device: str                          # where it actually ran, e.g. "onnxruntime:cpu"
    target: str                          # artifact variant, e.g. "onnx-int8"
    model: str
    version: str
    trace_id: str
    bucket: str                          # static-shape bucket used, e.g. "seq64"
    truncated: bool = False              # input longer than the largest bucket
    input_length: int | None = None      # tokens before truncation / decoded pixels (the drift signal)
    outputs: dict[str, np.ndarray] | None = field(default=None, repr=False)  # tensors task

    def to_dict(self) -> dict:
        out = {
            "prediction": self.prediction,
            "scores": {str(k): float(v) for k, v in self.scores.items()},
            "embedding": None if self.embedding is None else [float(x) for x in self.embedding],
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
        if self.outputs is not None:
            out["outputs"] = {
                k: {"dtype": str(v.dtype), "shape": list(v.shape), "data": np.asarray(v).tolist()}
                for k, v in self.outputs.items()
            }
        if isinstance(out["prediction"], (np.generic,)):
            out["prediction"] = out["prediction"].item()
        return out
