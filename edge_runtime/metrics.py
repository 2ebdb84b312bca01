"""Runtime metrics: latency histograms per device/bucket, the input-length
histogram (the drift signal), counts per error code, fallbacks.

``Runtime.metrics()`` returns a plain-dict snapshot; ``prometheus_text()``
renders snapshots in the Prometheus text exposition format (0.0.4) with no
dependency; ``PrometheusCollector`` exposes the same figures through
``prometheus_client`` when that is installed (it is never required).
Recording a successful call is one append to a queue (no lock: ``deque.append`` is atomic);
the queue is folded into the histograms under the lock every ``FOLD_AT`` calls and at every
snapshot, so a snapshot counts every call that returned before it, and memory stays bounded.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import Counter, deque

from . import error_codes as ec

# seconds: sub-millisecond (a warm Edge TPU call) up to the 5 s default deadline and past it
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
# in the task's own unit (Task.length_unit): tokens for text, decoded pixels for images, elements for tensors
FOLD_AT = 256       # queued successful calls folded into the histograms at once (memory: ~100 bytes each)
LENGTH_BUCKETS = (1, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                  16777216, 41943040)


def length_unit(task) -> str:
    """The unit of the task's input lengths (``Task.length_unit``); "units" for a task not registered here."""
    from edge_runtime.models import get_task

    try:
        return str(get_task(task).length_unit)
    except Exception:  # an unknown or broken task: the figure keeps a neutral unit
        return "units"


class Histogram:
    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)   # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def snapshot(self) -> dict:
        cumulative, total = [], 0
        for c in self.counts:
            total += c
            cumulative.append(total)
        return {"buckets": [[b, n] for b, n in zip(list(self.bounds) + [math.inf], cumulative)],
                "sum": self.sum, "count": self.count}


class RuntimeMetrics:
    def __init__(self, labels: dict):
        self.labels = dict(labels)       # model, version, task, target, device
        self._length_unit = length_unit(self.labels.get("task"))
        self._lock = threading.Lock()
        self._latency: dict[str, Histogram] = {}
        self._length = Histogram(LENGTH_BUCKETS)
        self._errors: Counter = Counter()
        self._pending: deque = deque()   # (bucket, latency_ms, length, truncated) of calls not yet folded
        self._truncated = 0
        self._fallbacks: list[str] = []

    def ok(self, bucket: str, latency_ms: float, length: int | None, truncated: bool) -> None:
        """One successful call: queued (~0.1 µs; the lock, a bisect and the adds took ~1 µs of every
        call of a 20 µs model), folded every ``FOLD_AT`` calls and at every snapshot."""
        q = self._pending
        q.append((bucket, latency_ms, length, truncated))
        if len(q) >= FOLD_AT:
            with self._lock:
                self._fold()

    def _fold(self) -> None:
        """Move the queued calls into the histograms (the lock held). Pops exactly the calls queued
        when it started: one appended meanwhile by another thread waits for the next fold."""
        q, latency, lengths = self._pending, self._latency, self._length
        for _ in range(len(q)):
            bucket, latency_ms, length, truncated = q.popleft()
            hist = latency.get(bucket)
            if hist is None:
                hist = latency[bucket] = Histogram(LATENCY_BUCKETS_S)
            hist.observe(latency_ms / 1000)
            if length is not None:
                lengths.observe(length)
            if truncated:
                self._truncated += 1

    def length(self, length: int | None) -> None:
        """The length of an input that was prepared but then failed on the device."""
        if length is not None:
            with self._lock:
                self._length.observe(length)

    def error(self, exc) -> None:
        with self._lock:
            self._errors[(type(exc).__name__, getattr(exc, "code", ec.UNKNOWN))] += 1

    def fallback(self, reason: str) -> None:
        with self._lock:
            self._fallbacks.append(reason)

    def reset(self) -> None:
        with self._lock:
            for _ in range(len(self._pending)):
                self._pending.popleft()
            self._latency.clear()
            self._length = Histogram(LENGTH_BUCKETS)
            self._errors.clear()
            self._truncated = 0

    def snapshot(self) -> dict:
        with self._lock:
            self._fold()
            return {
                "labels": dict(self.labels),
                "latency_seconds": {b: h.snapshot() for b, h in sorted(self._latency.items())},
                "input_length": dict(self._length.snapshot(), unit=self._length_unit),
                "errors": [{"type": t, "code": c, "count": n} for (t, c), n in sorted(self._errors.items())],
                "truncated": self._truncated,
                "fallbacks": list(self._fallbacks),
            }


