"""``edge-infer shadow A B INPUT``: the same inputs through two inference versions, diffed.

A and B are two artifacts, or one artifact on two devices or variants
(``--device-a onnxruntime --device-b openvino``). Every input ``score`` reads
(``score_inputs``: JSONL, CSV/TSV, plain text, an image folder) goes through
both, one ``infer()`` each, the side that runs first alternating per input so
neither always meets a warm cache. Each input is one JSONL line, in input order::

    {"index", "id", "line", "ok", "agree", "truth", "truth_id"?, "input",
     "a": {"ok": true, "result": {...}} | {"ok": false, "error": {...}}, "b": {...},
     "compare": {"kind", "agree", "badness", ...task figures} | null, "error"?}

- ``ok``: both sides answered; ``agree``: the task's comparison says they agree
  (``shadow_compare``); one side failing is a disagreement; both failing is
  ``agree`` null (not compared, counted as ``both_failed``);
- ``truth``: the input's label when it has one (an image folder's ``<label>/``,
  a CSV/TSV/JSONL ``--label-field`` column, default ``label``), resolved against
  A's labels like ``edge-infer eval`` does (a name, or an index into the labels):
  the class's label text, and ``truth_id`` its class id (``shadow_truth``); where
  B's labels differ from A's, ``truth_id_b`` the same class among B's (null: B's
  labels cannot say which; -1: B has none). A label whose text the labels file
  repeats names no one class and is refused before anything runs (``input_invalid``,
  exit 2, as ``eval``), as is a ``--label-field`` other than ``label`` that no record
  holds (``input_field_missing``) and a CSV header naming the label column twice. A piped
  input (``/dev/stdin``, a FIFO) is read once, by the run: no truth, ``accuracy_note``
  says why (a second read for the labels lost records). Classifiers only: another task has no truth;
- ``input``: the text (first 300 characters) or the image path, for the report.

Nothing lost: the output and its job record are ``score``'s (``score.prepare_output``,
``score.job_identity``, ``OUT.job.json`` written atomically before the first line); so are
its refusals (an output or job record that is not a regular file, is the input, lies inside
either artifact or is an image of the input folder: nothing touched, exit 2; a -o that cannot be
created: ``input_invalid`` naming it; ``-o -`` whose stdout is the input file, ``-o - >> IN``:
``score_job.check_stream``) and its lines
(strict UTF-8 JSON whatever the id holds: ``score_lines``).
The job record is A's, with B's artifact seal, variant, device and the agreement
threshold in its options, so ``--resume`` refuses (``score_output_mismatch``) another
input, either side's artifact, variant or device; a partial last line is cut and
re-run. The summary is computed over the whole output, resumed lines included.

B's class ids are compared as A's classes where their labels differ (``shadow_truth.a_classes``):
a classifier's ``class_id`` and ``top_k``, a detector's boxes, a segmenter's mask values, so a
swapped labels file never agrees and a reordered one with its class ids reordered does.

The summary: agreement = agreeing inputs / compared inputs (compared: at least one
side answered; ``empty``: those where neither side found anything, ``mismatched``: those
whose results could not be compared, ``truncated``: inputs each side answered on a cut text);
rates are cut, never rounded up (19999 of 20000 is 0.9999, never 1.0000); the flip matrix
(classifiers: A's label × B's label, counts, each answer named by the class it was compared as, so
its diagonal is exactly the agreeing inputs; a text the labels repeat shown with its class id,
``crane#517``; labels that share no text by class index, ``seven=7``; a class of B that is no one
class of A's as B's own, ``crane#B0``: ``ShadowSummary.use_labels``); the
N worst inputs (highest ``badness``: a failure on one side, then the task's own
figure: the lowest margin, cosine, F1...); each side's accuracy over the labelled
inputs, by class id, never by label text (a failure counts as wrong; B's is null, with
``accuracy_note``, where B's labels cannot name A's class); p50/p99 of each side's ``latency_ms`` (one
``infer()``: raw input in, result out).

This module holds the run (``shadow``: both sides, the output and its job record)
and is the import path for all of it; the parts live beside it: ``shadow_summary``
(``ShadowSummary``, ``verdict``), ``shadow_lines`` (an input's output line),
``shadow_truth`` (each input's label) and ``shadow_compare`` (the comparison).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from . import error_codes as ec
from .errors import EdgeRuntimeError, InputError
from .shadow_lines import INPUT_PREVIEW_CHARS, _dumps, shadow_line
from .shadow_summary import FAILED_BADNESS, ShadowSummary, check_fraction, verdict
from .shadow_truth import a_classes, check_labels, class_labels, labels_of, read_twice, truths


# -- running --------------------------------------------------------------------------------

def _infer(rt, value):
    try:
        return rt.infer(value)
    except EdgeRuntimeError as exc:
        return exc


def _runs_as(rt) -> tuple:
    """What one side runs: the artifact's seal, the variant, the device and its options."""
    return (rt.artifact.manifest.get("manifest_sha256"), rt.variant["target"], rt.device,
            json.dumps(getattr(rt, "device_options", None) or {}, sort_keys=True, default=str))


