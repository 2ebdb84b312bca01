"""One output line of ``edge-infer score`` (and of its Ray engine): an input's record and its
outcome as the JSONL line (``_line``) and its text (``_dump``: NaN or infinity is a failure).

The text is compact JSON, written by orjson (in C) when it is installed (the ``serve`` extra
installs it) and by the standard library otherwise; both read back to the same values. A MiniLM
embedding line took 225 µs through ``json`` (384 float reprs) and 12 µs through orjson (2-core
Xeon, 2026-12-06): on a CPU-bound batch job that is CPU taken from the model (``score`` / the raw
AsyncInferQueue 0.85 with ``json``)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from . import error_codes as ec
from .errors import EdgeRuntimeError
from .score_inputs import Record


def _jsonable(value):
    """An id as JSON holds it: a numpy scalar as its value, NaN or infinity (the caller's id, not a
    result) as the string JSON's readers spell it (``"NaN"``, ``"Infinity"``, ``"-Infinity"``, as the
    JSONL reader does), anything else but a scalar as its ``str``."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def _line(record: Record, outcome) -> dict:
    head = {"index": record.index, "id": _jsonable(record.id), "line": getattr(record, "line", None)}
    if isinstance(outcome, EdgeRuntimeError):
        err = outcome.to_dict()
        return {**head, "ok": False, "error": {k: err[k] for k in ("type", "code", "message") if k in err}}
    from .draw import summarize         # a segmentation mask: its shape and per-class counts, not every pixel

    return {**head, "ok": True, "result": summarize(outcome.to_dict())}


_orjson: Any
try:
    import orjson as _orjson
except ImportError:                  # the standard library writes the same values
    _orjson = None


def _default(value):
    """What ``json.dumps(default=str)`` writes for a value JSON has no type for: a float or int
    subclass (numpy's float64) as its number, anything else (numpy's float32) as its ``str``."""
    if isinstance(value, float):
        return float(value)
    if isinstance(value, int):
        return int(value)
    return str(value)


def _finite(value) -> bool:
    """No NaN or infinity anywhere in ``value`` (nested dicts and lists): a list of numbers is one
    ``sum`` (finite unless an element is not, or the sum overflows: then each value is checked),
    anything else is walked."""
    t = type(value)
    if t is float:
        return math.isfinite(value)
    if t is dict:
        return all(_finite(v) for v in value.values())
    if t is list or t is tuple:
        try:
            if math.isfinite(sum(value)):
                return True
        except Exception:   # not all numbers (a top-k list of dicts; numpy values broadcasting)
            pass
        return all(_finite(v) for v in value)
    if isinstance(value, (float, np.floating)):       # numpy's float32 too, which json writes as "inf"
        return bool(np.isfinite(value))
    return True


def _text(line: dict) -> str | None:
    """The line as compact JSON; None when it holds NaN or infinity (a numpy float among them:
    ``json.dumps(default=str)`` would write it as the string "nan")."""
    if not _finite(line):
        return None
    if _orjson is not None:
        try:
            return _orjson.dumps(line, default=_default, option=_orjson.OPT_NON_STR_KEYS).decode("utf-8")
        except TypeError:   # an int beyond 64 bits, a lone surrogate: the standard library writes those
            pass
    try:
        return json.dumps(line, ensure_ascii=False, allow_nan=False, default=str, separators=(",", ":"))
    except ValueError:
        return None


_SURROGATE = re.compile("[\ud800-\udfff\x85\u2028\u2029]")


def _utf8_safe(text: str) -> str:
    """``text`` (a JSON line) encodable as strict UTF-8: each lone surrogate (an id ``"\\ud800"`` in
    the input, an undecodable CSV byte kept by ``surrogateescape``) written as its JSON escape
    ``\\udXXX``, which reads back to the same string. It can only stand inside a JSON string (the
    rest of the line is ASCII), and orjson's text never holds one. So are U+0085, U+2028 and U+2029
    (in an id, a label, an error's message): Python's ``str.splitlines`` and JavaScript before ES2019
    end a line there, so one output line read two."""
    if text.isascii():          # O(1) for a str CPython knows to be ASCII: the common line
        return text
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _dump(record: Record, outcome) -> tuple[dict, str]:
    """The line and its text: valid UTF-8, strict JSON (no NaN), whatever the id holds."""
    line = _line(record, outcome)
    text = _text(line)
    if text is None:        # NaN/inf in a result: a corrupt output is a failure, never a silent "NaN"
        line = {"index": record.index, "id": line["id"], "line": line["line"], "ok": False,
                "error": {"type": "InferenceRuntimeError", "code": ec.RESULT_NONFINITE,
                          "message": "the model produced NaN or infinity"}}
        text = json.dumps(line, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return line, _utf8_safe(text)
