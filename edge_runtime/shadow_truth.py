"""The truth of each input of ``edge-infer shadow``: the class its label names (the label folder of
an image folder's ``<label>/<image>`` row that ``eval`` evaluates, never a deeper file, a second name
of one image or a dangling link: ``_eval_rows``; or a CSV/JSONL label field), as a **class id** of
side A's labels, and the same
class among B's labels, resolved as ``edge-infer eval`` does (``evaluate.LabelIndex``).

Never a label text: a labels file may repeat a text (ImageNet's ``crane`` at 134 and 517), and a
repeated text names no one class. A label that is such a text is refused before anything runs
(``check_labels``: ``evaluate.ambiguous_label``, ``input_invalid``, exit 2, the indices named), as
``eval`` refuses it. Only classifiers have a truth (``evaluate.is_classifier``): a detector's or a
segmenter's "prediction" is its top box's or largest region's label, not one answer per input.

Where B's labels differ from A's (reordered, a class added), a class is matched by a text each
file holds once: B's accuracy is scored against that class (``b_classes``; not at all where a
repeated text leaves it unsaid), and B's answer is compared with A's as A's class (``a_classes``)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, NamedTuple

from . import error_codes as ec
from .errors import InputError
from .eval_labels import LabelIndex, Skipped, ambiguous_label, is_classifier

NO_CLASS = -1       # ``Truth.b`` where B's labels have no class of that text: B is wrong whatever it answers


class Truth(NamedTuple):
    """An input's truth: A's label text of the class (what the line shows), A's class id, and B's
    class id of the same class (the same id when the labels are the same; ``NO_CLASS`` when B has
    none of that text; None when B's labels cannot say which, so B's accuracy is not measured)."""

    text: str
    a: int
    b: int | None


def labels_of(rt) -> list[str] | None:
    """The labels a truth is resolved against: a classifier's; None for any other task (no truth)."""
    if not is_classifier(rt.task):
        return None
    return list(getattr(rt.task, "labels", None) or []) or None


def class_labels(rt) -> list[str] | None:
    """The labels a result's class ids index, for any task that has them (a classifier's, a detector's
    boxes, a segmenter's mask values): what B's class ids are translated by (``a_classes``)."""
    return list(getattr(rt.task, "labels", None) or []) or None


def _same_class(src: list[str], dst: list[str]) -> list[int | None]:
    """For each class of ``src``, the class of ``dst`` with its text, where each file holds that text
    once; None where either repeats it; ``NO_CLASS`` where ``dst`` lacks it."""
    s, d = LabelIndex(src), LabelIndex(dst)
    return [None if len(s.by_text[t]) > 1 or len(d.by_text.get(t, [])) > 1
            else d.by_text[t][0] if t in d.by_text else NO_CLASS for t in src]


def _shared(labels_a: list[str] | None, labels_b: list[str] | None) -> bool:
    return bool(labels_a and labels_b and set(labels_a) & set(labels_b))


def b_classes(labels_a: list[str], labels_b: list[str] | None) -> list[int | None] | None:
    """B's class id of each of A's classes (``_same_class``), for B's accuracy; None when the labels
    are the same (the same ids, repeated texts included). None for every class when the two share
    no text (another label space: nothing to match by)."""
    if labels_b == labels_a:
        return None
    if not _shared(labels_a, labels_b):
        return [None] * len(labels_a)
    return _same_class(labels_a, labels_b or [])


def a_classes(labels_a: list[str] | None, labels_b: list[str] | None) -> list[int] | None:
    """A's class id of each of B's classes, so that B's answer is compared with A's as the same class
    (labels reordered, a class added); a class of B that is no one class of A gets an id no class of
    A has (-1 - its id). None: the ids compare as they are (the same labels, or no text shared)."""
    if labels_b == labels_a or not _shared(labels_a, labels_b):
        return None
    return [-1 - i if c is None or c == NO_CLASS else c for i, c in enumerate(_same_class(labels_b or [],
                                                                                           labels_a or []))]


def label_basis(labels_a: list[str] | None, labels_b: list[str] | None) -> str:
    """How B's class ids are read as A's, what every figure of the summary uses (``a_classes``):
    ``same`` (the same labels: ids as they are), ``text`` (matched by a text each file holds once),
    ``index`` (no text shared, or only one side has labels: by class index alone)."""
    if labels_b == labels_a:
        return "same"
    return "text" if _shared(labels_a, labels_b) else "index"


def _some(texts: list[str]) -> str:
    return ", ".join(repr(t) for t in texts[:3]) + (f" and {len(texts) - 3} more" if len(texts) > 3 else "")