def refuse_fallen_together(rt_a, rt_b) -> None:
    """A side whose device fell back (``--device-b openvino`` where OpenVINO cannot run it) onto exactly
    what the other side runs (the same artifact, variant, device and options): the run would compare
    one path with itself, "agreement 1.0000", exit 0, while the user asked for two. Refused
    (``DeviceError`` ``device_fell_back``, exit 4) before anything is written; a comparison of one
    artifact with itself that nobody's fallback made (``shadow ART ART``) still runs."""
    from .errors import DeviceError

    fell = [(side, rt.choice.fallback) for side, rt in (("A", rt_a), ("B", rt_b))
            if getattr(getattr(rt, "choice", None), "fallback", None)]
    if not fell or _runs_as(rt_a) != _runs_as(rt_b):
        return
    why = "; ".join(f"side {side}: {text}" for side, text in fell)
    raise DeviceError(f"{why}: A and B both run {rt_a.artifact.name} {rt_a.variant['target']} on {rt_a.device}, "
                      f"so shadow would compare that path with itself (an agreement of 1.0 that measures "
                      f"nothing); install or attach the device asked for, or pick two that run here "
                      f"(`edge-infer devices`)", code=ec.DEVICE_FELL_BACK)


def job_record(rt_a, rt_b, source: dict | None, agree_at: float | None, label_field: str = "label") -> dict:
    """score's job record of side A, with side B, the agreement threshold and (where it is not the
    default ``label``) the label field in its options: ``score.prepare_output`` then refuses a resume
    with another B as it does another A, and one whose truths would come from another column (the
    lines kept their old truths: the accuracy mixed two columns, exit 0)."""
    from .score import job_identity

    job = job_identity(rt_a, source)
    b = job_identity(rt_b, None)
    job["options"]["shadow_b"] = {"manifest_sha256": b["artifact"]["manifest_sha256"], "model": b["artifact"]["model"],
                                  "version": b["artifact"]["version"], "variant": b["variant"], "device": b["device"],
                                  "device_options": b["options"]["device_options"]}
    job["options"]["shadow_agree_at"] = agree_at
    if label_field != "label":      # absent for the default: job records written before it still resume
        job["options"]["shadow_label_field"] = label_field
    return job


def _existing(out: Path, summary: ShadowSummary, labels) -> None:
    """The lines already written, into ``summary``; a line written before truths were class ids
    (a ``truth`` text, no ``truth_id``) takes its record's truth from ``labels`` (``truths``)."""
    from .shadow_lines import truth_fields

    with open(out, "rb") as fh:
        for raw in fh:
            if raw.endswith(b"\n"):
                line = json.loads(raw)
                truth = next(labels)
                if line.get("truth") is not None and "truth_id" not in line:
                    line.update(truth_fields(truth))
                summary.add(line)


