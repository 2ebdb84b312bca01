"""``edge-infer shadow A B INPUT``: the same inputs through two inference versions, diffed.

A and B are two artifacts, or one artifact on two devices or variants
(``--device-a onnxruntime --device-b openvino``). Every input ``score`` reads
(``score_inputs``: JSONL, CSV/TSV, plain text, an image folder) goes through
both, one ``infer()`` each, the side that runs first alternating per input so
neither always meets a warm cache. Each input is one JSONL line, in input order::

    {"index", "id", "line", "ok", "agree", "truth", "input",
     "a": {"ok": true, "result": {...}} | {"ok": false, "error": {...}}, "b": {...},
     "compare": {"kind", "agree", "badness", ...task figures} | null, "error"?}

- ``ok``: both sides answered; ``agree``: the task's comparison says they agree
  (``shadow_compare``); one side failing is a disagreement; both failing is
  ``agree`` null (not compared, counted as ``both_failed``);
- ``truth``: the input's label when it has one (an image folder's ``<label>/``,
  a CSV/TSV/JSONL ``--label-field`` column, default ``label``), resolved against
  A's labels like ``edge-infer eval`` does (a name, or an index into the labels);
- ``input``: the text (first 300 characters) or the image path, for the report.

Nothing lost: the output and its job record are ``score``'s (``score.prepare_output``,
``score.job_identity``, ``OUT.job.json`` written atomically before the first line).
The job record is A's, with B's artifact seal, variant, device and the agreement
threshold in its options, so ``--resume`` refuses (``score_output_mismatch``) another
input, either side's artifact, variant or device; a partial last line is cut and
re-run. The summary is computed over the whole output, resumed lines included.

The summary: agreement = agreeing inputs / compared inputs (compared: at least one
side answered); the flip matrix (classifiers: A's label × B's label, counts); the
N worst inputs (highest ``badness``: a failure on one side, then the task's own
figure: the lowest margin, cosine, F1...); each side's accuracy over the labelled
inputs (a failure counts as wrong); p50/p99 of each side's ``latency_ms`` (one
``infer()``: raw input in, result out).
"""

from __future__ import annotations

import heapq
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from . import error_codes as ec
from .errors import EdgeRuntimeError, InputError, ParityError
from .shadow_compare import compare

INPUT_PREVIEW_CHARS = 300
FAILED_BADNESS = 10.0       # one side failed: worse than any figure


def _latency(values: list) -> dict:
    lat = np.asarray(values, dtype=float)
    if not lat.size:
        return {"n": 0, "p50": None, "p99": None, "mean": None}
    return {"n": int(lat.size), "p50": round(float(np.percentile(lat, 50)), 3),
            "p99": round(float(np.percentile(lat, 99)), 3), "mean": round(float(lat.mean()), 3)}


def _pred(side: dict) -> Any:
    if not side.get("ok"):
        return None
    return side["result"].get("prediction")


