"""Offline batch scoring: every input gets exactly one output line, in input order.

Output is JSONL, one complete line per input: ``{"index", "id", "ok": true,
"result": {...}}`` or ``{"index", "id", "ok": false, "error": {"type",
"code", "message"}}``. Lines are written a batch at a time in one write and
flushed (fsync at most once a second), so a crash or ``kill -9`` leaves a
prefix of complete lines plus at most one partial line. ``resume=True`` cuts
the partial line, checks that the last complete line is the input it claims
to be, and continues with the next input: none missing, none twice.

Batches go through ``Runtime.infer_batch`` (the device's throughput path:
OpenVINO's AsyncInferQueue), ``concurrency`` batches in flight, written in
order. A batch the runtime refuses as a whole (its total size over the
request limit) is retried item by item so each item gets its own answer.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import EdgeRuntimeError, InputError
from .score_inputs import Record


@dataclass
class Summary:
    total: int = 0
    ok: int = 0
    rejected: int = 0          # InputError: the input's fault
    failed: int = 0            # everything else: device, timeout, runtime
    resumed_from: int = 0      # lines already in the output when the run started
    scored: int = 0            # inputs scored by this run
    wall_s: float = 0.0
    latencies_ms: list = field(default_factory=list, repr=False)
    errors: dict = field(default_factory=dict)
    last_id: object = field(default=None, repr=False)     # id on the output's last line (resume check)

    def count(self, line: dict) -> None:
        self.total += 1
        if line.get("ok"):
            self.ok += 1
            return
        err = line.get("error") or {}
        if err.get("type") == "InputError":
            self.rejected += 1
        else:
            self.failed += 1
        self.errors[err.get("code", "unknown")] = self.errors.get(err.get("code", "unknown"), 0) + 1

    def to_dict(self) -> dict:
        lat = np.asarray(self.latencies_ms, dtype=float)
        return {"total": self.total, "ok": self.ok, "rejected": self.rejected, "failed": self.failed,
                "errors": dict(sorted(self.errors.items())), "resumed_from": self.resumed_from,
                "scored": self.scored, "wall_s": round(self.wall_s, 3),
                "throughput_per_s": round(self.scored / self.wall_s, 2) if self.wall_s > 0 else None,
                "latency_ms": {"p50": round(float(np.percentile(lat, 50)), 3) if lat.size else None,
                               "p99": round(float(np.percentile(lat, 99)), 3) if lat.size else None}}


def _jsonable(value):
    if isinstance(value, (np.generic,)):
        return value.item()
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def _line(record: Record, outcome) -> dict:
    if isinstance(outcome, EdgeRuntimeError):
        err = outcome.to_dict()
        return {"index": record.index, "id": _jsonable(record.id), "ok": False,
                "error": {k: err[k] for k in ("type", "code", "message") if k in err}}
    return {"index": record.index, "id": _jsonable(record.id), "ok": True, "result": outcome.to_dict()}


def prepare_output(out: Path, resume: bool, force: bool, summary: Summary) -> int:
    """Make ``out`` ready to append; return how many inputs it already holds."""
    if not out.exists():
        return 0
    if not resume:
        if not force:
            raise InputError(f"{out} exists: pass --resume to continue it or --force to overwrite",
                             code="score_output_exists")
        out.unlink()
        return 0
    with open(out, "rb+") as fh:
        data_end = fh.seek(0, os.SEEK_END)
        # the partial last line (if any) is cut: it is re-scored
        keep, last = 0, None
        fh.seek(0)
        for raw in iter(fh.readline, b""):
            if not raw.endswith(b"\n"):
                break
            try:
                line = json.loads(raw)
            except ValueError:
                raise InputError(f"{out}: line {summary.total + 1} is not JSON; not an output of this command",
                                 code="score_output_corrupt") from None
            if not isinstance(line, dict) or line.get("index") != summary.total:
                raise InputError(f"{out}: line {summary.total + 1} has index {line.get('index') if isinstance(line, dict) else '?'}"
                                 f", expected {summary.total}", code="score_output_corrupt")
            summary.count(line)
            keep += len(raw)
            last = line
        if keep < data_end:
            fh.truncate(keep)
    summary.resumed_from = summary.total
    summary.last_id = None if last is None else last.get("id")
    return summary.total


def _dump(record: Record, outcome) -> tuple[dict, str]:
    line = _line(record, outcome)
    try:
        return line, json.dumps(line, ensure_ascii=False, allow_nan=False, default=str)
    except ValueError:      # NaN/inf in a result: a corrupt output is a failure, never a silent "NaN"
        line = {"index": record.index, "id": line["id"], "ok": False,
                "error": {"type": "InferenceRuntimeError", "code": "result_nonfinite",
                          "message": "the model produced NaN or infinity"}}
        return line, json.dumps(line, ensure_ascii=False)


class Progress:
    """A bar with rate and ETA on a terminal; a parseable line every few seconds otherwise."""

    def __init__(self, total: int | None, stream, enabled: bool = True, every_s: float = 5.0):
        self.total, self.stream, self.enabled = total, stream, enabled
        self.tty = enabled and hasattr(stream, "isatty") and stream.isatty()
        self.every_s = 0.2 if self.tty else every_s
        self.t0 = time.perf_counter()
        self.last = 0.0

    def update(self, done: int, scored: int, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not final and now - self.last < self.every_s:
            return
        self.last = now
        elapsed = max(now - self.t0, 1e-9)
        rate = scored / elapsed
        eta = (self.total - done) / rate if self.total and rate > 0 else None
        if self.tty:
            frac = min(done / self.total, 1.0) if self.total else 0.0
            bar = "#" * int(frac * 30)
            self.stream.write(f"\r[{bar:<30}] {done}/{self.total or '?'} {rate:7.1f}/s ETA "
                              f"{'-' if eta is None else f'{eta:5.0f}s'}" + ("\n" if final else ""))
        else:
            self.stream.write(f"progress done={done} total={self.total if self.total is not None else '-'} "
                              f"rate={rate:.1f}/s eta_s={'-' if eta is None else round(eta, 1)}\n")
        self.stream.flush()


def _run_batch(rt, batch: list[Record], deadline_ms):
    todo = [r for r in batch if r.error is None]
    outcomes = {r.index: r.error for r in batch if r.error is not None}
    if todo:
        try:
            results = rt.infer_batch([r.value for r in todo], deadline_ms=deadline_ms)
        except EdgeRuntimeError:        # refused as a whole: each item on its own
            results = []
            for r in todo:
                try:
                    results += rt.infer_batch([r.value], deadline_ms=deadline_ms)
                except EdgeRuntimeError as exc:
                    results.append(exc)
        for r, res in zip(todo, results):
            outcomes[r.index] = res
    return [(r, outcomes[r.index]) for r in batch]


def score(rt, records, out: Path, *, batch_size: int = 32, concurrency: int = 2, resume: bool = False,
          force: bool = False, deadline_ms: int | None = None, progress: Progress | None = None) -> Summary:
    out = Path(out)
    if batch_size < 1 or concurrency < 1:
        raise InputError("--batch-size and --concurrency must be at least 1", code="input_invalid")
    batch_size = min(batch_size, rt.limits.max_batch_items)
    summary = Summary()
    skip = prepare_output(out, resume, force, summary)
    last_id = summary.last_id
    out.parent.mkdir(parents=True, exist_ok=True)
    rt.warm_batch()                      # the throughput path's compile is load time, not scoring time
    t0 = time.perf_counter()
    last_sync = t0
    with open(out, "ab") as fh, ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="edge-score") as pool:
        pending: deque = deque()

        def drain(limit: int):
            nonlocal last_sync
            while len(pending) > limit:
                pairs = pending.popleft().result()
                lines = []
                for record, outcome in pairs:
                    line, text = _dump(record, outcome)
                    summary.count(line)
                    summary.scored += 1
                    if line["ok"]:
                        summary.latencies_ms.append(line["result"]["latency_ms"])
                    lines.append(text)
                fh.write(("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
                fh.flush()
                if time.perf_counter() - last_sync >= 1.0:
                    os.fsync(fh.fileno())
                    last_sync = time.perf_counter()
                if progress:
                    progress.update(summary.total, summary.scored)

        batch: list[Record] = []
        for record in records:
            if record.index < skip:
                if record.index == skip - 1 and last_id is not None and _jsonable(record.id) != last_id:
                    raise InputError(f"{out} does not belong to this input: its line {skip} has id {last_id!r}, "
                                     f"input {skip} has id {_jsonable(record.id)!r}", code="score_output_mismatch")
                continue
            batch.append(record)
            if len(batch) >= batch_size:
                pending.append(pool.submit(_run_batch, rt, batch, deadline_ms))
                batch = []
                drain(concurrency)
        if batch:
            pending.append(pool.submit(_run_batch, rt, batch, deadline_ms))
        drain(0)
        fh.flush()
        os.fsync(fh.fileno())
    summary.wall_s = time.perf_counter() - t0
    if progress:
        progress.update(summary.total, summary.scored, final=True)
    return summary