def shadow(rt_a, rt_b, records, out=None, *, resume: bool = False, force: bool = False,
           agree_at: float | None = None, label_field: str = "label", worst_n: int = 10, progress=None,
           stream=None) -> ShadowSummary:
    """Run ``records`` (``score_inputs.read_records``) through both runtimes into ``out`` (a path,
    ``"-"`` for ``stream``/stdout, or None: the summary only) and return the summary."""
    from .score import Summary, _append_to, _jsonable, _start_output, prepare_output
    from .score_job import check_output, check_resume_options, check_stream

    check_resume_options(resume, force, out)
    agree_at = check_fraction("agree_at", agree_at)     # NaN: every continuous figure "disagreed"
    if rt_a.artifact.task != rt_b.artifact.task:
        raise InputError(f"A is a {rt_a.artifact.task} artifact, B a {rt_b.artifact.task} one: their outputs "
                         f"cannot be compared", code=ec.SHADOW_TASK_MISMATCH)
    refuse_fallen_together(rt_a, rt_b)
    summary = ShadowSummary(worst_n=worst_n)
    source = getattr(records, "source", None)
    labels_a = labels_of(rt_a)
    unknown: dict = {}
    labelled = check_labels(source, labels_a, label_field, unknown=unknown)   # a label naming several: refused
    if label_field != "label" and not labelled and not unknown.get("count") and source is not None \
            and source.get("format") in ("csv", "jsonl") and read_twice(source):
        # asked for by name, found nowhere: it ran unlabelled, no accuracy and no word of why, exit 0
        raise InputError(f"--label-field {label_field}: no record of {source['path']} has a label there (a CSV "
                         f"column or JSONL field of that name, with a value); name the label column or drop the "
                         f"option", code=ec.INPUT_FIELD_MISSING)
    if unknown.get("count"):        # never silently unlabelled: a typo'd label column gave no accuracy at all
        summary.unknown_labels = (int(unknown["count"]), str(unknown["first"]))
    if unknown.get("skipped") and labels_a is not None:      # as eval skips them: out of the accuracy, said
        summary.eval_skipped = (int(unknown["skipped"]), str(unknown["skipped_first"]))
    if labels_a is None and labelled:
        task = getattr(rt_a.task, "name", None) or rt_a.artifact.task
        summary.accuracy_note = (f"the input holds {labelled} labelled record{'s' if labelled > 1 else ''}, but A is "
                                 f"a {task} artifact: accuracy is measured for classifiers only (one class per "
                                 f"input), so none is reported")
    elif labels_a is not None and source is not None and source.get("format") in ("csv", "jsonl") \
            and not read_twice(source):
        summary.accuracy_note = (f"the input {source['path']} is a pipe, read once by the run: its labels are not "
                                 f"read, so no accuracy is measured (give a file for it)")

    labels_b = labels_of(rt_b)
    # B's labels reordered or extended: compared as A's classes; a detector's boxes and a segmenter's mask
    # too (their labels are no classifier's, so not ``labels_of``'s: a swapped labels file agreed); the
    # summary names the flip matrix's rows and columns by the same reading, and says it (``labels_note``)
    b_to_a = a_classes(class_labels(rt_a), class_labels(rt_b))
    summary.use_labels(class_labels(rt_a), class_labels(rt_b))

    def labels():
        return truths(source, labels_a, label_field, labels_b=labels_b)
    skip, last_id, last_line = 0, None, None
    fh: Any = None
    owned = False
    if out is not None and str(out) != "-":
        out = Path(out)
        job = job_record(rt_a, rt_b, source, agree_at, label_field)
        # the job record names A's artifact only: B's is checked as score checks its own (``-o B/manifest.json
        # --force`` deleted B's manifest, exit 0), before anything is deleted or written
        check_output(out, dict(job, artifact={"path": str(Path(rt_b.artifact.root).resolve())}))
        counted = Summary()
        skip = prepare_output(out, resume, force, counted, job)    # refuses a device, a folder, the input
        last_id, last_line = counted.last_id, counted.last_line
        _start_output(out, job if skip == 0 else None)      # a -o that cannot be created: an InputError naming it
        if skip:
            _existing(out, summary, labels())
            summary.resumed_from = skip
        fh, owned = _append_to(out), True
    elif out is not None:
        import sys

        fh = stream if stream is not None else sys.stdout.buffer
        # ``-o - >> IN``: each line read back as one more input, without end; ``>> A/manifest.json``
        check_stream(fh, source, (rt_a.artifact.root, rt_b.artifact.root))
    truth_of = labels()
    t0 = last_sync = last_flush = time.perf_counter()
    seen = 0
    try:
        for record in records:
            truth = next(truth_of)
            seen = record.index + 1
            if record.index < skip:
                if record.index == skip - 1 and (_jsonable(record.id), record.line) != (last_id, last_line):
                    raise InputError(f"{out} does not belong to this input: its line {skip} is id {last_id!r}, "
                                     f"input {skip} is id {_jsonable(record.id)!r}", code=ec.SCORE_OUTPUT_MISMATCH)
                continue
            if record.error is not None:
                out_a = out_b = record.error
            elif record.index % 2 == 0:
                out_a = _infer(rt_a, record.value)
                out_b = _infer(rt_b, record.value)
            else:
                out_b = _infer(rt_b, record.value)
                out_a = _infer(rt_a, record.value)
            text, line = _dumps(shadow_line(record, out_a, out_b, truth, agree_at, b_to_a))
            summary.add(line)
            if fh is not None:
                fh.write((text + "\n").encode("utf-8"))      # _dumps escapes lone surrogates
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


__all__ = ["FAILED_BADNESS", "INPUT_PREVIEW_CHARS", "ShadowSummary", "_dumps", "check_labels", "job_record",
           "labels_of", "shadow", "shadow_line", "truths", "verdict"]