@dataclass
class ShadowSummary:
    """What ``shadow`` reports, accumulated line by line (``add``), resumed lines included."""

    worst_n: int = 10
    total: int = 0
    compared: int = 0
    agree: int = 0
    both_failed: int = 0
    only_a_failed: int = 0
    only_b_failed: int = 0
    resumed_from: int = 0
    wall_s: float = 0.0
    kind: str | None = None
    agree_at: float | None = None
    latencies_a: list = field(default_factory=list, repr=False)
    latencies_b: list = field(default_factory=list, repr=False)
    figures: dict = field(default_factory=dict, repr=False)       # figure name -> values
    matrix: dict = field(default_factory=dict)                    # (label A, label B) -> count
    errors_a: dict = field(default_factory=dict)
    errors_b: dict = field(default_factory=dict)
    labelled: int = 0
    correct_a: int = 0
    correct_b: int = 0
    _worst: list = field(default_factory=list, repr=False)        # heap of (badness, -index, entry)
    side_counts: tuple = field(default=(), repr=False)            # (score.Summary of A, of B)

    def __post_init__(self):
        from .score import Summary

        self.side_counts = (Summary(), Summary())

    def add(self, line: dict) -> None:
        self.total += 1
        a, b = line["a"], line["b"]
        for side, counts, errs, lat in ((a, self.side_counts[0], self.errors_a, self.latencies_a),
                                        (b, self.side_counts[1], self.errors_b, self.latencies_b)):
            counts.count(side)
            if side.get("ok"):
                lat.append(float(side["result"]["latency_ms"]))
            else:
                code = (side.get("error") or {}).get("code", ec.UNKNOWN)
                errs[code] = errs.get(code, 0) + 1
        truth = line.get("truth")
        if truth is not None:
            self.labelled += 1
            self.correct_a += _pred(a) == truth
            self.correct_b += _pred(b) == truth
        if not a.get("ok") and not b.get("ok"):
            self.both_failed += 1
            return
        self.compared += 1
        self.agree += bool(line.get("agree"))
        cmp = line.get("compare")
        if cmp is None:
            self.only_a_failed += not a.get("ok")
            self.only_b_failed += not b.get("ok")
            badness = FAILED_BADNESS
        else:
            self.kind = self.kind or cmp.get("kind")
            if cmp.get("agree_at") is not None:
                self.agree_at = cmp["agree_at"]
            for k in ("margin", "cosine", "f1", "mean_iou", "pixel_agreement", "pck", "score_diff"):
                if isinstance(cmp.get(k), (int, float)):
                    self.figures.setdefault(k, []).append(float(cmp[k]))
            if cmp.get("kind") == "classification":
                key = (str(_pred(a)), str(_pred(b)))
                self.matrix[key] = self.matrix.get(key, 0) + 1
            badness = float(cmp.get("badness", 0.0))
        entry = {"index": line["index"], "id": line.get("id"), "input": line.get("input"), "truth": truth,
                 "agree": line.get("agree"), "a": _brief(a), "b": _brief(b),
                 "compare": {k: v for k, v in (cmp or {}).items() if k not in ("badness",)}, "badness": badness}
        item = (badness, -int(line["index"]), entry)
        if len(self._worst) < self.worst_n:
            heapq.heappush(self._worst, item)
        elif self.worst_n and item[:2] > self._worst[0][:2]:
            heapq.heapreplace(self._worst, item)

    @property
    def agreement(self) -> float | None:
        return self.agree / self.compared if self.compared else None

    def worst(self) -> list[dict]:
        return [e for _, _, e in sorted(self._worst, key=lambda t: (-t[0], -t[1]))]

    def flips(self) -> list[dict]:
        rows = [{"a": k[0], "b": k[1], "count": n} for k, n in self.matrix.items() if k[0] != k[1]]
        return sorted(rows, key=lambda r: (-r["count"], r["a"], r["b"]))

    def matrix_table(self) -> dict:
        labels = sorted({k[0] for k in self.matrix} | {k[1] for k in self.matrix}, key=_label_key)
        return {"labels": labels, "counts": [[self.matrix.get((x, y), 0) for y in labels] for x in labels]}

    def to_dict(self) -> dict:
        figs = {k: {"mean": round(float(np.mean(v)), 6), "min": round(float(np.min(v)), 6),
                    "p5": round(float(np.percentile(v, 5)), 6)} for k, v in self.figures.items() if v}
        acc = None
        if self.labelled:
            acc = {"samples": self.labelled, "a": round(self.correct_a / self.labelled, 6),
                   "b": round(self.correct_b / self.labelled, 6), "correct_a": self.correct_a,
                   "correct_b": self.correct_b}
        return {"total": self.total, "compared": self.compared, "agree": self.agree,
                "agreement": None if self.agreement is None else round(self.agreement, 6), "kind": self.kind,
                "agree_at": self.agree_at, "both_failed": self.both_failed, "only_a_failed": self.only_a_failed,
                "only_b_failed": self.only_b_failed, "figures": figs, "flips": self.flips(),
                "matrix": self.matrix_table() if self.matrix else None, "accuracy": acc,
                "latency_ms": {"a": _latency(self.latencies_a), "b": _latency(self.latencies_b),
                               "basis": "each side's result latency_ms: one infer(), raw input in, result out"},
                "errors": {"a": dict(sorted(self.errors_a.items())), "b": dict(sorted(self.errors_b.items()))},
                "worst": self.worst(), "resumed_from": self.resumed_from, "wall_s": round(self.wall_s, 3)}


def _label_key(label: str):
    return (0, int(label), "") if label.lstrip("-").isdigit() else (1, 0, label)


def _brief(side: dict) -> dict:
    if not side.get("ok"):
        err = side.get("error") or {}
        return {"ok": False, "code": err.get("code"), "message": str(err.get("message", ""))[:200]}
    r = side["result"]
    out = {"ok": True, "prediction": r.get("prediction"), "latency_ms": r.get("latency_ms")}
    if r.get("top_k"):
        out["score"] = r["top_k"][0]["score"]
    return out


# -- running --------------------------------------------------------------------------------

def _side(outcome) -> tuple[dict, dict | None]:
    """(the line's side, the full result dict for the comparison)."""
    if isinstance(outcome, EdgeRuntimeError):
        err = outcome.to_dict()
        return {"ok": False, "error": {k: err[k] for k in ("type", "code", "message") if k in err}}, None
    from .draw import summarize

    full = outcome.to_dict()
    return {"ok": True, "result": summarize(dict(full))}, full