def label_space_note(labels_a: list[str] | None, labels_b: list[str] | None) -> str | None:
    """What the summary must say when B's answers are not matched to A's class for class by text:
    both have labels, they differ and share no text (a renamed ``LABEL_0`` -> ``negative``, or another
    model's classes altogether), or only one side has labels, so "agree" means "the same index", which
    the run cannot check; or they share only some texts, so B's classes that name no one class of A's
    never agree (and A's with no class of B's are never B's answer)."""
    basis = label_basis(labels_a, labels_b)
    if basis == "same":
        return None
    if basis == "index":
        if not labels_a or not labels_b:
            return (f"{'A' if not labels_a else 'B'} has no labels: answers are compared by class index alone; an "
                    f"agreement is only as true as that pairing")
        pairs = ", ".join(f"{x!r} = {y!r}" for x, y in list(zip(labels_a, labels_b))[:3])
        more = ", ..." if min(len(labels_a), len(labels_b)) > 3 else ""
        sizes = "" if len(labels_a) == len(labels_b) else f"; A has {len(labels_a)} classes, B {len(labels_b)}"
        return (f"A's and B's labels share no text: answers are compared by class index alone (A's {pairs}{more}"
                f"{sizes}); an agreement is only as true as that pairing")
    to_a = a_classes(labels_a, labels_b) or []
    only_b = [t for t, c in zip(labels_b or [], to_a) if c < 0]
    hit = {c for c in to_a if c >= 0}
    only_a = [t for i, t in enumerate(labels_a or []) if i not in hit]
    if not only_b and not only_a:
        return None         # the same classes, reordered: each matched by its text
    parts = []
    if only_b:
        parts.append(f"B's {_some(only_b)} name{'s' if len(only_b) == 1 else ''} no one class of A's, so B "
                     f"answering {'it' if len(only_b) == 1 else 'them'} never agrees")
    if only_a:
        parts.append(f"A's {_some(only_a)} {'has' if len(only_a) == 1 else 'have'} no one class among B's labels, "
                     f"so B never agrees with A there")
    return (f"A's and B's labels share only some texts: classes are matched by text; " + "; ".join(parts))


def in_a_space(result: dict, to_a: list[int] | None) -> dict:
    """B's result dict with its class ids as A's (``a_classes``): ``class_id``, ``top_k`` indices, each
    detection's ``class_id`` and a segmentation mask's values."""
    if to_a is None:
        return result

    def tr(i):
        return to_a[i] if isinstance(i, int) and 0 <= i < len(to_a) else i

    out = dict(result, class_id=tr(result.get("class_id")))
    if result.get("top_k"):
        out["top_k"] = [dict(t, index=tr(t["index"])) for t in result["top_k"]]
    if result.get("detections"):        # a detector's boxes: matched by class id, so by A's
        out["detections"] = [dict(d, class_id=tr(d.get("class_id"))) for d in result["detections"]]
    outs = result.get("outputs")
    if isinstance(outs, dict) and outs.get("mask") is not None:     # a segmenter's mask holds class ids
        out["outputs"] = dict(outs, mask=_mask_in_a_space(outs["mask"], to_a))
    return out


def _mask_in_a_space(mask, to_a: list[int]):
    import numpy as np

    data = mask["data"] if isinstance(mask, dict) and "data" in mask else mask
    arr = np.asarray(data)
    if arr.dtype.kind not in "iu" or not arr.size:
        return mask
    table = np.asarray(to_a, dtype=np.int64)
    ids = arr.astype(np.int64)
    inside = (ids >= 0) & (ids < len(table))
    moved = np.where(inside, table[np.clip(ids, 0, max(len(table) - 1, 0))], ids)
    return dict(mask, data=moved.tolist()) if isinstance(mask, dict) and "data" in mask else moved.tolist()


def repeated_texts(*labels: list[str] | None) -> frozenset:
    """The texts any of ``labels`` repeats (each names several classes there)."""
    return frozenset(t for lab in labels if lab for t, ids in LabelIndex(lab).by_text.items() if len(ids) > 1)


class _AllSkipped(Skipped):
    """``Skipped`` that keeps every skipped path's reason (``path -> reason``), not only examples."""

    def __init__(self):
        super().__init__()
        self.paths: dict[str, str] = {}

    def add(self, reason: str, where: dict, detail: str) -> None:
        super().add(reason, where, detail)
        self.paths.setdefault(str(where.get("path", "")), reason)


def _eval_rows(root: Path) -> tuple[dict[str, str] | None, dict[str, str]]:
    """The image folder as ``edge-infer eval`` reads it: (each evaluated image's relative path -> its
    label folder's name, each skipped path -> eval's reason: ``nested_folder``, ``duplicate``,
    ``broken_symlink``, ``not_an_image``, ...). (None, {}) where eval cannot walk it (a folder that
    cannot be listed: the run's own error record names it)."""
    from .evaluate import _folder_rows

    skipped = _AllSkipped()
    try:
        kept = {where["path"]: str(label) for _, label, where in _folder_rows(root, None, skipped)}
    except (InputError, OSError):
        return None, {}
    return kept, skipped.paths


