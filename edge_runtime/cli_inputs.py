"""The inputs of ``edge-infer infer``: ``--limit KEY=VALUE`` and the readers of ``--text-file``/stdin,
``--input`` JSON and ``.npy``/``.npz`` arrays, each checked against the call's limits before it is read
(``cli_infer``). ``edge_runtime.cli`` re-exports ``_read_json_input``, its old import path."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from . import error_codes as ec
from .errors import InputError
from .limits import DEFAULT_LIMITS, Limits, deadline_value, json_depth


def ms_value(text: str, what: str) -> int | float:
    """A deadline given on the command line, as the API takes it (``deadline_value``: any positive
    number of ms, 2.5 too); before 2026-12-07 ``--deadline-ms 2.5`` was click's usage error and
    ``--limit deadline_ms=2.5`` "must be a positive integer", while ``infer(deadline_ms=2.5)`` ran."""
    try:
        number: int | float = int(text.strip())
    except ValueError:
        try:
            number = float(text.strip())
        except ValueError:
            raise InputError(f"{what} must be a positive number of milliseconds, got {text!r}",
                             code=ec.LIMIT_INVALID) from None
    return deadline_value(number, InputError, what)


def _limit_overrides(pairs) -> dict:
    """``--limit KEY=VALUE`` (repeatable): per-call limits, checked for syntax and known
    keys here and, once the artifact is loaded, never above its own limits."""
    out: dict[str, int | float] = {}
    known = sorted(Limits().to_dict())
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InputError(f"--limit wants KEY=VALUE, got {pair!r} (valid keys: {', '.join(known)})",
                             code=ec.INPUT_INVALID)
        if key not in known:
            raise InputError(f"unknown limit {key!r} (valid keys: {', '.join(known)})", code=ec.LIMIT_UNKNOWN)
        if key == "deadline_ms":        # any positive number of ms, as the API's deadline_ms (2.5 too)
            number: int | float = ms_value(value, "--limit deadline_ms")
        else:
            try:
                number = int(value.strip())
            except ValueError:
                raise InputError(f"limit {key} must be a positive integer, got {value!r}",
                                 code=ec.LIMIT_INVALID) from None
        if out.get(key, number) != number:      # the last one was kept: `=3` then `=100` dropped the lower, silently
            raise InputError(f"--limit {key} given more than once with different values: give it once",
                             code=ec.INPUT_INVALID)
        out[key] = number
    Limits().merged(out)            # positive integers only
    return out


def _file_size(path: str, lim: Limits) -> int:
    try:
        size = Path(path).stat().st_size
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}", code=ec.INPUT_FILE_UNREADABLE) from None
    if size > lim.max_request_bytes:
        raise InputError(f"{path} is {size} bytes, over the request limit of {lim.max_request_bytes}",
                         code=ec.INPUT_TOO_LARGE, limit=lim.max_request_bytes)
    return size


def _read_capped(source: str, cap: int, what: str) -> bytes:
    """The bytes of file ``source`` or ``-`` (stdin), at most ``cap`` read: a longer stream is refused
    without reading the rest."""
    name = "stdin" if source == "-" else source
    try:
        if source == "-":
            stream = getattr(sys.stdin, "buffer", None)     # None: the process has no stdin (``<&-``)
            if stream is None:
                raise OSError("stdin is closed")
            data = stream.read(cap + 1)
        else:
            with open(source, "rb") as fh:
                data = fh.read(cap + 1)
    except (OSError, ValueError) as exc:        # ValueError: a closed stream
        raise InputError(f"cannot read {name}: {getattr(exc, 'strerror', None) or exc}",
                         code=ec.INPUT_FILE_UNREADABLE) from None
    if len(data) > cap:
        raise InputError(f"{what} from {name} is over the {'request' if what == 'text' else 'image'} limit of {cap} "
                         "bytes", code=ec.INPUT_TOO_LARGE, limit=cap)
    return data


def _read_image_stdin(lim: Limits) -> bytes:
    """``--image -``: the encoded image from stdin, at most the image (and request) limit read. Before
    2026-12-07 ``-`` was looked for as a file named '-' (``--text -`` already read stdin)."""
    data = _read_capped("-", min(lim.max_image_bytes, lim.max_request_bytes), "image")
    if not data:
        raise InputError("--image -: stdin was empty (pipe an encoded PNG/JPEG/BMP into it)", code=ec.INPUT_INVALID)
    return data


def _read_text(source: str, lim: Limits) -> str:
    """``--text-file F`` or ``-`` (stdin): UTF-8, at most the request limit read (a longer
    stream is refused without reading the rest); one trailing newline is dropped. The
    character limit is the runtime's, as for ``--text``."""
    name = "stdin" if source == "-" else source
    data = _read_capped(source, lim.max_request_bytes, "text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"text from {name} is not UTF-8: {exc}", code=ec.INPUT_BAD_ENCODING) from None
    text = text.removeprefix("\ufeff")
    return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text


def _nesting(text: bytes, limit: int) -> None:
    """Refuse a document whose brackets nest deeper than ``limit``; brackets inside strings
    are text, not nesting (a short string of 40 ``[`` is a valid input)."""
    cur = 0
    in_str = escaped = False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == 0x5C:        # backslash
                escaped = True
            elif ch == 0x22:        # closing quote
                in_str = False
        elif ch == 0x22:
            in_str = True
        elif ch == 0x5B or ch == 0x7B:      # [ {
            cur += 1
            if cur > limit:
                raise _too_deep(limit)
        elif ch == 0x5D or ch == 0x7D:      # ] }
            cur -= 1


def _too_deep(limit: int) -> InputError:
    return InputError(f"JSON nested deeper than {limit} levels", code=ec.INPUT_TOO_DEEP)


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list) -> dict:
    """One JSON object, refused when it names a key twice (``{"x": [...], "x": [...]}`` fed the last)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


def _read_json_input(path: str, lim: Limits = DEFAULT_LIMITS):
    _file_size(path, lim)
    text = Path(path).read_bytes()
    _nesting(text, lim.max_json_depth)      # before json builds it: its recursion would crash
    try:
        # a BOM (Notepad writes one) is not content, as for --text-file
        data = json.loads(text.decode("utf-8-sig"), object_pairs_hook=_unique_keys)
    except RecursionError:
        raise _too_deep(lim.max_json_depth) from None
    except _DuplicateKey as exc:
        raise InputError(f"{path}: key {exc.args[0]!r} is given twice in one object (which one is meant is "
                         "unknown: json keeps the last)", code=ec.INPUT_BAD_JSON) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path} is not valid JSON: {exc}", code=ec.INPUT_BAD_JSON) from None
    json_depth(data, lim.max_json_depth)
    if isinstance(data, dict) and set(data) == {"inputs"}:
        data = data["inputs"]
    return data


def _npy_header(fh, what: str):
    """(shape, dtype) from a ``.npy`` header, before any data is read."""
    from numpy.lib import format as npf

    version = npf.read_magic(fh)
    if version == (1, 0):
        shape, _, dtype = npf.read_array_header_1_0(fh)
    elif version == (2, 0):
        shape, _, dtype = npf.read_array_header_2_0(fh)
    else:
        raise ValueError(f"unsupported .npy format version {version}")
    if dtype.hasobject:
        raise InputError(f"{what} holds Python objects; only plain numeric arrays are loaded (never pickles)",
                         code=ec.INPUT_BAD_FILE)
    return shape, dtype


def _read_arrays(path: str, lim: Limits, input_names: list[str]):
    """``.npy`` (one array, single-input models) or ``.npz`` (named arrays). The file
    size and every array's declared size (from its header, so a compressed member
    cannot expand past the limit) are checked before loading; ``allow_pickle=False``."""
    import math
    import zipfile

    import numpy as np

    _file_size(path, lim)
    npz = path.lower().endswith(".npz")
    if not npz and len(input_names) != 1:
        raise InputError(f"{path} holds one array but the model has {len(input_names)} inputs "
                         f"({', '.join(input_names)}): give a .npz with one named array each",
                         code=ec.INPUT_WRONG_NAMES)
    total = 0
    try:
        if npz:
            with zipfile.ZipFile(path) as zf:
                seen: set[str] = set()
                for info in zf.infolist():
                    if not info.filename.endswith(".npy"):
                        raise InputError(f"{path}: member {info.filename!r} is not an array (.npy)",
                                         code=ec.INPUT_BAD_FILE)
                    if info.filename in seen:   # numpy reads the last of them; which one was meant is unknown
                        raise InputError(f"{path}: array {info.filename[:-4]!r} is in the archive twice",
                                         code=ec.INPUT_BAD_FILE)
                    seen.add(info.filename)
                    with zf.open(info) as fh:
                        shape, dtype = _npy_header(fh, f"{path}:{info.filename}")
                    total += math.prod(shape) * dtype.itemsize
        else:
            with open(path, "rb") as fh:
                shape, dtype = _npy_header(fh, path)
            total = math.prod(shape) * dtype.itemsize
        if total > lim.max_request_bytes:
            raise InputError(f"{path} holds {total} bytes of arrays, over the request limit of "
                             f"{lim.max_request_bytes}", code=ec.INPUT_TOO_LARGE, limit=lim.max_request_bytes)
        if npz:
            with np.load(path, allow_pickle=False) as data:
                return {name: data[name] for name in data.files}
        return np.load(path, allow_pickle=False)
    except InputError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path} is not a readable {'.npz' if npz else '.npy'} file: {exc}",
                         code=ec.INPUT_BAD_FILE) from None
