"""The truth of each input of ``edge-infer shadow``: the labels of side A, and each record's
label (an image folder's first folder, or a CSV/JSONL label field) resolved against them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from .errors import InputError


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
