"""README "Measured on the target", checked as a user would: what tune and verify say of a row
whose probes compared nothing (``not_judged``), and of a ``verify --all`` whose named device fails.

- A not-judged row (a budget recorded, the probes compared nothing) read "no budget" in the one-line
  summary of the rows (``tune``'s error and progress lines, the warning a load gives when tune kept
  nothing), read like a passing figure in a decision's reason (``devices --artifact``,
  ``info()["tuned"]``), and ``info()["tuned"]["measured"]`` dropped why its ``passed`` is null.
- ``tune`` whose every path ran but compared nothing said "no candidate path ran the probe set here",
  exit 4: now ``probe_invalid``, exit 3, saying they ran and compared nothing.
- ``verify --all --device D`` where D cannot run the artifact: the chosen error row named the
  fallback's path (the one that runs, and passes in the next row) as the path that failed.
"""

from __future__ import annotations

import json
import logging

import pytest
from click.testing import CliRunner

NOTHING = {"metric": "detection_f1", "value": 1.0, "matched": 0, "unmatched_reference": 0, "unmatched_candidate": 0}


@pytest.fixture
def no_box(monkeypatch):
    """Every detector probe compares nothing: F1 1.0 over no box on either side."""
    from edge_runtime.models.object_detection import ObjectDetection

    monkeypatch.setattr(ObjectDetection, "compare", staticmethod(lambda ref, cand: {**NOTHING,
                                                                                    "samples": len(ref)}))


def test_tune_says_not_judged_not_no_budget_when_the_probes_compare_nothing(make_artifact, own_cache, no_box,
                                                                            caplog):
    import edge_runtime as er
    from edge_runtime.cli import main

    art = make_artifact("object-detection", probe=4, budget=0.9)
    res = CliRunner().invoke(main, ["tune", str(art), "--rounds", "1", "--json"])
    assert res.exit_code != 0, res.output
    doc = json.loads(res.stdout)
    assert doc["rows"][0]["budget"] == 0.9 and doc["rows"][0]["not_judged"], doc["rows"]
    message = doc["error"]["message"]
    assert "not judged" in message and "no budget" not in message, message
    # the paths ran: not "no candidate path ran the probe set here", exit 4, but the probe set's fault
    assert res.exit_code == 3 and doc["error"]["code"] == "probe_invalid", (res.exit_code, doc["error"])
    assert "ran the probe set here, but its probes compared nothing" in message, message
    text = CliRunner().invoke(main, ["tune", str(art), "--rounds", "1"])
    assert "no candidate's probes compared anything its budget can judge here" in text.stdout, text.stdout
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="edge_runtime"):
        rt = er.load(art)       # tune kept nothing: the load warns, and keeps the static policy
    try:
        warned = " ".join(r.getMessage() for r in caplog.records)
        assert rt.info()["decided_by"] == "policy"
        assert "tune found no path" in warned and "not judged" in warned and "no budget" not in warned, warned
        measured = rt.info()["tuned"]["measured"][0]
        assert measured["passed"] is None and measured["budget"] == 0.9 and measured["not_judged"], measured
    finally:
        rt.close()


def test_a_decisions_reason_does_not_read_a_not_judged_row_as_a_figure_that_held():
    from edge_runtime.tune import _best, _why

    judged_nothing = {"target": "a", "backend": "fake-a", "device_options": {}, "metric": "detection_f1",
                      "value": 1.0, "budget": 0.9, "passed": None, "latency_ms_median": 0.4,
                      "not_judged": "no box on either side"}
    held = {"target": "b", "backend": "fake-b", "device_options": {}, "metric": "detection_f1", "value": 0.95,
            "budget": 0.9, "passed": True, "latency_ms_median": 3.0}
    rows = [judged_nothing, held]
    best = _best(rows, "latency")
    assert best is held
    why = _why(best, rows, "latency")
    part = why.split("a on fake-a: ", 1)[1].split(";", 1)[0]
    assert "not judged" in part, why


def test_verify_all_with_a_named_device_that_cannot_run_it_names_no_other_path_as_failed(make_artifact, own_cache):
    from edge_runtime.cli import main
    from edge_runtime.verify import verify_artifact

    art = make_artifact("text-classification", probe=4)
    rep = verify_artifact(art, device="onnxruntime", all_paths=True)
    failed, other = rep["rows"][0], rep["rows"][1:]
    assert failed["chosen"] and failed["error"]["code"].startswith("device_") and failed["device"] == "onnxruntime"
    # the fake path runs (and passes, in its own row): it is not the path that failed
    assert (failed["target"], failed["backend"]) != ("fake", "fake"), failed
    assert [(r["target"], r["backend"], r["verdict"]) for r in other] == [("fake", "fake", "pass")], other
    # "each row carries fallback (null when none)": error rows too
    assert all("fallback" in r for r in rep["rows"]), rep["rows"]
    res = CliRunner().invoke(main, ["verify", str(art), "--all", "--device", "onnxruntime", "--json"])
    assert res.exit_code == 4, res.output
    rows = json.loads(res.stdout)["rows"]
    assert rows[0]["backend"] != "fake" and rows[1]["verdict"] == "pass", rows


def test_a_named_device_whose_path_fails_to_load_is_still_named_as_that_path(make_artifact, own_cache):
    # the strict static choice still names the path the device runs when the failure is its load
    from edge_runtime.verify import verify_artifact

    art = make_artifact("text-classification", probe=4)
    rep = verify_artifact(art, device="fake", all_paths=True, load_kw={"device_options": {"fail_load": True}})
    failed = rep["rows"][0]
    assert failed["chosen"] and "error" in failed and (failed["target"], failed["backend"]) == ("fake", "fake")
    assert failed["fallback"] is None
    assert rep["rows"][1]["verdict"] == "pass", rep["rows"]
