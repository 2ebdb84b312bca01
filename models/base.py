"""The task contract shared by every task.

Classification results carry the class *index*, not only its label text:
labels files repeat names (ImageNet's has ``crane`` twice), so a label is not
a key. ``rank_classes`` returns the prediction's label and ``class_id``, the
ordered top-k as ``[{"index", "label", "score"}]`` and the ``scores`` dict,
whose key is the label itself for a unique label and ``"label#index"`` for
every label the file repeats (both entries kept). ``scores`` is a
:class:`Scores` (a ``dict``) that also carries ``class_id`` and ``top_k``, so
code that only passes ``scores`` along keeps the indices.
"""

from __future__ import annotations

import array
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError, InputError

log = logging.getLogger("edge_runtime")


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


class TaskMismatch(ValueError):
    """A model's inputs or outputs do not fit the task (``check_io``); ``part`` says which side
    ("inputs" or "outputs"), the message what they look like and the task that fits."""

    def __init__(self, message: str, part: str = "outputs"):
        super().__init__(message)
        self.part = part


def preprocess_error(message: str):
    """A ``--preprocess`` key or value the task cannot use (the caller's)."""
    raise InputError(message, code=ec.CONVERT_PREPROCESS_INVALID)


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class Task:
    """The task contract: what a task declares and does, each member with its default.

    A task is one module with one :class:`Task` subclass, registered under its
    ``name`` (``models/__init__.py``: built-ins, and the ``edge_runtime.tasks``
    entry-point group). Everything else derives from these declarations: the
    manifest validation (``manifest_sections``, ``manifest_files``), the CLI
    (``input_kind``, ``score_field``), the converters (``sequence_buckets``,
    ``default_buckets``, ``recipe_family``, ``needs_tokenizer``,
    ``needs_preprocess``, ``takes_labels``, ``preprocess_keys`` +
    ``check_preprocess``, ``check_sample_path``, ``load_samples``,
    ``build_sections``), import (``importable``, ``import_options``,
    ``check_io``, ``import_sections``), parity (``parity_metric``,
    ``parity_best``, ``compare``) and metrics (``length_unit``).

    An instance is the contract over one artifact variant: ``manifest`` is the
    artifact manifest, ``read_file(rel) -> bytes`` reads a verified artifact
    file, ``buckets`` are the chosen variant's buckets. ``prepare`` turns one raw
    input into feeds (every bad input an ``InputError``, before any device
    work); ``finish`` turns the outputs into a :class:`TaskOutput`.
    """

    # -- identity and parity -------------------------------------------------
    name: str = ""                         # the manifest's "task" and the registry key
    parity_metric: str = ""                # what compare() reports ("top1_agreement", "cosine_mean", ...)
    parity_best: float = 1.0               # compare()'s value for identical outputs

    # -- raw inputs ----------------------------------------------------------
    input_kind: str = "tensors"            # "text" | "image" | "tensors": the raw input prepare() takes (CLI flags)
    score_field: str = "inputs"            # the record field `edge-infer score` reads by default
    length_unit: str = "units"             # unit of Prepared.length (the input-length histogram)

    call_options: tuple[str, ...] = ()     # per-call settings infer(options=...) takes (check_call_options)

    # -- convert -------------------------------------------------------------
    sequence_buckets: bool = False         # buckets are sequence lengths (--buckets); else one static shape
    default_buckets: tuple[int, ...] = ()  # the sequence lengths used without --buckets
    recipe_family: str = "cnn"             # the quantization recipes' model family: "cnn" or "transformer"
    needs_tokenizer: bool = False          # convert refuses it without --tokenizer
    needs_preprocess: bool = False         # convert refuses it without --preprocess
    takes_labels: bool = False             # --labels allowed (convert and import)
    takes_postprocess: bool = False        # --postprocess/--family allowed (convert): build_sections reads them
    preprocess_keys: tuple[str, ...] = ()  # the --preprocess keys it reads (check_preprocess types them)

    # -- the manifest --------------------------------------------------------
    # the keys it needs at load, per section, with their JSON types ({"preprocess": {"tokenizer": str}})
    manifest_sections: dict = {}
    manifest_files: tuple[str, ...] = ()   # preprocess/postprocess keys that name an artifact file

    # -- import (a quantized model wrapped as it is) -------------------------
    importable: bool = False               # import_sections() builds its sections
    import_options: tuple[str, ...] = ()   # the import pre-processing options it reads (scale, mean, ...)

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

    def check_call_options(self, options: dict, limits) -> dict:
        """``options`` (``infer(options=...)``) checked against ``call_options`` and ``limits``; what
        ``finish`` reads from ``prepared.meta["options"]``. Default: the task takes none."""
        raise InputError(f"task {self.name} takes no per-call options (got {', '.join(map(repr, options))})",
                         code=ec.INPUT_INVALID)

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
        """``{"metric": parity_metric, "value": float, "samples": int, ...}`` over pairs of outputs."""
        raise NotImplementedError

    def warmup_sample(self):
        """A raw input the runtime runs once at load, so the first real call
        does not pay for first-use code paths (decoders, tokenizer caches)."""
        return None

    @property
    def allows_nonfinite_outputs(self) -> bool:
        """Whether NaN/infinity in a float output is a legitimate result of this artifact. Default no:
        the runtime refuses such an output (``non_finite_output``) before ``finish`` sees it."""
        return False

    def bucket_samples(self, limits) -> list:
        """One raw input per bucket that ``prepare`` routes to that bucket (None where there is
        none): what the benchmark times each bucket with. Default: the warm-up sample each."""
        return [self.warmup_sample() for _ in self.buckets]

    # -- samples (convert: calibration and parity data) -----------------------
    @classmethod
    def load_samples(cls, path) -> list:
        """The raw inputs in a calibration / parity data file or folder."""
        raise InputError(f"task {cls.name or cls.__name__} has no sample loader: it cannot be converted "
                         f"(calibration and parity data need one)", code=ec.TASK_SAMPLES_UNSUPPORTED)

    @classmethod
    def check_sample_path(cls, path, what: str) -> None:
        """Refuse (``InputError`` ``convert_calibration_invalid``) a path ``load_samples`` cannot
        read, before it is called; ``what`` is the option ("--calibration")."""

    # -- --preprocess --------------------------------------------------------
    @classmethod
    def check_preprocess(cls, pre) -> None:
        """Refuse keys the task does not read and values it cannot use (``convert_preprocess_invalid``)."""
        if pre is None:
            return
        if not isinstance(pre, dict):
            preprocess_error(f"--preprocess must be a JSON object, got {type(pre).__name__}")
        allowed = tuple(cls.preprocess_keys)
        unknown = sorted(set(pre) - set(allowed))
        if unknown:
            preprocess_error(f"--preprocess: unknown key(s) {', '.join(map(repr, unknown))} for task {cls.name} "
                             f"(known: {', '.join(allowed) or 'none: the task takes no --preprocess'})")
        cls.check_preprocess_values(pre)

    @classmethod
    def check_preprocess_values(cls, pre: dict) -> None:
        """Type-check the known keys' values (``preprocess_error`` on a bad one)."""

    # -- the artifact's sections ------------------------------------------------
    @classmethod
    def build_sections(cls, request, writer, outputs: list[dict]) -> tuple[dict, dict]:
        """``(preprocess, postprocess)`` of an artifact converted from ``request`` (its
        ``tokenizer``, ``labels``, ``preprocess``, ``buckets``); files go into the artifact
        through ``writer.add_file(rel, src)``, which returns ``rel``. ``outputs`` are the
        source model's output specs. Default: the pre-processing given, no post-processing."""
        return {"kind": cls.input_kind, **(request.preprocess or {})}, {}

    @classmethod
    def check_io(cls, inputs: list[dict], outputs: list[dict], post: dict | None = None) -> dict:
        """The task's contract on a model's tensors, checked at import (and by the task at load):
        :class:`TaskMismatch` when they do not fit, else facts about them (``"classes"``: the
        class count, ``"output"``: the score output's spec, for a classifier). Default: any fit."""
        return {}

    @classmethod
    def import_sections(cls, model: dict, options: dict, warnings: list) -> tuple[dict, dict]:
        """``(preprocess, postprocess)`` of a model imported as it is (``model``: ``inputs``,
        ``outputs``, ``ops``; ``options``: the ``import_options`` given; warnings appended)."""
        raise InputError(f"import does not support task {cls.name!r}", code=ec.IMPORT_TASK_UNSUPPORTED)

    # -- helpers -----------------------------------------------------------
    @staticmethod
    def labels_section(request, writer, post: dict) -> dict:
        """``post`` with the labels file (``request.labels``) added into the artifact, when given."""
        if getattr(request, "labels", None):
            post["labels"] = writer.add_file("labels.txt", request.labels)
        return post

    def output_spec(self, name: str, bucket: int = 0) -> dict:
        for spec in self.buckets[bucket]["outputs"]:
            if spec["name"] == name:
                return spec
        raise ArtifactError(f"model has no output {name!r}", file="manifest.json", code=ec.MANIFEST_FIELD_INVALID)

    def read_labels(self) -> list[str] | None:
        """The labels file's non-empty lines; duplicates are kept (each is its own
        class index) and logged (info: import already warned)."""
        rel = self.post.get("labels")
        if not rel:
            return None
        text = self._read_file(rel).decode("utf-8", "replace")
        labels = [line.strip() for line in text.splitlines() if line.strip()]
        if not labels:
            raise ArtifactError("labels file is empty", file=rel, code=ec.ARTIFACT_FILE_INVALID)
        dup = duplicate_labels(labels)
        if dup:     # import warned and recorded it; at every load it is only logged (info), not printed
            log.info("%s: %s", rel, describe_duplicates(dup))
        return labels


