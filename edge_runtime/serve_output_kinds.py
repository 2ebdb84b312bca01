"""The outputs of ``edge-infer serve``, kind by kind: each output's record (:class:`Output`: name,
datatype, metadata shape) and how it is built from a request's results, for classifiers,
embeddings, detectors, pose models, segmenters and tensors models. Which kind a model is, and the
sizes its metadata states, are ``serve_outputs``'s; ``serve_tensors`` re-exports both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import error_codes as ec
from . import serve_json
from .errors import InferenceRuntimeError
from .serve_output_params import classes_to_send, classification_tensor
from .serve_types import BYTES, DATATYPES, ServeError, Tensor, bytes_elements, datatype_of

_BIG = ("embedding", "outputs", "raw_outputs")
MASK_PAD = 255       # the class id of the padding of a mask smaller than its request's largest (VOC's "void")


def bad(message: str) -> ServeError:
    return ServeError("bad_request", message, ec.SERVE_REQUEST_MALFORMED)


def internal(message: str) -> ServeError:
    return ServeError("internal", message, ec.UNEXPECTED)


def positive_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and bool(v > 0)


def datatype_name(dtype: Any) -> str:
    dt = np.dtype(dtype)
    for name, d in DATATYPES.items():
        if np.dtype(d) == dt:
            return name
    return BYTES


def _item_json(res: Any) -> bytes:
    d = res.to_dict()
    for k in _BIG:
        d.pop(k, None)
    return serve_json.dumps(d, default=str)


def _bytes_tensor(name: str, values: list[bytes]) -> Tensor:
    return Tensor(name, BYTES, [len(values)], values)


_BY_DTYPE = {np.dtype(v): k for k, v in DATATYPES.items()}


def _array_tensor(name: str, arr: np.ndarray) -> Tensor:
    arr = np.ascontiguousarray(arr)
    datatype = _BY_DTYPE.get(arr.dtype) or datatype_of(arr)
    if datatype == BYTES:         # a model's text output: a flat list of bytes, as every BYTES tensor's data
        try:
            return Tensor(name, BYTES, list(arr.shape), bytes_elements(arr))
        except TypeError as exc:
            raise internal(f"output {name!r}: {exc}") from None
    return Tensor(name, datatype, list(arr.shape), arr)


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
    """The outputs of one served model, in metadata order, from its task (``serve_outputs.served_outputs``)."""

    def __init__(self, outputs: list[Output], ranked: int | None = None, classes: int = -1):
        self.outputs = outputs
        self.by_name = {o.name: o for o in outputs}
        self.defaults = [o for o in outputs if o.default]
        self.ranked = ranked        # a classifier's top-k length (-1: not stated); None: not a classifier
        self.classes = classes      # a classifier's number of classes (-1: not stated)

    def metadata(self) -> list[dict]:
        return [o.meta() for o in self.outputs]

    def build(self, results: list, requested: list[str] | None,
              classification: dict[str, int] | None = None) -> list[Tensor]:
        """The response tensors: those ``requested`` (or the defaults), each output named in
        ``classification`` answered as the classification extension's top classes."""
        if requested is None:
            return [o.make(results) for o in self.defaults]
        unknown = [n for n in requested if n not in self.by_name]
        if unknown:
            raise bad(f"unknown output(s) {', '.join(map(repr, unknown))}; this model has "
                      f"{', '.join(self.by_name)}")
        classification = classification or {}
        return [self._classified(n, results, classification[n]) if classification.get(n)
                else self.by_name[n].make(results) for n in requested]

    def check_classification(self, classification: dict[str, int]) -> None:
        """Refuse, before any model work, a classification its model cannot answer (not a classifier,
        ``result``, more classes than it ranks); an unknown output is refused with the others."""
        for name, count in classification.items():
            if name in self.by_name:
                self._classifier_output(name)
                if self.ranked is not None and self.ranked >= 0:
                    classes_to_send(name, count, self.ranked, self.classes)

    def _classifier_output(self, name: str) -> int:
        if self.ranked is None or name == "result":
            raise bad(f"output {name!r}: classification applies to a classifier's outputs"
                      + ("" if self.ranked is None else " (label, class_id, score, top_k_*), not 'result'"))
        return self.ranked

    def _classified(self, name: str, results: list, count: int) -> Tensor:
        return classification_tensor(name, results, count, self._classifier_output(name), self.classes)


