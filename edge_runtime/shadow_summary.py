"""What ``edge-infer shadow`` reports: ``ShadowSummary`` (agreement, flips, the worst inputs,
accuracy, latency; accumulated line by line) and ``verdict`` (the typed error the run ends with)."""

from __future__ import annotations

import heapq
import math
from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import error_codes as ec
from .errors import EdgeRuntimeError, InputError, ParityError

FAILED_BADNESS = 10.0       # one side failed: worse than any figure
LOWER_IS_BETTER = ("score_diff",)   # figures whose worst is their largest (the others': their smallest)


# samples a percentile needs before at least one lies above it (below that it reads the slowest: bench's rule)
MIN_SAMPLES = {"p50": 2, "p99": 100}


def sig(value: float, digits: int = 12) -> float:
    """``value`` to ``digits`` significant digits: the float noise of a mean or an interpolated
    percentile (0.045000000000000005) goes, and the text's cut toward the worse side (``cli_shadow._f``)
    reads the figure, not the noise; a non-zero value never becomes 0 nor 1.0 short of its 12th digit.
    Decimals did: ``round(x, 6)`` made a score_diff max of 4e-7 "0.0", a cosine min of 0.9999996 "1.0"
    (as if B were A), and ``round(ms, 3)`` a latency of 0.0004 ms "0.0"."""
    return float(f"{value:.{digits}g}")


def _latency(values) -> dict:
    lat = np.asarray(values, dtype=float)
    if not lat.size:
        return {"n": 0, "p50": None, "p99": None, "mean": None, "few_samples_for": []}
    return {"n": int(lat.size), "p50": sig(float(np.percentile(lat, 50))),
            "p99": sig(float(np.percentile(lat, 99))), "mean": sig(math.fsum(lat.tolist()) / lat.size),
            "few_samples_for": [p for p, k in MIN_SAMPLES.items() if lat.size < k]}


def _mean(values) -> float:
    """The mean of the exactly rounded sum (``math.fsum``): its only error is the division's, where a
    float sum over millions of inputs drifts."""
    return sig(math.fsum(values) / len(values))


def json_rate(num: int, den: int) -> float:
    """A rate for the JSON document: ``floor_rate`` at 6 decimals, or as many as ``den`` has digits, so
    that a non-zero count never reads 0.0 (1 of 2,000,000 is 0.0000005, not 0.0) nor one short of all 1.0."""
    return floor_rate(num, den, max(6, len(str(int(den)))))


