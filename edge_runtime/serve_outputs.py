"""Which outputs a model served by ``edge-infer serve`` answers with: decided once, at load, by its
task (the task the manifest declares, or the built-in task a plugin's derives from) and the sizes
its manifest states (the classes, the top-k, an embedding's width, the keypoints, a tensors model's
declared outputs), never by what one result holds. How each kind's outputs are built is
``serve_output_kinds``'s; ``serve_tensors`` re-exports what others import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .serve_output_kinds import (ServedOutputs, classifier_outputs, datatype_name, detection_outputs,
                                 embedding_outputs, pose_outputs, positive_int, result_output,
                                 segmentation_outputs, tensors_outputs)
from .serve_types import Tensor, datatype_of

# the built-in tasks whose outputs are typed; a task subclassing one of them (a plugin) gets its outputs
TASK_KINDS: dict[str, str] = {
    "image-classification": "classifier", "text-classification": "classifier", "text-embedding": "embedding",
    "object-detection": "detection", "pose-estimation": "pose", "semantic-segmentation": "segmentation",
    "tensors": "tensors"}


@dataclass(frozen=True)
class Sizes:
    """What a kind's metadata states of its outputs' sizes (-1: it varies, or nothing says)."""

    top_k: int = -1                # a classifier's K
    classes: int = -1              # a classifier's number of classes
    dim: int = -1                  # an embedding's D
    keypoints: int = -1            # a pose model's K
    max_pixels: int | None = None  # the image pixel limit a segmenter's padded masks must fit
    declared: list[tuple[str, str, list]] = field(default_factory=list)   # a tensors model's outputs


_KINDS: dict[str, Callable[[Sizes], list]] = {
    "classifier": lambda s: classifier_outputs(s.top_k),
    "embedding": lambda s: embedding_outputs(s.dim),
    "detection": lambda s: detection_outputs(),
    "pose": lambda s: pose_outputs(s.keypoints),
    "segmentation": lambda s: segmentation_outputs(s.max_pixels),
    "tensors": lambda s: tensors_outputs(s.declared),
}


def outputs_of_kind(kind: str | None, sizes: Sizes) -> ServedOutputs:
    """The outputs of a task ``kind`` (``TASK_KINDS``); a task of its own (None): ``result`` alone."""
    make = _KINDS.get(kind or "")
    if make is None:
        return ServedOutputs([result_output(default=True)])
    return ServedOutputs(make(sizes), ranked=sizes.top_k if kind == "classifier" else None, classes=sizes.classes)


def task_kind(task: Any) -> str | None:
    """``TASK_KINDS`` of ``task``'s class or the nearest built-in task it derives from; None for a
    task of its own (a plugin): its outputs are ``result`` alone."""
    for cls in type(task).__mro__:
        name = vars(cls).get("name")
        if isinstance(name, str) and name in TASK_KINDS:
            return TASK_KINDS[name]
    return None


def served_outputs(task: Any, limits: Any = None) -> ServedOutputs:
    """The outputs of a model of ``task`` (the model's declared task and its manifest: the classes,
    the top-k, the embedding's width, the keypoints, a tensors model's declared outputs), whatever
    any one result holds: a detector answers ``num_detections`` and ``result`` whether an image holds
    boxes or none, a segmenter ``mask`` ``[N, H, W]`` for one image as for many."""
    kind = task_kind(task)
    return outputs_of_kind(kind, Sizes(
        top_k=_top_k_len(task) if kind == "classifier" else -1,
        classes=_classes(task) if kind == "classifier" else -1,
        dim=_embedding_dim(task) if kind == "embedding" else -1,
        keypoints=_keypoint_count(task) if kind == "pose" else -1,
        max_pixels=getattr(limits, "max_image_pixels", None),
        declared=_declared_outputs(getattr(task, "buckets", None) or []) if kind == "tensors" else []))


def _kind_of_results(results: list) -> str | None:
    """For a caller without a model (``response_outputs`` given no ``ServedOutputs``): the task kind
    the results' fields say; a server always decides from the model's task."""
    r0 = results[0]
    if getattr(r0, "detections", None) is not None:
        return "detection"
    if getattr(r0, "keypoints", None) is not None:
        return "pose"
    if getattr(r0, "embedding", None) is not None:
        return "embedding"
    if getattr(r0, "top_k", None) is not None:
        return "classifier"
    outputs = getattr(r0, "outputs", None)
    if outputs is not None:
        return "segmentation" if "mask" in outputs else "tensors"
    return None


def outputs_of_results(results: list) -> ServedOutputs:
    """The outputs the results' fields say (sizes -1: nothing states them), for a caller without a model."""
    kind = _kind_of_results(results)
    declared = []
    if kind == "tensors":
        arrays = {k: np.asarray(v) for k, v in results[0].outputs.items()}
        declared = [(k, datatype_of(a), list(a.shape)) for k, a in arrays.items()]
    return outputs_of_kind(kind, Sizes(declared=declared))