def result_output(default: bool) -> Output:
    """``result``: one JSON document per item, the result's ``to_dict()`` without its arrays."""
    return Output("result", BYTES, (-1,), lambda rs: _bytes_tensor("result", [_item_json(r) for r in rs]), default)


def classifier_outputs(k: int) -> list[Output]:
    """label, class_id, score, top_k_class_ids, top_k_scores; ``result`` by name. A classifier's few
    scalars go out as flat Python lists (``numeric_bytes`` packs them), not numpy arrays: five small
    arrays built from lists, then serialised, were ~15 µs of a digits request."""
    def label(rs: list) -> Tensor:
        return _bytes_tensor("label", [str(r.prediction).encode("utf-8") for r in rs])

    def class_id(rs: list) -> Tensor:
        if any(r.class_id is None for r in rs):
            raise internal("a classifier result has no class_id")
        return Tensor("class_id", "INT64", [len(rs)], [int(r.class_id) for r in rs])

    def score(rs: list) -> Tensor:
        if not all(r.top_k for r in rs):
            raise internal("a classifier result has no top_k: no score")
        return Tensor("score", "FP32", [len(rs)], [float(r.top_k[0]["score"]) for r in rs])

    def top_len(rs: list) -> int:
        ks = {len(r.top_k or ()) for r in rs}
        if len(ks) != 1 or (k >= 0 and k not in ks):
            raise internal(f"the classifier's results hold top-k lists of {sorted(ks)} entries, "
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
            Output("top_k_scores", "FP32", (-1, k), top_scores), result_output(default=False)]


def embedding_outputs(d: int) -> list[Output]:
    def embedding(rs: list) -> Tensor:
        vecs = [np.asarray(r.embedding, dtype=np.float32).reshape(-1) for r in rs]
        if len({v.shape for v in vecs}) != 1 or (d >= 0 and vecs[0].shape[0] != d):
            raise internal(f"the embeddings are {sorted({v.shape[0] for v in vecs})} wide, not the "
                           f"{d if d >= 0 else 'one width'} the metadata states")
        return _array_tensor("embedding", np.stack(vecs))

    return [Output("embedding", "FP32", (-1, d), embedding), result_output(default=False)]


def detection_outputs() -> list[Output]:
    """num_detections and ``result`` (the boxes: a list per item, its length varies), both sent by
    default, for an image with boxes or without."""
    def num(rs: list) -> Tensor:
        return Tensor("num_detections", "INT64", [len(rs)], [len(r.detections or ()) for r in rs])

    return [Output("num_detections", "INT64", (-1,), num), result_output(default=True)]


KEYPOINT_FIELDS = ("x", "y", "score")      # the last axis of ``keypoints``, as the result's keypoints hold them


def pose_outputs(k: int) -> list[Output]:
    """keypoints FP32 ``[N, K, 3]``: per keypoint, in the result's order (COCO's 17 for MoveNet), its
    x, y (pixels of the original image) and score, exactly the result's ``keypoints`` (as float32);
    image_size INT32 ``[N, 2]`` (each image's height and width); ``result`` (with the keypoints'
    names and the pose score) by name."""
    def keypoints(rs: list) -> Tensor:
        rows = []
        for r in rs:
            if r.keypoints is None:
                raise internal("a pose result has no keypoints")
            rows.append([[p[f] for f in KEYPOINT_FIELDS] for p in r.keypoints])
        counts = {len(row) for row in rows}
        if len(counts) != 1 or (k >= 0 and k not in counts):
            raise internal(f"the pose results hold {sorted(counts)} keypoints, not the "
                           f"{k if k >= 0 else 'one count'} the metadata states")
        return _array_tensor("keypoints", np.asarray(rows, dtype=np.float32).reshape(len(rs), counts.pop(), 3))

    def image_size(rs: list) -> Tensor:
        sizes = [np.asarray((r.outputs or {}).get("image_size", ()), dtype=np.int32).reshape(-1) for r in rs]
        if any(s.shape != (2,) for s in sizes):
            raise internal("a pose result has no image_size [height, width]")
        return _array_tensor("image_size", np.stack(sizes))

    return [Output("keypoints", "FP32", (-1, k, 3), keypoints), Output("image_size", "INT32", (-1, 2), image_size),
            result_output(default=False)]


