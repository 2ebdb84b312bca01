"""Labelled evaluation of an artifact: accuracy and latency through ``infer``.

Data: an image folder with one sub-folder per label (``held_out/7/0042.png``)
or a TSV of ``text<TAB>label`` (the label as a name or an index into the
artifact's labels; the text is everything before the last tab).

No row is dropped without a word. A row that cannot be evaluated is counted
by reason in the report's ``skipped`` (``count``, ``by_reason`` and the first
examples per reason, with the line number or the path); the reasons:

- TSV: ``no_tab`` (no tab on the line), ``empty_text``, ``unknown_label``
  (neither a label name nor an index), ``bad_encoding`` (not UTF-8),
  ``blank_line`` (a UTF-8 byte-order mark starting the file is no text);
- image folder: ``unknown_label`` (an image in a sub-folder whose name is no
  label: one per image), ``not_an_image`` (a file in a label folder without
  a PNG/JPEG/BMP suffix), ``not_in_label_folder`` (an image directly in DATA),
  ``nested_folder`` (a file deeper than ``<label>/<file>``, or a symlinked
  folder inside a label folder, not entered), ``duplicate`` (an
  image reached a second time through a symlink: a label folder ``03 -> 3``,
  whose every image is one row of ``3/`` and a ``duplicate`` here, whatever
  the sort order, or a symlinked file whose target is evaluated already: each
  image is evaluated once; ``score`` does not enter a symlinked folder at all),
  ``broken_symlink`` (a symlink that resolves to nothing: dangling or a loop),
  ``symlink_loop`` (a label folder that is a symlink to DATA or a folder above
  it: not entered, one per folder). A symlinked image or label folder whose
  target is read nowhere else (outside DATA) is evaluated. ``hidden``: an
  image in a dot-folder (``.cache/``, ``3/.ipynb_checkpoints/``), which is not
  read (as ``score`` reads none) but counted, one per image (a dot-folder that
  cannot be listed: one for the folder; a symlinked one whose target is in
  DATA or holds it: none, its images are read or counted there). Dot-files
  (``.DS_Store``, macOS's ``._x.png``) and other files directly in DATA (a
  README) are not rows. A folder that cannot
  be listed is ``eval_data_unreadable`` (never left out in silence), and so is
  a DATA that is neither a folder nor a regular file (a pipe). An image folder
  is for a task that takes images: its rows are paths, which a text
  classifier would classify as text (``input_invalid``).

The first line of a TSV whose label column is no label is its header
(``header`` in the report): not a sample, not a skip, not counted against
``limit``. ``limit`` = the first N evaluable samples; skipped rows met before
the Nth are reported, rows after it are not read (a TSV is read line by line).

``accuracy`` = correct / ``samples``, where ``samples`` counts the rows that
were run (an inference error counts as a wrong answer and is listed under
``errors``; ``error_types`` counts their classes: where every sample failed the
CLI exits ``eval_nothing_succeeded`` in the commonest one's class, after the
report). Skipped rows are outside it and reported beside it. When no row
can be evaluated, ``evaluate`` raises ``InputError`` (exit 2):
``eval_data_empty`` (nothing found) or ``eval_nothing_evaluated`` (every row
skipped, the reasons named).

A row is correct when the prediction's **class id** is the class its label
names, never by comparing label texts: a labels file may repeat a text
(Coral's ImageNet labels have ``crane`` at 135, the bird, and 518, the
machine), and a repeated text names no one class. A folder or TSV label that
is such a text is refused before anything runs (``InputError``
``input_invalid``, exit 2, the class indices named): name the folder, or
write the label, by its index instead (``518/``). A zero-padded number that is
no label text (``09``) is refused the same way where, as a number, it is
another class's text (labels ``1``..``10``: index 9 is ``10``, the text ``9``
is class 8); where both readings agree (labels ``0``..``9``) it is that class.

Only classifiers are evaluated (:func:`eval_tasks`: the tasks whose parity
metric is ``top1_agreement``, image- and text-classification built in): any
other task (detection, segmentation, pose, embeddings, tensors) has no one
label per input to compare, and is refused (``input_invalid``, exit 2,
the supported tasks named) before the data is read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import numpy as np

from . import error_codes as ec
from .errors import EdgeRuntimeError, InputError
# the labels' side, shared with shadow (re-exported: their import path was here)
from .eval_labels import (EXAMPLES_PER_REASON, LabelIndex, Rows, Skipped, _clip, _truth,  # noqa: F401
                          ambiguous_label, eval_tasks, is_classifier, resolve_label)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
# the manifest parity the report carries: the figure, or why there is none (``not_measured``, an
# import's ``note``, a detector's ``not_judged``), and a stand-in it was measured on instead
PARITY_KEYS = ("metric", "value", "min", "samples", "budget", "not_measured", "note", "reason", "not_judged",
               "measured_on", "not_measured_on_target")


def _tsv_rows(p: Path, labels, skipped: Skipped, header: dict) -> Rows:
    index = None if labels is None else LabelIndex(labels)
    # line by line (binary: a line of another encoding is a skip, not the end): --limit stops
    # reading at its Nth sample instead of holding the whole file in memory first
    for number, raw in enumerate(_binary_lines(p), start=1):
        where = {"line": number}
        raw = raw[:-1] if raw.endswith(b"\n") else raw        # the final newline ends the last line
        raw = raw[:-1] if raw.endswith(b"\r") else raw
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):     # a byte-order mark (Excel's UTF-8): no text
            raw = raw[3:]
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
        truth = _truth(label, index, f"{p} line {number}")
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


def _binary_lines(p: Path) -> Iterator[bytes]:
    try:
        with open(p, "rb") as f:
            yield from f
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc.strerror or exc}", code=ec.EVAL_DATA_UNREADABLE) from None


def _unreadable(folder: Path, exc: OSError) -> InputError:
    return InputError(f"cannot read the folder {folder}: {exc.strerror or exc} (its images would be left out of "
                      f"the accuracy without a word)", code=ec.EVAL_DATA_UNREADABLE, path=str(folder))


def _files_under(folder: Path) -> list[Path]:
    """Every entry under ``folder`` (``rglob("*")``'s: symlinked folders are listed, not entered),
    sorted; a folder that cannot be listed raises ``eval_data_unreadable`` (``rglob`` passes over it
    in silence, and its images would drop out of the accuracy)."""
    out: list[Path] = []
    todo = [folder]
    while todo:
        d = todo.pop()
        try:
            with os.scandir(d) as it:
                entries = list(it)
        except OSError as exc:
            raise _unreadable(d, exc) from None
        for e in entries:
            path = d / e.name
            out.append(path)
            try:
                entered = e.is_dir(follow_symlinks=False)
            except OSError:
                entered = False
            if entered and not e.name.startswith("."):
                todo.append(path)
    return sorted(out)


def _real(path) -> str:
    """``path`` with every symlink resolved (a loop or a dangling link: as far as it resolves)."""
    return os.path.realpath(path)


def _within(path: str, folder: str) -> bool:
    """Whether the resolved ``path`` is ``folder`` or lies under it."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _hidden_images(folder: Path, p: Path, root: str, skipped: Skipped) -> None:
    """The images in dot-folder ``folder`` (``.cache/``, ``3/.ipynb_checkpoints/``): not evaluated,
    as ``score`` reads no dot-folder, but each one a ``hidden`` skip (before 2026-12-07 they were
    left out in silence: data the user may believe was evaluated). A symlinked one whose target
    is inside DATA or holds it is read elsewhere, or is a loop: nothing here. Dot-files are no rows."""
    if folder.is_symlink():
        target = _real(folder)
        if _within(target, root) or _within(root, target):
            return
    top = folder.relative_to(p).as_posix() + "/"
    unreadable: list[OSError] = []
    for d, dirs, files in os.walk(folder, onerror=unreadable.append):
        dirs.sort()
        for name in sorted(files):
            if name.startswith(".") or Path(name).suffix.lower() not in IMAGE_SUFFIXES:
                continue
            rel = (Path(d) / name).relative_to(p).as_posix()
            skipped.add("hidden", {"path": rel}, f"in the dot-folder {top!r}: dot-folders are not read (as by "
                                                 f"score); move the image into a label folder to evaluate it")
    for exc in unreadable:
        where = Path(exc.filename).relative_to(p).as_posix() + "/" if exc.filename else top
        skipped.add("hidden", {"path": where}, f"a dot-folder that cannot be listed ({exc.strerror or exc}): "
                                               f"any images in it are not evaluated")


def _folder_rows(p: Path, labels, skipped: Skipped) -> Rows:
    index = None if labels is None else LabelIndex(labels)
    try:
        top = sorted(p.iterdir())
    except OSError as exc:
        raise _unreadable(p, exc) from None
    root = _real(p)
    # the folders read under their own names: DATA's real label folders (a symlinked one is judged
    # against them whatever the sort order: "03" -> "3" comes first, and "3" is the one counted)
    counted = {_real(e): e.name for e in top if not e.name.startswith(".") and not e.is_symlink() and e.is_dir()}
    seen: dict[str, str] = {}       # resolved image -> the row (DATA-relative) it was evaluated as
    for entry in top:
        if entry.name.startswith("."):      # a dot-file is no row; a dot-folder's images are ``hidden`` skips
            if entry.is_dir():
                _hidden_images(entry, p, root, skipped)
            continue
        if not entry.is_dir():
            if entry.is_symlink() and not os.path.exists(entry):
                skipped.add("broken_symlink", {"path": entry.name}, f"a symlink to {os.readlink(entry)!r} that "
                                                                      f"resolves to nothing (dangling, or a loop)")
            elif entry.suffix.lower() in IMAGE_SUFFIXES:
                skipped.add("not_in_label_folder", {"path": entry.name}, "an image directly in the data folder has "
                                                                          "no label")
            continue
        if entry.is_symlink():
            target = _real(entry)
            if _within(root, target):       # DATA itself or a folder above it: its images are counted already
                skipped.add("symlink_loop", {"path": entry.name + "/"},
                            f"a symlink to {target}, which holds the data folder itself: not entered")
                continue
            twin = counted.get(target)
            if twin is not None:            # "03" -> "3": the same images under a second name
                for f in _files_under(entry):
                    rel = f.relative_to(p)
                    if len(rel.parts) == 2 and not rel.name.startswith(".") and \
                            f.suffix.lower() in IMAGE_SUFFIXES and not f.is_dir():
                        skipped.add("duplicate", {"path": rel.as_posix()},
                                    f"folder {entry.name!r} is a symlink to {twin + '/'!r}: this image is "
                                    f"read once, as {twin}/{rel.name}")
                continue
            counted[target] = entry.name
            base = target
        else:
            base = os.path.join(root, entry.name)
        classes = [] if index is None else index.classes(entry.name)
        truth = entry.name if index is None else classes[0] if len(classes) == 1 else None
        for f in _files_under(entry):
            rel = f.relative_to(p)
            if rel.name.startswith("."):        # listed, never entered (``_files_under``)
                if f.is_dir():
                    _hidden_images(f, p, root, skipped)
                continue
            where = {"path": rel.as_posix()}
            if f.is_dir():      # a real one's files are listed themselves; a symlinked one is not entered
                if f.is_symlink():
                    skipped.add("nested_folder", where, "a symlink to a folder inside <label>/: not entered")
                continue
            if len(rel.parts) > 2:
                skipped.add("nested_folder", where, "deeper than <label>/<file>")
                continue
            if f.suffix.lower() not in IMAGE_SUFFIXES:
                skipped.add("not_an_image", where, f"suffix {f.suffix or '(none)'!r} is not "
                                                   f"{'/'.join(IMAGE_SUFFIXES)}")
                continue
            if f.is_symlink() and not os.path.exists(f):
                skipped.add("broken_symlink", where, f"a symlink to {os.readlink(f)!r} that resolves to nothing "
                                                     f"(dangling, or a loop)")
                continue
            real = _real(f) if f.is_symlink() else os.path.join(base, f.name)
            if real in seen:            # one image reached by two names, one of them a symlink
                skipped.add("duplicate", where, f"the same file as {seen[real]} (through a symlink): evaluated "
                                                f"once, as {seen[real]}")
                continue
            if len(classes) > 1:        # refused at its first image: rows past --limit are not read
                raise ambiguous_label(entry.name, classes, f"{p}: folder {entry.name!r}", folder=True)
            if truth is None:
                skipped.add("unknown_label", where, f"folder {entry.name!r} is not a label of the artifact")
                continue
            seen[real] = rel.as_posix()
            yield str(f), truth, where


def read_labelled(path, labels=None, limit: int | None = None):
    """(samples [(raw, truth, where)], Skipped, header dict or None), reading at most ``limit`` samples.
    ``truth`` is the class id the row's label names (``labels`` given; a label that names several
    classes raises ``InputError``), or the raw label text (``labels`` None)."""
    p = Path(path)
    skipped = Skipped()
    header: dict = {}
    if p.is_dir():
        rows = _folder_rows(p, labels, skipped)
    elif p.is_file():
        rows = _tsv_rows(p, labels, skipped, header)
    elif p.exists():
        raise InputError(f"evaluation data {p} is neither a folder nor a regular file (a pipe, a device): give a "
                         f"folder of <label>/<image> files or a TSV file", code=ec.EVAL_DATA_UNREADABLE)
    else:
        raise InputError(f"evaluation data {p} does not exist", code=ec.EVAL_DATA_MISSING)
    samples = []
    try:
        for row in rows:
            samples.append(row)
            if limit is not None and len(samples) >= limit:
                break
    finally:
        rows.close()                # a TSV read up to the limit is closed now, not at collection
    return samples, skipped, (header or None)


def labelled_samples(path) -> list[tuple[object, str]]:
    """Every (raw input, label) of ``path``, labels unchecked (see ``read_labelled`` for the skipped rows)."""
    samples, _, _ = read_labelled(path)
    if not samples:
        raise InputError(f"{path}: no labelled samples found", code=ec.EVAL_DATA_EMPTY)
    return [(raw, str(label)) for raw, label, _ in samples]


def evaluate(rt, path, limit: int | None = None) -> dict:
    if limit is not None and limit < 1:
        raise InputError(f"limit must be at least 1, got {limit}", code=ec.INPUT_INVALID)
    task_name = getattr(rt.task, "name", None) or type(rt.task).__name__
    if not is_classifier(rt.task):
        supported = eval_tasks()
        raise InputError(f"eval measures the accuracy of a classifier ({', '.join(supported)}); this artifact's "
                         f"task is {task_name}, which answers no one label per input: it is not evaluated "
                         f"(score writes its results)", code=ec.INPUT_INVALID, task=task_name, supported=supported)
    kind = getattr(rt.task, "input_kind", None)
    if Path(path).is_dir() and kind != "image":
        # each row's raw input is the image's path: a text classifier would classify the path string
        raise InputError(f"{path} is a folder of <label>/<image> files, and this artifact's task {task_name} takes "
                         f"{kind or 'no image'} input, not images: give it a text<TAB>label TSV",
                         code=ec.INPUT_INVALID, task=task_name, input_kind=kind)
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
    error_types: dict[str, int] = {}
    error_examples: list[dict] = []
    for raw, truth, where in samples:
        try:
            res = rt.infer(raw)
        except EdgeRuntimeError as exc:
            errors[exc.code] = errors.get(exc.code, 0) + 1
            error_types[type(exc).__name__] = error_types.get(type(exc).__name__, 0) + 1
            if len(error_examples) < EXAMPLES_PER_REASON:
                error_examples.append({"code": exc.code, **where, "message": exc.message[:200]})
            continue
        if res.class_id is None:      # a classifier plug-in whose result carries no class id
            raise EdgeRuntimeError(f"task {task_name} is a classifier (top1_agreement) but its result carries no "
                                   f"class_id: eval compares class ids, not label texts", code=ec.TASK_INVALID,
                                   task=task_name)
        latencies.append(res.latency_ms)
        correct += int(res.class_id) == truth
    n = len(samples)
    lat = np.asarray(latencies, dtype=float)
    par = rt.variant.get("parity") or {}

    def pct(q):
        return float(np.percentile(lat, q)) if lat.size else None

    return {
        "samples": n,
        "correct": int(correct),
        "accuracy": correct / n,
        "errors": errors,
        "error_types": error_types,
        "error_examples": error_examples,
        "skipped": skipped.to_dict(),
        "header": header,
        "limit": limit,
        "latency_ms": {"p50": pct(50), "p95": pct(95), "p99": pct(99),
                       "mean": float(lat.mean()) if lat.size else None},
        "device": rt.device,
        "target": rt.variant["target"],
        "parity": {k: par[k] for k in PARITY_KEYS if k in par},
    }
