"""Image decoding under strict limits: encoded bytes, a file path or an array in, 8-bit pixels out.

Accepts encoded PNG/JPEG/BMP bytes, a file path, or an HxW / HxWxC uint8
array. Sizes are checked before decoding (encoded bytes, then the header's
pixel count, so a decompression bomb is refused before it allocates). Each
format is opened by its own PIL plugin, imported with the first image of that
format (PIL's ``Image.open`` of bytes would import five).

Decoding always ends in 8-bit pixels, scaled, never truncated or wrapped:
16-bit grayscale PNGs (PIL modes ``I;16``, ``I;16B``, ``I``) are scaled by
255/65535 and rounded; 16-bit RGB/RGBA PNGs come from PIL as their high byte;
``P`` with transparency, ``LA``, ``PA`` and ``RGBA`` drop their alpha (through
RGBA, so a palette's colours are kept); CMYK JPEGs go through PIL's CMYK→RGB.
An EXIF orientation (a phone photo stored sideways) is applied: pixels, sizes and a detector's
boxes are those of the image as a viewer shows it.
Pre-processing (resize, normalisation, the input tensor) is :mod:`.image`.
"""

from __future__ import annotations

import io
import os
import stat
import struct

import numpy as np

from edge_runtime import error_codes as ec
from edge_runtime.errors import InputError

FORMATS = ("PNG", "JPEG", "BMP")

_PIL: list = []         # PIL.Image once imported: a from-import per call cost ~2 µs, twice per image

# each accepted format: its signature, PIL's plugin module, and PIL's format name. The plugin is
# imported when the first image of its format arrives: Image.open() of bytes would import five
# (BMP, GIF, JPEG, PPM, PNG: 6 ms of a process start on LiteRT, 2-core AMD EPYC with AVX-512 VNNI) before looking
_SIGNATURES = ((b"\x89PNG\r\n\x1a\n", "PngImagePlugin", "PNG"), (b"\xff\xd8\xff", "JpegImagePlugin", "JPEG"),
               (b"BM", "BmpImagePlugin", "BMP"))
_OPENERS: dict = {}     # PIL format name -> (factory, accept), from PIL's registry once the plugin is in


def _pil():
    if _PIL:
        return _PIL[0]
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = None  # our own limit is checked first, from the header
    _PIL.append(Image)
    return Image


def _open(raw: bytes):
    """PIL's image object for PNG/JPEG/BMP bytes (header read, pixels not yet decoded), opened by
    the format's own plugin; ``None`` when the bytes carry none of the three signatures or the
    plugin refuses them (what ``Image.open(formats=FORMATS)`` answers with ``UnidentifiedImageError``)."""
    for magic, module, fmt in _SIGNATURES:
        if raw.startswith(magic):
            break
    else:
        return None
    opener = _OPENERS.get(fmt)
    if opener is None:
        Image = _pil()
        import importlib

        importlib.import_module(f"PIL.{module}")       # registers itself in Image.OPEN
        opener = _OPENERS[fmt] = Image.OPEN[fmt]
    factory, accept = opener
    if accept is not None and not accept(raw[:16]):
        return None
    return factory(io.BytesIO(raw), "")


def bmp_bytes(width: int, height: int, color: tuple[int, int, int] = (0, 0, 0)) -> bytes:
    """A plain 24-bit BMP of one colour, written without PIL (saving through PIL imports its
    five common plugins): the tasks' warm-up samples."""
    row = bytes((color[2], color[1], color[0])) * width
    row += b"\0" * (-len(row) % 4)
    pixels = row * height
    header = struct.pack("<2sIHHI", b"BM", 54 + len(pixels), 0, 0, 54)
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, len(pixels), 2835, 2835, 0, 0)
    return header + info + pixels


