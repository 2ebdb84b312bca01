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
- pose-estimation: ``result`` (the keypoints) and ``image_size`` INT32 ``[N, 2]``;
- semantic-segmentation: ``mask`` UINT8 ``[N, H, W]`` and ``mask_size`` INT32
  ``[N, 2]``; images of different sizes in one request: each mask padded at the
  bottom and right with 255 to the largest (``mask[i, :h, :w]`` is item i's);
- tensors: the model's declared outputs by name (a quantized one dequantized
  to FP32), an output declared ``[1, ...]`` (or with a first dimension of any
  size) as ``[N, ...]``, any other stacked as ``[N, ...declared]``;
- every task: ``result`` BYTES, one JSON document per item: the result's
  ``to_dict()`` without its arrays (prediction, top_k, detections,
  keypoints, trace_id, latency_ms, bucket, truncated, ...); a task of its own
  (a plugin not derived from a built-in) has ``result`` alone.

A request that names no output gets every output, except ``result`` where a
typed output already carries the result (classifiers, embeddings, tensors,
segmentation): ask for it by name there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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


def _bytes_tensor(name: str, values: list[bytes]) -> Tensor:
    return Tensor(name, BYTES, [len(values)], values)


_BY_DTYPE = {np.dtype(v): k for k, v in DATATYPES.items()}


def _array_tensor(name: str, arr: np.ndarray) -> Tensor:
    arr = np.ascontiguousarray(arr)
    return Tensor(name, _BY_DTYPE.get(arr.dtype) or datatype_of(arr), list(arr.shape), arr)


# -- outputs: decided by the model's task at load, never by the values of one result ----------------

@dataclass(frozen=True)
class Output:
    """One output a served model answers with: its metadata (``shape``: ``-1`` where the size
    varies; the first dimension is always the request's items) and how it is built from the
    request's results (``make``, run only when the output is sent)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    make: Callable[[list], Tensor]
    default: bool = True          # sent when the request names no output

    def meta(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


class ServedOutputs:
    """The outputs of one served model, in metadata order, from its task (:func:`served_outputs`)."""

    def __init__(self, outputs: list[Output]):
        self.outputs = outputs
        self.by_name = {o.name: o for o in outputs}
        self.defaults = [o for o in outputs if o.default]

    def metadata(self) -> list[dict]:
        return [o.meta() for o in self.outputs]

    def build(self, results: list, requested: list[str] | None) -> list[Tensor]:
        if requested is None:
            return [o.make(results) for o in self.defaults]
        unknown = [n for n in requested if n not in self.by_name]
        if unknown:
            raise bad(f"unknown output(s) {', '.join(map(repr, unknown))}; this model has "
                      f"{', '.join(self.by_name)}")
        return [self.by_name[n].make(results) for n in requested]


# the built-in tasks whose outputs are typed; a task subclassing one of them (a plugin) gets its outputs
TASK_KINDS: dict[str, str] = {
    "image-classification": "classifier", "text-classification": "classifier", "text-embedding": "embedding",
    "object-detection": "detection", "pose-estimation": "pose", "semantic-segmentation": "segmentation",
    "tensors": "tensors"}
MASK_PAD = 255       # the class id of the padding of a mask smaller than its request's largest (VOC's "void")


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
    the top-k, the embedding's width, a tensors model's declared outputs), whatever any one
    result holds: a detector answers ``num_detections`` and ``result`` whether an image holds boxes
    or none, a segmenter ``mask`` ``[N, H, W]`` for one image as for many."""
    kind = task_kind(task)
    max_pixels = getattr(limits, "max_image_pixels", None)
    if kind == "classifier":
        return ServedOutputs(_classifier_outputs(_top_k_len(task)))
    if kind == "embedding":
        return ServedOutputs(_embedding_outputs(_embedding_dim(task)))
    if kind == "detection":
        return ServedOutputs(_detection_outputs())
    if kind == "pose":
        return ServedOutputs(_pose_outputs())
    if kind == "segmentation":
        return ServedOutputs(_segmentation_outputs(max_pixels))
    if kind == "tensors":
        return ServedOutputs(_tensors_outputs(_declared_outputs(getattr(task, "buckets", None) or [])))
    return ServedOutputs([_result_output(default=True)])


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
    kind = _kind_of_results(results)
    if kind == "classifier":
        return ServedOutputs(_classifier_outputs(-1))
    if kind == "embedding":
        return ServedOutputs(_embedding_outputs(-1))
    if kind == "detection":
        return ServedOutputs(_detection_outputs())
    if kind == "pose":
        return ServedOutputs(_pose_outputs())
    if kind == "segmentation":
        return ServedOutputs(_segmentation_outputs(None))
    if kind == "tensors":
        arrays = {k: np.asarray(v) for k, v in results[0].outputs.items()}
        return ServedOutputs(_tensors_outputs([(k, datatype_of(a), list(a.shape)) for k, a in arrays.items()]))
    return ServedOutputs([_result_output(default=True)])


