"""``edge-infer bench``: runs ours and the raw backend on the same files and reports ratios."""

import json

from click.testing import CliRunner

from edge_runtime.cli import main


def test_bench_reports_ours_raw_and_ratios(digits_artifact):
    res = CliRunner().invoke(main, ["bench", str(digits_artifact), "--device", "onnxruntime", "--calls", "8",
                                    "--repeats", "2", "--batch-size", "4", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["device"] == "onnxruntime:cpu" and d["raw"] == "onnxruntime"
    lat = d["warm_latency"]["static"]
    for p in ("p50", "p95", "p99"):
        assert lat["ours_ms"][p] > 0 and lat["raw_ms"][p] > 0
        assert abs(lat["ratio"][p] - lat["ours_ms"][p] / lat["raw_ms"][p]) < 0.01 * lat["ratio"][p] + 1e-3
    assert lat["ours_ms"]["p50"] <= lat["ours_ms"]["p95"] <= lat["ours_ms"]["p99"]
    t = d["throughput"]
    assert all(t[k] > 0 for k in ("ours_sync_per_s", "ours_async_per_s", "raw_sync_per_s", "raw_async_per_s"))
    c = d["cold_start"]
    assert 0 < c["ours_s"] < 60 and 0 < c["raw_s"] < 60 and c["ours_peak_rss_mb"] > 10 and c["raw_peak_rss_mb"] > 10
    human = CliRunner().invoke(main, ["bench", str(digits_artifact), "--device", "onnxruntime", "--calls", "4",
                                      "--repeats", "1", "--no-cold"])
    assert human.exit_code == 0 and "latency static p99 (ms)" in human.output and "cold start" not in human.output


def test_bench_without_a_raw_runner_and_per_bucket_samples(make_artifact):
    art = make_artifact("text-classification", buckets=(8, 16))
    res = CliRunner().invoke(main, ["bench", str(art), "--calls", "3", "--repeats", "1", "--no-cold", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["raw"] is None and set(d["warm_latency"]) == {"seq8", "seq16"}   # a sample routed to each bucket
    assert "raw_ms" not in d["warm_latency"]["seq8"] and d["throughput"]["ratio_sync"] is None
    bad = CliRunner().invoke(main, ["bench", str(art), "--calls", "0"])
    assert bad.exit_code == 2