def pick_output(outputs: list[dict], name: str | None, single: str) -> dict:
    """The output named ``name`` (``postprocess.output``), else the only one; ``TaskMismatch``
    otherwise (``single`` begins the message for a model with several outputs)."""
    if name is not None:
        chosen = [o for o in outputs if o.get("name") == name]
        if not chosen:
            raise TaskMismatch(f"the model has no output {name!r}")
        return chosen[0]
    if len(outputs) == 1:
        return outputs[0]
    raise TaskMismatch(f"{single}, this model has {len(outputs)}: "
                       + ", ".join(f"{o.get('name')!r} {o.get('shape')}" for o in outputs))


def dequantize(arr: np.ndarray, spec: dict) -> np.ndarray:
    q = spec.get("quantization")
    if q and arr.dtype.kind in "iu":
        return (arr.astype(np.float32) - float(q["zero_point"])) * float(q["scale"])
    return arr.astype(np.float32, copy=False)


def softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)         # a new array: the steps below work in place on it
    x -= x.max()
    np.exp(x, out=x)
    x /= x.sum()
    return x.astype(np.float32)


def duplicate_labels(labels: list[str]) -> dict[str, list[int]]:
    """``{label: [index, ...]}`` for every label that occurs more than once."""
    seen: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        seen.setdefault(label, []).append(i)
    return {label: idx for label, idx in seen.items() if len(idx) > 1}