def response_outputs(results: list, requested: list[str] | None, served: ServedOutputs | None = None,
                     classification: dict[str, int] | None = None) -> list[Tensor]:
    """The response tensors of ``results`` (one per item): those ``requested``, or the model's
    defaults; those in ``classification`` as the extension's top classes. ``served`` is the model's
    (``served_outputs``); without it, the results' fields say."""
    return (served or outputs_of_results(results)).build(results, requested, classification)


def _classes(task: Any) -> int:
    """A classifier's number of classes (its labels), -1 where the task does not say."""
    labels = getattr(task, "labels", None)
    return len(labels) if isinstance(labels, (list, tuple)) and labels else -1


def _top_k_len(task: Any) -> int:
    """K of a classifier's ``top_k`` (``postprocess.top_k`` over the labels; all classes without
    one), -1 where the task does not say."""
    labels, k = getattr(task, "labels", None), getattr(task, "top_k", None)
    if not isinstance(labels, (list, tuple)) or not labels:
        return -1
    if k is None or k == 0:
        return len(labels)
    return min(int(k), len(labels)) if positive_int(k) else -1


def _embedding_dim(task: Any) -> int:
    """D of a text embedding: the output's last dimension (pooled over the sequence), or every
    element of an already pooled output; -1 where the buckets disagree or do not say."""
    name, pooling = getattr(task, "output", None), getattr(task, "pooling", "mean")
    dims = set()
    for b in getattr(task, "buckets", None) or []:
        spec = next((o for o in b.get("outputs", ()) if o.get("name") == name), None)
        shape = list(spec.get("shape") or []) if spec else []
        if not shape or not all(positive_int(d) for d in shape):
            return -1
        dims.add(int(shape[-1]) if pooling in ("mean", "cls") else math.prod(int(d) for d in shape))
    return dims.pop() if len(dims) == 1 else -1


def _keypoint_count(task: Any) -> int:
    """K of a pose model: the keypoints its output holds (``PoseEstimation.count``, from the
    manifest's output shape), -1 where the task does not say."""
    k: Any = getattr(task, "count", None)
    return int(k) if positive_int(k) else -1


def _declared_outputs(buckets: list[dict]) -> list[tuple[str, str, list]]:
    """(name, datatype as served, shape) of a tensors model's outputs over its buckets: a quantized
    integer output is served dequantized (FP32); a dimension the buckets disagree on, or that is
    not a fixed size, is -1."""
    found: dict[str, tuple[str, list]] = {}
    for b in buckets:
        for spec in b.get("outputs", ()):
            dt = np.dtype(spec["dtype"])
            datatype = "FP32" if spec.get("quantization") and dt.kind in "iu" else datatype_name(dt)
            shape = [int(d) if positive_int(d) else -1 for d in spec.get("shape") or []]
            name = str(spec["name"])
            if name in found:
                was_type, was = found[name]
                if len(was) != len(shape):
                    shape = [-1] * len(was)
                shape = [a if a == b else -1 for a, b in zip(was, shape)]
                datatype = was_type if was_type == datatype else datatype
            found[name] = (datatype, shape)
    return [(n, dt, shape) for n, (dt, shape) in found.items()]
