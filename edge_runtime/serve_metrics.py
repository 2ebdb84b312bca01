"""``GET /metrics`` of ``edge-infer serve``: the runtime's figures per model plus the server's counters
(requests per model and status, in flight, queue depth, rejections by reason, dynamic batches, bytes)."""

from __future__ import annotations

from typing import Any

from .metrics import _labels, prometheus_text


def metrics_text(core) -> str:
    """Prometheus text for a ``ServeCore``: each model's ``rt.metrics()`` and the server's own counters."""
    lines = [prometheus_text([m.rt.metrics() for m in core.models.values()]).rstrip("\n")] if core.models else []

    def family(name: str, kind: str, help_text: str, rows: list[tuple[dict, Any]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{_labels(labels)} {value}" for labels, value in rows)

    family("edge_serve_requests_total", "counter", "Inference requests answered, per model and status.",
           [({"model": n, "status": s}, c) for (n, s), c in sorted(core._requests.items())])
    family("edge_serve_in_flight", "gauge", "Requests running on a model now.",
           [({"model": m.name, "version": m.version}, m.running) for m in core.models.values()])
    family("edge_serve_queue_depth", "gauge", "Requests waiting for a model now.",
           [({"model": m.name, "version": m.version}, m.waiting) for m in core.models.values()])
    family("edge_serve_rejections_total", "counter", "Requests refused, per reason: before any model work, or "
           "over one of the runtime's byte or item limits (413, too_large).",
           [({"reason": r}, c) for r, c in sorted(core._rejections.items())])
    family("edge_serve_batches_total", "counter", "Dynamic batches run (merged requests).",
           [({}, core._batches)])
    family("edge_serve_batched_requests_total", "counter", "Requests that went through a dynamic batch.",
           [({}, core._batched_requests)])
    family("edge_serve_received_bytes_total", "counter", "Inference request bytes received.",
           [({}, core._received_bytes)])
    inline = [m for m in core.models.values() if m.inline is not None]
    family("edge_serve_inline", "gauge", "1 while a sub-millisecond model runs on the event loop (0: on the "
           "thread pool: from the start, or since slow inline calls until fast pool calls bring it back).",
           [({"model": m.name, "version": m.version}, int(m.inline.on)) for m in inline])
    family("edge_serve_inline_calls_total", "counter", "Model calls run on the event loop.",
           [({"model": m.name, "version": m.version}, m.inline.calls) for m in inline])
    family("edge_serve_inline_demotions_total", "counter", "Times a model left the event loop for the thread "
           "pool (slow inline calls); a long run of fast pool calls brings it back, up to the last demotion.",
           [({"model": m.name, "version": m.version}, m.inline.demotions) for m in inline])
    family("edge_serve_ready", "gauge", "1 when every model is loaded and the server is not draining.",
           [({}, int(core.ready))])
    return "\n".join(lines) + "\n"