def _positive_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and bool(v > 0)


def _top_k_len(task: Any) -> int:
    """K of a classifier's ``top_k`` (``postprocess.top_k`` over the labels; all classes without
    one), -1 where the task does not say."""
    labels, k = getattr(task, "labels", None), getattr(task, "top_k", None)
    if not isinstance(labels, (list, tuple)) or not labels:
        return -1
    if k is None or k == 0:
        return len(labels)
    return min(int(k), len(labels)) if _positive_int(k) else -1


def _embedding_dim(task: Any) -> int:
    """D of a text embedding: the output's last dimension (pooled over the sequence), or every
    element of an already pooled output; -1 where the buckets disagree or do not say."""
    name, pooling = getattr(task, "output", None), getattr(task, "pooling", "mean")
    dims = set()
    for b in getattr(task, "buckets", None) or []:
        spec = next((o for o in b.get("outputs", ()) if o.get("name") == name), None)
        shape = list(spec.get("shape") or []) if spec else []
        if not shape or not all(_positive_int(d) for d in shape):
            return -1
        dims.add(int(shape[-1]) if pooling in ("mean", "cls") else math.prod(int(d) for d in shape))
    return dims.pop() if len(dims) == 1 else -1


def _result_output(default: bool) -> Output:
    """``result``: one JSON document per item, the result's ``to_dict()`` without its arrays."""
    return Output("result", BYTES, (-1,), lambda rs: _bytes_tensor("result", [_item_json(r) for r in rs]), default)


def _internal(message: str) -> ServeError:
    return ServeError("internal", message, ec.UNEXPECTED)


def _classifier_outputs(k: int) -> list[Output]:
    """label, class_id, score, top_k_class_ids, top_k_scores; ``result`` by name. A classifier's few
    scalars go out as flat Python lists (``numeric_bytes`` packs them), not numpy arrays: five small
    arrays built from lists, then serialised, were ~15 µs of a digits request."""
    def label(rs: list) -> Tensor:
        return _bytes_tensor("label", [str(r.prediction).encode("utf-8") for r in rs])

    def class_id(rs: list) -> Tensor:
        if any(r.class_id is None for r in rs):
            raise _internal("a classifier result has no class_id")
        return Tensor("class_id", "INT64", [len(rs)], [int(r.class_id) for r in rs])

    def score(rs: list) -> Tensor:
        if not all(r.top_k for r in rs):
            raise _internal("a classifier result has no top_k: no score")
        return Tensor("score", "FP32", [len(rs)], [float(r.top_k[0]["score"]) for r in rs])

    def top_len(rs: list) -> int:
        ks = {len(r.top_k or ()) for r in rs}
        if len(ks) != 1 or (k >= 0 and k not in ks):
            raise _internal(f"the classifier's results hold top-k lists of {sorted(ks)} entries, "
                            f"not the {k if k >= 0 else 'one length'} its metadata states")
        return ks.pop()

    def top_ids(rs: list) -> Tensor:
        n = top_len(rs)
        return Tensor("top_k_class_ids", "INT64", [len(rs), n], [int(t["index"]) for r in rs for t in r.top_k or ()])

    def top_scores(rs: list) -> Tensor:
        n = top_len(rs)
        return Tensor("top_k_scores", "FP32", [len(rs), n], [float(t["score"]) for r in rs for t in r.top_k or ()])

    return [Output("label", BYTES, (-1,), label), Output("class_id", "INT64", (-1,), class_id),
            Output("score", "FP32", (-1,), score), Output("top_k_class_ids", "INT64", (-1, k), top_ids),
            Output("top_k_scores", "FP32", (-1, k), top_scores), _result_output(default=False)]