def floor_rate(num: int, den: int, digits: int = 6) -> float:
    """``num / den`` cut (never rounded up) to ``digits`` decimals, in integers: 19999 of 20000 is
    0.9999 at four, never "1.0000" (nor 0.98995 "0.9900" against a threshold of 0.99)."""
    scale = 10 ** digits
    return (int(num) * scale // int(den)) / scale


def rate_text(num: int | None, den: int | None, digits: int = 4) -> str:
    """A rate of two counts as text, cut to ``digits`` (``floor_rate``); ``-`` over nothing."""
    if num is None or not den:
        return "-"
    return f"{floor_rate(num, den, digits):.{digits}f}"


def _pred(side: dict) -> Any:
    if not side.get("ok"):
        return None
    return side["result"].get("prediction")


def _class_id(side: dict) -> int | None:
    """The side's answer as accuracy compares it: its class id (a failure: None, wrong)."""
    return side["result"].get("class_id") if side.get("ok") else None


@dataclass
class ShadowSummary:
    """What ``shadow`` reports, accumulated line by line (``add``), resumed lines included."""

    worst_n: int = 10
    total: int = 0
    compared: int = 0
    agree: int = 0
    both_failed: int = 0
    both_failed_differently: int = 0    # ... with another error code on each side (A refused it, B timed out)
    only_a_failed: int = 0
    only_b_failed: int = 0
    resumed_from: int = 0
    wall_s: float = 0.0
    kind: str | None = None
    agree_at: float | None = None
    # one C double per input and figure (8 bytes, not a 32-byte float object in a list: a run over
    # millions of inputs keeps its summary in a quarter of the memory)
    latencies_a: array = field(default_factory=lambda: array("d"), repr=False)
    latencies_b: array = field(default_factory=lambda: array("d"), repr=False)
    figures: dict = field(default_factory=dict, repr=False)       # figure name -> values (array of doubles)
    matrix: dict = field(default_factory=dict)                    # (label A, label B) -> count
    errors_a: dict = field(default_factory=dict)
    errors_b: dict = field(default_factory=dict)
    labelled: int = 0
    correct_a: int = 0
    correct_b: int = 0
    unscored_b: int = 0             # labelled inputs whose class B's labels cannot name (B's labels differ)
    empty: int = 0                  # compared inputs where neither side found anything (no box, no keypoint)
    truncated_a: int = 0            # inputs a side answered on a cut text (longer than its largest bucket)
    truncated_b: int = 0
    truncated_one_side: int = 0     # ... on one side only: the two did not answer the same input
    mismatched: int = 0             # compared inputs whose results could not be compared (other sizes, shapes)
    accuracy_note: str | None = None
    labels_note: str | None = None      # A's and B's labels share no text: compared by class index alone
    unknown_labels: tuple | None = None     # (how many, the first and where): labels naming no class of A's
    eval_skipped: tuple | None = None       # (how many, the first and why): images eval skips (no truth)
    repeated: frozenset = frozenset()   # label texts a labels file repeats: the matrix names them with their id
    labels_basis: str | None = None     # how B's classes are read as A's (``use_labels``): same, text or index
    labels_a: list | None = field(default=None, repr=False)     # each side's labels (``use_labels``)
    labels_b: list | None = field(default=None, repr=False)
    b_to_a: list | None = field(default=None, repr=False)       # B's class ids as A's (``shadow_truth.a_classes``)
    _order: dict = field(default_factory=dict, repr=False)      # a flip matrix name -> its sort key
    _worst: list = field(default_factory=list, repr=False)        # heap of (badness, -index, entry)
    side_counts: tuple = field(default=(), repr=False)            # (score.Summary of A, of B)

    def __post_init__(self):
        from .score import Summary

        self.side_counts = (Summary(), Summary())

    def use_labels(self, labels_a: list[str] | None, labels_b: list[str] | None) -> None:
        """Read B's classes as the comparison does (``shadow_truth``): the flip matrix names each answer by
        the class it was compared as, so a diagonal cell is an agreement and an agreement a diagonal cell."""
        from .shadow_truth import a_classes, label_basis, label_space_note, repeated_texts

        self.labels_a, self.labels_b = labels_a, labels_b
        self.b_to_a = a_classes(labels_a, labels_b)
        self.labels_basis = label_basis(labels_a, labels_b)
        self.labels_note = label_space_note(labels_a, labels_b)
        self.repeated = repeated_texts(labels_a, labels_b)

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
        cut = [bool(side.get("ok") and side["result"].get("truncated")) for side in (a, b)]
        self.truncated_a += cut[0]
        self.truncated_b += cut[1]
        self.truncated_one_side += a.get("ok") and b.get("ok") and cut[0] != cut[1]
        truth = line.get("truth")
        truth_id = line.get("truth_id")     # class ids, never label texts: a labels file may repeat one
        if truth_id is not None:
            self.labelled += 1
            self.correct_a += _class_id(a) == truth_id
            truth_b = line.get("truth_id_b", truth_id)
            if truth_b is None:
                self.unscored_b += 1
            else:
                self.correct_b += _class_id(b) == truth_b
        if not a.get("ok") and not b.get("ok"):
            self.both_failed += 1
            codes = [(side.get("error") or {}).get("code") for side in (a, b)]
            self.both_failed_differently += codes[0] != codes[1]     # not compared, but not alike either
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
            self.empty += bool(cmp.get("empty"))
            self.mismatched += bool(cmp.get("mismatch"))
            for k in ("margin", "cosine", "f1", "mean_iou", "pixel_agreement", "pck", "score_diff"):
                if cmp.get("empty"):
                    break           # an F1 of 1 over no box is no figure of how alike the two are
                if isinstance(cmp.get(k), (int, float)):
                    self.figures.setdefault(k, array("d")).append(float(cmp[k]))
            if cmp.get("kind") == "classification":
                key = (self._name(a), self._name(b, side_b=True))
                self.matrix[key] = self.matrix.get(key, 0) + 1
            badness = float(cmp.get("badness", 0.0))
        entry = {"index": line["index"], "id": line.get("id"), "input": line.get("input"), "truth": truth,
                 "truth_id": truth_id,
                 "agree": line.get("agree"), "a": _brief(a), "b": _brief(b),
                 "compare": {k: v for k, v in (cmp or {}).items() if k not in ("badness",)}, "badness": badness}
        item = (badness, -int(line["index"]), entry)
        if len(self._worst) < self.worst_n:
            heapq.heappush(self._worst, item)
        elif self.worst_n and item[:2] > self._worst[0][:2]:
            heapq.heapreplace(self._worst, item)

    def _name(self, side: dict, side_b: bool = False) -> str:
        """The side's answer in the flip matrix, named by the class it was compared as (``use_labels``): its
        label, with ``#class_id`` where the text is repeated (two cranes are two rows, and a flip between
        them is a flip); by class index where the labels share no text (``zero=0``: one row and column
        per index, as the agreement counts); a class of B that is no one class of A's by its own text
        (``crane#B0`` where A has that text too or B repeats it), never on the diagonal, as it never agrees."""
        pred, cid = str(_pred(side)), _class_id(side)
        if not isinstance(cid, int) or isinstance(cid, bool):
            return pred             # no class id: the text as it is (the comparison's too)
        la, lb = self.labels_a or [], self.labels_b or []
        if self.labels_basis == "index":
            parts = [lab[cid] if 0 <= cid < len(lab) else f"#{cid}" for lab in (la, lb)]
            name = parts[0] if parts[0] == parts[1] else "=".join(parts)
            if parts[0] in self.repeated or parts[1] in self.repeated:
                name += f"#{cid}"
            return self._keep(name, (0, cid, name))
        if side_b and self.b_to_a is not None:
            c = self.b_to_a[cid] if 0 <= cid < len(self.b_to_a) else cid       # as ``in_a_space`` reads it
            if c < 0:
                text = lb[cid] if 0 <= cid < len(lb) else pred
                name = f"{text}#B{cid}" if text in la or text in self.repeated else text
                return self._keep(name, (1, cid, name))
            cid = c
        if 0 <= cid < len(la):
            pred = la[cid]          # A's text of the class, whichever side answered it
        name = f"{pred}#{cid}" if pred in self.repeated else pred
        return self._keep(name, (0, cid, name))

    def _keep(self, name: str, key: tuple) -> str:
        if self.labels_basis is not None:       # no labels given: sorted by the text (``_label_key``)
            self._order.setdefault(name, key)
        return name

    @property
    def agreement(self) -> float | None:
        return self.agree / self.compared if self.compared else None

    def worst(self) -> list[dict]:
        return [e for _, _, e in sorted(self._worst, key=lambda t: (-t[0], -t[1]))]

    def flips(self) -> list[dict]:
        rows = [{"a": k[0], "b": k[1], "count": n} for k, n in self.matrix.items() if k[0] != k[1]]
        return sorted(rows, key=lambda r: (-r["count"], r["a"], r["b"]))

    def matrix_table(self) -> dict:
        labels = sorted({k[0] for k in self.matrix} | {k[1] for k in self.matrix},
                        key=lambda x: self._order.get(x) or (2, 0, "") + _label_key(x))
        return {"labels": labels, "counts": [[self.matrix.get((x, y), 0) for y in labels] for x in labels]}

    def _unknown_labels(self) -> dict | None:
        if not self.unknown_labels:
            return None
        n, first = self.unknown_labels
        return {"count": n, "first": first,
                "note": f"{n} labelled input{'s' if n > 1 else ''} name{'s' if n == 1 else ''} no class of A's labels "
                        f"(the first: {first}): left out of the accuracy, as eval skips them"}

    def _eval_skipped(self) -> dict | None:
        if not self.eval_skipped:
            return None
        n, first = self.eval_skipped
        return {"count": n, "first": first,
                "note": f"{n} input{'s' if n > 1 else ''} of the image folder {'are' if n > 1 else 'is'} no "
                        f"<label>/<image> row eval evaluates (the first: {first}): compared, but left out of "
                        f"the accuracy, as eval skips {'them' if n > 1 else 'it'}"}

    def to_dict(self) -> dict:
        # full figures (``sig``: 12 significant digits, never decimals): min and max are the inputs' own values
        figs: dict[str, dict[str, Any]] = {k: {"mean": _mean(v), "min": float(np.min(v)),
                    "p5": sig(float(np.percentile(v, 5)))} for k, v in self.figures.items() if v}
        for k in LOWER_IS_BETTER:       # its worst tail is the top one: the low tail hid the largest drift
            if self.figures.get(k):
                figs[k].update(p95=sig(float(np.percentile(self.figures[k], 95))),
                               max=float(np.max(self.figures[k])), worst="max")
        acc = None
        if self.labelled:
            scored_b = not self.unscored_b
            acc = {"samples": self.labelled, "a": json_rate(self.correct_a, self.labelled),
                   "b": json_rate(self.correct_b, self.labelled) if scored_b else None, "correct_a": self.correct_a,
                   "correct_b": self.correct_b if scored_b else None, "basis": "class ids (A's labels)"}
        note = self.accuracy_note
        if self.labelled and self.unscored_b:
            note = (f"B's labels differ from A's: {self.unscored_b} of the {self.labelled} labelled inputs name a "
                    f"class B's labels do not name once (a text either repeats, or none shared), so B's accuracy is "
                    f"not measured")
        return {"total": self.total, "compared": self.compared, "agree": self.agree,
                "agreement": json_rate(self.agree, self.compared) if self.compared else None, "kind": self.kind,
                "agree_at": self.agree_at, "empty": self.empty, "mismatched": self.mismatched,
                "truncated": {"a": self.truncated_a, "b": self.truncated_b, "one_side": self.truncated_one_side},
                "both_failed": self.both_failed, "both_failed_differently": self.both_failed_differently,
                "only_a_failed": self.only_a_failed,
                "only_b_failed": self.only_b_failed, "figures": figs, "flips": self.flips(),
                "matrix": self.matrix_table() if self.matrix else None, "accuracy": acc, "accuracy_note": note,
                "labels_note": self.labels_note, "labels_basis": self.labels_basis,
                "unknown_labels": self._unknown_labels(), "eval_skipped": self._eval_skipped(),
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


def check_fraction(name: str, value: object) -> float | None:
    """``value`` (``--min-agreement``, ``--agree-at``) as a float in [0, 1], or None; anything else
    (NaN: every comparison with it is false, so it passed any agreement) is an ``InputError``."""
    import numbers

    if value is None:
        return None
    v = float("nan")           # a bool, a text, anything but a real number: refused below
    if not isinstance(value, bool) and isinstance(value, numbers.Real):
        v = float(value)
    if not 0.0 <= v <= 1.0:
        raise InputError(f"{name} must be a number in [0, 1], got {value!r}", code=ec.INPUT_INVALID)
    return v


def verdict(summary: ShadowSummary, min_agreement: float | None = None) -> EdgeRuntimeError | None:
    """The typed error the run ends with, or None: no input (exit 2); no input answered on
    either side, or on one of them (that side's most frequent error's layer, as ``score``: a B
    that answered nothing was never compared, whatever the agreement says); agreement under
    ``min_agreement`` (``ParityError``, exit 7), or ``min_agreement`` asked of a run where no
    input held anything to compare (neither side found a box or keypoint anywhere)."""
    from .score import verdict as score_verdict

    min_agreement = check_fraction("min_agreement", min_agreement)
    if summary.total == 0:
        return InputError("the input held no records: nothing was compared", code=ec.SCORE_INPUT_EMPTY)
    for side, counts in zip("AB", summary.side_counts):
        problem = score_verdict(counts)
        if problem is not None:
            if summary.compared:        # the other side answered: say which side answered nothing
                problem.message = f"side {side}: {problem.message}"
                problem.args = (problem.message,)
                problem.details["side"] = side
            return problem
    agreement = summary.agreement
    if min_agreement is not None and summary.compared and summary.empty == summary.compared:
        return ParityError(f"no input held anything to compare: neither side found anything in any of the "
                           f"{summary.compared} compared inputs, so their agreement is over nothing and cannot "
                           f"meet --min-agreement {min_agreement:g}", code=ec.SHADOW_AGREEMENT_BELOW,
                           agreement=agreement, compared=summary.compared, min_agreement=min_agreement)
    if min_agreement is not None and agreement is not None and agreement < min_agreement:
        shown = rate_text(summary.agree, summary.compared)
        return ParityError(f"A and B agree on {summary.agree} of {summary.compared} inputs ({shown}), under "
                           f"--min-agreement {min_agreement:g}", code=ec.SHADOW_AGREEMENT_BELOW,
                           agreement=agreement, compared=summary.compared, min_agreement=min_agreement)
    return None
