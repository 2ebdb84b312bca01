"""The options a tune decision chose say so: an OpenVINO precision picked by tune is not "requested".

Runtime merged the decision's device options as if the caller had passed them, so
``rt.info()`` said ``precision_reason: "requested"`` for a precision nobody asked for.
"""

import edge_runtime as er
from edge_runtime import tune_cache


def _entry(precision: str) -> dict:
    return {"static": None, "rows": [], "decision": {"latency": {
        "target": "openvino", "backend": "openvino", "device_options": {"precision": precision},
        "why": f"openvino {precision} was the fastest within budget (test)"}}}


def _session(rt) -> dict:
    return rt.info()["sessions"][0]


def test_a_tuned_precision_names_the_tune_as_its_reason(ov_digits_artifact, monkeypatch, own_cache):
    monkeypatch.setattr(tune_cache, "lookup", lambda *a, **k: _entry("f32"))
    with er.load(ov_digits_artifact, warmup=False) as rt:
        assert rt.choice.decided_by == "measurement" and rt.variant.target == "openvino"
        s = _session(rt)
        assert s["precision_reason"] != "requested", s
        assert "tune" in s["precision_reason"] and "fastest within budget" in s["precision_reason"], s


def test_the_callers_own_precision_is_still_requested(ov_digits_artifact, monkeypatch, own_cache):
    monkeypatch.setattr(tune_cache, "lookup", lambda *a, **k: _entry("f32"))
    with er.load(ov_digits_artifact, warmup=False, device_options={"precision": "f32"}) as rt:
        assert _session(rt)["precision_reason"] == "requested"
