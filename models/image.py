"""Image decoding and normalisation under strict limits.

Accepts encoded PNG/JPEG/BMP bytes, a file path, or an HxW / HxWxC uint8
array. Sizes are checked before decoding (encoded bytes, then the header's
pixel count, so a decompression bomb is refused before it allocates).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from edge_runtime.errors import InputError

FORMATS = ("PNG", "JPEG", "BMP")
_RESAMPLE = {"bilinear": 2, "nearest": 0, "bicubic": 3, "lanczos": 1, "box": 4}


def _pil():
    from PIL import BmpImagePlugin, Image, JpegImagePlugin, PngImagePlugin  # noqa: F401 (plugins load once, here)

    Image.MAX_IMAGE_PIXELS = None  # our own limit is checked first, from the header
    return Image


def _read_path(path, limits) -> bytes:
    if not str(path):
        raise InputError("image path is empty", code="input_empty")
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise InputError(f"cannot read image file {str(p)!r}: {exc.strerror}", code="input_file_unreadable") from None
    if not p.is_file():
        raise InputError(f"{str(p)!r} is not a file", code="input_file_unreadable")
    if size > limits.max_image_bytes:
        raise InputError(f"image file is {size} bytes, over the limit of {limits.max_image_bytes}",
                         code="input_too_large", limit=limits.max_image_bytes)
    return p.read_bytes()


def decode(raw, limits, mode: str):
    """Return a PIL image in ``mode`` ("L" or "RGB")."""
    Image = _pil()
    if isinstance(raw, np.ndarray):
        return _from_array(raw, limits, mode)
    if isinstance(raw, (str, os.PathLike)):
        raw = _read_path(raw, limits)
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise InputError(f"expected image bytes, a file path or a uint8 array, got {type(raw).__name__}",
                         code="input_wrong_type")
    raw = bytes(raw)
    if not raw:
        raise InputError("image is empty", code="input_empty")
    if len(raw) > limits.max_image_bytes:
        raise InputError(f"image is {len(raw)} bytes, over the limit of {limits.max_image_bytes}",
                         code="input_too_large", limit=limits.max_image_bytes)
    try:
        img = Image.open(io.BytesIO(raw), formats=list(FORMATS))
    except Exception as exc:
        raise InputError(f"not a decodable PNG/JPEG/BMP image ({type(exc).__name__})", code="input_undecodable") from None
    w, h = img.size
    if w <= 0 or h <= 0:
        raise InputError("image has no pixels", code="input_undecodable")
    if w * h > limits.max_image_pixels:
        raise InputError(f"image is {w}x{h} = {w * h} pixels, over the limit of {limits.max_image_pixels}",
                         code="input_too_many_pixels", limit=limits.max_image_pixels)
    try:
        img.load()
        return img.convert(mode)
    except Exception as exc:
        raise InputError(f"image data is truncated or corrupt ({type(exc).__name__}: {exc})",
                         code="input_undecodable") from None


def _from_array(arr: np.ndarray, limits, mode: str):
    Image = _pil()
    if arr.dtype != np.uint8:
        raise InputError(f"image arrays must be uint8, got {arr.dtype}", code="input_wrong_dtype")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] in (3, 4))):
        raise InputError(f"image arrays must be HxW or HxWxC with C in 1,3,4; got shape {list(arr.shape)}",
                         code="input_wrong_shape")
    h, w = arr.shape[:2]
    if h == 0 or w == 0:
        raise InputError("image array has no pixels", code="input_empty")
    if h * w > limits.max_image_pixels:
        raise InputError(f"image is {w}x{h} pixels, over the limit of {limits.max_image_pixels}",
                         code="input_too_many_pixels", limit=limits.max_image_pixels)
    src_mode = "L" if arr.ndim == 2 else ("RGB" if arr.shape[2] == 3 else "RGBA")
    return Image.fromarray(np.ascontiguousarray(arr), mode=src_mode).convert(mode)


def resize_half_pixel(x: np.ndarray, h: int, w: int) -> np.ndarray:
    """Bilinear resize with half-pixel centres, in float (TF's ``resize_bilinear``
    with ``half_pixel_centers=True``, what Coral's models were evaluated with;
    PIL's bilinear filter antialiases when it shrinks, which this does not).

    ``x`` is HxWxC (uint8 or float); returns float32 hxwxC. The axis that
    shrinks most is done first, and the source is gathered before it is
    converted to float, so no full-size float copy is made.
    """
    def axis(n_in, n_out):
        src = (np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5
        src = np.clip(src, 0, n_in - 1)
        i0 = np.floor(src).astype(np.intp)
        i1 = np.minimum(i0 + 1, n_in - 1)
        return i0, i1, (src - i0).astype(np.float32)

    def lerp(a, b, t):          # a + (b - a) * t, in place on the gathered copies
        b -= a
        b *= t
        a += b
        return a

    y0, y1, wy = axis(x.shape[0], h)
    x0, x1, wx = axis(x.shape[1], w)
    if x.shape[1] - w >= x.shape[0] - h:   # columns first
        cols = lerp(x[:, x0].astype(np.float32), x[:, x1].astype(np.float32), wx[None, :, None])
        return lerp(cols[y0], cols[y1], wy[:, None, None])
    rows = lerp(x[y0].astype(np.float32), x[y1].astype(np.float32), wy[:, None, None])
    return lerp(rows[:, x0], rows[:, x1], wx[None, :, None])


def to_tensor(img, pre: dict, spec: dict) -> np.ndarray:
    """Resize, normalise, lay out and (for integer inputs) quantize.

    ``pre["input"] == "pixels"``: the resized 0..255 pixels *are* the model's
    quantized input (Coral/TFLite image models: uint8 as is, int8 shifted by
    128), with no normalisation.
    """
    h, w = pre["size"]
    method = pre.get("resize", "bilinear")
    if method == "bilinear-half-pixel":
        x = np.asarray(img)
        if x.ndim == 2:
            x = x[:, :, None]
        if x.shape[:2] != (h, w):
            x = resize_half_pixel(x, h, w)
            np.clip(x, 0, 255, out=x)
            np.floor(x, out=x)                                   # truncate, as the reference does
        else:
            x = x.astype(np.float32)
    else:
        if img.size != (w, h):
            img = img.resize((w, h), resample=_RESAMPLE[method])
        x = np.asarray(img, dtype=np.float32)
        if x.ndim == 2:
            x = x[:, :, None]
    if pre.get("input") == "pixels":
        dtype = np.dtype(spec["dtype"])
        if pre.get("layout", "NHWC") == "NCHW":
            x = x.transpose(2, 0, 1)
        x = x[None]
        return (x - 128).astype(np.int8) if dtype == np.int8 else x.astype(dtype)
    x = x * float(pre.get("scale", 1.0 / 255.0))
    mean = np.asarray(pre.get("mean", [0.0]), dtype=np.float32)
    std = np.asarray(pre.get("std", [1.0]), dtype=np.float32)
    x = (x - mean) / std
    if pre.get("layout", "NCHW") == "NCHW":
        x = x.transpose(2, 0, 1)
    x = x[None]
    dtype = np.dtype(spec["dtype"])
    q = spec.get("quantization")
    if dtype.kind in "iu":
        if q:
            x = np.round(x / float(q["scale"]) + float(q["zero_point"]))
        info = np.iinfo(dtype)
        x = np.clip(x, info.min, info.max)
    return x.astype(dtype)


def load_image_samples(path) -> list:
    """An image folder (recursive, sorted) or a .npy of uint8 images."""
    p = Path(path)
    if p.is_file() and p.suffix == ".npy":
        arr = np.load(p, allow_pickle=False)
        return [a for a in arr]
    files = sorted(f for f in p.rglob("*") if f.suffix.lower() in (".png", ".jpg", ".jpeg", ".bmp"))
    if not files:
        raise ValueError(f"no PNG/JPEG/BMP images under {p}")
    return [f.read_bytes() for f in files]
