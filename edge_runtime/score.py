"""Offline batch scoring: every input gets exactly one output line, in input order.

Output is JSONL, one complete line per input::

    {"index": 0, "id": "r1", "line": 2, "ok": true, "result": {...}}
    {"index": 1, "id": null, "line": 3, "ok": false, "error": {"type", "code", "message"}}

- ``index``: the record's 0-based position in the input (the output's line number - 1);
- ``id``: the record's own id (see ``score_inputs``: the JSONL/CSV id field, the
  text line number, the image's relative path), ``null`` when a JSONL/CSV record
  has none (an unparsable line, no id field): a line number is never passed off as
  an id, since it could collide with a real one;
- ``line``: the 1-based line of the input file where the record starts (``null``
  for an image folder);
- ``result``: ``InferenceResult.to_dict()`` (with ``detections`` / ``keypoints``
  for those tasks; a segmentation's ``outputs["mask"]`` summarised by
  ``draw.summarize``: shape and per-class pixel counts); ``error``: the typed error.

Lines are written a batch at a time in one write and flushed (fsync at most
once a second), so a crash or ``kill -9`` leaves a prefix of complete lines
plus at most one partial line. ``out`` ``"-"`` writes the lines to stdout
(no job record, no resume).

The job record. Before the first line, ``OUT.job.json`` (``job_path``) is
written atomically (a temporary file, fsync, rename)::

    {"schema": "edge-infer-score-job/1", "created_utc", "edge_runtime",
     "input": {"path", "format", "field", "id_field", "kind", "bytes", "files", "sha256"} | null,
     "artifact": {"path", "manifest_sha256", "model", "version"},
     "variant", "device", "options": {"deadline_ms", "device_options"}}

``resume=True`` refuses (``InputError``, exit 2) an output whose job record
differs from this job in what changes results: the input's format, field, id
field and content fingerprint (file size + sha256, or the image folder's
names, sizes and hashes; not its path or mtime), the artifact's
``manifest_sha256``, the variant, the device it runs on, the deadline and the
device options (``score_output_mismatch``, every difference named). An output
with at least one complete line and no job record (written before job records
existed, or not by this command) is refused too (``score_resume_unverifiable``):
nothing says which job made it; start over with ``force``. An output with no
complete line is started over. ``input: null`` (``score()`` given records
that do not say where they come from) cannot be checked: the resume goes on
with a warning in ``Summary.warnings``. Then it cuts the partial last line,
checks that the last complete line's id and line are those of the input at
that index, and continues with the next input: none missing, none twice.
``resume`` with ``force`` is an error (``score_options_conflict``).

Batches go through ``Runtime.infer_batch`` (the device's throughput path:
OpenVINO's AsyncInferQueue), ``concurrency`` batches in flight, written in
order. A batch the runtime refuses as a whole (its total size over the
request limit) is retried item by item so each item gets its own answer.

``verdict(summary, max_error_rate)`` is the run's pass/fail (``edge-infer
score`` raises it after the summary): no record at all → ``InputError``
``score_input_empty`` (exit 2); no input succeeded → ``score_nothing_succeeded``;
(rejected + failed) / total above ``max_error_rate`` → ``score_error_rate_exceeded``.
The last two are raised as the most frequent error type among the lines
(a tie goes to the higher exit code), so they exit with that layer's code:
2 when the inputs were rejected, 4 device, 5 timeout, 6 runtime failure.
Counts are over the whole output, resumed lines included.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from . import errors as _errors
from . import error_codes as ec
from .errors import EdgeRuntimeError, InputError, _json_safe
from .score_inputs import Record, input_fingerprint

JOB_SCHEMA = "edge-infer-score-job/1"
LATENCY_BASIS = ("each result's latency_ms; on the batch path it runs from the start of the item's batch "
                 "to the end of its bucket group, so it is a batch's latency, not one item's compute time")


@dataclass
class Summary:
    total: int = 0
    ok: int = 0
    rejected: int = 0          # InputError: the input's fault
    failed: int = 0            # everything else: device, timeout, runtime
    resumed_from: int = 0      # lines already in the output when the run started
    scored: int = 0            # inputs scored by this run
    wall_s: float = 0.0
    batch_size: int = 0
    latencies_ms: list = field(default_factory=list, repr=False)
    errors: dict = field(default_factory=dict)
    error_types: dict = field(default_factory=dict)       # error type -> lines
    warnings: list = field(default_factory=list)
    last_id: object = field(default=None, repr=False)     # id on the output's last line (resume check)
    last_line: object = field(default=None, repr=False)   # its input line

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
        code, kind = err.get("code", ec.UNKNOWN), err.get("type", "EdgeRuntimeError")
        self.errors[code] = self.errors.get(code, 0) + 1
        self.error_types[kind] = self.error_types.get(kind, 0) + 1

    def to_dict(self) -> dict:
        lat = np.asarray(self.latencies_ms, dtype=float)
        return {"total": self.total, "ok": self.ok, "rejected": self.rejected, "failed": self.failed,
                "errors": dict(sorted(self.errors.items())), "error_types": dict(sorted(self.error_types.items())),
                "resumed_from": self.resumed_from, "scored": self.scored, "wall_s": round(self.wall_s, 3),
                "throughput_per_s": round(self.scored / self.wall_s, 2) if self.wall_s > 0 else None,
                "wall_ms_per_input": round(self.wall_s * 1000 / self.scored, 3) if self.scored else None,
                "batch_size": self.batch_size,
                "latency_ms": {"p50": round(float(np.percentile(lat, 50)), 3) if lat.size else None,
                               "p99": round(float(np.percentile(lat, 99)), 3) if lat.size else None},
                "latency_basis": LATENCY_BASIS, "warnings": list(self.warnings)}


def _dominant_type(error_types: dict) -> type[EdgeRuntimeError]:
    """The most frequent error type's class (a tie: the higher exit code, i.e. ours before the caller's)."""
    found = {name: getattr(_errors, name, None) for name in error_types}
    classes: dict[str, type[EdgeRuntimeError]] = {
        n: c if isinstance(c, type) and issubclass(c, EdgeRuntimeError) else EdgeRuntimeError for n, c in found.items()}
    if not classes:
        return EdgeRuntimeError
    name = max(classes, key=lambda n: (error_types[n], classes[n].exit_code))
    return classes[name]


def _error_counts(summary: Summary) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(summary.errors.items(), key=lambda kv: -kv[1])[:5])


def verdict(summary: Summary, max_error_rate: float | None = None) -> EdgeRuntimeError | None:
    """The typed error the run ends with, or None when it passed (see the module doc)."""
    if summary.total == 0:
        return InputError("the input held no records: nothing was scored", code=ec.SCORE_INPUT_EMPTY)
    bad = summary.rejected + summary.failed
    if summary.ok == 0:
        cls = _dominant_type(summary.error_types)
        return cls(f"0 of {summary.total} inputs succeeded ({summary.rejected} rejected, {summary.failed} failed: "
                   f"{_error_counts(summary)})", code=ec.SCORE_NOTHING_SUCCEEDED)
    if max_error_rate is not None and bad / summary.total > max_error_rate:
        cls = _dominant_type(summary.error_types)
        return cls(f"{bad} of {summary.total} inputs were rejected or failed (error rate {bad / summary.total:.4f}, "
                   f"over --max-error-rate {max_error_rate:g}): {_error_counts(summary)}",
                   code=ec.SCORE_ERROR_RATE_EXCEEDED)
    return None


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


# -- the job record ------------------------------------------------------------------

def job_path(out) -> Path:
    """The job record beside an output: ``OUT.job.json``."""
    out = Path(out)
    return out.with_name(out.name + ".job.json")


def job_identity(rt, source: dict | None = None, *, deadline_ms: int | None = None) -> dict:
    """This job's record. ``source``: ``{"path", "format", "field", "id_field"}`` (what
    ``read_records`` returns as ``.source``); None when the input is not known."""
    man = rt.artifact.manifest
    inp = None
    if source is not None:
        inp = {"path": str(Path(source["path"]).resolve()), "format": source.get("format"),
               "field": source.get("field"), "id_field": source.get("id_field"),
               **{k: v for k, v in input_fingerprint(source["path"], source.get("format")).items() if k != "format"}}
    from . import __version__

    return {"schema": JOB_SCHEMA, "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "edge_runtime": __version__, "input": inp,
            "artifact": {"path": str(Path(rt.artifact.root).resolve()), "manifest_sha256": man.get("manifest_sha256"),
                         "model": rt.artifact.name, "version": rt.artifact.version},
            "variant": rt.variant["target"], "device": rt.device,
            "options": {"deadline_ms": deadline_ms, "device_options": _json_safe(dict(rt.device_options or {}))}}


_INPUT_KEYS = ("format", "field", "id_field", "kind", "files", "bytes", "sha256")


def _short(v):
    return f"{v[:12]}…" if isinstance(v, str) and len(v) == 64 else json.dumps(v, default=str)


def job_differences(recorded: dict, current: dict) -> tuple[list[str], list[str]]:
    """(differences that change results, warnings) between two job records."""
    diffs, warns = [], []

    def cmp(what, a, b):
        if a != b:
            diffs.append(f"{what} {_short(a)} (the output's) vs {_short(b)} (now)")

    r_in, c_in = recorded.get("input"), current.get("input")
    if r_in is None or c_in is None:
        warns.append("the input could not be checked: the job record of "
                     + ("the output" if r_in is None else "this run") + " does not say which input it reads "
                     "(score() was given records without a source); only the last line's id was checked")
    else:
        for k in _INPUT_KEYS:
            cmp(f"input {k}", r_in.get(k), c_in.get(k))
        if c_in.get("sha256") is None and not diffs:
            warns.append(f"the input {c_in.get('path')} is not a regular file or folder: its content cannot be checked")
    cmp("artifact manifest_sha256", (recorded.get("artifact") or {}).get("manifest_sha256"),
        (current.get("artifact") or {}).get("manifest_sha256"))
    cmp("variant", recorded.get("variant"), current.get("variant"))
    cmp("device", recorded.get("device"), current.get("device"))
    r_opt, c_opt = recorded.get("options") or {}, current.get("options") or {}
    for k in sorted(set(r_opt) | set(c_opt)):
        cmp(k, r_opt.get(k), c_opt.get(k))
    return diffs, warns


def _write_job(path: Path, job: dict) -> None:
    """Atomically: a temporary file, fsync, rename, fsync of the folder."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    data = json.dumps(job, indent=2, ensure_ascii=False, default=str) + "\n"
    with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    try:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _read_job(path: Path, out: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        job = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: the job record of {out} does not parse ({exc}); start over with --force",
                         code=ec.SCORE_OUTPUT_CORRUPT) from None
    if not isinstance(job, dict) or job.get("schema") != JOB_SCHEMA:
        raise InputError(f"{path} is not a job record of edge-infer score ({JOB_SCHEMA}); start over with --force",
                         code=ec.SCORE_OUTPUT_CORRUPT)
    return job


