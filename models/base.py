"""The task contract shared by every task.

This module holds the ``Task`` base class and the helpers task modules share
(``TaskMismatch``, ``pick_output``, ``dequantize``, ...), and is the import path
for the rest of the contract, which lives beside it: ``results`` (``Prepared``,
``TaskOutput``, ``Scores``, ``Outputs``) and ``classification`` (softmax, label
keys, ranking and top-1 parity).
"""

from __future__ import annotations

import logging
from typing import Callable

import numpy as np

from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError, InputError

from .classification import (classification_parity, classify, describe_duplicates, duplicate_labels, rank_classes,
                             score_keys, softmax, top_indices, top_k_scores)
from .results import Outputs, Prepared, Scores, TaskOutput

__all__ = ["Outputs", "Prepared", "Scores", "Task", "TaskMismatch", "TaskOutput", "classification_parity", "classify",
           "dequantize", "describe_duplicates", "duplicate_labels", "is_number", "pick_output", "preprocess_error",
           "rank_classes", "reject_type", "score_keys", "softmax", "top_indices", "top_k_scores"]

log = logging.getLogger("edge_runtime")


class TaskMismatch(ValueError):
    """A model's inputs or outputs do not fit the task (``check_io``); ``part`` says which side
    ("inputs" or "outputs"), the message what they look like and the task that fits."""

    def __init__(self, message: str, part: str = "outputs"):
        super().__init__(message)
        self.part = part


def preprocess_error(message: str):
    """A ``--preprocess`` key or value the task cannot use (the caller's)."""
    raise InputError(message, code=ec.CONVERT_PREPROCESS_INVALID)


# a score this far past 0..1 is a quantised model's overshoot (a uint8 step is 1/256: clipped); further, the
# model answers logits, not probabilities (a detector's or a pose model's head without its sigmoid: refused)
SCORE_SLACK = 0.01


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
    labels_inner_blanks: tuple[int, ...] | list[int] = ()   # read_labels: blank lines between names (1-based)

    # -- raw inputs ----------------------------------------------------------
    input_kind: str = "tensors"            # "text" | "image" | "tensors": the raw input prepare() takes (CLI flags)
    score_field: str = "inputs"            # the record field `edge-infer score` reads by default
    length_unit: str = "units"             # unit of Prepared.length (the input-length histogram)

    call_options: tuple[str, ...] = ()     # per-call settings infer(options=...) takes (check_call_options)
    # limits of this task's kind over DEFAULT_LIMITS, under the manifest's and the caller's
    # (image tasks: a request may be a camera frame or a photo, edge_runtime.limits.IMAGE_LIMITS)
    default_limits: dict = {}

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

    def prepare_batch(self, raws: list, limits) -> list:
        """``prepare`` of each input: a ``Prepared`` or the exception it raised, in order (the batch
        path, ``infer_batch``). A task may do the batch at once (text: one tokenizer call)."""
        out: list = []
        for raw in raws:
            try:
                out.append(self.prepare(raw, limits))
            except Exception as exc:
                out.append(exc)
        return out

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
        if isinstance(raw, (bytes, bytearray)):
            return len(raw)
        if isinstance(raw, memoryview):     # its len() counts the first dimension's items, not bytes
            return raw.nbytes
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

    def joined_sample(self, a, b):
        """One raw input made of the samples ``a`` and ``b`` (longer than either), so the probe set
        can reach a bucket no single held-out sample does; None where the task cannot join inputs."""
        return None

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
        try:        # strict, as inspect reads it: a byte of another encoding was served as "z\ufffdro" before
            text = self._read_file(rel).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ArtifactError(f"labels file is not UTF-8 text ({exc}): save it as UTF-8", file=rel,
                                code=ec.ARTIFACT_FILE_INVALID) from None
        lines = [line.strip() for line in text.splitlines()]
        labels = [line for line in lines if line]
        if not labels:
            raise ArtifactError("labels file is empty", file=rel, code=ec.ARTIFACT_FILE_INVALID)
        # blank lines between names: a stray newline, or an unused class id? A task that knows its class
        # count tells them apart by the count; one that does not (an in-graph postprocess) must refuse
        last = max(i for i, line in enumerate(lines) if line)
        self.labels_inner_blanks = [i + 1 for i, line in enumerate(lines[:last]) if not line]
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


def reject_type(raw, expected: str):
    raise InputError(f"expected {expected}, got {type(raw).__name__}", code=ec.INPUT_WRONG_TYPE)