def _escape(value) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(d: dict) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in d.items()) + "}" if d else ""


def _num(v) -> str:
    if v == math.inf:
        return "+Inf"
    return repr(float(v)) if isinstance(v, float) else str(v)


def _histogram(rows: list, name: str, labels: dict, snap: dict) -> None:
    for bound, n in snap["buckets"]:
        rows.append((f"{name}_bucket", {**labels, "le": _num(float(bound))}, n))
    rows.append((f"{name}_sum", labels, float(snap["sum"])))
    rows.append((f"{name}_count", labels, snap["count"]))


def prometheus_text(snapshots) -> str:
    """Snapshots of one or more runtimes (a dict, or any iterable of them) in the text exposition
    format. Runtimes whose series carry the same labels (one model and version loaded twice: on two
    devices, the errors, truncations, fallbacks and input lengths; on one device, every family) add
    up into one series each: a scrape never holds a series twice (Prometheus keeps one of them and
    drops the other runtime's figures)."""
    if isinstance(snapshots, dict):
        snapshots = [snapshots]
    snapshots = list(snapshots)         # read once per family: a generator would feed only the first
    lines: list[str] = []

    def family(name, kind, help_text, emit):
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        rows: list = []
        for s in snapshots:
            emit(rows, s, {k: s["labels"][k] for k in ("model", "version") if k in s["labels"]})
        merged: dict[tuple[str, str], float] = {}
        for sample, labels, value in rows:
            key = (sample, _labels(labels))
            old = merged.get(key)
            # counters and histograms add up; the one gauge (info, always 1) stays 1
            merged[key] = value if old is None else max(old, value) if kind == "gauge" else old + value
        lines.extend(f"{sample}{text} {_num(value)}" for (sample, text), value in merged.items())

    family("edge_runtime_info", "gauge", "The loaded model, its variant and the device it runs on.",
           lambda rows, s, base: rows.append(("edge_runtime_info", s["labels"], 1)))

    def latency(rows, s, base):
        for b, h in s["latency_seconds"].items():
            _histogram(rows, "edge_runtime_inference_latency_seconds",
                       {**base, "device": s["labels"].get("device", ""), "bucket": b}, h)

    family("edge_runtime_inference_latency_seconds", "histogram",
           "infer() latency per device and bucket, input received to result (successful calls).", latency)
    family("edge_runtime_input_length", "histogram",
           "Input length before truncation (tokens, pixels or elements): the drift signal.",
           lambda rows, s, base: _histogram(rows, "edge_runtime_input_length",
                                            {**base, "unit": s["input_length"]["unit"]}, s["input_length"]))

    def errors(rows, s, base):
        for e in s["errors"]:
            rows.append(("edge_runtime_errors_total", {**base, "type": e["type"], "code": e["code"]}, e["count"]))

    family("edge_runtime_errors_total", "counter", "Failed calls per error class and code.", errors)
    family("edge_runtime_truncated_total", "counter", "Inputs truncated to the largest bucket.",
           lambda rows, s, base: rows.append(("edge_runtime_truncated_total", base, s["truncated"])))
    family("edge_runtime_fallbacks_total", "counter", "Device fallbacks taken at load (reason in rt.info()).",
           lambda rows, s, base: rows.append(("edge_runtime_fallbacks_total", base, len(s["fallbacks"]))))
    return "\n".join(lines) + "\n"


class PrometheusCollector:
    """A ``prometheus_client`` collector over runtimes: ``REGISTRY.register(PrometheusCollector(rt))``."""

    def __init__(self, *runtimes):
        self.runtimes = runtimes

    def collect(self):
        from prometheus_client.parser import text_string_to_metric_families

        yield from text_string_to_metric_families(prometheus_text([rt.metrics() for rt in self.runtimes]))
