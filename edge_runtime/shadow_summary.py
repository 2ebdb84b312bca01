"""What ``edge-infer shadow`` reports: ``ShadowSummary`` (agreement, flips, the worst inputs,
accuracy, latency; accumulated line by line) and ``verdict`` (the typed error the run ends with)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import error_codes as ec
from .errors import EdgeRuntimeError, InputError, ParityError

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
    unscored_b: int = 0             # labelled inputs whose class B's labels cannot name (B's labels differ)
    accuracy_note: str | None = None
    repeated: frozenset = frozenset()   # label texts a labels file repeats: the matrix names them with their id
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
                key = (self._name(a), self._name(b))
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

    def _name(self, side: dict) -> str:
        """The side's answer in the flip matrix: its label, with ``#class_id`` where the text is repeated
        (two cranes are two rows, and a flip between them is a flip)."""
        pred, cid = str(_pred(side)), _class_id(side)
        return f"{pred}#{cid}" if pred in self.repeated and cid is not None else pred

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
            scored_b = not self.unscored_b
            acc = {"samples": self.labelled, "a": round(self.correct_a / self.labelled, 6),
                   "b": round(self.correct_b / self.labelled, 6) if scored_b else None, "correct_a": self.correct_a,
                   "correct_b": self.correct_b if scored_b else None, "basis": "class ids (A's labels)"}
        note = self.accuracy_note
        if self.labelled and self.unscored_b:
            note = (f"B's labels differ from A's: {self.unscored_b} of the {self.labelled} labelled inputs name a "
                    f"class B's labels do not name once (a text either repeats, or none shared), so B's accuracy is "
                    f"not measured")
        return {"total": self.total, "compared": self.compared, "agree": self.agree,
                "agreement": None if self.agreement is None else round(self.agreement, 6), "kind": self.kind,
                "agree_at": self.agree_at, "both_failed": self.both_failed, "only_a_failed": self.only_a_failed,
                "only_b_failed": self.only_b_failed, "figures": figs, "flips": self.flips(),
                "matrix": self.matrix_table() if self.matrix else None, "accuracy": acc, "accuracy_note": note,
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
