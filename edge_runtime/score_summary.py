"""``edge-infer score``'s counts and pass/fail: ``Summary`` (the counts over the output's lines,
resumed ones included) and ``verdict`` (the typed error the run ends with; see ``score``'s doc)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import errors as _errors
from . import error_codes as ec
from .errors import EdgeRuntimeError, InputError

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
