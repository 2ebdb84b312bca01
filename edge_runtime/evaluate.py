"""Labelled evaluation of an artifact: accuracy and latency through ``infer``.

Data: an image folder with one sub-folder per label (``held_out/7/0042.png``)
or a TSV of ``text<TAB>label`` (the label as a name or an index into the
artifact's labels; the text is everything before the last tab).

No row is dropped without a word. A row that cannot be evaluated is counted
by reason in the report's ``skipped`` (``count``, ``by_reason`` and the first
examples per reason, with the line number or the path); the reasons:

- TSV: ``no_tab`` (no tab on the line), ``empty_text``, ``unknown_label``
  (neither a label name nor an index), ``bad_encoding`` (not UTF-8),
  ``blank_line``;
- image folder: ``unknown_label`` (an image in a sub-folder whose name is no
  label: one per image), ``not_an_image`` (a file in a label folder without
  a PNG/JPEG/BMP suffix), ``not_in_label_folder`` (an image directly in DATA),
  ``nested_folder`` (a file deeper than ``<label>/<file>``). Hidden files and
  other files directly in DATA (a README) are not rows.

The first line of a TSV whose label column is no label is its header
(``header`` in the report): not a sample, not a skip, not counted against
``limit``. ``limit`` = the first N evaluable samples; skipped rows met before
the Nth are reported, rows after it are not read.

``accuracy`` = correct / ``samples``, where ``samples`` counts the rows that
were run (an inference error counts as a wrong answer and is listed under
``errors``). Skipped rows are outside it and reported beside it. When no row
can be evaluated, ``evaluate`` raises ``InputError`` (exit 2):
``eval_data_empty`` (nothing found) or ``eval_nothing_evaluated`` (every row
skipped, the reasons named).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from . import error_codes as ec
from .errors import EdgeRuntimeError, InputError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
EXAMPLES_PER_REASON = 5


@dataclass
class Skipped:
    """Rows that were not evaluated: counts by reason and the first examples of each."""

    by_reason: dict = field(default_factory=dict)
    examples: list = field(default_factory=list)

    def add(self, reason: str, where: dict, detail: str) -> None:
        n = self.by_reason.get(reason, 0)
        self.by_reason[reason] = n + 1
        if n < EXAMPLES_PER_REASON:
            self.examples.append({"reason": reason, **where, "detail": detail})

    @property
    def count(self) -> int:
        return sum(self.by_reason.values())

    def to_dict(self) -> dict:
        return {"count": self.count, "by_reason": dict(sorted(self.by_reason.items(), key=lambda kv: -kv[1])),
                "examples": list(self.examples)}

    def summary(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.by_reason.items(), key=lambda kv: -kv[1]))


def resolve_label(truth: str, labels) -> str | None:
    """The artifact's label for ``truth`` (a name, or an index into ``labels``); None if it is neither.
    ``labels`` None: no check (the raw label)."""
    if labels is None:
        return truth
    if truth in labels:
        return truth
    if truth.isdigit() and int(truth) < len(labels):
        return labels[int(truth)]
    return None


def _clip(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n] + "…"


def _tsv_rows(p: Path, labels, skipped: Skipped, header: dict) -> Iterator[tuple[object, str, dict]]:
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc.strerror or exc}", code=ec.EVAL_DATA_UNREADABLE) from None
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()                              # the final newline ends the last line; it starts none
    for number, raw in enumerate(raw_lines, start=1):
        where = {"line": number}
        raw = raw[:-1] if raw.endswith(b"\r") else raw
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            skipped.add("bad_encoding", where, f"not UTF-8 ({exc.reason} at byte {exc.start})")
            continue
        if not line.strip():
            skipped.add("blank_line", where, "")
            continue
        text, sep, label = line.rpartition("\t")
        if not sep:
            skipped.add("no_tab", where, _clip(line))
            continue
        label = label.strip()
        truth = resolve_label(label, labels)
        if truth is None and number == 1:
            header.update(line=number, text=_clip(line, 200))
            continue
        if not text.strip():
            skipped.add("empty_text", where, _clip(line))
            continue
        if truth is None:
            skipped.add("unknown_label", where, f"label {label!r} is not a label of the artifact: {_clip(line)}")
            continue
        yield text, truth, where


def _folder_rows(p: Path, labels, skipped: Skipped) -> Iterator[tuple[object, str, dict]]:
    for entry in sorted(p.iterdir()):
        if entry.name.startswith("."):
            continue
        if not entry.is_dir():
            if entry.suffix.lower() in IMAGE_SUFFIXES:
                skipped.add("not_in_label_folder", {"path": entry.name}, "an image directly in the data folder has "
                                                                          "no label")
            continue
        truth = resolve_label(entry.name, labels)
        for f in sorted(entry.rglob("*")):
            rel = f.relative_to(p)
            if any(part.startswith(".") for part in rel.parts) or f.is_dir():
                continue
            where = {"path": rel.as_posix()}
            if len(rel.parts) > 2:
                skipped.add("nested_folder", where, "deeper than <label>/<file>")
            elif f.suffix.lower() not in IMAGE_SUFFIXES:
                skipped.add("not_an_image", where, f"suffix {f.suffix or '(none)'!r} is not "
                                                   f"{'/'.join(IMAGE_SUFFIXES)}")
            elif truth is None:
                skipped.add("unknown_label", where, f"folder {entry.name!r} is not a label of the artifact")
            else:
                yield str(f), truth, where


def read_labelled(path, labels=None, limit: int | None = None):
    """(samples [(raw, label, where)], Skipped, header dict or None), reading at most ``limit`` samples."""
    p = Path(path)
    skipped = Skipped()
    header: dict = {}
    if p.is_dir():
        rows = _folder_rows(p, labels, skipped)
    elif p.is_file():
        rows = _tsv_rows(p, labels, skipped, header)
    else:
        raise InputError(f"evaluation data {p} does not exist", code=ec.EVAL_DATA_MISSING)
    samples = []
    for row in rows:
        samples.append(row)
        if limit is not None and len(samples) >= limit:
            break
    return samples, skipped, (header or None)


def labelled_samples(path) -> list[tuple[object, str]]:
    """Every (raw input, label) of ``path``, labels unchecked (see ``read_labelled`` for the skipped rows)."""
    samples, _, _ = read_labelled(path)
    if not samples:
        raise InputError(f"{path}: no labelled samples found", code=ec.EVAL_DATA_EMPTY)
    return [(raw, label) for raw, label, _ in samples]


def evaluate(rt, path, limit: int | None = None) -> dict:
    if limit is not None and limit < 1:
        raise InputError(f"limit must be at least 1, got {limit}", code=ec.INPUT_INVALID)
    labels = list(getattr(rt.task, "labels", None) or [])
    samples, skipped, header = read_labelled(path, labels, limit)
    if not samples:
        if not skipped.count:
            what = "<label>/<image> files" if Path(path).is_dir() else "text<TAB>label lines"
            raise InputError(f"{path}: no {what} found", code=ec.EVAL_DATA_EMPTY)
        first = skipped.examples[0]
        raise InputError(f"{path}: nothing to evaluate, all {skipped.count} rows skipped ({skipped.summary()}); "
                         f"first: {first.get('path') or 'line ' + str(first.get('line'))}: {first['detail']}"[:600],
                         code=ec.EVAL_NOTHING_EVALUATED, skipped=skipped.to_dict())
    correct, latencies = 0, []
    errors: dict[str, int] = {}
    error_examples: list[dict] = []
    for raw, truth, where in samples:
        try:
            res = rt.infer(raw)
        except EdgeRuntimeError as exc:
            errors[exc.code] = errors.get(exc.code, 0) + 1
            if len(error_examples) < EXAMPLES_PER_REASON:
                error_examples.append({"code": exc.code, **where, "message": exc.message[:200]})
            continue
        latencies.append(res.latency_ms)
        correct += res.prediction == truth
    n = len(samples)
    lat = np.asarray(latencies, dtype=float)

    def pct(q):
        return float(np.percentile(lat, q)) if lat.size else None

    return {
        "samples": n,
        "correct": int(correct),
        "accuracy": correct / n,
        "errors": errors,
        "error_examples": error_examples,
        "skipped": skipped.to_dict(),
        "header": header,
        "limit": limit,
        "latency_ms": {"p50": pct(50), "p95": pct(95), "p99": pct(99),
                       "mean": float(lat.mean()) if lat.size else None},
        "device": rt.device,
        "target": rt.variant["target"],
        "parity": {k: rt.variant["parity"].get(k) for k in ("metric", "value", "min", "samples", "budget")
                   if k in rt.variant["parity"]},
    }
