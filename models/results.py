"""What a task hands on: ``Prepared`` (one input's feeds), ``TaskOutput`` (one result), and the
dicts that carry more than their items (``Scores``: the ranking's indices; ``Outputs``: the
model's raw arrays)."""

from __future__ import annotations

from typing import Any

import numpy as np

from edge_runtime.value import Record


class Prepared(Record):
    """One input, ready for a device: the bucket it goes to and its feeds."""

    bucket: int
    feeds: dict[str, np.ndarray]
    truncated: bool
    length: int | None                 # tokens / pixels, for the drift histogram
    meta: dict | None                  # what finish needs beyond the feeds (vision: the letterbox transform)

    def __init__(self, bucket: int, feeds: dict[str, np.ndarray], truncated: bool = False, length: int | None = None,
                 meta: dict | None = None) -> None:
        self.bucket = bucket
        self.feeds = feeds
        self.truncated = truncated
        self.length = length
        self.meta = meta


class Scores(dict):
    """``{key: score}`` in rank order (a plain ``dict`` to its users), with the
    ranking's ``class_id`` (the prediction's index) and ``top_k``
    (``[{"index", "label", "score"}, ...]``) as attributes."""

    __slots__ = ("class_id", "top_k")

    def __init__(self, items=(), class_id: int | None = None, top_k: list | None = None):
        super().__init__(items)
        self.class_id = class_id
        self.top_k = top_k


class Outputs(dict):
    """``{name: array}`` as a task reports them (dequantized), with ``raw``:
    the arrays exactly as the model returned them, for the outputs that differ."""

    __slots__ = ("raw",)

    def __init__(self, items=(), raw: dict | None = None):
        super().__init__(items)
        self.raw = raw


class TaskOutput(Record):
    prediction: Any
    scores: dict[str, float]
    embedding: np.ndarray | None
    outputs: dict[str, np.ndarray] | None
    class_id: int | None                         # the prediction's class index (classifiers)
    top_k: list[dict] | None                     # [{"index", "label", "score"}], best first
    raw_outputs: dict[str, np.ndarray] | None    # tensors: the model's own (quantized) arrays
    # object-detection: [{"label", "class_id", "score", "box": [x1, y1, x2, y2]}] in original-image pixels,
    # best first
    detections: list[dict] | None
    # pose-estimation: [{"name", "x", "y", "score"}] in original-image pixels, one per named keypoint
    keypoints: list[dict] | None
    # object-detection, for parity only (never in a result): the detections just under the score
    # threshold, so that a box whose score drifted across it is not counted as a different answer
    near_detections: list[dict] | None

    def __init__(self, prediction: Any = None, scores: dict[str, float] | None = None,
                 embedding: np.ndarray | None = None, outputs: dict[str, np.ndarray] | None = None,
                 class_id: int | None = None, top_k: list[dict] | None = None,
                 raw_outputs: dict[str, np.ndarray] | None = None, detections: list[dict] | None = None,
                 keypoints: list[dict] | None = None, near_detections: list[dict] | None = None) -> None:
        if scores is None:
            scores = {}
        self.prediction = prediction
        self.scores = scores
        self.embedding = embedding
        self.outputs = outputs
        self.class_id = getattr(scores, "class_id", None) if class_id is None else class_id
        self.top_k = getattr(scores, "top_k", None) if top_k is None else top_k
        self.raw_outputs = getattr(outputs, "raw", None) if raw_outputs is None else raw_outputs
        self.detections = detections
        self.keypoints = keypoints
        self.near_detections = near_detections