def _read_path(path, limits) -> bytes:
    try:
        name = os.fsdecode(os.fspath(path))      # a PathLike may give its name in bytes, as os.fsencode does
    except TypeError as exc:                     # a PathLike whose __fspath__ gives neither
        raise InputError(f"image path: {exc}", code=ec.INPUT_WRONG_TYPE) from None
    if not name:
        raise InputError("image path is empty", code=ec.INPUT_EMPTY)
    try:
        st = os.stat(name)    # one stat: the size and whether it is a regular file (is_file() was a second)
    except OSError as exc:
        raise InputError(f"cannot read image file {name!r}: {exc.strerror}", code=ec.INPUT_FILE_UNREADABLE) from None
    except ValueError as exc:     # a NUL byte, a lone surrogate: no file has that name (was an untyped ValueError)
        raise InputError(f"cannot read image file {name!r}: not a valid path ({exc})",
                         code=ec.INPUT_FILE_UNREADABLE) from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{name!r} is not a file", code=ec.INPUT_FILE_UNREADABLE)
    if st.st_size > limits.max_image_bytes:
        raise InputError(f"image file is {st.st_size} bytes, over the limit of {limits.max_image_bytes}",
                         code=ec.INPUT_TOO_LARGE, limit=limits.max_image_bytes)
    try:
        with open(name, "rb") as fh:
            data = fh.read(st.st_size + 1)     # one byte past the stat's size: a file longer than it said shows
            if len(data) > st.st_size:          # grown since the stat, or a /proc file whose stat says 0 bytes:
                data += fh.read(limits.max_image_bytes + 1 - len(data))      # never more than the limit
    except OSError as exc:      # permissions, a file gone since the stat, /proc/self/mem's EIO (was an untyped OSError)
        raise InputError(f"cannot read image file {name!r}: {exc.strerror or exc}",
                         code=ec.INPUT_FILE_UNREADABLE) from None
    if len(data) > limits.max_image_bytes:      # a file growing, or a /proc file whose stat says 0 bytes
        raise InputError(f"image file {name!r} holds over {limits.max_image_bytes} bytes (the limit), though its "
                         f"size said {st.st_size}", code=ec.INPUT_TOO_LARGE, limit=limits.max_image_bytes)
    return data


def decode(raw, limits, mode: str):
    """Return a PIL image in ``mode`` ("L" or "RGB")."""
    if isinstance(raw, np.ndarray):
        return _from_array(raw, limits, mode)
    if isinstance(raw, (str, os.PathLike)):
        raw = _read_path(raw, limits)
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise InputError(f"expected image bytes, a file path or a uint8 array, got {type(raw).__name__}",
                         code=ec.INPUT_WRONG_TYPE)
    raw = bytes(raw)
    if not raw:
        raise InputError("image is empty", code=ec.INPUT_EMPTY)
    if len(raw) > limits.max_image_bytes:
        raise InputError(f"image is {len(raw)} bytes, over the limit of {limits.max_image_bytes}",
                         code=ec.INPUT_TOO_LARGE, limit=limits.max_image_bytes)
    try:
        img = _open(raw)
    except Exception as exc:
        raise InputError(f"not a decodable PNG/JPEG/BMP image ({type(exc).__name__})", code=ec.INPUT_UNDECODABLE) from None
    if img is None:
        raise InputError("not a decodable PNG/JPEG/BMP image (UnidentifiedImageError)", code=ec.INPUT_UNDECODABLE)
    w, h = img.size
    if w <= 0 or h <= 0:
        raise InputError("image has no pixels", code=ec.INPUT_UNDECODABLE)
    if w * h > limits.max_image_pixels:
        raise InputError(f"image is {w}x{h} = {w * h} pixels, over the limit of {limits.max_image_pixels}",
                         code=ec.INPUT_TOO_MANY_PIXELS, limit=limits.max_image_pixels)
    try:
        img.load()
        turn = _orientation(img)
        img = to_8bit(img)
        img = img if img.mode == mode else img.convert(mode)     # same mode: convert() would only copy
    except Exception as exc:
        raise InputError(f"image data is truncated or corrupt ({type(exc).__name__}: {exc})",
                         code=ec.INPUT_UNDECODABLE) from None
    return img if turn is None else img.transpose(turn)