def _embedding_outputs(d: int) -> list[Output]:
    def embedding(rs: list) -> Tensor:
        vecs = [np.asarray(r.embedding, dtype=np.float32).reshape(-1) for r in rs]
        if len({v.shape for v in vecs}) != 1 or (d >= 0 and vecs[0].shape[0] != d):
            raise _internal(f"the embeddings are {sorted({v.shape[0] for v in vecs})} wide, not the "
                            f"{d if d >= 0 else 'one width'} the metadata states")
        return _array_tensor("embedding", np.stack(vecs))

    return [Output("embedding", "FP32", (-1, d), embedding), _result_output(default=False)]


def _detection_outputs() -> list[Output]:
    """num_detections and ``result`` (the boxes: a list per item, its length varies), both sent by
    default, for an image with boxes or without."""
    def num(rs: list) -> Tensor:
        return Tensor("num_detections", "INT64", [len(rs)], [len(r.detections or ()) for r in rs])

    return [Output("num_detections", "INT64", (-1,), num), _result_output(default=True)]


def _pose_outputs() -> list[Output]:
    """``result`` (the keypoints) and image_size ``[N, 2]`` (each image's height and width)."""
    def image_size(rs: list) -> Tensor:
        sizes = [np.asarray((r.outputs or {}).get("image_size", ()), dtype=np.int32).reshape(-1) for r in rs]
        if any(s.shape != (2,) for s in sizes):
            raise _internal("a pose result has no image_size [height, width]")
        return _array_tensor("image_size", np.stack(sizes))

    return [_result_output(default=True), Output("image_size", "INT32", (-1, 2), image_size)]


def _segmentation_outputs(max_pixels: int | None) -> list[Output]:
    """mask UINT8 ``[N, H, W]`` and mask_size INT32 ``[N, 2]`` (each item's height and width). Masks
    are at their images' sizes: where a request's images differ in size, each mask is padded at the
    bottom and right with ``MASK_PAD`` to the largest height and width (``mask[i, :h, :w]`` is item
    i's), unless that box is over the image pixel limit (a 400: send those images one at a time)."""
    def masks(rs: list) -> list[np.ndarray]:
        out = [np.asarray((r.outputs or {}).get("mask")) for r in rs]
        if any(m.ndim != 2 for m in out):
            raise _internal("a segmentation result has no [H, W] mask")
        return out

    def mask(rs: list) -> Tensor:
        ms = masks(rs)
        if len({m.shape for m in ms}) == 1:
            return _array_tensor("mask", np.stack(ms).astype(np.uint8, copy=False))
        h, w = max(m.shape[0] for m in ms), max(m.shape[1] for m in ms)
        if max_pixels is not None and h * w > max_pixels:
            raise ServeError("bad_request", f"the masks ({', '.join(f'{m.shape[0]}x{m.shape[1]}' for m in ms)}) "
                             f"padded to one [N, {h}, {w}] tensor would be {h * w} pixels each, over the limit of "
                             f"{max_pixels}: send these images in separate requests", ec.INPUT_TOO_MANY_PIXELS)
        out = np.full((len(ms), h, w), MASK_PAD, dtype=np.uint8)
        for i, m in enumerate(ms):
            out[i, :m.shape[0], :m.shape[1]] = m
        return _array_tensor("mask", out)

    def mask_size(rs: list) -> Tensor:
        return Tensor("mask_size", "INT32", [len(rs), 2], [int(d) for m in masks(rs) for d in m.shape])

    return [Output("mask", "UINT8", (-1, -1, -1), mask), Output("mask_size", "INT32", (-1, 2), mask_size),
            _result_output(default=False)]


