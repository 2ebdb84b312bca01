"""The task contract shared by every task."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from edge_runtime.errors import ArtifactError, InputError


@dataclass
class Prepared:
    """One input, ready for a device: the bucket it goes to and its feeds."""

    bucket: int
    feeds: dict[str, np.ndarray]
    truncated: bool = False
    length: int | None = None          # tokens / pixels, for the drift histogram


@dataclass
class TaskOutput:
    prediction: Any = None
    scores: dict[str, float] = field(default_factory=dict)
    embedding: np.ndarray | None = None
    outputs: dict[str, np.ndarray] | None = None


class Task:
    """Base class. Subclasses set ``name`` and ``parity_metric``.

    ``manifest`` is the artifact manifest, ``read_file(rel) -> bytes`` reads a
    verified artifact file, ``buckets`` are the chosen variant's buckets.
    """

    name = ""
    parity_metric = ""

    def __init__(self, manifest: dict, read_file: Callable[[str], bytes], buckets: list[dict]):
        self.manifest = manifest
        self.pre = manifest["preprocess"]
        self.post = manifest["postprocess"]
        self.buckets = buckets
        self._read_file = read_file

    # -- the contract ------------------------------------------------------
    def prepare(self, raw, limits) -> Prepared:
        raise NotImplementedError

    def finish(self, outputs: dict[str, np.ndarray], prepared: Prepared) -> TaskOutput:
        raise NotImplementedError

    def request_bytes(self, raw) -> int:
        """Approximate size of one raw input, for the request-size limit."""
        if isinstance(raw, str):
            return len(raw) * 4 if len(raw) > 1 << 18 else len(raw.encode("utf-8", "surrogatepass"))
        if isinstance(raw, (bytes, bytearray, memoryview)):
            return len(raw)
        if isinstance(raw, np.ndarray):
            return int(raw.nbytes)
        return 0

    @staticmethod
    def compare(reference: list[TaskOutput], candidate: list[TaskOutput]) -> dict:
        raise NotImplementedError

    def warmup_sample(self):
        """A raw input the runtime runs once at load, so the first real call
        does not pay for first-use code paths (decoders, tokenizer caches)."""
        return None

    # -- helpers -----------------------------------------------------------
    def output_spec(self, name: str, bucket: int = 0) -> dict:
        for spec in self.buckets[bucket]["outputs"]:
            if spec["name"] == name:
                return spec
        raise ArtifactError(f"model has no output {name!r}", file="manifest.json", code="manifest_field_invalid")

    def read_labels(self) -> list[str] | None:
        rel = self.post.get("labels")
        if not rel:
            return None
        text = self._read_file(rel).decode("utf-8", "replace")
        labels = [line.strip() for line in text.splitlines() if line.strip()]
        if not labels:
            raise ArtifactError("labels file is empty", file=rel, code="artifact_file_invalid")
        return labels


def dequantize(arr: np.ndarray, spec: dict) -> np.ndarray:
    q = spec.get("quantization")
    if q and arr.dtype.kind in "iu":
        return (arr.astype(np.float32) - float(q["zero_point"])) * float(q["scale"])
    return arr.astype(np.float32, copy=False)


def softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max()
    e = np.exp(x)
    return (e / e.sum()).astype(np.float32)


def top_k_scores(probs: np.ndarray, labels: list[str], k: int | None) -> tuple[str, dict[str, float]]:
    order = np.argsort(-probs, kind="stable")
    if k:
        order = order[:k]
    values = probs.tolist()              # python floats/ints: indexing numpy scalars one by one is slow
    order = order.tolist()
    scores = {labels[i]: float(values[i]) for i in order}
    return labels[order[0]], scores


def classification_parity(reference: list[TaskOutput], candidate: list[TaskOutput]) -> dict:
    agree = [r.prediction == c.prediction for r, c in zip(reference, candidate)]
    diffs = []
    for r, c in zip(reference, candidate):
        keys = set(r.scores) & set(c.scores)
        diffs.append(max((abs(r.scores[k] - c.scores[k]) for k in keys), default=0.0))
    return {
        "metric": "top1_agreement",
        "value": float(np.mean(agree)) if agree else None,
        "samples": len(agree),
        "max_score_diff": float(max(diffs)) if diffs else None,
    }


def reject_type(raw, expected: str):
    raise InputError(f"expected {expected}, got {type(raw).__name__}", code="input_wrong_type")
