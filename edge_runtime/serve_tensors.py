"""Task <-> tensor mapping for ``edge-infer serve``, protocol-neutral.

Inputs (one request holds N items; every item goes through ``rt.infer_batch``):

- text tasks: one ``BYTES`` input ``text``, each element one UTF-8 text;
- image tasks: one ``BYTES`` input (``image``), each element one encoded
  PNG/JPEG/BMP image (always the image's bytes, never a path on the server),
  or one ``UINT8`` input, ``[H, W]`` / ``[H, W, C]`` for one image or
  ``[N, H, W, C]`` for N;
- ``tensors``: the model's named numeric inputs, as the model declares them
  (``[1, ...]``), or ``[N, ...]`` for N items when the model's batch axis is 1.

An input name the model does not declare is refused (``serve_request_malformed``,
naming the model's), as Triton does.

Outputs, decided by the model's task at load (``served_outputs``: the task the
manifest declares, or the built-in task a plugin's derives from), never by what
one result holds; each carries the items as its first axis, ``[N, ...]``, for
one item as for many; the metadata lists them, ``-1`` where a size varies:

- classifiers: ``label`` BYTES, ``class_id`` INT64, ``score`` FP32 (the
  prediction's probability), ``top_k_class_ids`` INT64 ``[N, K]`` and
  ``top_k_scores`` FP32 ``[N, K]``;
- embeddings: ``embedding`` FP32 ``[N, D]``;
- object-detection: ``num_detections`` INT64 and ``result`` (the boxes);
- pose-estimation: ``keypoints`` FP32 ``[N, K, 3]`` (per keypoint x, y in the
  original image's pixels and score, as the result's ``keypoints``; K = 17,
  COCO's order, for MoveNet) and ``image_size`` INT32 ``[N, 2]``;
- semantic-segmentation: ``mask`` UINT8 ``[N, H, W]`` and ``mask_size`` INT32
  ``[N, 2]``; images of different sizes in one request: each mask padded at the
  bottom and right with 255 to the largest (``mask[i, :h, :w]`` is item i's);
- tensors: the model's declared outputs by name (a quantized one dequantized
  to FP32), each in its declared datatype (``serve_output_kinds._as_declared``),
  an output declared ``[1, ...]`` (or with a first dimension of any
  size) as ``[N, ...]``, any other stacked as ``[N, ...declared]``;
- every task: ``result`` BYTES, one JSON document per item: the result's
  ``to_dict()`` without its arrays (prediction, top_k, detections,
  keypoints, trace_id, latency_ms, bucket, truncated, ...); a task of its own
  (a plugin not derived from a built-in) has ``result`` alone.

A request that names no output gets every output, except ``result`` where a
typed output already carries the result (classifiers, embeddings, pose,
tensors, segmentation): ask for it by name there.

This module decodes a request's tensors into the runtime's items and states the
metadata; the outputs are ``serve_outputs`` (which, from the task) and
``serve_output_kinds`` (how each is built), re-exported here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .serve_output_kinds import MASK_PAD, Output, ServedOutputs, bad, datatype_name, positive_int
from .serve_outputs import TASK_KINDS, outputs_of_results, response_outputs, served_outputs, task_kind
from .serve_types import BYTES, InferRequest

__all__ = ["INPUT_NAME", "MASK_PAD", "MAX_DIMS", "TASK_KINDS", "Output", "ServedOutputs", "bad", "io_metadata",
           "outputs_of_results", "request_items", "response_outputs", "served_outputs", "shape_count", "task_kind"]

# the one input of a text or image model, as its metadata names it (io_metadata)
INPUT_NAME = {"text": "text", "image": "image"}
# a request tensor's shape, on both protocols: at most MAX_DIMS dimensions, and its dimensions other than
# 0 multiplying to at most MAX_ELEMENTS. A shape with a 0 holds no data, so its other dimensions are never
# held to the data's length: [0, 2**62, 2**62] (or 70 dimensions) is no array numpy can make, even
# empty, and was a 500 (gRPC INTERNAL) instead of a 400
MAX_DIMS = 16
MAX_ELEMENTS = 2 ** 40


def shape_count(where: str, shape: list[int]) -> int:
    """The element count of a request tensor's ``shape`` (non-negative integers, checked by the caller);
    a 400 ``serve_request_malformed`` for a shape no array can have (``MAX_DIMS``, ``MAX_ELEMENTS``)."""
    if len(shape) > MAX_DIMS:
        raise bad(f"{where}: shape has {len(shape)} dimensions, over the server's {MAX_DIMS}")
    count, held = 1, 1
    for d in shape:
        count *= d                  # Python ints: a huge shape never overflows
        held *= d or 1
    if held > MAX_ELEMENTS:
        raise bad(f"{where}: shape {str(shape)[:120]} is too large (over {MAX_ELEMENTS} elements, "
                  "its zero dimensions left out)")
    return count


def request_items(kind: str, model_inputs: list[dict], req: InferRequest) -> list:
    """The raw items ``rt.infer_batch`` takes, from the request's tensors (``ServeError`` bad_request)."""
    if not req.inputs:
        raise bad("the request has no inputs")
    if kind in ("text", "image"):
        if len(req.inputs) != 1:
            raise bad(f"this {kind} model takes one input, got {len(req.inputs)}: "
                      f"{', '.join(t.name for t in req.inputs)}")
        t = req.inputs[0]
        want = INPUT_NAME[kind]
        if t.name != want:         # as Triton: an input the model does not declare is refused, not guessed
            raise bad(f"input {t.name!r} is not an input of this model; it takes {want!r}")
        items: list[Any]
        if t.datatype == BYTES:
            items = [bytes(x) for x in t.data]
        elif kind == "image" and t.datatype == "UINT8":
            arr = np.asarray(t.data)
            if arr.ndim in (2, 3):
                items = [arr]
            elif arr.ndim == 4:
                items = list(arr)
            else:
                raise bad(f"input {t.name!r}: a UINT8 image is [H, W], [H, W, C] or [N, H, W, C], "
                          f"got shape {list(arr.shape)}")
        else:
            want = "BYTES (encoded images) or UINT8" if kind == "image" else "BYTES (UTF-8 texts)"
            raise bad(f"input {t.name!r} is {t.datatype}; a {kind} model takes {want}")
        if not items:
            raise bad(f"input {t.name!r} holds no items")
        return items
    return _tensor_items(model_inputs, req)


