"""One output line of ``edge-infer shadow``: both sides' outcomes, their comparison and the
input's preview (``shadow_line``), and its text (``_dumps``: a side with NaN or infinity fails)."""

from __future__ import annotations

import json
from typing import Any

from . import error_codes as ec
from .errors import EdgeRuntimeError
from .score_lines import _finite, _jsonable, _text, _utf8_safe
from .shadow_compare import compare
from .shadow_truth import Truth, in_a_space

INPUT_PREVIEW_CHARS = 300


def _side(outcome) -> tuple[dict, dict | None]:
    """(the line's side, the full result dict for the comparison)."""
    if isinstance(outcome, EdgeRuntimeError):
        err = outcome.to_dict()
        return {"ok": False, "error": {k: err[k] for k in ("type", "code", "message") if k in err}}, None
    from .draw import summarize

    full = outcome.to_dict()
    return {"ok": True, "result": summarize(dict(full))}, full


def _preview(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= INPUT_PREVIEW_CHARS else value[:INPUT_PREVIEW_CHARS] + "…"
    return None


def truth_fields(truth) -> dict:
    """The line's truth: ``truth`` (A's label text), ``truth_id`` (A's class id, what accuracy
    compares) and, only where B's labels differ from A's, ``truth_id_b`` (``shadow_truth.Truth``)."""
    if not isinstance(truth, Truth):
        return {"truth": truth}         # None: unlabelled
    out = {"truth": truth.text, "truth_id": truth.a}
    if truth.b != truth.a:
        out["truth_id_b"] = truth.b
    return out


def shadow_line(record, out_a, out_b, truth, agree_at: float | None, b_to_a: list[int] | None = None) -> dict:
    """One output line from the two outcomes (``InferenceResult`` or ``EdgeRuntimeError``);
    ``truth`` a ``shadow_truth.Truth`` or None; ``b_to_a`` A's class id of each of B's classes where
    their labels differ (``shadow_truth.a_classes``): the comparison sees B's classes as A's."""
    side_a, full_a = _side(out_a)
    side_b, full_b = _side(out_b)
    head = {"index": record.index, "id": _jsonable(record.id), "line": getattr(record, "line", None)}
    cmp = compare(full_a, in_a_space(full_b, b_to_a), agree_at) if full_a is not None and full_b is not None else None
    if cmp is not None:
        agree: bool | None = bool(cmp["agree"])
    elif full_a is None and full_b is None:
        agree = None
    else:
        agree = False
    line = {**head, "ok": cmp is not None, "agree": agree, **truth_fields(truth), "input": _preview(record.value),
            "a": side_a, "b": side_b, "compare": cmp}
    if cmp is None:
        line["error"] = (side_a if not side_a["ok"] else side_b)["error"]
    return line


def _dumps(line: dict) -> tuple[str, dict]:
    """(the JSON text, the line as written): strict UTF-8 JSON as ``score`` writes it
    (``score_lines._text`` and ``_utf8_safe``: compact, a lone surrogate in an id or the input
    written as its ``\\uXXXX`` escape, a NaN id already the string ``"NaN"``). A side whose result
    holds NaN or infinity is written as that side's failure (``result_nonfinite``), never as a
    silent "NaN"; NaN elsewhere (the comparison) fails the comparison, never the writer."""
    text = _text(line)
    if text is not None:
        return _utf8_safe(text), line
    line = dict(line)
    for key in ("a", "b"):
        if line[key].get("ok") and not _finite(line[key]):
            line[key] = _nonfinite("the model produced NaN or infinity")
    a_ok, b_ok = line["a"]["ok"], line["b"]["ok"]
    error = (line["a"] if not a_ok else line["b"] if not b_ok
             else _nonfinite("the comparison of A and B produced NaN or infinity"))["error"]
    line.update(ok=False, compare=None, agree=None if not a_ok and not b_ok else False, error=error)
    text = _text(line)
    if text is None:        # NaN outside the sides and the comparison (the input holds no float): never
        text = json.dumps(line, ensure_ascii=False, default=str, separators=(",", ":"))
    return _utf8_safe(text), line


def _nonfinite(message: str) -> dict:
    return {"ok": False, "error": {"type": "InferenceRuntimeError", "code": ec.RESULT_NONFINITE, "message": message}}