def describe_duplicates(dup: dict[str, list[int]], offset: int = 0) -> str:
    shown = "; ".join(f"{label!r} at classes {', '.join(str(i + offset) for i in idx)}"
                      for label, idx in list(dup.items())[:5])
    more = f" and {len(dup) - 5} more" if len(dup) > 5 else ""
    return (f"{len(dup)} duplicate label(s): {shown}{more}; each class keeps its own entry "
            f"(scores keys 'label#index' for these)")


def score_keys(labels: list[str]) -> list[str]:
    """The ``scores`` key of each class: the label, or ``"label#index"`` when the label repeats."""
    dup = duplicate_labels(labels)
    if not dup:
        return list(labels)
    return [f"{label}#{i}" if label in dup else label for i, label in enumerate(labels)]


def top_indices(probs: np.ndarray, k: int | None) -> list[int]:
    """The indices of the ``k`` best scores, best first, ties by the lower index: exactly
    ``np.argsort(-probs, kind="stable")[:k].tolist()``, without sorting every class past 64 of
    them: for k <= 8, k ``argmax`` passes (each returns the first of equal maxima, so ties keep
    index order); for a larger k, a partition that keeps every score tied with the k-th, then a
    stable sort of those. Anything not a plain finite ranking (NaN, -inf) takes the full sort."""
    n = probs.shape[0]
    if n <= 64 and probs.dtype.kind == "f":
        # a few classes: Python's sort (stable, and stable under reverse=True too) on the
        # values, cheaper than four numpy calls; only for finite values (a NaN sum says not)
        values = probs.tolist()
        if math.isfinite(sum(values)):
            ranked = sorted(range(n), key=values.__getitem__, reverse=True)
            return ranked[:k] if k else ranked
    if not k or k >= n or n <= 64 or probs.dtype.kind != "f":
        order = np.argsort(-probs, kind="stable")
        return (order[:k] if k else order).tolist()
    if k <= 8:
        work = probs.copy()
        out = []
        for _ in range(k):
            i = int(work.argmax())
            if not work[i] > -np.inf:       # NaN or -inf reached: the sort defines their order
                return np.argsort(-probs, kind="stable")[:k].tolist()
            out.append(i)
            work[i] = -np.inf
        return out
    neg = -probs
    kth = neg[np.argpartition(neg, k - 1)[k - 1]]         # the k-th best score (negated)
    if kth != kth:
        return np.argsort(neg, kind="stable")[:k].tolist()
    cand = np.flatnonzero(neg <= kth)                     # ascending indices: ties stay in index order
    return cand[np.argsort(neg[cand], kind="stable")[:k]].tolist()


