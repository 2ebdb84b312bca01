"""The JSONL reader of ``edge-infer score``: one record a non-blank line, and the id of a line
refused unread (over-long: ``_overlong_id``; not UTF-8: ``_undecodable_id``). See ``score_inputs``."""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path
from typing import Any, Iterator

from . import error_codes as ec
from .errors import InputError
from .score_images import _image_path, image_base
from .score_records import Record, _lines, _Overlong, _too_long


def read_jsonl(path: Path, cap: int, field: str, id_field: str | None) -> Iterator[Record]:
    base = image_base(path)
    id_field = id_field or "id"
    for i, line, number in _jsonl_lines(path, cap):
        if isinstance(line, _Overlong):         # not read, but its id is found where it can be
            yield Record(i, _json_id(_overlong_id(line, id_field)), error=_too_long(cap), line=number)
            continue
        try:
            obj = json.loads(line)
        except UnicodeDecodeError as exc:       # not UTF-8: refused, with its id when it parses without that byte
            yield Record(i, _json_id(_undecodable_id(line, id_field)), error=InputError(
                f"line {number} is not valid UTF-8 ({exc.reason} at byte {exc.start})", code=ec.INPUT_BAD_ENCODING),
                line=number)
            continue
        except (ValueError, RecursionError) as exc:
            yield Record(i, None, error=InputError(f"line {number} is not JSON: {exc}"[:300], code=ec.INPUT_BAD_JSON),
                         line=number)
            continue
        if not isinstance(obj, dict):
            yield Record(i, None, error=InputError(f"line {number} is a JSON {type(obj).__name__}, not an object",
                                                   code=ec.INPUT_BAD_JSON), line=number)
            continue
        twice = _twice(line, (field, id_field))
        rid = _json_id(obj.get(id_field)) if id_field not in twice else None
        if twice:
            yield Record(i, rid, error=InputError(
                f"line {number} has {' and '.join(repr(k) for k in twice)} more than once: which one is meant is "
                f"unclear (JSON readers differ: the last, the first, an error)", code=ec.INPUT_BAD_JSON), line=number)
            continue
        if field not in obj:
            yield Record(i, rid, error=InputError(f"line {number} has no field {field!r}", code=ec.INPUT_FIELD_MISSING),
                         line=number)
            continue
        yield Record(i, rid, _image_path(obj[field], field, base), line=number)   # relative to the file


def _twice(line: bytes, keys: tuple[str, ...]) -> list[str]:
    """The ``keys`` the line's top-level object has more than once (``json.loads`` keeps the last one
    silently). Parsed again, keeping every member, only when a key's text (any of its characters
    possibly ``\\u``-escaped) is there twice: the common line costs one regex scan."""
    if all(len(_key_text(k).findall(line)) < 2 for k in keys):
        return []
    top: list = []

    def pairs(members):             # called for each object as it closes: the top-level one last
        top[:] = [m[0] for m in members]
        return dict(members)

    json.loads(line, object_pairs_hook=pairs)
    return [k for k in dict.fromkeys(keys) if top.count(k) > 1]


@functools.lru_cache(maxsize=16)
def _key_text(key: str) -> re.Pattern:
    """``"key"`` as a JSON line may spell it: each character as itself or as its ``\\uXXXX`` escape
    (a surrogate pair beyond the BMP), any case of hex."""
    def hexes(n: int) -> str:
        return "".join(f"[{c}{c.upper()}]" if c.isalpha() else c for c in f"{n:04x}")

    alts = []
    for ch in key:
        units = [ord(ch)] if ord(ch) < 0x10000 else list(divmod(ord(ch) - 0x10000, 0x400))
        if len(units) == 2:
            units = [0xD800 + units[0], 0xDC00 + units[1]]
        esc = "".join(r"\\u" + hexes(u) for u in units)
        lit = re.escape(json.dumps(ch, ensure_ascii=False)[1:-1])
        alts.append(f"(?:{lit}|{esc}" + (r"|\\/" if ch == "/" else "") + ")")
    return re.compile(('"' + "".join(alts) + '"').encode("utf-8", "surrogateescape"))


