"""The labels' side of ``edge-infer eval`` (and of shadow's truth): which class a label names
(``LabelIndex``, ``resolve_label``: the text, Unicode-normalised, or an index; a text of several
classes is refused with ``ambiguous_label``), the rows not evaluated (``Skipped``), and which tasks
have a truth at all (``is_classifier``). The readers of the data are ``evaluate``'s."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import Generator

from . import error_codes as ec
from .errors import InputError

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
    """The artifact's label *text* for ``truth`` (a name, or an index into ``labels``); None if it is
    neither. ``labels`` None: no check (the raw label). A text, not a class: where the labels file
    repeats a text it names several classes (``eval`` compares class ids: :class:`LabelIndex`)."""
    if labels is None:
        return truth
    if truth in labels:
        return truth
    if truth.isascii() and truth.isdigit() and int(truth) < len(labels):      # "²".isdigit(), and int() refuses it
        return labels[int(truth)]
    return None


class LabelIndex:
    """The classes a label names (a folder name, a TSV label): built once per labels list."""

    def __init__(self, labels: list[str]):
        self.n = len(labels)
        self.by_text: dict[str, list[int]] = {}
        self.by_nfc: dict[str, list[int]] = {}     # the texts in Unicode's composed form (NFC)
        for i, label in enumerate(labels):
            self.by_text.setdefault(label, []).append(i)
            self.by_nfc.setdefault(unicodedata.normalize("NFC", label), []).append(i)

    def classes(self, name: str) -> list[int]:
        """The class ids ``name`` names: those whose label text it is (more than one where the labels
        file repeats it; the same text in another Unicode normal form, NFD "café" for NFC "café",
        is that text), else the index it spells (``"518"``); ``[]`` when it is neither. A label
        text comes first, as before: with labels ``0..9`` the folder ``7`` is the class labelled 7."""
        found = self.by_text.get(name) or self.by_nfc.get(unicodedata.normalize("NFC", name))
        if found:       # a folder named on macOS is decomposed ("cafe" + U+0301), labels.txt composed
            return list(found)
        if name.isascii() and name.isdigit() and int(name) < self.n:
            # a zero-padded number ("09") is no text; as an index it is class 9, but where the labels
            # have the text "9" at another class (labels "1".."10": class 8) it names that one as well
            as_text = self.by_text.get(str(int(name)), [])
            return [int(name)] + [c for c in as_text if c != int(name)]
        return []


def ambiguous_label(name: str, classes: list[int], where: str, folder: bool = False) -> InputError:
    """The refusal of a label that names several classes (a text the labels file repeats, or a
    zero-padded number that is one class's index and, as a number, another class's text)."""
    shown = ", ".join(str(c) for c in classes)
    choices = " or ".join(f"{c}/" if folder else str(c) for c in classes[:5])
    fix = f"name the folder by the class index instead ({choices})" if folder else \
        f"write the label as the class index instead ({choices})"
    if name.isascii() and name.isdigit() and name != str(int(name)):
        others = ", ".join(str(c) for c in classes[1:])
        what = (f"is no label text; it is the index of class {classes[0]}, but as the number "
                f"{int(name)} it is the text of class{'es' if len(classes) > 2 else ''} {others}")
        thing = "name the folder" if folder else "write the label"
        fix = f"{thing} by the label text of the class it means ({str(int(name))!r} is class {others})"
    else:
        what = f"is the text of {len(classes)} classes of the artifact (indices {shown})"
    return InputError(f"{where}: label {name!r} {what}, so it cannot say which one is right; {fix}"[:600],
                      code=ec.INPUT_INVALID, label=name, classes=classes)


def eval_tasks() -> list[str]:
    """The tasks ``evaluate`` measures: the classifiers (parity metric ``top1_agreement``)."""
    from edge_runtime.models import tasks_where

    return tasks_where(is_classifier)


def is_classifier(task) -> bool:
    """``task`` (a Task class or instance) answers one class per input (``top1_agreement``)."""
    return getattr(task, "parity_metric", None) == "top1_agreement"


Rows = Generator[tuple[object, object, dict], None, None]     # (raw input, truth, where) of each row


def _clip(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n] + "…"


def _truth(name: str, index: LabelIndex | None, where: str) -> object:
    """The truth of a row labelled ``name``: the raw name (no labels: ``labelled_samples``), the
    class id it names, or None when it names none. A name of several classes is refused."""
    if index is None:
        return name
    classes = index.classes(name)
    if len(classes) > 1:
        raise ambiguous_label(name, classes, where)
    return classes[0] if classes else None
