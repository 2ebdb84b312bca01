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
plus at most one partial line. ``out`` ``"-"`` writes the lines to stdout (no job
record, no resume; a stdout that is the input file is refused: ``score_job.check_stream``).
An ``out`` (or its job record) that exists and is not a regular file (a device, a FIFO, a
folder, a dangling link), that is the input itself (the same path, a symlink or a hard link to
it), inside the artifact or an image of the input folder (``score_job._inside``), is refused before
anything is written or removed (``InputError`` ``input_invalid``, exit 2), as is
an ``out`` that cannot be created (``score_job.check_output``, ``output_error``).
Each line is valid UTF-8 and strict JSON whatever its id holds (``score_lines``).

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

This module holds the batching loop (``score``) and is the import path for all of
it; the parts live beside it: ``score_summary`` (``Summary``, ``verdict``),
``score_job`` (the job record, ``prepare_output``), ``score_lines`` (an input's
output line) and ``score_progress`` (``Progress``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import error_codes as ec
from .errors import EdgeRuntimeError, InputError
from .score_inputs import Record
from .score_job import (JOB_SCHEMA, _write_job, check_resume_options, check_stream, job_differences, job_identity,
                        job_path, output_error, prepare_output)
from .score_lines import _dump, _jsonable
from .score_progress import Progress
from .score_summary import LATENCY_BASIS, Summary, verdict

__all__ = ["JOB_SCHEMA", "LATENCY_BASIS", "Progress", "Summary", "_dump", "_jsonable", "_run_batch", "_write_job",
           "job_differences", "job_identity", "job_path", "prepare_output", "score", "verdict"]


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


def _start_output(out: Path, job: dict | None) -> None:
    """Create ``out``'s folder and write the job record (``job``, when starting over: before the
    first line, so a resume can always check it). An ``OSError`` (no such folder, no permission) is
    the caller's ``-o``: an ``InputError`` naming the path."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if job is not None:
            _write_job(job_path(out), job)
    except OSError as exc:
        raise output_error(out, exc) from None


def _stdout():
    import sys

    return sys.stdout.buffer


@contextlib.contextmanager
def _writing(out):
    """A write that fails (a full disk, ``-o - > /dev/full``, an I/O error) is the typed output error
    naming where (exit 2), not a bare ``OSError`` (exit 1); a reader that left (EPIPE) stays itself."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise output_error("<stdout>" if str(out) == "-" else out, exc) from None


def _append_to(out: Path):
    try:
        return open(out, "ab")
    except OSError as exc:
        raise output_error(out, exc) from None


def score(rt, records, out, *, batch_size: int = 32, concurrency: int = 2, resume: bool = False,
          force: bool = False, deadline_ms: int | None = None, progress: Progress | None = None,
          job: dict | None = None, stream=None) -> Summary:
    """Score ``records`` into ``out`` (a path, or ``"-"``: the lines go to ``stream``, default
    stdout's binary buffer). ``job``: this job's record (``job_identity``); by default it is
    made from ``rt`` and ``records.source`` (set by ``read_records``)."""
    to_stream = str(out) == "-"
    check_resume_options(resume, force, out)
    if batch_size < 1 or concurrency < 1:
        raise InputError("--batch-size and --concurrency must be at least 1", code=ec.INPUT_INVALID)
    batch_size = min(batch_size, rt.limits.max_batch_items)
    summary = Summary(batch_size=batch_size)
    if to_stream:
        skip = 0
        check_stream(stream if stream is not None else _stdout(), getattr(records, "source", None),
                     (rt.artifact.root,))
    else:
        out = Path(out)
        if job is None:
            job = job_identity(rt, getattr(records, "source", None), deadline_ms=deadline_ms)
        skip = prepare_output(out, resume, force, summary, job)     # refuses a device, a folder, the input
        _start_output(out, job if skip == 0 else None)
    last_id, last_line = summary.last_id, summary.last_line
    rt.warm_batch()                      # the throughput path's compile is load time, not scoring time
    t0 = time.perf_counter()
    last_sync = t0
    if to_stream:
        fh = stream if stream is not None else _stdout()
        owned = False
    else:
        fh = _append_to(out)
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
                    with _writing(out):
                        fh.write(("\n".join(lines) + "\n").encode("utf-8"))   # _dump escapes lone surrogates
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
        with _writing(out):
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