def _json_id(rid):
    """A JSONL id as the output writes it: a string, number, bool or null as it is; NaN, infinity
    (the caller's data, not a failed result) and anything else as its JSON text."""
    if isinstance(rid, float) and not math.isfinite(rid):
        return json.dumps(rid)
    if not isinstance(rid, (str, int, float, bool)) and rid is not None:
        return json.dumps(rid)[:200]
    return rid


_MISSING = object()
_WS = " \t\r\n"


def _members(text: str, i: int, id_field: str, whole: bool):
    """The value of top-level member ``id_field`` in the JSON object members starting at ``text[i]``
    (just after ``{``, or at a member's key), walked one ``"key": value`` at a time; ``_MISSING``
    when the walk stops first (a value cut off at the end of ``text``, anything not JSON). ``whole``:
    the members must run to the object's closing ``}`` and the end of ``text`` (a line's tail), or the
    find does not count (a key of a nested object, or inside a string)."""
    dec = json.JSONDecoder()
    found: Any = _MISSING
    n = len(text)
    while True:
        while i < n and text[i] in _WS:
            i += 1
        if i >= n or text[i] != '"':
            break
        try:
            key, i = dec.raw_decode(text, i)             # a string: text[i] is its quote
            while i < n and text[i] in _WS:
                i += 1
            if i >= n or text[i] != ":":
                break
            i += 1
            while i < n and text[i] in _WS:
                i += 1
            value, i = dec.raw_decode(text, i)
        except (ValueError, RecursionError):
            break
        while i < n and text[i] in _WS:
            i += 1
        if i >= n:                  # a value at the very end may be cut short (123 of 12345)
            break
        if key == id_field and found is _MISSING:
            found = value
            if not whole:
                return found
        if text[i] == ",":
            i += 1
            continue
        if whole and text[i] == "}" and not text[i + 1:].strip(_WS):
            return found
        break
    return _MISSING if whole else found


def _overlong_id(line: _Overlong, id_field: str):
    """The id of a JSONL line too long to parse: the top-level ``id_field`` among the members its
    first bytes hold whole, else among the last members, found in its tail from an unescaped
    ``"id_field":`` that the members run on from to the object's end (a nested object's key, or the
    text of a string, does not). None when neither holds it."""
    head = line.head.decode("utf-8", "surrogateescape")
    start = len(head) - len(head.lstrip(_WS))
    if head[start:start + 1] == "{":
        found = _members(head, start + 1, id_field, whole=False)
        if found is not _MISSING:
            return found
    tail = line.tail.decode("utf-8", "surrogateescape")
    key = json.dumps(id_field, ensure_ascii=False)
    at = tail.rfind(key)
    while at > 0:
        slashes = len(tail[:at]) - len(tail[:at].rstrip("\\"))
        if slashes < at and slashes % 2 == 0:        # the key's quote is no string's escaped quote
            found = _members(tail, at, id_field, whole=True)
            if found is not _MISSING:
                return found
        at = tail.rfind(key, 0, at)
    return None


def _undecodable_id(line: bytes, id_field: str):
    """The id of a JSONL line that is not UTF-8, read with its bad bytes as lone surrogates (as a
    CSV's); None when it is no JSON object even so."""
    try:
        obj = json.loads(line.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError):
        return None
    return obj.get(id_field) if isinstance(obj, dict) else None


def _jsonl_lines(path: Path, cap: int) -> Iterator[tuple[int, bytes | _Overlong, int]]:
    """``_lines`` without the blank ones (no record), each with its record index."""
    i = 0
    for line, number in _lines(path, cap):
        if isinstance(line, bytes) and not line.strip():
            continue
        yield i, line, number
        i += 1
