"""What ``edge-infer convert`` is asked for, and the checks and lookups made on
the request before anything is built: the request itself, its validation,
recipe names per target, which targets this host can build, the calibration
fingerprint, the sample-count policy and the toolchain record."""

from __future__ import annotations

import hashlib
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from edge_runtime import __version__
from edge_runtime import error_codes as ec
from edge_runtime.errors import InputError

from .base import Converter
from .registry import converter_targets, get_converter, unknown_target


class _PreprocessKeys(Mapping):
    """task -> the ``--preprocess`` keys it reads: a read-only view of each task's
    ``preprocess_keys`` (models/), for code that looked them up here."""

    def __getitem__(self, task: str) -> tuple[str, ...]:
        from edge_runtime.models import UnknownTask, get_task

        try:
            return tuple(get_task(task).preprocess_keys)
        except UnknownTask:
            raise KeyError(task) from None

    def __iter__(self):
        from edge_runtime.models import task_names

        return iter(task_names())

    def __len__(self) -> int:
        from edge_runtime.models import task_names

        return len(task_names())


PREPROCESS_KEYS: Mapping[str, tuple[str, ...]] = _PreprocessKeys()

# Sample counts: under the minimum a convert is refused (unless allow_few_samples),
# under the warning level it warns. The zoo meets them: digits-cnn 200 calibration
# images / 360 held-out; MiniLM's calibration.txt split 3:1 (300 calibration after
# the cap, 129 held out) or SST-2's 872 dev sentences for parity.
MIN_CALIBRATION_SAMPLES = 16
MIN_PARITY_SAMPLES = 8
WARN_CALIBRATION_SAMPLES = 100
WARN_PARITY_SAMPLES = 32


@dataclass
class ConvertRequest:
    source: Path
    out: Path
    task: str
    targets: list[str]
    calibration: Path
    labels: Path | None = None
    tokenizer: Path | None = None
    buckets: list[int] | None = None      # tasks with sequence buckets only (None: the task's default_buckets)
    min_parity: float | None = None
    parity_data: Path | None = None
    preprocess: dict | None = None
    postprocess: dict | None = None       # tasks that decode outputs (object-detection: family, thresholds)
    name: str | None = None
    version: str = "1"
    recipe: str | None = None
    recipe_overrides: dict | None = None
    input_shapes: dict | None = None
    heldout_fraction: float = 0.25
    max_calibration: int = 300
    seed: int = 0
    force: bool = False
    limits: dict = field(default_factory=dict)
    torch_source: Path | None = None   # a PyTorch twin of source (TorchScript or torch.export .pt2), for
                                       # targets that convert from torch (coreml)
    min_calibration_samples: int = MIN_CALIBRATION_SAMPLES
    min_parity_samples: int = MIN_PARITY_SAMPLES
    allow_few_samples: bool = False    # under the minimums: warn and go on instead of refusing
    allow_skip: bool = False           # a target whose toolchain is missing: skip it (and build its fallback)
                                       # instead of refusing; the CLI passes False unless --allow-skip
    probe_samples: int = 32            # held-out inputs kept in the artifact with their fp32 results
                                       # (edge_runtime.probe: verify / tune on the target); 0 keeps none
    probe_max_bytes: int = 4 * 1024 * 1024   # the probe set's cap in bytes (fewer samples when they are big)


def _sample_bytes(s) -> bytes:
    if isinstance(s, str):
        return s.encode("utf-8")
    if isinstance(s, dict):   # named arrays (tensors): names, dtypes and shapes count too
        import numpy as np

        parts = []
        for k in sorted(s, key=str):
            a = np.ascontiguousarray(s[k])
            parts.append(f"{k}:{a.dtype.str}:{list(a.shape)}".encode("utf-8") + b"\x01" + a.tobytes())
        return b"\x02".join(parts)
    if hasattr(s, "dtype") and hasattr(s, "shape") and hasattr(s, "tobytes"):   # an array: its dtype and shape count
        import numpy as np

        a = np.ascontiguousarray(s)
        return f"{a.dtype.str}:{list(a.shape)}".encode("utf-8") + b"\x01" + a.tobytes()
    return s.tobytes() if hasattr(s, "tobytes") else bytes(s)


def fingerprint(samples) -> str:
    """The calibration samples' identity (the manifest's ``calibration.fingerprint``): each sample's
    bytes after its length, so no two sample lists share one (["a\\x00", "b"] and ["a", "\\x00b"]
    did, and an 8x8 image array the same 64 bytes as a 64-wide row)."""
    h = hashlib.sha256()
    for s in samples:
        b = _sample_bytes(s)
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def _bad(msg: str, code: str = ec.CONVERT_REQUEST_INVALID):
    raise InputError(msg, code=code)


def task_of(req: ConvertRequest):
    """The request's task contract; an unknown task is the caller's (``convert_task_unknown``)."""
    from edge_runtime.models import UnknownTask, get_task

    try:
        return get_task(req.task)
    except UnknownTask as exc:
        _bad(exc.message, ec.CONVERT_TASK_UNKNOWN)


