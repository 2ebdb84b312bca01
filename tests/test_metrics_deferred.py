"""Successful calls are queued and folded into the histograms (``metrics.FOLD_AT``): a snapshot
still counts every call that returned before it, from any number of threads, and the queue stays
bounded whether or not anyone ever reads the metrics."""

from __future__ import annotations

import threading

from edge_runtime import metrics as m


def _count(snap: dict) -> int:
    return sum(h["count"] for h in snap["latency_seconds"].values())


def test_snapshot_counts_every_call_before_it_from_many_threads():
    rm = m.RuntimeMetrics({"task": "text-classification"})
    threads, calls = 8, 3 * m.FOLD_AT + 7
    seen_max = []

    def work(i: int) -> None:
        for k in range(calls):
            rm.ok(f"seq{64 * (1 + i % 2)}", 1.5, 10 + k % 5, k % 3 == 0)
        seen_max.append(len(rm._pending))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    snaps = [rm.snapshot() for _ in range(20)]          # snapshots taken while the threads record
    for t in ts:
        t.join()
    counts = [_count(s) for s in snaps]
    assert counts == sorted(counts)                       # never goes back
    snap = rm.snapshot()
    assert _count(snap) == threads * calls
    assert snap["input_length"]["count"] == threads * calls
    assert snap["truncated"] == threads * len(range(0, calls, 3))
    assert set(snap["latency_seconds"]) == {"seq64", "seq128"}
    h = snap["latency_seconds"]["seq64"]
    assert abs(h["sum"] - 1.5 / 1000 * h["count"]) < 1e-9
    assert max(seen_max) < m.FOLD_AT + threads           # bounded without a reader


def test_reset_forgets_queued_calls_and_the_next_ones_count():
    rm = m.RuntimeMetrics({"task": "image-classification"})
    for _ in range(5):
        rm.ok("static", 0.2, 64, False)
    rm.reset()
    assert _count(rm.snapshot()) == 0 and rm.snapshot()["input_length"]["count"] == 0
    rm.ok("static", 0.2, None, True)
    snap = rm.snapshot()
    assert _count(snap) == 1 and snap["truncated"] == 1 and snap["input_length"]["count"] == 0
    assert "edge_runtime" in m.prometheus_text(snap)
