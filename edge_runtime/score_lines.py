"""One output line of ``edge-infer score`` (and of its Ray engine): an input's record and its
outcome as the JSONL line (``_line``) and its text (``_dump``: NaN or infinity is a failure)."""

from __future__ import annotations

import json

import numpy as np

from . import error_codes as ec
from .errors import EdgeRuntimeError
from .score_inputs import Record


def _jsonable(value):
    if isinstance(value, (np.generic,)):
        return value.item()
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def _line(record: Record, outcome) -> dict:
    head = {"index": record.index, "id": _jsonable(record.id), "line": getattr(record, "line", None)}
    if isinstance(outcome, EdgeRuntimeError):
        err = outcome.to_dict()
        return {**head, "ok": False, "error": {k: err[k] for k in ("type", "code", "message") if k in err}}
    from .draw import summarize         # a segmentation mask: its shape and per-class counts, not every pixel

    return {**head, "ok": True, "result": summarize(outcome.to_dict())}


def _dump(record: Record, outcome) -> tuple[dict, str]:
    line = _line(record, outcome)
    try:
        return line, json.dumps(line, ensure_ascii=False, allow_nan=False, default=str)
    except ValueError:      # NaN/inf in a result: a corrupt output is a failure, never a silent "NaN"
        line = {"index": record.index, "id": line["id"], "line": line["line"], "ok": False,
                "error": {"type": "InferenceRuntimeError", "code": ec.RESULT_NONFINITE,
                          "message": "the model produced NaN or infinity"}}
        return line, json.dumps(line, ensure_ascii=False)