def _tensor_items(model_inputs: list[dict], req: InferRequest) -> list:
    specs = {s["name"]: list(s["shape"]) for s in model_inputs}
    unknown = [t.name for t in req.inputs if t.name not in specs]
    if unknown:                # before any work, as for text and image (a missing input: the runtime's 400)
        raise bad(f"input(s) {', '.join(map(repr, unknown))} not declared by this model; "
                  f"it takes {', '.join(map(repr, specs))}")
    arrays: dict[str, np.ndarray] = {}
    for t in req.inputs:
        if t.datatype == BYTES:
            raise bad(f"input {t.name!r} is BYTES; this model takes numeric tensors")
        if t.name in arrays:
            raise bad(f"input {t.name!r} is given twice")
        arrays[t.name] = np.asarray(t.data)
    counts = set()
    for name, arr in arrays.items():
        shape = specs.get(name)
        if shape and shape[0] == 1 and arr.ndim == len(shape) and list(arr.shape[1:]) == shape[1:]:
            counts.add(int(arr.shape[0]))
        else:
            counts.add(-1)
    if len(counts) == 1 and (n := counts.pop()) > 1:
        return [{k: v[i:i + 1] for k, v in arrays.items()} for i in range(n)]
    return [arrays]


def io_metadata(kind: str, model_inputs: list[dict], served: ServedOutputs) -> tuple[list[dict], list[dict]]:
    """v2 metadata ``inputs`` and ``outputs`` (``-1``: any size) from the task: what every answer holds."""
    if kind in INPUT_NAME:
        inputs = [{"name": INPUT_NAME[kind], "datatype": BYTES, "shape": [-1]}]
    else:
        # N items in one request where every input is declared [1, ...] (request_items): the first is -1
        batched = bool(model_inputs) and all(list(s["shape"])[:1] == [1] for s in model_inputs)
        inputs = [{"name": s["name"], "datatype": datatype_name(s["dtype"]),
                   "shape": ([-1] if batched else []) + [int(d) if positive_int(d) else -1
                                                         for d in list(s["shape"])[1 if batched else 0:]]}
                  for s in model_inputs]
    return inputs, served.metadata()
