"""Three "wrong answer with exit 0" findings (2026-12-07):

1. ``edge-infer tune`` whose decision could not be cached (a read-only cache dir) printed "not cached"
   and exited 0: later loads silently kept the static policy. Now exit 4 ``tune_not_cached`` (after the
   table; under ``--json`` the whole entry with ``cache_error`` and ``error``), unless ``--no-save``.
2. ``limits`` took absurd values (``max_text_chars: 10**30``, ``deadline_ms: 1e300``, infinity): no
   limit at all, and huge integers overflow C code later. Now each limit has a ceiling, refused with
   ``limit_invalid`` (``InputError`` from a caller, ``ArtifactError`` from a manifest).
3. ``shadow``'s summary rounded its figures to 6 decimals and its latencies to 3: a score_diff max of
   4e-7 read 0.0, a cosine min of 0.9999996 read 1.0 (B as A), a latency of 0.0004 ms read 0.0, and an
   agreement of 1 in 2,000,000 read 0.0. Now significant digits, never a non-zero read as 0 (or 1.0).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

import edge_runtime as er
from edge_runtime import limits as lm
from edge_runtime.cli import main
from edge_runtime.errors import ArtifactError, InputError
from edge_runtime.limits import DEFAULT_LIMITS, Limits, deadline_value


# == 1. a tune decision that could not be cached =====================================================

@pytest.fixture
def unwritable_cache(tmp_path, monkeypatch):
    """The cache dir is a regular file: no entry can be made under it (root ignores a read-only mode)."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("EDGE_RUNTIME_CACHE_DIR", str(blocker))
    return blocker