def _declared_outputs(buckets: list[dict]) -> list[tuple[str, str, list]]:
    """(name, datatype as served, shape) of a tensors model's outputs over its buckets: a quantized
    integer output is served dequantized (FP32); a dimension the buckets disagree on, or that is
    not a fixed size, is -1."""
    found: dict[str, tuple[str, list]] = {}
    for b in buckets:
        for spec in b.get("outputs", ()):
            dt = np.dtype(spec["dtype"])
            datatype = "FP32" if spec.get("quantization") and dt.kind in "iu" else _datatype_name(dt)
            shape = [int(d) if _positive_int(d) else -1 for d in spec.get("shape") or []]
            name = str(spec["name"])
            if name in found:
                was_type, was = found[name]
                if len(was) != len(shape):
                    shape = [-1] * len(was)
                shape = [a if a == b else -1 for a, b in zip(was, shape)]
                datatype = was_type if was_type == datatype else datatype
            found[name] = (datatype, shape)
    return [(n, dt, shape) for n, (dt, shape) in found.items()]


def _tensors_outputs(declared: list[tuple[str, str, list]]) -> list[Output]:
    """Each model output by name, the items along the first axis: an output declared ``[1, ...]``
    (or with a first dimension of any size) is concatenated along it, ``[N, ...]``; any other
    (``[]``, ``[K, ...]``) is stacked on a new first axis, ``[N, K, ...]``, one item or many."""
    outs = []
    for name, datatype, shape in declared:
        along = bool(shape) and shape[0] in (1, -1)
        meta = (-1, *shape[1:]) if along else (-1, *shape)
        outs.append(Output(name, datatype, tuple(meta), _tensor_maker(name, along)))
    return outs + [_result_output(default=False)]


def _tensor_maker(name: str, along: bool) -> Callable[[list], Tensor]:
    def make(rs: list) -> Tensor:
        arrays = []
        for r in rs:
            if name not in (r.outputs or {}):
                raise _internal(f"a result has no output {name!r}")
            arrays.append(np.asarray(r.outputs[name]))
        if len({a.shape for a in arrays}) != 1:
            raise bad(f"output {name!r} has a different shape for each item "
                      f"({', '.join(str(list(a.shape)) for a in arrays)}): send the items in separate requests")
        if along and arrays[0].ndim >= 1:
            return _array_tensor(name, arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0))
        return _array_tensor(name, np.stack(arrays))
    return make


def response_outputs(results: list, requested: list[str] | None, served: ServedOutputs | None = None
                     ) -> list[Tensor]:
    """The response tensors of ``results`` (one per item): those ``requested``, or the model's
    defaults. ``served`` is the model's (``served_outputs``); without it, the results' fields say."""
    return (served or outputs_of_results(results)).build(results, requested)


def io_metadata(kind: str, model_inputs: list[dict], served: ServedOutputs) -> tuple[list[dict], list[dict]]:
    """v2 metadata ``inputs`` and ``outputs`` (``-1``: any size) from the task: what every answer holds."""
    if kind in INPUT_NAME:
        inputs = [{"name": INPUT_NAME[kind], "datatype": BYTES, "shape": [-1]}]
    else:
        # N items in one request where every input is declared [1, ...] (request_items): the first is -1
        batched = bool(model_inputs) and all(list(s["shape"])[:1] == [1] for s in model_inputs)
        inputs = [{"name": s["name"], "datatype": _datatype_name(s["dtype"]),
                   "shape": ([-1] if batched else []) + [int(d) if _positive_int(d) else -1
                                                         for d in list(s["shape"])[1 if batched else 0:]]}
                  for s in model_inputs]
    return inputs, served.metadata()


def _datatype_name(dtype: Any) -> str:
    dt = np.dtype(dtype)
    for name, d in DATATYPES.items():
        if np.dtype(d) == dt:
            return name
    return BYTES
