"""Wrong answers with exit 0 hunted in tune / verify (issue #17): a cached decision whose path can no
longer run here, and non-finite parity figures. Fake backend, tiny artifacts."""

from __future__ import annotations

import logging

import pytest

import edge_runtime as er
from edge_runtime import tune
from edge_runtime.verify import holds
from factories import seal_of

pytestmark = pytest.mark.usefixtures("own_cache")


def _hw(art):
    with er.load(art, warmup=False, device="fake") as rt:
        return rt.hardware


def _store(art, target: str, backend: str) -> None:
    d = {"target": target, "backend": backend, "device_options": {}, "why": "measured here (test)"}
    entry = {"artifact": str(art), "model": "m", "version": "3", "seal": seal_of(art), "created": "2026-12-07T00:00:00Z",
             "here": {}, "static": {"target": "fake", "backend": "fake"}, "decision": {"latency": d},
             "rows": [], "rounds": 1, "probe_samples": 4, "seconds": 0.1}
    tune.store(seal_of(art), _hw(art), entry)


def test_a_cached_decision_whose_path_is_gone_says_the_policy_decides(make_artifact, caplog):
    """Before: the load ran the static path, decided_by "policy", and nothing said the decision was dropped.
    (A load whose target= excludes the decided variant is not warned about: the decision is not for it.)"""
    art = make_artifact("image-classification", probe=4)
    _store(art, "onnx-fp32", "fake")
    with caplog.at_level(logging.WARNING, logger="edge_runtime"):
        with er.load(art, target="fake") as rt:
            assert rt.choice.decided_by == "policy"
    assert "cannot run here" not in caplog.text
    _store(art, "fake", "fake-gone-here")
    with caplog.at_level(logging.WARNING, logger="edge_runtime"):
        with er.load(art) as rt:
            assert rt.choice.decided_by == "policy" and rt.choice.backend_name == "fake"
    text = caplog.text
    assert "fake-gone-here" in text and "cannot run here" in text and "static policy decides" in text, text


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_parity_figure_never_holds(value):
    """Before: NaN top-1 agreement crashed with a ValueError; an infinite figure passed any budget."""
    for metric in ("top1_agreement", "cosine_mean", "detection_f1"):
        for v in (value, -value):
            figures = {"metric": metric, "value": v, "samples": 8, "matched": 3, "unmatched_reference": 0,
                       "unmatched_candidate": 0}
            assert holds(figures, 0.99) is False, (metric, v)


def test_a_decision_written_by_another_edge_runtime_version_is_a_miss(make_artifact, monkeypatch):
    """Before: the key named the backend packages only; the devices' own code is edge-runtime's, and a
    decision an older edge-runtime measured was reused by a newer one as if measured by it."""
    import edge_runtime
    from edge_runtime import tune_cache

    art = make_artifact("image-classification", probe=4)
    hw = _hw(art)
    entry = tune.tune(art, rounds=1, batch=False)
    before = edge_runtime.__version__
    with er.load(art) as rt:
        assert rt.choice.decided_by == "measurement"
    assert tune_cache.lookup(seal_of(art), hw)["decision"] == entry["decision"]
    monkeypatch.setattr(edge_runtime, "__version__", "99.0.0")
    assert tune_cache.lookup(seal_of(art), hw) is None
    with er.load(art) as rt:
        assert rt.choice.decided_by == "policy"
    monkeypatch.setattr(tune_cache, "CACHE_FORMAT", tune_cache.CACHE_FORMAT + 1)
    monkeypatch.setattr(edge_runtime, "__version__", before)
    assert tune_cache.lookup(seal_of(art), hw) is None          # another cache format: a miss too


def test_a_cached_row_whose_error_is_a_string_does_not_break_info(make_artifact):
    """The cache check accepts a row's error as a code string (rows_text and the table read it so);
    before, rt.info() then failed with a TypeError (``r["error"]["code"]`` of a string)."""
    art = make_artifact("image-classification", probe=4)
    d = {"target": "fake", "backend": "fake", "device_options": {}, "why": "measured here (test)"}
    entry = {"artifact": str(art), "model": "m", "version": "3", "seal": seal_of(art), "created": "2026-12-07T00:00:00Z",
             "here": {}, "static": {"target": "fake", "backend": "fake"}, "decision": {"latency": d},
             "rows": [{"target": "fake", "backend": "fake-gone", "device_options": {}, "error": "device_load_failed",
                       "passed": False}], "rounds": 1, "probe_samples": 4, "seconds": 0.1}
    tune.store(seal_of(art), _hw(art), entry)
    with er.load(art) as rt:
        info = rt.info()
    assert info["tuned"]["measured"][0]["error"] == "device_load_failed"


def test_a_decision_measured_under_another_thread_count_env_is_a_miss(make_artifact, monkeypatch):
    """Before: a tune run with $EDGE_RUNTIME_THREADS=1 (every candidate timed on one thread) was the
    decision of a later process without it, and the reverse."""
    from edge_runtime import tune_cache

    art = make_artifact("image-classification", probe=4)
    hw = _hw(art)
    monkeypatch.setenv("EDGE_RUNTIME_THREADS", "1")
    tune.tune(art, rounds=1, batch=False)
    assert tune_cache.lookup(seal_of(art), hw) is not None
    monkeypatch.delenv("EDGE_RUNTIME_THREADS")
    assert tune_cache.lookup(seal_of(art), hw) is None
    monkeypatch.setenv("EDGE_RUNTIME_THREADS", "4")
    assert tune_cache.lookup(seal_of(art), hw) is None


class _Variant(dict):
    @property
    def parity(self):
        return self["parity"]


@pytest.mark.parametrize("extra", [{"threads": 2}, {"threads": 2, "max_requests": 4}])
def test_the_recorded_figure_of_a_row_is_its_own_hint_s_under_other_options(extra):
    """Before: any option beside the precision (the threads a cgroup quota or $EDGE_RUNTIME_THREADS
    sets, a caller's max_requests) made no trial match, and the bf16 row of ``verify --all`` showed
    the kept f32 hint's figure as its own "recorded"."""
    from edge_runtime.verify import _recorded

    v = _Variant(parity={"value": 0.999}, runtime_trials=[{"options": {"precision": "f32"}, "parity": 0.999},
                                                           {"options": {"precision": "bf16"}, "parity": 0.95}])
    assert _recorded(v, {"precision": "bf16", **extra}) == 0.95
    assert _recorded(v, {"precision": "f32", **extra}) == 0.999
    assert _recorded(v, {"precision": "f16", **extra}) == 0.999      # no trial of it: the kept figure
    assert _recorded(v, {"precision": "bf16"}) == 0.95 and _recorded(v, {}) == 0.999