def check_request(req: ConvertRequest) -> None:
    task = task_of(req)
    if not Path(req.source).is_file():
        raise InputError(f"source model {req.source} does not exist", code=ec.CONVERT_SOURCE_MISSING)
    if not Path(req.calibration).exists():
        raise InputError(f"calibration data {req.calibration} does not exist", code=ec.CONVERT_CALIBRATION_MISSING)
    task.check_sample_path(req.calibration, "--calibration")
    if req.parity_data is not None:
        if not Path(req.parity_data).exists():
            raise InputError(f"parity data {req.parity_data} does not exist", code=ec.CONVERT_CALIBRATION_MISSING)
        task.check_sample_path(req.parity_data, "--parity-data")
    if task.needs_tokenizer and not req.tokenizer:
        raise InputError(f"task {req.task} needs --tokenizer", code=ec.CONVERT_TOKENIZER_MISSING)
    fills = fills_preprocess(task)
    if task.needs_preprocess and not req.preprocess and not fills:
        raise InputError(f"{req.task} needs --preprocess ({', '.join(task.preprocess_keys)})",
                         code=ec.CONVERT_PREPROCESS_MISSING)
    if req.postprocess and not task.takes_postprocess:
        raise InputError(f"--postprocess/--family: task {req.task} takes no post-processing settings",
                         code=ec.CONVERT_REQUEST_INVALID)
    if req.labels and not task.takes_labels:
        raise InputError(f"--labels: task {req.task} takes no labels (drop --labels)", code=ec.CONVERT_LABELS_UNUSED)
    out = Path(req.out)
    if out.exists() and not out.is_dir():
        raise InputError(f"output {out} exists and is not a directory", code=ec.CONVERT_OUT_EXISTS)
    if out.exists() and any(out.iterdir()) and not req.force:
        raise InputError(f"output directory {out} exists and is not empty (use --force)", code=ec.CONVERT_OUT_EXISTS)
    if not req.targets:
        raise InputError("no --target given", code=ec.CONVERT_NO_TARGET)
    known = converter_targets()
    for t in req.targets:
        if t not in known:
            raise unknown_target(t, known)
    if req.torch_source is not None and not Path(req.torch_source).is_file():
        raise InputError(f"torch source {req.torch_source} does not exist", code=ec.CONVERT_SOURCE_MISSING)
    check_options(req)
    pre = req.preprocess
    if fills and isinstance(pre, dict) and "size" not in pre:
        pre = {**pre, "size": [1, 1]}     # the size is the source input's (filled in later): the stated keys are checked
    task.check_preprocess(pre)


def fills_preprocess(task) -> bool:
    """An object detector's --preprocess is optional: its family's usual input, the one import and
    the runtime take, fills in what it leaves out (``convert_inputs.detector_preprocess``)."""
    from edge_runtime.models.object_detection import ObjectDetection

    return isinstance(task, type) and issubclass(task, ObjectDetection)


