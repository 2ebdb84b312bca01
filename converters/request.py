"""What ``edge-infer convert`` is asked for, and the checks and lookups made on
the request before anything is built: the request itself, its validation,
recipe names per target, which targets this host can build, the calibration
fingerprint, the sample-count policy and the toolchain record."""

from __future__ import annotations

import hashlib
import platform
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from edge_runtime import __version__
from edge_runtime.errors import InputError

from .base import Converter
from .registry import converter_targets, get_converter, unknown_target

TEXT_TASKS = ("text-classification", "text-embedding")

# --preprocess keys each task reads (models/image.py ``to_tensor`` and
# ImageClassification; models/tensors.py). The one place to extend when a task
# learns a new key; ``check_preprocess`` type-checks the ones it knows.
PREPROCESS_KEYS: dict[str, tuple[str, ...]] = {
    "image-classification": ("size", "channels", "scale", "mean", "std", "layout", "resize", "input"),
    "tensors": ("allow_nonfinite",),
}
LAYOUTS = ("NCHW", "NHWC")
_RESIZE_FALLBACK = ("bilinear", "nearest", "bicubic", "lanczos", "box", "bilinear-half-pixel")

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
    buckets: list[int] | None = None      # text tasks only (None: 64, 128)
    min_parity: float | None = None
    parity_data: Path | None = None
    preprocess: dict | None = None
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
    return s.tobytes() if hasattr(s, "tobytes") else bytes(s)


def fingerprint(samples) -> str:
    h = hashlib.sha256()
    for s in samples:
        h.update(_sample_bytes(s))
        h.update(b"\x00")
    return h.hexdigest()


def _bad(msg: str, code: str = "convert_request_invalid"):
    raise InputError(msg, code=code)


def check_request(req: ConvertRequest) -> None:
    from edge_runtime.models import task_names

    if req.task not in task_names():
        _bad(f"unknown task {req.task!r} (known: {', '.join(task_names())})", "convert_task_unknown")
    if not Path(req.source).is_file():
        raise InputError(f"source model {req.source} does not exist", code="convert_source_missing")
    if not Path(req.calibration).exists():
        raise InputError(f"calibration data {req.calibration} does not exist", code="convert_calibration_missing")
    check_data_path(req.task, req.calibration, "--calibration")
    if req.parity_data is not None:
        if not Path(req.parity_data).exists():
            raise InputError(f"parity data {req.parity_data} does not exist", code="convert_calibration_missing")
        check_data_path(req.task, req.parity_data, "--parity-data")
    if req.task in TEXT_TASKS and not req.tokenizer:
        raise InputError(f"task {req.task} needs --tokenizer", code="convert_tokenizer_missing")
    if req.task == "image-classification" and not req.preprocess:
        raise InputError("image-classification needs --preprocess (size, channels, mean, std, layout)",
                         code="convert_preprocess_missing")
    out = Path(req.out)
    if out.exists() and not out.is_dir():
        raise InputError(f"output {out} exists and is not a directory", code="convert_out_exists")
    if out.exists() and any(out.iterdir()) and not req.force:
        raise InputError(f"output directory {out} exists and is not empty (use --force)", code="convert_out_exists")
    if not req.targets:
        raise InputError("no --target given", code="convert_no_target")
    known = converter_targets()
    for t in req.targets:
        if t not in known:
            raise unknown_target(t, known)
    if req.torch_source is not None and not Path(req.torch_source).is_file():
        raise InputError(f"torch source {req.torch_source} does not exist", code="convert_source_missing")
    check_options(req)
    check_preprocess(req.task, req.preprocess)