def _label_values(source: dict | None, label_field: str) -> Iterator[tuple[str | None, str, bool, str | None]]:
    """(the raw label or None, where it is, is it a folder, eval's skip reason or None) of each record
    of ``source`` in reader order; for an image folder the label folder of a ``<label>/<image>`` path
    that ``eval`` evaluates (a deeper file, a dangling symlink, a second name of one image, a file
    eval reads as no image: no label, with eval's reason: accuracy as ``eval`` measures it), else the
    ``label_field`` column/field. Ends where the labels end (no source, stdin, no label column)."""
    from .score_inputs import read_records

    if source is None:
        return
    if source["format"] == "images":
        from .score_images import read_images

        # the records themselves (not ``image_files``): a subfolder that cannot be listed is one error
        # record there, so the labels of the images after it went one record early (a failure took the
        # next image's label, the last image none)
        root = Path(source["path"])
        kept, skipped = _eval_rows(root)
        for rec in read_images(root):
            rel = str(rec.id)
            if rec.error is not None or "/" not in rel:
                yield None, str(root), True, None
            elif kept is None:      # the folder could not be walked as eval walks it: <label>/<image> only
                head = rel.split("/")[0] if rel.count("/") == 1 else None
                yield head, f"{root}: folder {head!r}" if head else f"{root}: {rel}", True, \
                    None if head else "nested_folder"
            elif rel in kept:
                yield kept[rel], f"{root}: folder {kept[rel]!r}", True, None
            else:
                yield None, f"{root}: {rel}", True, skipped.get(rel, "not_in_label_folder")
        return
    if source["format"] not in ("csv", "jsonl") or not read_twice(source):
        return
    try:
        # its values only; the label column as the id too: an id column that is not the run's (``--id-field
        # key`` while the header names ``id`` twice) must not refuse or drop the labels
        stream = read_records(source["path"], source["format"], field=label_field, id_field=label_field)
        for rec in stream:
            raw = rec.value if rec.error is None else None
            yield (None if raw is None else str(raw).strip()), f"{source['path']} line {rec.line}", False, None
    except InputError as exc:
        if exc.code != ec.INPUT_FIELD_MISSING:      # a header naming the label column twice: which is meant?
            raise InputError(f"the labels of {source['path']} cannot be read (--label-field {label_field}): "
                             f"{exc.message}", code=exc.code) from None
        return      # no label column: unlabelled


def read_twice(source: dict | None) -> bool:
    """Whether the input can be read for its labels before the run reads it: a regular file or a folder.
    A pipe or a FIFO (``cat in.csv | shadow A B /dev/stdin``) is read once, by the run: the labels' read
    took the records after the CSV reader's first block (5000 piped, ~2200 compared, exit 0), or drained a
    JSONL pipe before the run read it (``score_input_empty``, exit 2, on a full input)."""
    import os
    import stat

    try:
        mode = os.stat(source["path"]).st_mode if source is not None else 0
    except OSError:
        return False
    return stat.S_ISREG(mode) or stat.S_ISDIR(mode)


def _truth(raw: str, index: LabelIndex, labels: list[str], to_b, where: str, folder: bool) -> Truth | None:
    classes = index.classes(raw)
    if len(classes) > 1:
        raise ambiguous_label(raw, classes, where, folder=folder)
    if not classes:
        return None         # no label of A's: unlabelled
    c = classes[0]
    return Truth(labels[c], c, c if to_b is None else to_b[c])


def check_labels(source: dict | None, labels: list[str] | None, label_field: str = "label", *,
                 unknown: dict | None = None) -> int:
    """The number of records whose label names a class of ``labels``; raises ``InputError``
    (``input_invalid``) at the first label that names several (a text the labels file repeats),
    before anything runs. ``labels`` None (no classifier): the records that carry a label at all.
    ``unknown`` (a dict) gets ``count``, the labels that name no class (left out of the accuracy,
    as ``eval`` skips them as ``unknown_label``), and ``first``, the first of them and where; and
    ``skipped``, the images ``eval`` would skip (``nested_folder``, ``duplicate``, ``broken_symlink``,
    ...: no truth, out of the accuracy), and ``skipped_first``, the first and its reason."""
    index = None if labels is None else LabelIndex(labels)
    n = 0
    for raw, where, folder, skip in _label_values(source, label_field):
        if skip is not None and unknown is not None:    # eval skips it: out of the accuracy, said so
            unknown["skipped"] = unknown.get("skipped", 0) + 1
            unknown.setdefault("skipped_first", f"{where}: {skip}")
        if raw is None:
            continue
        named = index is None or _truth(raw, index, labels or [], None, where, folder) is not None
        n += named
        if not named and unknown is not None:
            unknown["count"] = unknown.get("count", 0) + 1
            unknown.setdefault("first", f"{raw!r} ({where})")
    return n


def truths(source: dict | None, labels: list[str] | None, label_field: str = "label", *,
           labels_b: list[str] | None = None) -> Iterator[Truth | None]:
    """The ``Truth`` of each record of ``source`` in reader order (None where it has no label of
    A's), then None for ever. ``labels`` None (not a classifier, no labels): no truth."""
    if labels:
        index, to_b = LabelIndex(labels), b_classes(labels, labels_b)
        for raw, where, folder, _skip in _label_values(source, label_field):
            yield None if raw is None else _truth(raw, index, labels, to_b, where, folder)
    while True:
        yield None