def check_options(req: ConvertRequest) -> None:
    if req.min_parity is not None:
        mp = req.min_parity
        if isinstance(mp, bool) or not isinstance(mp, (int, float)) or not (0.0 < float(mp) <= 1.0):
            _bad(f"--min-parity must be in (0, 1] (top-1 agreement or mean cosine), got {mp!r}",
                 ec.CONVERT_MIN_PARITY_INVALID)
    if req.buckets is not None:
        if not task_of(req).sequence_buckets:
            _bad(f"--buckets are sequence lengths, for text tasks (tasks with sequence buckets); task {req.task} "
                 f"has one static shape (fix an input's dims with --input-shape NAME=D1,D2,... instead)",
                 ec.CONVERT_BUCKETS_INVALID)
        if not req.buckets or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in req.buckets):
            _bad(f"--buckets must be positive integers, got {req.buckets!r}", ec.CONVERT_BUCKETS_INVALID)
    for what, n, least in (("probe_samples", req.probe_samples, 0), ("probe_max_bytes", req.probe_max_bytes, 1)):
        if isinstance(n, bool) or not isinstance(n, int) or n < least:
            _bad(f"{what.replace('_', '-')} must be an integer >= {least}, got {n!r}", ec.CONVERT_REQUEST_INVALID)
    for what, n in (("min_calibration_samples", req.min_calibration_samples),
                    ("min_parity_samples", req.min_parity_samples)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            _bad(f"{what.replace('_', '-')} must be a positive integer, got {n!r}", ec.CONVERT_REQUEST_INVALID)


def check_data_path(task: str, path, what: str) -> None:
    """The kind of file or folder the task's ``load_samples`` takes, checked before it is called
    (``Task.check_sample_path``)."""
    from edge_runtime.models import get_task

    get_task(task).check_sample_path(path, what)


def check_preprocess(task: str, pre) -> None:
    """Refuse keys the task does not read and values it cannot use (``Task.check_preprocess``)."""
    from edge_runtime.models import get_task

    get_task(task).check_preprocess(pre)


def sample_policy(req: ConvertRequest, n_calib: int, n_held: int, progress) -> dict:
    """Refuse (or, with allow_few_samples, warn) under the minimums; warn under the warning levels.
    Returns the record kept in the manifest: per side the count, minimum, warning level, any warning
    and ``allow_few_samples`` where the override let a count under the minimum through."""
    rows = {"calibration": (n_calib, req.min_calibration_samples, WARN_CALIBRATION_SAMPLES),
            "parity": (n_held, req.min_parity_samples, WARN_PARITY_SAMPLES)}
    record, refused = {}, []
    for side, (n, minimum, warn) in rows.items():
        rec: dict[str, object] = {"samples": n, "min_samples": minimum, "warn_below": warn}
        what = "calibration samples" if side == "calibration" else "held-out parity samples"
        if n < minimum:
            if not req.allow_few_samples:
                refused.append(f"{n} {what}, under the minimum of {minimum}")
                continue
            rec["warning"] = f"only {n} {what}, under the minimum of {minimum} (allowed by --allow-few-samples)"
            rec["allow_few_samples"] = True
        elif n < warn:
            rec["warning"] = f"only {n} {what} (fewer than {warn}): the figure is a rough one"
        if "warning" in rec:
            progress(f"warning: {rec['warning']}")
        record[side] = rec
    if refused:
        raise InputError("too few samples: " + "; ".join(refused) + ". Give more (--calibration; --parity-data "
                         "for a separate held-out set), lower --min-calibration-samples / --min-parity-samples, "
                         "or pass --allow-few-samples", code=ec.CONVERT_TOO_FEW_SAMPLES)
    return record


def available_targets(requested: list[str], progress, allow_skip: bool = False) -> tuple[list[str], list[dict]]:
    """Targets whose toolchain is here; one that is not is refused unless ``allow_skip``, in
    which case it is skipped with its reason and replaced by its fallback (edgetpu without
    edgetpu_compiler -> tflite-int8)."""
    targets, skipped = [], []
    for target in requested:
        converter = get_converter(target)
        why = converter.unavailable()
        if not why:
            if target not in targets:
                targets.append(target)
            continue
        fallback = converter.fallback_target
        if not allow_skip:
            cause = why.split(";")[0]   # the reason's first clause: what is missing (the rest says what skipping does)
            raise InputError(f"target {target} cannot be built here: {cause}. Install what it needs, or pass "
                             f"--allow-skip to " + (f"build {fallback} instead" if fallback else "leave it out")
                             + " (recorded in the manifest's skipped_targets)", code=ec.CONVERT_TARGET_UNAVAILABLE)
        progress(f"warning: {target}: skipped: {why}" + (f" (building {fallback} instead)" if fallback else ""))
        skipped.append({"target": target, "reason": why})
        if fallback and fallback not in targets and fallback not in requested:
            targets.append(fallback)
    if not targets:
        raise InputError("no requested target can be built here: " + "; ".join(
            f"{s['target']}: {s['reason']}" for s in skipped), code=ec.CONVERT_NO_TARGET)
    return targets, skipped


AUTO = "auto"   # --recipe auto: every target tries its auto_recipes, fastest first


def check_recipe(req: ConvertRequest) -> None:
    if not req.recipe or "=" in req.recipe or req.recipe == AUTO:
        return
    known = {t: tuple(get_converter(t).recipes) for t in req.targets}
    if not any(req.recipe in names for names in known.values()):
        raise InputError(f"no target knows recipe {req.recipe!r} ("
                         + "; ".join(f"{t}: {', '.join(n) or '?'}" for t, n in known.items()) + ")",
                         code=ec.CONVERT_RECIPE_INVALID)


def recipe_for(recipe: str | None, target: str, converter: Converter) -> str | None:
    """``--recipe`` is one name (for the targets that know it) or ``target=name,...``."""
    if not recipe:
        return None
    if "=" in recipe:
        table = {}
        for part in recipe.split(","):
            key, _, value = part.partition("=")
            if not key.strip() or not value.strip():
                raise InputError(f"--recipe {recipe!r}: expected target=recipe pairs", code=ec.CONVERT_RECIPE_INVALID)
            table[key.strip()] = value.strip()
        return table.get(target)
    known = tuple(converter.recipes)
    return recipe if (not known or recipe in known or recipe == AUTO) else None


def toolchain(converter: Converter) -> dict:
    import numpy

    tc = {"edge-runtime": __version__, "python": platform.python_version(), "numpy": numpy.__version__}
    tc.update(converter.toolchain())
    return tc


def data_name(path) -> str:
    """A data path as the parity record names it: its own name, also when given as ``.`` or ``..``
    (``Path(".").name`` is empty: the record said " (20 samples)", naming nothing)."""
    p = Path(path)
    return p.name if p.name not in ("", ".", "..") else (p.resolve().name or str(p.resolve()))
