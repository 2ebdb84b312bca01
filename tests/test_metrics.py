"""rt.metrics(): what it counts, and that the exposition text parses."""

import math

import numpy as np
import pytest

import edge_runtime as er
from edge_runtime.metrics import Histogram, PrometheusCollector, prometheus_text


def test_histogram_is_cumulative_with_inf():
    h = Histogram((1, 10))
    for v in (0.5, 1, 5, 50):
        h.observe(v)
    snap = h.snapshot()
    assert snap["buckets"] == [[1, 2], [10, 3], [math.inf, 4]]    # le=1 includes 1
    assert snap["count"] == 4 and snap["sum"] == 56.5


def test_runtime_counts_results_errors_lengths_per_bucket(make_artifact):
    rt = er.load(make_artifact("text-classification"), device="fake")
    m = rt.metrics()
    assert m["latency_seconds"] == {} and m["errors"] == []          # warm-up is not traffic
    rt.infer("good")                                                 # short: bucket seq8
    long = rt.infer("good movie " * 20)                              # long: truncated to seq16
    assert long.truncated and long.input_length > 16                 # counted before truncation
    with pytest.raises(er.InputError):
        rt.infer(12)
    with pytest.raises(er.InputError):
        rt.infer("x" * 20_000)
    out = rt.infer_batch(["bad", None, "fine"])
    assert isinstance(out[1], er.InputError)
    m = rt.metrics()
    counts = {b: h["count"] for b, h in m["latency_seconds"].items()}
    assert counts == {"seq8": 3, "seq16": 1}
    codes = {(e["type"], e["code"]): e["count"] for e in m["errors"]}
    assert sum(codes.values()) == 3 and all(t == "InputError" for t, _ in codes)
    assert codes == {("InputError", "input_wrong_type"): 2, ("InputError", "input_too_long"): 1}
    assert m["input_length"]["count"] == 4 and m["input_length"]["unit"] == "tokens"
    assert m["truncated"] == 1
    assert m["labels"]["device"] == rt.device and m["labels"]["model"] == rt.artifact.name
    rt.close()


def test_timeouts_and_device_failures_are_counted(make_artifact):
    rt = er.load(make_artifact("text-classification"), device="fake",
                 device_options={"stall_ms": 300, "cancellable": True})
    with pytest.raises(er.InferenceTimeout):
        rt.infer("good", deadline_ms=30)
    codes = {e["code"]: e["count"] for e in rt.metrics()["errors"]}
    assert codes == {"inference_timeout": 1}
    rt.close()


def test_fallback_is_counted(make_artifact):
    rt = er.load(make_artifact("text-classification"), device="onnxruntime")   # no onnxruntime variant
    m = rt.metrics()
    assert len(m["fallbacks"]) == 1 and "onnxruntime" in m["fallbacks"][0]
    assert "edge_runtime_fallbacks_total" in prometheus_text(m)
    rt.close()


def test_exposition_parses_and_matches_the_snapshot(make_artifact):
    parser = pytest.importorskip("prometheus_client.parser")
    rt = er.load(make_artifact("image-classification"), device="fake")
    img = np.full((8, 8), 30, np.uint8)
    for _ in range(3):
        rt.infer(img)
    with pytest.raises(er.InputError):
        rt.infer(b"not an image")
    text = prometheus_text(rt.metrics())
    families = {f.name: f for f in parser.text_string_to_metric_families(text)}
    lat = families["edge_runtime_inference_latency_seconds"]
    assert lat.type == "histogram"
    count = [s for s in lat.samples if s.name.endswith("_count")]
    assert len(count) == 1 and count[0].value == 3 and count[0].labels["device"] == rt.device
    inf = [s for s in lat.samples if s.name.endswith("_bucket") and s.labels["le"] == "+Inf"]
    assert inf[0].value == 3
    errors = families["edge_runtime_errors"]                        # the parser strips _total
    assert [(s.labels["code"], s.value) for s in errors.samples] == [(rt.metrics()["errors"][0]["code"], 1.0)]
    length = families["edge_runtime_input_length"]
    assert [s.value for s in length.samples if s.name.endswith("_count")] == [3.0]
    rt.close()


def test_prometheus_client_collector(make_artifact):
    prom = pytest.importorskip("prometheus_client")
    rt = er.load(make_artifact("text-embedding"), device="fake")
    rt.infer("stock market rises")
    reg = prom.CollectorRegistry()
    reg.register(PrometheusCollector(rt))
    body = prom.generate_latest(reg).decode()
    assert 'edge_runtime_inference_latency_seconds_count{bucket="seq8"' in body
    assert "edge_runtime_info{" in body
    rt.close()


def test_label_values_are_escaped():
    snap = {"labels": {"model": 'a"b\\c\nd', "version": "1"}, "latency_seconds": {},
            "input_length": {**Histogram((1,)).snapshot(), "unit": "tokens"}, "errors": [], "truncated": 0,
            "fallbacks": []}
    text = prometheus_text(snap)
    assert 'model="a\\"b\\\\c\\nd"' in text