def test_a_tune_whose_decision_is_not_cached_fails_after_printing_it(make_artifact, unwritable_cache, tmp_path,
                                                                     monkeypatch):
    art = make_artifact("image-classification", probe=4)
    res = CliRunner().invoke(main, ["tune", str(art), "--rounds", "1", "--no-batch", "--json"])
    assert res.exit_code == 4, res.output          # was 0
    entry = json.loads(res.stdout)                  # the whole entry, printed before the exit
    assert entry["decision"]["latency"]["backend"] == "fake" and entry["rows"]
    assert entry["cache_error"] and "cache_file" not in entry
    assert entry["error"]["code"] == "tune_not_cached" and entry["error"]["type"] == "DeviceError"
    assert "error [tune_not_cached]" in res.stderr and "--no-save" in res.stderr
    assert "static policy" in res.stderr

    text = CliRunner().invoke(main, ["tune", str(art), "--rounds", "1", "--no-batch"])
    assert text.exit_code == 4, text.output
    assert "measured (latency): fake on fake" in text.stdout and "not cached: " in text.stdout
    assert "error [tune_not_cached]" in text.stderr

    # --no-save asks for no entry: exit 0, no error
    res = CliRunner().invoke(main, ["tune", str(art), "--rounds", "1", "--no-batch", "--no-save", "--json"])
    assert res.exit_code == 0, res.output
    assert not {"error", "cache_error", "cache_file"} & set(json.loads(res.stdout))

    # a writable cache: cached, exit 0
    monkeypatch.setenv("EDGE_RUNTIME_CACHE_DIR", str(tmp_path / "cache"))
    res = CliRunner().invoke(main, ["tune", str(art), "--rounds", "1", "--no-batch", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["cache_file"] and "error" not in json.loads(res.stdout)

    # nothing within budget (exit 7) says more than the cache failure: that error stays the run's
    from edge_runtime import tune

    row = {"target": "fake", "backend": "fake", "device_options": {}, "metric": "top1_agreement", "value": 0.5,
           "budget": 0.99, "passed": False}
    none = {**entry, "decision": {}, "rows": [row], "cache_error": "NotADirectoryError: no"}
    none.pop("error")
    monkeypatch.setattr(tune, "tune", lambda *a, **kw: dict(none))
    res = CliRunner().invoke(main, ["tune", str(art), "--json"])
    assert res.exit_code == 7 and json.loads(res.stdout)["error"]["code"] == "parity_below_budget_here", res.output


# == 2. limits with no sane bound =======================================================================

@pytest.mark.parametrize("key, value", [
    ("max_text_chars", 10 ** 30), ("max_request_bytes", 2 ** 63), ("max_batch_items", 10 ** 7),
    ("max_image_pixels", 10 ** 12), ("max_image_bytes", 5 * 1024 ** 3), ("max_json_depth", 10_000),
    ("max_detections", 10 ** 9), ("deadline_ms", 1e300), ("deadline_ms", math.inf), ("deadline_ms", 2 ** 80),
    ("deadline_ms", 86_400_001), ("max_text_chars", np.uint64(2 ** 63)),
])
def test_an_absurd_limit_is_refused_from_a_caller_and_from_a_manifest(key, value):
    with pytest.raises(InputError) as ei:
        DEFAULT_LIMITS.merged({key: value})
    assert ei.value.code == "limit_invalid" and key in ei.value.message
    assert len(ei.value.message) < 300                  # a huge integer is named by its size, not its digits
    with pytest.raises(ArtifactError) as ei:
        DEFAULT_LIMITS.merged({key: value}, source="manifest")
    assert ei.value.code == "limit_invalid"


def test_every_limit_has_a_ceiling_taken_at_it_and_refused_past_it():
    assert set(lm.CEILINGS) == set(Limits.FIELDS)
    for key, top in lm.CEILINGS.items():
        assert getattr(DEFAULT_LIMITS.merged({key: top}), key) == top
        with pytest.raises(InputError):
            DEFAULT_LIMITS.merged({key: top + 1})
        assert getattr(DEFAULT_LIMITS, key) <= top      # the defaults are well inside


@pytest.mark.parametrize("ms", [1e300, math.inf, 10 ** 12, 86_400_000.5])
def test_a_deadline_keyword_past_a_day_is_refused(ms):
    with pytest.raises(InputError) as ei:
        deadline_value(ms)
    assert ei.value.code == "limit_invalid"
    assert deadline_value(86_400_000) == 86_400_000 and deadline_value(0.5) == 0.5


def test_a_manifest_limit_past_its_ceiling_refuses_the_load(make_artifact):
    art = make_artifact("text-classification", limits={"max_text_chars": 10 ** 30})
    with pytest.raises(ArtifactError) as ei:
        er.load(art, device="fake")
    assert ei.value.code == "limit_invalid"


def test_a_call_deadline_past_a_day_is_refused_and_counted(make_artifact):
    art = make_artifact("text-classification")
    with er.load(art, device="fake") as rt:
        for kw in ({"deadline_ms": 1e300}, {"limits": {"deadline_ms": math.inf}},
                   {"limits": {"max_text_chars": 10 ** 30}}):
            with pytest.raises(InputError) as ei:
                rt.infer("good movie", **kw)
            assert ei.value.code == "limit_invalid"
        assert {e["code"]: e["count"] for e in rt.metrics()["errors"]} == {"limit_invalid": 3}
        assert rt.infer("good movie", deadline_ms=60_000).prediction


# == 3. shadow's figures never read a difference as none ================================================

def _line(i: int, cmp: dict, lat_a: float = 1.0, lat_b: float = 1.0) -> dict:
    return {"index": i, "id": str(i), "agree": bool(cmp.get("agree", True)), "compare": cmp,
            "a": {"ok": True, "result": {"latency_ms": lat_a, "prediction": "0", "class_id": 0}},
            "b": {"ok": True, "result": {"latency_ms": lat_b, "prediction": "0", "class_id": 0}}}


def _text(summary) -> str:
    from edge_runtime.cli_shadow import summary_lines

    meta = {"model": "m", "version": "1", "target": "t", "device": "d", "manifest_sha256": "0" * 64}
    return "\n".join(summary_lines(dict(summary.to_dict(), a=meta, b=meta, cpu="cpu", output=None)))


def test_a_tiny_score_diff_is_not_reported_as_none():
    from edge_runtime.shadow_summary import ShadowSummary

    s = ShadowSummary()
    for i in range(3):
        s.add(_line(i, {"kind": "classification", "agree": True, "margin": 0.5, "score_diff": 4e-7 if i == 1 else 0.0,
                        "badness": -0.5}))
    fig = s.to_dict()["figures"]["score_diff"]
    assert fig["max"] == 4e-7 and fig["p95"] > 0 and fig["mean"] > 0      # were 0.0, 0.0, 0.0
    assert "score_diff: mean 0.0001, p95 0.0001, max 0.0001" in _text(s)   # was "... max 0.0000"


def test_a_cosine_just_under_1_is_not_reported_as_1():
    from edge_runtime.shadow_summary import ShadowSummary

    s = ShadowSummary()
    for i, cos in enumerate((1.0, 0.9999996, 1.0)):
        s.add(_line(i, {"kind": "embedding", "agree": True, "cosine": cos, "agree_at": 0.99, "badness": 1 - cos}))
    fig = s.to_dict()["figures"]["cosine"]
    assert fig["min"] == 0.9999996 and fig["min"] < 1.0 and fig["p5"] < 1.0 and fig["mean"] < 1.0   # were 1.0
    assert "p5 0.9999, min 0.9999" in _text(s)       # was "p5 1.0000, min 1.0000": B read as A


def test_a_sub_microsecond_latency_is_not_reported_as_0():
    from edge_runtime.shadow_summary import ShadowSummary

    s = ShadowSummary()
    for i in range(3):
        s.add(_line(i, {"kind": "embedding", "agree": True, "cosine": 1.0, "badness": 0.0}, lat_a=0.0004, lat_b=2.0))
    lat = s.to_dict()["latency_ms"]
    assert lat["a"]["p50"] == 0.0004 and lat["a"]["mean"] == 0.0004 and lat["a"]["p99"] > 0     # were 0.0
    assert lat["b"]["p50"] == 2.0


def test_a_tiny_agreement_or_accuracy_is_not_reported_as_0_or_1():
    from edge_runtime.shadow_summary import ShadowSummary

    s = ShadowSummary()
    s.total = s.compared = 2_000_000
    s.agree = 1
    s.labelled, s.correct_a, s.correct_b = 2_000_000, 1_999_999, 1
    d = s.to_dict()
    assert 0 < d["agreement"] < 1e-6                    # was 0.0
    assert 0 < d["accuracy"]["b"] and d["accuracy"]["a"] < 1.0
    from edge_runtime.shadow_summary import json_rate

    assert json_rate(19_999, 20_000) == 0.99995 and json_rate(0, 5) == 0.0 and json_rate(5, 5) == 1.0
