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

Outputs, each ``[N, ...]`` along the items:

- classifiers: ``label`` BYTES, ``class_id`` INT64, ``score`` FP32 (the
  prediction's probability), ``top_k_class_ids`` INT64 ``[N, K]`` and
  ``top_k_scores`` FP32 ``[N, K]``;
- embeddings: ``embedding`` FP32 ``[N, D]``;
- detection: ``num_detections`` INT64 (the boxes are in ``result``);
- tensors and segmentation: the model's (dequantized) outputs by name
  (segmentation: ``mask``);
- every task: ``result`` BYTES, one JSON document per item: the result's
  ``to_dict()`` without its arrays (prediction, top_k, detections,
  keypoints, trace_id, latency_ms, bucket, truncated, ...).

A request that names no output gets every output, except ``result`` where a
typed output already carries the result (classifiers, embeddings, tensors,
segmentation): ask for it by name there.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from . import error_codes as ec
from . import serve_json
from .serve_types import BYTES, DATATYPES, InferRequest, ServeError, Tensor, datatype_of

_BIG = ("embedding", "outputs", "raw_outputs")


# the one input of a text or image model, as its metadata names it (io_metadata)
INPUT_NAME = {"text": "text", "image": "image"}


def bad(message: str) -> ServeError:
    return ServeError("bad_request", message, ec.SERVE_REQUEST_MALFORMED)


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


def _item_json(res) -> bytes:
    d = res.to_dict()
    for k in _BIG:
        d.pop(k, None)
    return serve_json.dumps(d, default=str)


def _stack(arrays: list[np.ndarray]) -> np.ndarray:
    if len(arrays) == 1:
        return np.asarray(arrays[0])
    if all(a.ndim >= 1 and a.shape[0] == 1 for a in arrays) and len({a.shape for a in arrays}) == 1:
        return np.concatenate(arrays, axis=0)
    return np.stack(arrays)


def _bytes_tensor(name: str, values: list[bytes]) -> Tensor:
    return Tensor(name, BYTES, [len(values)], values)


_BY_DTYPE = {np.dtype(v): k for k, v in DATATYPES.items()}


def _array_tensor(name: str, arr: np.ndarray) -> Tensor:
    arr = np.ascontiguousarray(arr)
    return Tensor(name, _BY_DTYPE.get(arr.dtype) or datatype_of(arr), list(arr.shape), arr)


def output_makers(results: list) -> dict[str, Callable[[], Tensor]]:
    """Output name -> a function building that tensor from ``results`` (only the asked-for ones are built).
    A classifier's few scalars go out as flat Python lists (``numeric_bytes`` packs them), not numpy
    arrays: five small arrays built from lists, then serialised, were ~15 µs of a digits request."""
    r0 = results[0]
    n = len(results)
    makers: dict[str, Callable[[], Tensor]] = {}
    if r0.class_id is not None:
        makers["label"] = lambda: _bytes_tensor("label", [str(r.prediction).encode("utf-8") for r in results])
        makers["class_id"] = lambda: Tensor("class_id", "INT64", [n], [int(r.class_id) for r in results])
        makers["score"] = lambda: Tensor("score", "FP32", [n], [
            float(r.top_k[0]["score"]) if r.top_k else math.nan for r in results])
        ks = {len(r.top_k or ()) for r in results}
        if len(ks) == 1 and (k := ks.pop()) > 0:
            makers["top_k_class_ids"] = lambda: Tensor("top_k_class_ids", "INT64", [n, k], [
                int(t["index"]) for r in results for t in r.top_k])
            makers["top_k_scores"] = lambda: Tensor("top_k_scores", "FP32", [n, k], [
                float(t["score"]) for r in results for t in r.top_k])
    if r0.embedding is not None:
        makers["embedding"] = lambda: _array_tensor("embedding", np.stack(
            [np.asarray(r.embedding, dtype=np.float32) for r in results]))
    if r0.detections is not None:
        makers["num_detections"] = lambda: Tensor("num_detections", "INT64", [n], [
            len(r.detections or ()) for r in results])
    for name in (r0.outputs or {}):
        if name not in makers:
            makers[name] = (lambda n: lambda: _array_tensor(n, _stack([np.asarray(r.outputs[n]) for r in results])))(name)
    if "result" not in makers:
        makers["result"] = lambda: _bytes_tensor("result", [_item_json(r) for r in results])
    return makers


def default_outputs(makers: dict) -> list[str]:
    """The outputs sent when none is named: every one, but ``result`` only where no typed output carries
    the structured result (detection, pose): a classifier's or an embedding's JSON twin is asked by name."""
    typed = [n for n in makers if n not in ("result", "num_detections")]
    return list(makers) if not typed else typed


def response_outputs(results: list, requested: list[str] | None) -> list[Tensor]:
    makers = output_makers(results)
    if requested is None:
        return [makers[n]() for n in default_outputs(makers)]
    unknown = [n for n in requested if n not in makers]
    if unknown:
        raise bad(f"unknown output(s) {', '.join(map(repr, unknown))}; this model has {', '.join(makers)}")
    return [makers[n]() for n in requested]


def io_metadata(kind: str, model_inputs: list[dict], sample_results: list | None) -> tuple[list[dict], list[dict]]:
    """v2 metadata ``inputs`` and ``outputs`` (``-1``: any size) from the task kind and one real result."""
    if kind in INPUT_NAME:
        inputs = [{"name": INPUT_NAME[kind], "datatype": BYTES, "shape": [-1]}]
    else:
        inputs = [{"name": s["name"], "datatype": _datatype_name(s["dtype"]), "shape": list(s["shape"])}
                  for s in model_inputs]
    outputs: list[dict[str, Any]] = []
    if sample_results:
        makers = output_makers(sample_results)
        for t in (make() for make in makers.values()):
            outputs.append({"name": t.name, "datatype": t.datatype, "shape": [-1] + list(t.shape[1:])})
    else:
        outputs.append({"name": "result", "datatype": BYTES, "shape": [-1]})
    return inputs, outputs


def _datatype_name(dtype: Any) -> str:
    dt = np.dtype(dtype)
    for name, d in DATATYPES.items():
        if np.dtype(d) == dt:
            return name
    return BYTES
