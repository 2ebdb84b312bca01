"""Soak: 100,000 infer() calls, RSS growth under 5% (bench/bench_soak.py's loop).

On ONNX Runtime with real digits images, 100,000 calls (the inline path with the watchdog, where a
disarmed entry once kept the backend's run options alive: +14% RSS), and
30,000 on the fake backend (the runtime layer alone, worker-pool path)."""

import sys
from pathlib import Path

import pytest

import edge_runtime as er
from conftest import ZOO

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_soak import soak  # noqa: E402


@pytest.mark.slow
def test_30k_calls_do_not_grow_rss_fake(make_artifact):
    art = make_artifact("text-classification")
    texts = [f"input number {i} " + "word " * (i % 12) for i in range(64)]
    with er.load(art, device="fake") as rt:
        res = soak(rt, texts, 30_000)
        assert sum(h["count"] for h in rt.metrics()["latency_seconds"].values()) == 35_000
    assert res["growth"] < 0.05, res


@pytest.mark.slow
def test_100k_calls_do_not_grow_rss_onnxruntime(digits_artifact):
    images = sorted(str(p) for p in (ZOO / "digits-cnn" / "held_out").rglob("*.png"))[:50]
    with er.load(digits_artifact, device="onnxruntime", strict=True) as rt:
        res = soak(rt, images, 100_000)
        assert sum(h["count"] for h in rt.metrics()["latency_seconds"].values()) == 105_000
        assert not rt.metrics()["errors"]
    assert res["growth"] < 0.05, res