def _infer(rt, value):
    try:
        return rt.infer(value)
    except EdgeRuntimeError as exc:
        return exc


def _preview(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= INPUT_PREVIEW_CHARS else value[:INPUT_PREVIEW_CHARS] + "…"
    return None


def shadow_line(record, out_a, out_b, truth, agree_at: float | None) -> dict:
    """One output line from the two outcomes (``InferenceResult`` or ``EdgeRuntimeError``)."""
    from .score import _jsonable

    side_a, full_a = _side(out_a)
    side_b, full_b = _side(out_b)
    head = {"index": record.index, "id": _jsonable(record.id), "line": getattr(record, "line", None)}
    cmp = compare(full_a, full_b, agree_at) if full_a is not None and full_b is not None else None
    if cmp is not None:
        agree: bool | None = bool(cmp["agree"])
    elif full_a is None and full_b is None:
        agree = None
    else:
        agree = False
    line = {**head, "ok": cmp is not None, "agree": agree, "truth": truth, "input": _preview(record.value),
            "a": side_a, "b": side_b, "compare": cmp}
    if cmp is None:
        line["error"] = (side_a if not side_a["ok"] else side_b)["error"]
    return line


def _dumps(line: dict) -> tuple[str, dict]:
    """(the JSON text, the line as written): a side whose result holds NaN or infinity is written
    as that side's failure (``result_nonfinite``), never as a silent "NaN"."""
    try:
        return json.dumps(line, ensure_ascii=False, allow_nan=False, default=str), line
    except ValueError:
        pass
    line = dict(line)
    for key in ("a", "b"):
        try:
            json.dumps(line[key], allow_nan=False, default=str)
        except ValueError:
            line[key] = {"ok": False, "error": {"type": "InferenceRuntimeError", "code": ec.RESULT_NONFINITE,
                                                "message": "the model produced NaN or infinity"}}
    both_failed = not line["a"]["ok"] and not line["b"]["ok"]
    line.update(ok=False, compare=None, agree=None if both_failed else False,
                error=(line["a"] if not line["a"]["ok"] else line["b"])["error"])
    return json.dumps(line, ensure_ascii=False, default=str), line


def job_record(rt_a, rt_b, source: dict | None, agree_at: float | None) -> dict:
    """score's job record of side A, with side B and the agreement threshold in its options:
    ``score.prepare_output`` then refuses a resume with another B as it does another A."""
    from .score import job_identity

    job = job_identity(rt_a, source)
    b = job_identity(rt_b, None)
    job["options"]["shadow_b"] = {"manifest_sha256": b["artifact"]["manifest_sha256"], "model": b["artifact"]["model"],
                                  "version": b["artifact"]["version"], "variant": b["variant"], "device": b["device"],
                                  "device_options": b["options"]["device_options"]}
    job["options"]["shadow_agree_at"] = agree_at
    return job


def _write_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _existing(out: Path, summary: ShadowSummary) -> None:
    with open(out, "rb") as fh:
        for raw in fh:
            if raw.endswith(b"\n"):
                summary.add(json.loads(raw))


def labels_of(rt) -> list[str] | None:
    return list(getattr(rt.task, "labels", None) or []) or None


def truths(source: dict | None, labels: list[str] | None, label_field: str = "label") -> Iterator[Any]:
    """The label of each record of ``source`` in reader order (None where it has none); for an
    image folder the first folder of the record's path, else the ``label_field`` column/field."""
    from .evaluate import resolve_label
    from .score_inputs import read_records

    if source is None or not labels:     # no source, or a task without labels (embeddings...): no truth
        while True:
            yield None
    if source["format"] == "images":
        from .score_inputs import image_files

        for rel, _ in image_files(Path(source["path"])):
            head = rel.split("/")[0] if "/" in rel else None
            yield None if head is None else resolve_label(head, labels)
        return
    if source["format"] not in ("csv", "jsonl"):
        while True:
            yield None
    try:
        stream = read_records(source["path"], source["format"], field=label_field)   # its values only
        for rec in stream:
            raw = rec.value if rec.error is None else None
            yield None if raw is None else resolve_label(str(raw).strip(), labels)
    except InputError:      # no label column: unlabelled
        pass
    while True:
        yield None


def shadow(rt_a, rt_b, records, out=None, *, resume: bool = False, force: bool = False,
           agree_at: float | None = None, label_field: str = "label", worst_n: int = 10, progress=None,
           stream=None) -> ShadowSummary:
    """Run ``records`` (``score_inputs.read_records``) through both runtimes into ``out`` (a path,
    ``"-"`` for ``stream``/stdout, or None: the summary only) and return the summary."""
    from .score import Summary, job_path, prepare_output

    if resume and force:
        raise InputError("--resume and --force exclude each other", code=ec.SCORE_OPTIONS_CONFLICT)
    if resume and (out is None or str(out) == "-"):
        raise InputError("--resume needs an output file (-o OUT.jsonl)", code=ec.SCORE_OPTIONS_CONFLICT)
    if rt_a.artifact.task != rt_b.artifact.task:
        raise InputError(f"A is a {rt_a.artifact.task} artifact, B a {rt_b.artifact.task} one: their outputs "
                         f"cannot be compared", code=ec.SHADOW_TASK_MISMATCH)
    summary = ShadowSummary(worst_n=worst_n)
    source = getattr(records, "source", None)
    skip, last_id, last_line = 0, None, None
    fh: Any = None
    owned = False
    if out is not None and str(out) != "-":
        out = Path(out)
        job = job_record(rt_a, rt_b, source, agree_at)
        counted = Summary()
        skip = prepare_output(out, resume, force, counted, job)
        last_id, last_line = counted.last_id, counted.last_line
        out.parent.mkdir(parents=True, exist_ok=True)
        if skip == 0:
            _write_atomic(job_path(out), job)
        else:
            _existing(out, summary)
            summary.resumed_from = skip
        fh, owned = open(out, "ab"), True
    elif out is not None:
        import sys

        fh = stream if stream is not None else sys.stdout.buffer
    labels = truths(source, labels_of(rt_a), label_field)
    t0 = last_sync = last_flush = time.perf_counter()
    seen = 0
    try:
        for record in records:
            truth = next(labels)
            seen = record.index + 1
            if record.index < skip:
                if record.index == skip - 1 and (record.id, record.line) != (last_id, last_line):
                    raise InputError(f"{out} does not belong to this input: its line {skip} is id {last_id!r}, "
                                     f"input {skip} is id {record.id!r}", code=ec.SCORE_OUTPUT_MISMATCH)
                continue
            if record.error is not None:
                out_a = out_b = record.error
            elif record.index % 2 == 0:
                out_a = _infer(rt_a, record.value)
                out_b = _infer(rt_b, record.value)
            else:
                out_b = _infer(rt_b, record.value)
                out_a = _infer(rt_a, record.value)
            text, line = _dumps(shadow_line(record, out_a, out_b, truth, agree_at))
            summary.add(line)
            if fh is not None:
                fh.write((text + "\n").encode("utf-8", "surrogateescape"))
                now = time.perf_counter()
                if now - last_flush >= 0.2:
                    fh.flush()
                    last_flush = now
                if owned and now - last_sync >= 1.0:
                    os.fsync(fh.fileno())
                    last_sync = now
            if progress:
                progress.update(summary.total, summary.total - summary.resumed_from)
        if seen < skip:
            raise InputError(f"{out} does not belong to this input: it holds {skip} lines, the input only {seen}",
                             code=ec.SCORE_OUTPUT_MISMATCH)
        if fh is not None:
            fh.flush()
            if owned:
                os.fsync(fh.fileno())
    finally:
        if owned:
            fh.close()
    summary.wall_s = time.perf_counter() - t0
    if progress:
        progress.update(summary.total, summary.total - summary.resumed_from, final=True)
    return summary


def verdict(summary: ShadowSummary, min_agreement: float | None = None) -> EdgeRuntimeError | None:
    """The typed error the run ends with, or None: no input (exit 2); no input answered on
    either side (the most frequent error's layer, as ``score``); agreement under
    ``min_agreement`` (``ParityError``, exit 7)."""
    from .score import verdict as score_verdict

    if summary.total == 0:
        return InputError("the input held no records: nothing was compared", code=ec.SCORE_INPUT_EMPTY)
    if summary.compared == 0:
        return score_verdict(summary.side_counts[0]) or score_verdict(summary.side_counts[1])
    agreement = summary.agreement
    if min_agreement is not None and agreement is not None and agreement < min_agreement:
        return ParityError(f"A and B agree on {summary.agree} of {summary.compared} inputs ({agreement:.4f}), under "
                           f"--min-agreement {min_agreement:g}", code=ec.SHADOW_AGREEMENT_BELOW,
                           agreement=agreement, compared=summary.compared, min_agreement=min_agreement)
    return None


__all__ = ["ShadowSummary", "shadow", "shadow_line", "verdict", "job_record", "truths"]