def _has_complete_line(out: Path) -> bool:
    with open(out, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 16), b""):
            if b"\n" in block:
                return True
    return False


def prepare_output(out: Path, resume: bool, force: bool, summary: Summary, job: dict | None = None) -> int:
    """Make ``out`` ready to append; return how many inputs it already holds."""
    if not out.exists():
        return 0
    if not resume:
        if not force:
            raise InputError(f"{out} exists: pass --resume to continue it or --force to overwrite",
                             code=ec.SCORE_OUTPUT_EXISTS)
        out.unlink()
        job_path(out).unlink(missing_ok=True)
        return 0
    recorded = _read_job(job_path(out), out)
    if recorded is None:
        if _has_complete_line(out):
            raise InputError(f"{out} has no job record ({job_path(out).name}): it was written before job records "
                             f"existed or not by edge-infer score, so nothing says it belongs to this job; start over "
                             f"with --force", code=ec.SCORE_RESUME_UNVERIFIABLE)
    elif job is not None:
        diffs, warns = job_differences(recorded, job)
        if diffs:
            raise InputError(f"{out} was written by another job, not resumed: " + "; ".join(diffs)
                             + ". Resume with the same input, artifact, device and options, or --force to start over",
                             code=ec.SCORE_OUTPUT_MISMATCH)
        summary.warnings += warns
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
                                 code=ec.SCORE_OUTPUT_CORRUPT) from None
            if not isinstance(line, dict) or line.get("index") != summary.total:
                raise InputError(f"{out}: line {summary.total + 1} has index {line.get('index') if isinstance(line, dict) else '?'}"
                                 f", expected {summary.total}", code=ec.SCORE_OUTPUT_CORRUPT)
            summary.count(line)
            keep += len(raw)
            last = line
        if keep < data_end:
            fh.truncate(keep)
    summary.resumed_from = summary.total
    summary.last_id = None if last is None else last.get("id")
    summary.last_line = None if last is None else last.get("line")
    return summary.total


