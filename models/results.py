"""What a task hands on: ``Prepared`` (one input's feeds), ``TaskOutput`` (one result), and the
dicts that carry more than their items (``Scores``: the ranking's indices; ``Outputs``: the
model's raw arrays)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Prepared:
    """One input, ready for a device: the bucket it goes to and its feeds."""

    bucket: int
    feeds: dict[str, np.ndarray]
    truncated: bool = False
    length: int | None = None          # tokens / pixels, for the drift histogram
    meta: dict | None = None           # what finish needs beyond the feeds (vision: the letterbox transform)


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


@dataclass
class TaskOutput:
    prediction: Any = None
    scores: dict[str, float] = field(default_factory=dict)
    embedding: np.ndarray | None = None
    outputs: dict[str, np.ndarray] | None = None
    class_id: int | None = None                  # the prediction's class index (classifiers)
    top_k: list[dict] | None = None              # [{"index", "label", "score"}], best first
    raw_outputs: dict[str, np.ndarray] | None = None   # tensors: the model's own (quantized) arrays
    # object-detection: [{"label", "class_id", "score", "box": [x1, y1, x2, y2]}] in original-image pixels,
    # best first
    detections: list[dict] | None = None
    # pose-estimation: [{"name", "x", "y", "score"}] in original-image pixels, one per named keypoint
    keypoints: list[dict] | None = None
    # object-detection, for parity only (never in a result): the detections just under the score
    # threshold, so that a box whose score drifted across it is not counted as a different answer
    near_detections: list[dict] | None = None

    def __post_init__(self):
        if self.class_id is None:
            self.class_id = getattr(self.scores, "class_id", None)
        if self.top_k is None:
            self.top_k = getattr(self.scores, "top_k", None)
        if self.raw_outputs is None:
            self.raw_outputs = getattr(self.outputs, "raw", None)