def segmentation_outputs(max_pixels: int | None) -> list[Output]:
    """mask UINT8 ``[N, H, W]`` and mask_size INT32 ``[N, 2]`` (each item's height and width). Masks
    are at their images' sizes: where a request's images differ in size, each mask is padded at the
    bottom and right with ``MASK_PAD`` to the largest height and width (``mask[i, :h, :w]`` is item
    i's), unless that box is over the image pixel limit (a 400: send those images one at a time)."""
    def masks(rs: list) -> list[np.ndarray]:
        out = [np.asarray((r.outputs or {}).get("mask")) for r in rs]
        if any(m.ndim != 2 for m in out):
            raise internal("a segmentation result has no [H, W] mask")
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
            result_output(default=False)]


def tensors_outputs(declared: list[tuple[str, str, list]]) -> list[Output]:
    """Each model output by name, the items along the first axis: an output declared ``[1, ...]``
    (or with a first dimension of any size) is concatenated along it, ``[N, ...]``; any other
    (``[]``, ``[K, ...]``) is stacked on a new first axis, ``[N, K, ...]``, one item or many."""
    outs = []
    for name, datatype, shape in declared:
        along = bool(shape) and shape[0] in (1, -1)
        meta = (-1, *shape[1:]) if along else (-1, *shape)
        outs.append(Output(name, datatype, tuple(meta), _tensor_maker(name, along, datatype)))
    return outs + [result_output(default=False)]


def _as_declared(name: str, arr: np.ndarray, datatype: str | None) -> np.ndarray:
    """An output in the datatype its metadata states, whatever width the device returned: the answer's
    datatype is always the metadata's. A narrower one that holds every value (Core ML's float16 for
    FP32, int32 for INT64) is cast up; a wider float (float64 for FP32, float32 for FP16) is rounded to
    the declared float, as the manifest promises, unless a finite value is out of its range; a wider
    integer (int64 for INT32), a float for an integer or an integer for a float only where every value
    fits exactly. Anything else is an ``InferenceRuntimeError`` (500, ``inference_failed``) naming the
    output and both datatypes: never a wrapped, truncated or infinite value, nor a datatype the metadata
    does not state. A non-numeric output, or one declared BYTES, goes as it is."""
    want_type = DATATYPES.get(datatype or "")
    if want_type is None or arr.dtype.kind not in "biuf":
        return arr
    want = np.dtype(want_type)
    if arr.dtype == want:
        return arr
    if np.can_cast(arr.dtype, want, "safe"):
        return arr.astype(want)
    with np.errstate(over="ignore", invalid="ignore"):
        out = arr.astype(want)
    if arr.size and not _fits(arr, out, want):
        raise InferenceRuntimeError(
            f"output {name!r}: the device returned {arr.dtype} values (from {arr.min()!r} to {arr.max()!r}) that "
            f"the model's declared {datatype} cannot hold exactly; not sent changed", code=ec.INFERENCE_FAILED,
            output=name, declared=datatype, returned=str(arr.dtype))
    return out


def _fits(arr: np.ndarray, out: np.ndarray, want: np.dtype) -> bool:
    """Whether ``out`` (``arr`` cast to ``want``, a narrower or other kind) is ``arr``'s values: a float
    rounded to a narrower float counts, an overflow to infinity does not."""
    src = arr.dtype.kind
    if want.kind == "b":
        return bool(np.isin(arr, (0, 1)).all())
    if want.kind == "f":
        if src == "f":
            return bool(np.array_equal(np.isinf(out), np.isinf(arr)))
        bound = 2 ** (np.finfo(want).nmant + 1)       # every integer within it is exact in ``want``
        return -bound <= int(arr.min()) and int(arr.max()) <= bound
    info = np.iinfo(want)
    if src == "f":
        if not (np.isfinite(arr).all() and (arr == np.floor(arr)).all()):
            return False
        return float(info.min) <= float(arr.min()) and float(arr.max()) < float(info.max) + 1
    return info.min <= int(arr.min()) and int(arr.max()) <= info.max


def _tensor_maker(name: str, along: bool, datatype: str | None = None) -> Callable[[list], Tensor]:
    def make(rs: list) -> Tensor:
        arrays = []
        for r in rs:
            if name not in (r.outputs or {}):
                raise internal(f"a result has no output {name!r}")
            arrays.append(_as_declared(name, np.asarray(r.outputs[name]), datatype))
        if len({a.shape for a in arrays}) != 1:
            raise bad(f"output {name!r} has a different shape for each item "
                      f"({', '.join(str(list(a.shape)) for a in arrays)}): send the items in separate requests")
        if along and arrays[0].ndim >= 1:
            return _array_tensor(name, arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0))
        return _array_tensor(name, np.stack(arrays))
    return make
