"""What ``edge-infer convert`` is asked for, and the checks and lookups made on
the request before anything is built: the request itself, its validation,
recipe names per target, which targets this host can build, the calibration
fingerprint and the toolchain record."""

from __future__ import annotations

import hashlib
import platform
from dataclasses import dataclass, field
from pathlib import Path

from edge_runtime import __version__
from edge_runtime.errors import InputError

from .registry import get_converter

TEXT_TASKS = ("text-classification", "text-embedding")


@dataclass
class ConvertRequest:
    source: Path
    out: Path
    task: str
    targets: list[str]
    calibration: Path
    labels: Path | None = None
    tokenizer: Path | None = None
    buckets: list[int] | None = None
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


def fingerprint(samples) -> str:
    h = hashlib.sha256()
    for s in samples:
        h.update(s.encode("utf-8") if isinstance(s, str) else (s.tobytes() if hasattr(s, "tobytes") else bytes(s)))
        h.update(b"\x00")
    return h.hexdigest()


def check_request(req: ConvertRequest) -> None:
    if not Path(req.source).is_file():
        raise InputError(f"source model {req.source} does not exist", code="convert_source_missing")
    if not Path(req.calibration).exists():
        raise InputError(f"calibration data {req.calibration} does not exist", code="convert_calibration_missing")
    if req.task in TEXT_TASKS and not req.tokenizer:
        raise InputError(f"task {req.task} needs --tokenizer", code="convert_tokenizer_missing")
    if req.task == "image-classification" and not req.preprocess:
        raise InputError("image-classification needs --preprocess (size, channels, mean, std, layout)",
                         code="convert_preprocess_missing")
    out = Path(req.out)
    if out.exists() and any(out.iterdir()) and not req.force:
        raise InputError(f"output directory {out} exists and is not empty (use --force)", code="convert_out_exists")
    if not req.targets:
        raise InputError("no --target given", code="convert_no_target")
    if req.torch_source is not None and not Path(req.torch_source).is_file():
        raise InputError(f"torch source {req.torch_source} does not exist", code="convert_source_missing")


def available_targets(requested: list[str], progress) -> tuple[list[str], list[dict]]:
    """Targets whose toolchain is here; one that is not is skipped with its reason and
    replaced by its fallback (edgetpu without edgetpu_compiler -> tflite-int8)."""
    targets, skipped = [], []
    for target in requested:
        converter = get_converter(target)
        why = getattr(converter, "unavailable", lambda: None)()
        if not why:
            if target not in targets:
                targets.append(target)
            continue
        progress(f"{target}: skipped: {why}")
        skipped.append({"target": target, "reason": why})
        fallback = getattr(converter, "fallback_target", None)
        if fallback and fallback not in targets and fallback not in requested:
            targets.append(fallback)
    if not targets:
        raise InputError("no requested target can be built here: " + "; ".join(
            f"{s['target']}: {s['reason']}" for s in skipped), code="convert_no_target")
    return targets, skipped


def check_recipe(req: ConvertRequest) -> None:
    if not req.recipe or "=" in req.recipe:
        return
    known = {t: tuple(getattr(get_converter(t), "recipes", ()) or ()) for t in req.targets}
    if not any(req.recipe in names for names in known.values()):
        raise InputError(f"no target knows recipe {req.recipe!r} ("
                         + "; ".join(f"{t}: {', '.join(n) or '?'}" for t, n in known.items()) + ")",
                         code="convert_recipe_invalid")


def recipe_for(recipe: str | None, target: str, converter) -> str | None:
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
    known = tuple(getattr(converter, "recipes", ()) or ())
    return recipe if (not known or recipe in known) else None


def toolchain(converter) -> dict:
    import numpy

    tc = {"edge-runtime": __version__, "python": platform.python_version(), "numpy": numpy.__version__}
    tc.update(converter.toolchain())
    return tc
