"""The ``preprocess`` section of an image model imported as it is (``edge-infer import``).

Its layout and size come from the input tensor; its normalisation
``x = (p * scale - mean[c]) / std[c]`` is stated (``scale``/``mean``/``std``:
numbers, lists, or strings such as ``"1/255"`` and ``"0.485,0.456,0.406"``) or
the default for the input dtype (:func:`.image.default_normalisation`), and is
checked against the input quantization: pixel values 0..255 must quantize
inside the integer range (at most one level over an end), else ``InputError``
``import_normalisation_clips``; under 1/8 of the integer range used is a
warning. ``input`` is ``"pixels"`` where the quantized normalised pixels are
the pixels themselves (the runtime casts them), ``"quantized"`` for any other
integer input; absent for a float input. Pure numpy: the task contract
(``ImageClassification.import_sections``) uses it, and so does the importer.
"""

from __future__ import annotations

import math

import numpy as np

from edge_runtime import error_codes as ec
from edge_runtime.errors import InputError

from .image import default_normalisation, input_plan, quantized_levels

# (name, normalisation, the options that state it): the ranges a warning may name
_KNOWN_NORMALISATIONS = (
    ("[-1, 1]", {"scale": 1 / 127.5, "mean": [1.0], "std": [1.0]}, "--scale 1/127.5 --mean 1 --std 1"),
    ("[0, 1] (RGB/255)", {"scale": 1 / 255, "mean": [0.0], "std": [1.0]}, "--scale 1/255 --mean 0 --std 1"),
    ("ImageNet mean/std", {"scale": 1 / 255, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
     "--scale 1/255 --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225"),
    ("[0, 255]", {"scale": 1.0, "mean": [0.0], "std": [1.0]}, "--scale 1 --mean 0 --std 1"),
)
_MIN_COVERAGE = 1 / 8
_MIN_USABLE = 1 / 16      # under this share of the input's steps nearly every image reaches the model alike: refused


def image_layout(shape: list[int]) -> str | None:
    """"NHWC" for [1, H, W, 1|3], "NCHW" for [1, 1|3, H, W], else None."""
    if len(shape) != 4 or shape[0] != 1:
        return None
    if shape[3] in (1, 3):
        return "NHWC"
    if shape[1] in (1, 3):
        return "NCHW"
    return None


def _floats(value, what: str) -> list[float]:
    """``0.5``, ``"1/255"``, ``"0.485,0.456,0.406"`` or a list of those → floats."""
    items: list
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        items = [value]
    elif isinstance(value, str):
        items = [v for v in value.replace(" ", "").split(",") if v != ""]
    else:
        items = list(value)
    out = []
    for item in items:
        try:
            if isinstance(item, str) and "/" in item:
                num, den = item.split("/", 1)
                f = float(num) / float(den)
            else:
                f = float(item)
        except (ValueError, ZeroDivisionError):
            raise InputError(f"{what}: {item!r} is not a number (write 0.5, 1/255 or 0.485,0.456,0.406)",
                             code=ec.IMPORT_PREPROCESS_INVALID) from None
        if not math.isfinite(f):
            raise InputError(f"{what}: {item!r} is not finite", code=ec.IMPORT_PREPROCESS_INVALID)
        out.append(f)
    if not out:
        raise InputError(f"{what} is empty", code=ec.IMPORT_PREPROCESS_INVALID)
    return out


def _stated_normalisation(channels: int, scale=None, mean=None, std=None) -> dict | None:
    if scale is None and mean is None and std is None:
        return None
    sc = _floats(scale, "--scale") if scale is not None else [1 / 255]
    if len(sc) != 1 or sc[0] <= 0:
        raise InputError(f"--scale must be one positive number, got {scale!r}", code=ec.IMPORT_PREPROCESS_INVALID)
    mn = _floats(mean, "--mean") if mean is not None else [0.0]
    sd = _floats(std, "--std") if std is not None else [1.0]
    for what, vals in (("--mean", mn), ("--std", sd)):
        if len(vals) not in (1, channels):
            raise InputError(f"{what} has {len(vals)} values for a {channels}-channel input (give 1 or {channels})",
                             code=ec.IMPORT_PREPROCESS_INVALID)
    if any(v <= 0 for v in sd):
        # a standard deviation is positive: a negative one inverted every pixel (--std -1 imported, and the cat
        # became a "mosquito net" with exit 0); --preprocess JSON already refused it ("every std must be > 0")
        raise InputError(f"--std must be positive (a standard deviation; a negative one inverts the image), got "
                         f"{std!r}", code=ec.IMPORT_PREPROCESS_INVALID)
    return {"scale": sc[0], "mean": mn, "std": sd}


def _range(norm: dict, channels: int) -> tuple[float, float]:
    """The normalised float range of pixel values 0..255 over all channels."""
    mean = np.broadcast_to(np.asarray(norm["mean"], dtype=np.float64), (channels,))
    std = np.broadcast_to(np.asarray(norm["std"], dtype=np.float64), (channels,))
    ends = np.stack([(0.0 - mean) / std, (255.0 * norm["scale"] - mean) / std])
    return float(ends.min()), float(ends.max())


def _looks_like(spec: dict, channels: int):
    """The known normalisation whose float range matches the input quantization's, or None."""
    q = spec.get("quantization")
    if not q:
        return None
    info = np.iinfo(np.dtype(spec["dtype"]))
    lo, hi = (info.min - q["zero_point"]) * q["scale"], (info.max - q["zero_point"]) * q["scale"]
    best = None
    for name, norm, flags in _KNOWN_NORMALISATIONS:
        a, b = _range(norm, channels)
        err = (abs(a - lo) + abs(b - hi)) / max(hi - lo, 1e-12)
        if err < 0.1 and (best is None or err < best[0]):
            best = (err, name, flags)
    return None if best is None else best[1:]


def _fits_hint(spec: dict, channels: int) -> str:
    """The known normalisation the input quantization covers, as the end of an error message."""
    seen = _looks_like(spec, channels)
    return f"; the input quantization covers the range of {seen[0]} ({seen[1]})" if seen else ""


def image_preprocess(spec: dict, *, resize: str = "bilinear-half-pixel", scale=None, mean=None, std=None,
                     warnings: list | None = None) -> dict:
    """The ``preprocess`` section for an image input ``spec`` (see the module doc),
    the normalisation checked against the input's quantization. Warnings are
    appended to ``warnings``."""
    warnings = [] if warnings is None else warnings
    shape = spec["shape"]
    layout = image_layout(shape)
    if layout is None:
        raise InputError(f"image input must be [1, H, W, 1|3] or [1, 1|3, H, W], got {shape}",
                         code=ec.IMPORT_MODEL_UNSUPPORTED)
    h, w, c = (shape[1], shape[2], shape[3]) if layout == "NHWC" else (shape[2], shape[3], shape[1])
    pre = {"kind": "image", "size": [h, w], "channels": c, "layout": layout, "resize": resize}
    norm = _stated_normalisation(c, scale, mean, std)
    source = "stated" if norm is not None else "default"
    if norm is None:
        norm = default_normalisation(spec)
        if spec["dtype"] == "int8":
            seen = _looks_like(spec, c)
            if seen is None or seen[0] != _KNOWN_NORMALISATIONS[0][0]:
                q = spec["quantization"] if spec.get("quantization") else {"scale": 1.0, "zero_point": 0}
                hint = (f"; its input quantization (scale {q['scale']:.6g}, zero point {q['zero_point']}) "
                        f"covers the range of {seen[0]}: if that is what it was trained on, import with {seen[1]}"
                        if seen else "")
                warnings.append(f"no normalisation stated for the int8 input: assuming [-1, 1] "
                                f"(--scale 1/127.5 --mean 1 --std 1){hint}")
    pre.update(scale=float(norm["scale"]), mean=[float(v) for v in norm["mean"]],
               std=[float(v) for v in norm["std"]], normalisation_source=source)
    dtype = np.dtype(spec["dtype"])
    if dtype.kind in "iu":
        levels = quantized_levels(pre, spec, c)
        info = np.iinfo(dtype)
        lo, hi = float(levels.min()), float(levels.max())
        q = spec.get("quantization") or {"scale": 1.0, "zero_point": 0}
        flo, fhi = _range(norm, c)
        if lo < info.min - 1 or hi > info.max + 1:
            hint = _fits_hint(spec, c)
            raise InputError(
                f"the normalised pixels ({flo:.4g}..{fhi:.4g}) quantize to {lo:.1f}..{hi:.1f} with the input's "
                f"scale {q['scale']:.6g} and zero point {q['zero_point']}, outside {dtype.name} "
                f"{info.min}..{info.max}: they would be clipped. The normalisation does not fit the model's "
                f"input; state the one it was trained with (--scale/--mean/--std){hint}",
                code=ec.IMPORT_NORMALISATION_CLIPS)
        share = (hi - lo) / (info.max - info.min)
        if share < _MIN_USABLE:
            # before 2026-12-07 only a warning: --scale 1/255 --mean 127.5 --std 127.5 imported, and every image
            # (cat, bird, Grace Hopper) was a "nematode", exit 0
            hint = _fits_hint(spec, c)
            raise InputError(
                f"the normalised pixels ({flo:.4g}..{fhi:.4g}) use {hi - lo:.1f} of the {info.max - info.min} steps "
                f"of the {dtype.name} input ({share:.1%}, under {_MIN_USABLE:.0%}): nearly every image would reach "
                f"the model as the same input. State the normalisation it was trained with (--scale/--mean/--std)"
                f"{hint}", code=ec.IMPORT_NORMALISATION_COLLAPSES)
        if share < _MIN_COVERAGE:
            warnings.append(f"the normalised pixels ({flo:.4g}..{fhi:.4g}) use {hi - lo:.1f} of the "
                            f"{info.max - info.min} steps of the {dtype.name} input ({share:.0%}): most pixel "
                            "values quantize alike; check --scale/--mean/--std")
        kind, _ = input_plan(pre, spec, c)
        pre["input"] = "pixels" if kind in ("cast", "shift") else "quantized"
    return pre