def check_options(req: ConvertRequest) -> None:
    if req.min_parity is not None:
        mp = req.min_parity
        if isinstance(mp, bool) or not isinstance(mp, (int, float)) or not (0.0 < float(mp) <= 1.0):
            _bad(f"--min-parity must be in (0, 1] (top-1 agreement or mean cosine), got {mp!r}",
                 "convert_min_parity_invalid")
    if req.buckets is not None:
        if req.task not in TEXT_TASKS:
            _bad(f"--buckets are sequence lengths for text tasks; task {req.task} has one static shape "
                 f"(fix an input's dims with --input-shape NAME=D1,D2,... instead)", "convert_buckets_invalid")
        if not req.buckets or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in req.buckets):
            _bad(f"--buckets must be positive integers, got {req.buckets!r}", "convert_buckets_invalid")
    for what, n in (("min_calibration_samples", req.min_calibration_samples),
                    ("min_parity_samples", req.min_parity_samples)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            _bad(f"{what.replace('_', '-')} must be a positive integer, got {n!r}", "convert_request_invalid")


def check_data_path(task: str, path, what: str) -> None:
    """The kind of file or folder each task's ``load_samples`` takes, checked before it is called."""
    p = Path(path)
    if task == "tensors":
        if p.is_dir():
            _bad(f"{what} {p} is a directory; the tensors task takes an .npz of named arrays, one per model "
                 f"input, samples along the first axis (numpy.savez(F, input_name=array))",
                 "convert_calibration_invalid")
        if not zipfile.is_zipfile(p):
            _bad(f"{what} {p} is not an .npz archive; the tensors task takes an .npz of named arrays, one per "
                 f"model input, samples along the first axis (numpy.savez(F, input_name=array))",
                 "convert_calibration_invalid")
    elif task == "image-classification":
        if not p.is_dir() and p.suffix.lower() != ".npy":
            _bad(f"{what} {p}: image-classification takes a folder of PNG/JPEG/BMP images or a .npy of "
                 f"uint8 images", "convert_calibration_invalid")
    elif task in TEXT_TASKS:
        if p.is_dir():
            _bad(f"{what} {p} is a directory; text tasks take a .txt (one sample a line), .jsonl ('text') or "
                 f".tsv (text<TAB>label) file", "convert_calibration_invalid")


def _resize_methods() -> tuple[str, ...]:
    try:
        from edge_runtime.models.image import _RESAMPLE

        return tuple(_RESAMPLE) + ("bilinear-half-pixel",)
    except ImportError:   # pragma: no cover
        return _RESIZE_FALLBACK


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_preprocess(task: str, pre) -> None:
    """Refuse keys the task does not read and values it cannot use."""
    if pre is None:
        return
    if not isinstance(pre, dict):
        _bad(f"--preprocess must be a JSON object, got {type(pre).__name__}", "convert_preprocess_invalid")
    allowed = PREPROCESS_KEYS.get(task, ())
    unknown = sorted(set(pre) - set(allowed))
    if unknown:
        _bad(f"--preprocess: unknown key(s) {', '.join(map(repr, unknown))} for task {task} (known: "
             f"{', '.join(allowed) or 'none: the task takes no --preprocess'})", "convert_preprocess_invalid")

    def bad(key, want):
        _bad(f"--preprocess {key!r}: {want}, got {pre[key]!r}", "convert_preprocess_invalid")

    if task == "image-classification":
        if "size" not in pre:
            _bad("--preprocess needs 'size' ([height, width]) for image-classification", "convert_preprocess_invalid")
    if "size" in pre:
        s = pre["size"]
        if not (isinstance(s, list) and len(s) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                            and v > 0 for v in s)):
            bad("size", "need two positive integers [height, width]")
    channels = pre.get("channels", 3)
    if "channels" in pre and (isinstance(channels, bool) or channels not in (1, 3)):
        bad("channels", "need 1 or 3")
    if "scale" in pre and not (_is_num(pre["scale"]) and pre["scale"] > 0):
        bad("scale", "need a positive number")
    for key in ("mean", "std"):
        if key in pre:
            v = pre[key]
            if not (isinstance(v, list) and len(v) in {1, channels} and all(_is_num(x) for x in v)):
                bad(key, f"need a list of 1 or {channels} (channels) numbers")
            if key == "std" and any(x <= 0 for x in v):
                bad(key, "every std must be > 0")
    if "layout" in pre and pre["layout"] not in LAYOUTS:
        bad("layout", f"need one of {', '.join(LAYOUTS)}")
    if "resize" in pre and pre["resize"] not in _resize_methods():
        bad("resize", f"need one of {', '.join(_resize_methods())}")
    if "input" in pre and not isinstance(pre["input"], str):
        bad("input", "need a string (\"pixels\": the 0..255 pixels are the model's integer input)")
    if "allow_nonfinite" in pre and not isinstance(pre["allow_nonfinite"], bool):
        bad("allow_nonfinite", "need true or false")


def sample_policy(req: ConvertRequest, n_calib: int, n_held: int, progress) -> dict:
    """Refuse (or, with allow_few_samples, warn) under the minimums; warn under the warning levels.
    Returns the record kept in the manifest: per side the count, minimum, warning level, any warning
    and ``allow_few_samples`` where the override let a count under the minimum through."""
    rows = {"calibration": (n_calib, req.min_calibration_samples, WARN_CALIBRATION_SAMPLES),
            "parity": (n_held, req.min_parity_samples, WARN_PARITY_SAMPLES)}
    record, refused = {}, []
    for side, (n, minimum, warn) in rows.items():
        rec = {"samples": n, "min_samples": minimum, "warn_below": warn}
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
                         "or pass --allow-few-samples", code="convert_too_few_samples")
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
                             + " (recorded in the manifest's skipped_targets)", code="convert_target_unavailable")
        progress(f"warning: {target}: skipped: {why}" + (f" (building {fallback} instead)" if fallback else ""))
        skipped.append({"target": target, "reason": why})
        if fallback and fallback not in targets and fallback not in requested:
            targets.append(fallback)
    if not targets:
        raise InputError("no requested target can be built here: " + "; ".join(
            f"{s['target']}: {s['reason']}" for s in skipped), code="convert_no_target")
    return targets, skipped


def check_recipe(req: ConvertRequest) -> None:
    if not req.recipe or "=" in req.recipe:
        return
    known = {t: tuple(get_converter(t).recipes) for t in req.targets}
    if not any(req.recipe in names for names in known.values()):
        raise InputError(f"no target knows recipe {req.recipe!r} ("
                         + "; ".join(f"{t}: {', '.join(n) or '?'}" for t, n in known.items()) + ")",
                         code="convert_recipe_invalid")


def recipe_for(recipe: str | None, target: str, converter: Converter) -> str | None:
    """``--recipe`` is one name (for the targets that know it) or ``target=name,...``."""
    if not recipe:
        return None
    if "=" in recipe:
        table = {}
        for part in recipe.split(","):
            key, _, value = part.partition("=")
            if not key.strip() or not value.strip():
                raise InputError(f"--recipe {recipe!r}: expected target=recipe pairs", code="convert_recipe_invalid")
            table[key.strip()] = value.strip()
        return table.get(target)
    known = tuple(converter.recipes)
    return recipe if (not known or recipe in known) else None


def toolchain(converter: Converter) -> dict:
    import numpy

    tc = {"edge-runtime": __version__, "python": platform.python_version(), "numpy": numpy.__version__}
    tc.update(converter.toolchain())
    return tc