def _dump(record: Record, outcome) -> tuple[dict, str]:
    line = _line(record, outcome)
    try:
        return line, json.dumps(line, ensure_ascii=False, allow_nan=False, default=str)
    except ValueError:      # NaN/inf in a result: a corrupt output is a failure, never a silent "NaN"
        line = {"index": record.index, "id": line["id"], "line": line["line"], "ok": False,
                "error": {"type": "InferenceRuntimeError", "code": ec.RESULT_NONFINITE,
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


def score(rt, records, out, *, batch_size: int = 32, concurrency: int = 2, resume: bool = False,
          force: bool = False, deadline_ms: int | None = None, progress: Progress | None = None,
          job: dict | None = None, stream=None) -> Summary:
    """Score ``records`` into ``out`` (a path, or ``"-"``: the lines go to ``stream``, default
    stdout's binary buffer). ``job``: this job's record (``job_identity``); by default it is
    made from ``rt`` and ``records.source`` (set by ``read_records``)."""
    to_stream = str(out) == "-"
    if resume and force:
        raise InputError("--resume and --force exclude each other: --resume continues the output, --force "
                         "starts it over", code=ec.SCORE_OPTIONS_CONFLICT)
    if resume and to_stream:
        raise InputError("--resume needs an output file: '-' (stdout) cannot be resumed",
                         code=ec.SCORE_OPTIONS_CONFLICT)
    if batch_size < 1 or concurrency < 1:
        raise InputError("--batch-size and --concurrency must be at least 1", code=ec.INPUT_INVALID)
    batch_size = min(batch_size, rt.limits.max_batch_items)
    summary = Summary(batch_size=batch_size)
    if to_stream:
        skip = 0
    else:
        out = Path(out)
        if job is None:
            job = job_identity(rt, getattr(records, "source", None), deadline_ms=deadline_ms)
        skip = prepare_output(out, resume, force, summary, job)
        out.parent.mkdir(parents=True, exist_ok=True)
        if skip == 0:
            _write_job(job_path(out), job)      # before the first line: a resume can always check it
    last_id, last_line = summary.last_id, summary.last_line
    rt.warm_batch()                      # the throughput path's compile is load time, not scoring time
    t0 = time.perf_counter()
    last_sync = t0
    if to_stream:
        import sys

        fh = stream if stream is not None else sys.stdout.buffer
        owned = False
    else:
        fh = open(out, "ab")
        owned = True
    seen = 0
    try:
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="edge-score") as pool:
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
                    if owned and time.perf_counter() - last_sync >= 1.0:
                        os.fsync(fh.fileno())
                        last_sync = time.perf_counter()
                    if progress:
                        progress.update(summary.total, summary.scored)

            batch: list[Record] = []
            for record in records:
                seen = record.index + 1
                if record.index < skip:
                    if record.index == skip - 1 and (_jsonable(record.id), getattr(record, "line", None)) != \
                            (last_id, last_line):
                        raise InputError(f"{out} does not belong to this input: its line {skip} is id {last_id!r} "
                                         f"(input line {last_line}), input {skip} is id {_jsonable(record.id)!r} "
                                         f"(input line {record.line})", code=ec.SCORE_OUTPUT_MISMATCH)
                    continue
                batch.append(record)
                if len(batch) >= batch_size:
                    pending.append(pool.submit(_run_batch, rt, batch, deadline_ms))
                    batch = []
                    drain(concurrency)
            if batch:
                pending.append(pool.submit(_run_batch, rt, batch, deadline_ms))
            drain(0)
        if seen < skip:
            raise InputError(f"{out} does not belong to this input: it holds {skip} lines, the input only {seen} "
                             f"records", code=ec.SCORE_OUTPUT_MISMATCH)
        fh.flush()
        if owned:
            os.fsync(fh.fileno())
    finally:
        if owned:
            fh.close()
    summary.wall_s = time.perf_counter() - t0
    if progress:
        progress.update(summary.total, summary.scored, final=True)
    return summary
