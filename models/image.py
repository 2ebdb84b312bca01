"""Image pre-processing: resize, normalisation and the model's input tensor.

Decoding (PNG/JPEG/BMP bytes, a path or an array, under the limits, to 8-bit
pixels) is :mod:`.image_decode`; its names are importable from here too.

Pre-processing: the pixels ``p`` (0..255, after the resize) are normalised to
``x = (p * scale - mean[c]) / std[c]`` (``preprocess`` ``scale``/``mean``/
``std``); an integer input is then quantized with the input tensor's own
parameters, ``q = clip(round(x / s + z))``. Since ``p`` is an integer, that is
one 256-entry lookup table per channel (exact, computed in float64). Where
the quantization of ``x`` IS the pixels (Coral's uint8 models: ``q = p``; or
``q = p - 128`` for int8) the pixels are cast as they are (``input_plan``
says which; ``"input": "pixels"`` in old manifests without ``scale``/``mean``/
``std`` means the default normalisation for the input dtype, see
:func:`default_normalisation`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError, InputError

from .base import is_number, preprocess_error
# decoding lives in image_decode; decode, decode_pixels and to_8bit stay importable from here
from .image_decode import FORMATS, _pil, bmp_bytes, decode, decode_pixels, image_size, to_8bit

__all__ = ["FORMATS", "TensorPlan", "bmp_bytes", "check_image_preprocess", "decode", "decode_pixels", "default_normalisation", "image_size",
           "input_plan", "load_image_samples", "normalisation", "quantized_levels", "resize_half_pixel",
           "to_8bit", "to_tensor"]

_RESAMPLE = {"bilinear": 2, "nearest": 0, "bicubic": 3, "lanczos": 1, "box": 4}


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


def default_normalisation(spec: dict) -> dict:
    """The normalisation assumed for an input when none is stated.

    - uint8: the pixels are the quantized input (Coral's convention): ``scale``
      = the input scale ``s``, ``mean`` = ``z * s``, ``std`` = 1, so ``q = p``
      (an unquantized uint8 input: ``x = p``);
    - int8 and float32: ``[-1, 1]`` (``p / 127.5 - 1``), quantized with the
      input's own scale and zero point for int8.
    """
    dtype = np.dtype(spec["dtype"])
    s, z = _input_quant(spec)
    if dtype == np.uint8:
        return {"scale": float(s), "mean": [float(z * s)], "std": [1.0]}
    return {"scale": 1 / 127.5, "mean": [1.0], "std": [1.0]}


def _input_quant(spec: dict) -> tuple[float, float]:
    q = spec.get("quantization") or {}
    s = float(q.get("scale") or 0.0)
    return (s, float(q.get("zero_point", 0))) if s > 0 else (1.0, 0.0)


def normalisation(pre: dict, spec: dict) -> tuple[float, np.ndarray, np.ndarray]:
    """``(scale, mean[C], std[C])`` for the input, the defaults filled in for an
    old ``"input": "pixels"`` manifest that recorded none."""
    if pre.get("input") == "pixels" and not any(k in pre for k in ("scale", "mean", "std")):
        pre = {**pre, **default_normalisation(spec)}
    scale = float(pre.get("scale", 1.0 / 255.0))
    mean = np.asarray(pre.get("mean", [0.0]), dtype=np.float64).reshape(-1)
    std = np.asarray(pre.get("std", [1.0]), dtype=np.float64).reshape(-1)
    return scale, mean, std


def quantized_levels(pre: dict, spec: dict, channels: int) -> np.ndarray:
    """``x / s + z`` for every pixel value 0..255 and channel, unrounded, float64 ``[C, 256]``."""
    scale, mean, std = normalisation(pre, spec)
    s, z = _input_quant(spec)
    p = np.arange(256, dtype=np.float64)
    c = max(channels, mean.size, std.size)
    mean, std = np.broadcast_to(mean, (c,)), np.broadcast_to(std, (c,))
    return ((p[None, :] * scale - mean[:, None]) / std[:, None]) / s + z


def input_plan(pre: dict, spec: dict, channels: int = 3):
    """How pixels become the input tensor: ``("cast", None)`` when the quantized
    normalised pixels are the pixels (uint8 ``q = p``), ``("shift", None)`` for
    int8 ``q = p - 128``, ``("lut", table[C, 256])`` for any other integer input,
    ``("float", None)`` for a float input (normalised in float32)."""
    dtype = np.dtype(spec["dtype"])
    if dtype.kind not in "iu":
        return ("float", None)
    levels = quantized_levels(pre, spec, channels)
    p = np.arange(256, dtype=np.float64)
    if dtype == np.uint8 and np.abs(levels - p).max() < 1e-3:
        return ("cast", None)
    if dtype == np.int8 and np.abs(levels - (p - 128)).max() < 1e-3:
        return ("shift", None)
    info = np.iinfo(dtype)
    table = np.clip(np.rint(levels), info.min, info.max).astype(dtype)
    return ("lut", table)


def _as_pil(x):
    if not isinstance(x, np.ndarray):
        return x
    if x.ndim == 3 and x.shape[2] == 1:
        x = x[:, :, 0]
    return _pil().fromarray(np.ascontiguousarray(x), mode="L" if x.ndim == 2 else "RGB")


def _pixels(img, pre: dict) -> np.ndarray:
    """Resized HxWxC pixels, integer-valued (float32 from the half-pixel resize, else uint8).
    ``img`` is a PIL image or an HxWxC uint8 array (:func:`decode_pixels`)."""
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
        return x
    if isinstance(img, np.ndarray) and img.shape[:2] == (h, w):
        return img if img.ndim == 3 else img[:, :, None]         # no resize: the pixels as they are
    img = _as_pil(img)
    if img.size != (w, h):
        img = img.resize((w, h), resample=_RESAMPLE[method])
    x = np.asarray(img)
    if x.ndim == 2:
        x = x[:, :, None]
    return x


class TensorPlan:
    """Pixels (HxWxC) → the input tensor, everything that does not depend on the pixels
    computed once (a task builds one at load). Integer-valued pixels index 256-entry tables
    per channel: the quantized levels of an integer input (:func:`input_plan`), and for a
    float input ``(p * scale - mean[c]) / std[c]``, computed in float32 exactly as the
    per-pixel formula is, so the tensor is bit-identical to computing it pixel by pixel."""

    __slots__ = ("kind", "table", "dtype", "nchw", "scale", "mean", "std", "ftable")

    def __init__(self, pre: dict, spec: dict, channels: int = 3, plan=None):
        self.kind, self.table = plan if plan is not None else input_plan(pre, spec, channels)
        self.dtype = np.dtype(spec["dtype"])
        layout = pre.get("layout", "NHWC" if pre.get("input") == "pixels" else "NCHW")
        if layout not in ("NCHW", "NHWC"):      # any other word was read as NHWC: channels fed as rows
            raise ArtifactError(f"preprocess.layout {layout!r}: need NCHW or NHWC", file="manifest.json",
                                code=ec.MANIFEST_FIELD_INVALID)
        self.nchw = layout == "NCHW"
        self.ftable = np.zeros((1, 256), np.float32)      # the float input's table (set below)
        if self.kind == "float":
            scale, mean, std = normalisation(pre, spec)
            self.scale = np.float32(scale)
            self.mean, self.std = mean.astype(np.float32), std.astype(np.float32)
            p = np.arange(256, dtype=np.float32) * self.scale
            self.ftable = (p[None, :] - self.mean[:, None]) / self.std[:, None]      # [C or 1, 256] float32

    @staticmethod
    def _lookup(table: np.ndarray, idx: np.ndarray, nchw: bool) -> np.ndarray:
        """``table[channel % rows][idx]`` for uint8 pixels ``idx`` (HxWxC), laid out CHW or HWC.
        ``take`` per channel plane, written straight into the output's layout: 2-5x faster than
        one fancy index then a transpose copy on a 224x224x3 image (int8 per-channel table, CHW:
        1.49 -> 0.35 ms, 2-core Xeon); the same values (indices are 0-255, the table 256 wide,
        so ``mode="clip"`` never clips and skips the bounds check)."""
        h, w, c = idx.shape
        rows = table.shape[0]
        if c == 1:
            plane = table[0].take(idx[:, :, 0], mode="clip")
            return plane[None] if nchw else plane[:, :, None]
        if rows == 1 and not nchw:
            return table[0].take(idx, mode="clip")
        out = np.empty((c, h, w) if nchw else (h, w, c), table.dtype)
        for ch in range(c):
            table[ch % rows].take(idx[:, :, ch], out=out[ch] if nchw else out[:, :, ch], mode="clip")
        return out

    def __call__(self, x: np.ndarray) -> np.ndarray:
        kind = self.kind
        if kind == "float" and x.dtype == np.uint8:
            out = self._lookup(self.ftable, x, self.nchw)
        elif kind == "lut":
            out = self._lookup(self.table, x if x.dtype == np.uint8 else x.astype(np.uint8), self.nchw)
        else:
            if kind == "float":
                out = (x.astype(np.float32) * self.scale - self.mean) / self.std
            elif kind == "cast":
                out = x.astype(self.dtype)
            else:
                out = (x.astype(np.int16) - 128).astype(np.int8)
            if self.nchw:
                out = np.ascontiguousarray(out.transpose(2, 0, 1))
        out = out[None]
        return out if out.dtype == self.dtype else out.astype(self.dtype)


def to_tensor(img, pre: dict, spec: dict, plan=None) -> np.ndarray:
    """Resize, normalise, lay out and (for integer inputs) quantize.

    ``plan`` is :func:`input_plan` for ``pre``/``spec`` (computed here when not
    given; a task computes it once at load), or a :class:`TensorPlan`.
    """
    x = _pixels(img, pre)
    if not isinstance(plan, TensorPlan):
        plan = TensorPlan(pre, spec, x.shape[2], plan)
    return plan(x)


# the suffixes an image folder's samples are read from (what the runtime decodes: FORMATS), and
# image suffixes it does not decode: such files are left out and said, never skipped in silence
SAMPLE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
UNDECODED_SUFFIXES = (".webp", ".gif", ".tif", ".tiff", ".heic", ".heif", ".avif", ".jxl", ".jp2", ".ico", ".ppm",
                      ".pgm", ".pnm")
OTHER_SUFFIXES = (".jfif", ".jpe", ".pjpeg", ".pjp", ".dib")       # JPEG/BMP under a suffix not read: rename


class ImageSamples(list):
    """:func:`load_image_samples`' answer for a folder: the encoded images in order, with
    ``left_out`` (one line per kind of thing not read, a count and examples) and ``entered``
    (the symlinked subfolders read, each ``name/``)."""

    def __init__(self, items=(), left_out=(), entered=()):
        super().__init__(items)
        self.left_out: list[str] = list(left_out)
        self.entered: list[str] = list(entered)


def load_image_samples(path) -> list:
    """An image folder (recursive, sorted; dot-files and dot-folders skipped, as ``score`` skips
    them: a ``.ipynb_checkpoints`` copy or a macOS ``._x.png`` is no sample) or a .npy (any case)
    of uint8 images.

    A folder's PNG/JPEG/BMP files are read (an :class:`ImageSamples`); a symlinked subfolder
    (``calib/cat -> /data/cat``) is entered, each real folder once (a link to a folder read
    already, or to one above it, a loop, is not), as ``eval`` does; what is not read is said in
    ``left_out``: files in an image format the runtime does not decode (.webp, .gif, .tif),
    the folders not entered, subfolders that cannot be listed, broken links, files that are no
    regular file (a FIFO would block the read). A folder with no PNG/JPEG/BMP image is an
    ``InputError`` naming what it holds."""
    p = Path(path)
    if p.is_file() and p.suffix.lower() == ".npy":
        arr = np.load(p, allow_pickle=False)
        return [a for a in arr]
    if not p.is_dir():
        raise ValueError(f"no PNG/JPEG/BMP images under {p}: " + ("neither a folder nor a regular .npy file"
                                                                   if p.exists() else "no such folder"))
    files, kinds, entered = _image_folder(p)
    left_out = _left_out_lines(kinds)
    if not files:
        held = f": {'; '.join(left_out)}" if left_out else ""
        hint = " (the runtime decodes PNG, JPEG and BMP only: convert them)" if kinds.get("format") else \
            " (rename them)" if kinds.get("suffix") else ""
        raise InputError(f"no PNG/JPEG/BMP images under {p}{held}{hint}", code=ec.CONVERT_CALIBRATION_INVALID)
    return ImageSamples((f.read_bytes() for f in files), left_out, entered)


def _image_folder(p: Path) -> tuple[list[Path], dict[str, list[str]], list[str]]:
    """(the image files, sorted by path as ``sorted(p.rglob(...))`` sorts them; what is not read,
    by kind, each a name relative to ``p``; the symlinked subfolders entered). Real folders are
    walked first, then the symlinked ones met (in that order; links met in them after), so a
    link to a real folder of ``p`` is the repeat whatever the sort order."""
    files: list[Path] = []
    links: list[Path] = []
    kinds: dict[str, list[str]] = {}
    read: dict[str, str] = {}               # real folder -> the name it is read as
    entered: list[str] = []

    def rel(f: Path) -> str:
        return f.relative_to(p).as_posix()

    def walk(d: Path, real: str) -> None:
        if real in read:                     # a real folder reached again under a linked one
            kinds.setdefault("twice", []).append(f"{rel(d)}/ (the same folder as {read[real]}/)")
            return
        read[real] = rel(d)
        try:
            with os.scandir(d) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            if d == p:
                raise
            kinds.setdefault("unlistable", []).append(f"{rel(d)}/")
            return
        for e in entries:
            if e.name.startswith("."):
                continue
            f = d / e.name
            suffix = os.path.splitext(e.name)[1].lower()
            try:
                link, is_dir, is_file = e.is_symlink(), e.is_dir(), e.is_file()
            except OSError:
                link, is_dir, is_file = False, False, False
            if is_dir:
                if link:
                    links.append(f)
                else:
                    walk(f, os.path.join(real, e.name))
            elif link and not os.path.exists(f):
                kinds.setdefault("broken", []).append(rel(f))
            elif suffix in SAMPLE_SUFFIXES:
                if is_file:
                    files.append(f)
                else:
                    kinds.setdefault("special", []).append(rel(f))
            elif suffix in UNDECODED_SUFFIXES:
                kinds.setdefault("format", []).append(rel(f))
            elif suffix in OTHER_SUFFIXES:
                kinds.setdefault("suffix", []).append(rel(f))

    walk(p, os.path.realpath(p))
    for f in links:                          # grows while linked folders are walked
        target = os.path.realpath(f)
        above = f.parents[:len(f.relative_to(p).parts)]        # f's folders up to p, by the names it is reached
        if any(os.path.commonpath([os.path.realpath(a), target]) == target for a in above):   # a loop
            kinds.setdefault("loop", []).append(f"{rel(f)}/ (a link to a folder that holds it)")
        elif target in read:
            kinds.setdefault("twice", []).append(f"{rel(f)}/ (the same folder as {read[target]}/)")
        else:
            entered.append(f"{rel(f)}/")
            walk(f, target)
    return sorted(files), kinds, entered


def _left_out_lines(kinds: dict[str, list[str]]) -> list[str]:
    """One line per kind of thing :func:`_image_folder` did not read: a count and the first examples."""
    what = {"format": "{n} file{s} in an image format the runtime does not decode (PNG/JPEG/BMP only) left out",
            "suffix": "{n} JPEG/BMP file{s} under a suffix not read (rename {them} .jpg or .bmp) left out",
            "loop": "{n} symlinked folder{s} that loop{v} left out",
            "twice": "{n} folder{s} reached a second time through a symlink, read once",
            "unlistable": "{n} folder{s} that cannot be listed left out", "broken": "{n} broken symlink{s} left out",
            "special": "{n} file{s} that {is_} no regular file left out"}
    lines = []
    for kind, says in what.items():
        names = kinds.get(kind)
        if names:
            n = len(names)
            shown = ", ".join(names[:3]) + (f", ... ({n - 3} more)" if n > 3 else "")
            one = n == 1
            lines.append(says.format(n=n, s="" if one else "s", v="s" if one else "", is_="is" if one else "are",
                                      them="it" if one else "them")
                         + f": {shown}")
    return lines


def check_image_preprocess(pre: dict, task: str, bad) -> int:
    """The ``--preprocess`` keys every image task shares (size, channels, scale, mean, std), checked
    with ``bad(key, want)``; returns the channel count."""
    if "size" not in pre:
        preprocess_error(f"--preprocess needs 'size' ([height, width]) for {task}")
    s = pre["size"]
    if not (isinstance(s, list) and len(s) == 2 and all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                                        for v in s)):
        bad("size", "need two positive integers [height, width]")
    channels = pre.get("channels", 3)
    if "channels" in pre and (isinstance(channels, bool) or channels not in (1, 3)):
        bad("channels", "need 1 or 3")
    if "scale" in pre and not (is_number(pre["scale"]) and pre["scale"] > 0):
        bad("scale", "need a positive number")
    for key in ("mean", "std"):
        if key in pre:
            v = pre[key]
            if not (isinstance(v, list) and len(v) in {1, channels} and all(is_number(x) for x in v)):
                bad(key, f"need a list of 1 or {channels} (channels) numbers")
            if key == "std" and any(x <= 0 for x in v):
                bad(key, "every std must be > 0")
    return channels