def rank_classes(probs: np.ndarray, labels: list[str], k: int | None, keys: list[str] | None = None):
    """``(label, class_id, scores, top_k)`` for a 1-D score vector, best first.

    ``keys`` are :func:`score_keys` of ``labels`` (pass them precomputed when
    ranking many times); ``scores`` is a :class:`Scores` carrying ``class_id``
    and ``top_k``. Only the top ``k`` are ranked and converted (:func:`top_indices`).
    """
    if keys is None:
        keys = score_keys(labels)
    order = top_indices(probs, k)
    values = probs[order].tolist()       # python floats, only for the k ranked
    if probs.dtype.kind != "f":
        values = [float(v) for v in values]
    top = [{"index": i, "label": labels[i], "score": v} for i, v in zip(order, values)]
    class_id = order[0]
    scores = Scores(zip([keys[i] for i in order], values), class_id=class_id, top_k=top)
    return labels[class_id], class_id, scores, top


def classify(vals: np.ndarray, labels: list[str], k: int | None, keys: list[str], apply_softmax: bool):
    """:func:`rank_classes` of ``softmax(vals)`` (or of ``vals``), a 1-D float32 vector. Up to 64
    classes, the softmax runs on Python floats in float64 and is rounded to float32, as
    :func:`softmax` does, without numpy's per-call cost (about half of it on 10 classes)."""
    n = vals.shape[0]
    if apply_softmax and 0 < n <= 64:
        values = vals.tolist()
        top = max(values)
        if math.isfinite(top) and math.isfinite(sum(values)):
            e = [math.exp(x - top) for x in values]
            total = sum(e)
            probs = array.array("f", [x / total for x in e]).tolist()      # float32, as softmax() returns
            order = sorted(range(n), key=probs.__getitem__, reverse=True)  # stable: ties by the lower index
            if k:
                order = order[:k]
            ranked = [probs[i] for i in order]
            class_id = order[0]
            top_k = [{"index": i, "label": labels[i], "score": v} for i, v in zip(order, ranked)]
            scores = Scores(zip([keys[i] for i in order], ranked), class_id=class_id, top_k=top_k)
            return labels[class_id], class_id, scores, top_k
    return rank_classes(softmax(vals) if apply_softmax else vals, labels, k, keys)


def top_k_scores(probs: np.ndarray, labels: list[str], k: int | None) -> tuple[str, dict[str, float]]:
    """``(label, scores)``; ``scores`` is a :class:`Scores` (see :func:`rank_classes`)."""
    label, _, scores, _ = rank_classes(probs, labels, k)
    return label, scores


def _class_of(out: TaskOutput):
    return out.class_id if out.class_id is not None else out.prediction


def classification_parity(reference: list[TaskOutput], candidate: list[TaskOutput]) -> dict:
    """Top-1 agreement by class index (label text where a result has no index:
    duplicated labels must not make two classes agree)."""
    agree = [_class_of(r) == _class_of(c) for r, c in zip(reference, candidate)]
    diffs = []
    for r, c in zip(reference, candidate):
        rs, cs = _scores_by_class(r), _scores_by_class(c)
        keys = set(rs) & set(cs)
        diffs.append(max((abs(rs[k] - cs[k]) for k in keys), default=0.0))
    return {
        "metric": "top1_agreement",
        "value": float(np.mean(agree)) if agree else None,
        "samples": len(agree),
        "max_score_diff": float(max(diffs)) if diffs else None,
    }


def _scores_by_class(out: TaskOutput) -> dict:
    if out.top_k:
        return {t["index"]: t["score"] for t in out.top_k}
    return dict(out.scores)


def reject_type(raw, expected: str):
    raise InputError(f"expected {expected}, got {type(raw).__name__}", code=ec.INPUT_WRONG_TYPE)