# EXIF orientation (tag 0x0112) -> the PIL transpose that shows the image upright, as a viewer
# does (PIL's Image.Transpose values; ImageOps.exif_transpose's table)
_UPRIGHT = {2: 0, 3: 3, 4: 1, 5: 5, 6: 4, 7: 6, 8: 2}


def _orientation(img) -> int | None:
    """The transpose a phone photo's EXIF orientation asks for, or None (no EXIF, upright, or an
    EXIF block PIL cannot parse: then the stored layout, as a viewer falls back to it)."""
    if "exif" not in img.info:          # most images: one dict lookup
        return None
    try:
        return _UPRIGHT.get(img.getexif().get(0x0112))
    except Exception:
        return None


_WIDE_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def to_8bit(img):
    """A decoded image in an 8-bit mode PIL converts to L/RGB without loss of meaning.

    PIL's own ``convert("L")`` of a 16-bit image clips every value over 255 to
    white; here 16-bit values are scaled (``round(v * 255 / 65535)``). Alpha is
    dropped through RGBA so palette transparency does not warn or mis-map.
    """
    Image = _pil()
    if img.mode in _WIDE_MODES:
        a = np.asarray(img)                      # any byte order; "I" is int32, taken as 16-bit samples
        if a.dtype.kind != "u":
            a = np.clip(np.nan_to_num(a), 0, 65535)
        v = a.astype(np.uint32)
        v += 128
        v //= 257                                # round(v * 255 / 65535), exactly (257 is odd: no ties)
        return Image.fromarray(v.astype(np.uint8), mode="L")
    if img.mode in ("P", "PA", "LA", "La", "RGBa"):
        return img.convert("RGBA")
    return img


def _check_array(arr: np.ndarray, limits) -> np.ndarray:
    """A uint8 HxW / HxWxC (C in 1, 3, 4) array within the pixel limit, HxWx1 as HxW; else ``InputError``."""
    if arr.dtype != np.uint8:
        raise InputError(f"image arrays must be uint8, got {arr.dtype}", code=ec.INPUT_WRONG_DTYPE)
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] in (3, 4))):
        raise InputError(f"image arrays must be HxW or HxWxC with C in 1,3,4; got shape {list(arr.shape)}",
                         code=ec.INPUT_WRONG_SHAPE)
    h, w = arr.shape[:2]
    if h == 0 or w == 0:
        raise InputError("image array has no pixels", code=ec.INPUT_EMPTY)
    if h * w > limits.max_image_pixels:
        raise InputError(f"image is {w}x{h} pixels, over the limit of {limits.max_image_pixels}",
                         code=ec.INPUT_TOO_MANY_PIXELS, limit=limits.max_image_pixels)
    return arr


def _from_array(arr: np.ndarray, limits, mode: str):
    arr = _check_array(arr, limits)
    src_mode = "L" if arr.ndim == 2 else ("RGB" if arr.shape[2] == 3 else "RGBA")
    return _pil().fromarray(np.ascontiguousarray(arr), mode=src_mode).convert(mode)


def decode_pixels(raw, limits, mode: str):
    """:func:`decode`, except that an array already in ``mode`` (HxW or HxWx1 for "L", HxWx3
    for "RGB") comes back as an HxWxC uint8 array, checked but not copied: PIL's
    ``fromarray(a).convert(mode)`` of such an array is the array itself, so the round trip
    (~50 µs on an 8x8 digit) is skipped. Any other input is a PIL image, as from ``decode``."""
    if isinstance(raw, np.ndarray):
        arr = _check_array(raw, limits)
        if arr.ndim == 2:
            if mode == "L":
                return arr[:, :, None]
        elif mode == "RGB" and arr.shape[2] == 3:
            return arr
        src_mode = "L" if arr.ndim == 2 else ("RGB" if arr.shape[2] == 3 else "RGBA")
        return _pil().fromarray(np.ascontiguousarray(arr), mode=src_mode).convert(mode)
    return decode(raw, limits, mode)


def image_size(img) -> tuple[int, int]:
    """``(width, height)`` of a PIL image or an HxW(xC) array."""
    if isinstance(img, np.ndarray):
        return int(img.shape[1]), int(img.shape[0])
    return img.size
