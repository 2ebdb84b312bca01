"""A candidate whose calls fail while tune times it (a device fault after its parity pass, a timeout under
load): before, the exception ended the whole tune and nothing was decided; a path whose batch items all
failed (``infer_batch`` returns errors in place) was counted at full speed and could be the throughput
choice. Now that candidate is out with its error, the others are measured."""

from __future__ import annotations

import pytest

from edge_runtime import tune
from edge_runtime.devices import registry
from fake_backend import FakeBackend, FakeSession


class _Failing(FakeSession):
    def _run(self, feeds, cancel):
        if Flaky.FAIL:
            raise RuntimeError("injected device fault while timed")
        return super()._run(feeds, cancel)


class Flaky(FakeBackend):
    """The fastest candidate (no stall), failing once FAIL is set."""
    name = "fake-flaky"
    FAIL = False

    def open(self, model_path, bucket, sub, options):
        return _Failing(model_path, bucket, dict(options.values))


@pytest.fixture
def flaky(monkeypatch):
    Flaky.FAIL = False
    real_open = FakeBackend.open

    def slow_fake(self, model_path, bucket, sub, options):      # the policy's "fake" is the slower one
        return FakeSession(model_path, bucket, {**dict(options.values), "stall_ms": 2.0})

    monkeypatch.setattr(FakeBackend, "open", slow_fake)
    registry.register("fake-flaky", Flaky)
    yield
    registry.unregister("fake-flaky")


def _fail_after_verify(monkeypatch, when: str):
    """Set Flaky.FAIL once its parity pass is done: at the timing rounds, or only for the batch."""
    from edge_runtime import verify as verify_mod

    real_verify, real_tp = verify_mod.verify_runtime, tune._throughput

    def verify(rt, probe):
        row = real_verify(rt, probe)
        if rt.choice.backend_name == "fake-flaky" and when == "timing":
            Flaky.FAIL = True
        return row

    def throughput(rt, inputs):
        Flaky.FAIL = rt.choice.backend_name == "fake-flaky" and when == "batch"
        try:
            return real_tp(rt, inputs)
        finally:
            Flaky.FAIL = False

    monkeypatch.setattr(verify_mod, "verify_runtime", verify)
    monkeypatch.setattr(tune, "_throughput", throughput)


def test_a_candidate_failing_while_timed_is_out_and_the_tune_decides(make_artifact, flaky, monkeypatch):
    art = make_artifact("image-classification", probe=4)
    assert tune.tune(art, rounds=1, batch=False, save=False)["decision"]["latency"]["backend"] == "fake-flaky"
    _fail_after_verify(monkeypatch, "timing")
    entry = tune.tune(art, rounds=2, batch=False, save=False)
    rows = {r["backend"]: r for r in entry["rows"]}
    assert rows["fake-flaky"]["passed"] is False and "injected device fault" in rows["fake-flaky"]["error"]["message"]
    assert "calls" not in rows["fake-flaky"]          # no timing figure of its own (verify's pass stands)
    assert entry["decision"]["latency"]["backend"] == "fake"
    assert "failed (" in entry["decision"]["latency"]["why"]


def test_a_batch_whose_items_fail_is_no_throughput_figure(make_artifact, flaky, monkeypatch):
    art = make_artifact("image-classification", probe=4)
    _fail_after_verify(monkeypatch, "batch")
    entry = tune.tune(art, rounds=1, batch=True, save=False)
    rows = {r["backend"]: r for r in entry["rows"]}
    assert "batch_items_per_s" not in rows["fake-flaky"] and "batch_error" in rows["fake-flaky"]
    assert entry["decision"]["latency"]["backend"] == "fake-flaky"        # its latency stands
    assert entry["decision"]["throughput"]["backend"] == "fake"


def _row(backend, ms, passed, **kw):
    return {"target": "t", "backend": backend, "device_options": {}, "latency_ms_median": ms, "passed": passed,
            "metric": "f1", "value": kw.pop("value", 0.99 if passed else None), **kw}


def test_a_row_whose_probes_compared_nothing_is_never_the_choice():
    """A detector whose probes hold no box on either side: ``not_judged``, parity unknown here. It was
    kept as "the fastest within the parity budget" when it was the fastest."""
    rows = [_row("a", 1.0, None, not_judged="no box on either side"), _row("b", 3.0, True)]
    best = tune._best(rows, "latency")
    assert best["backend"] == "b"
    why = tune._why(best, rows, "latency")
    assert "within the parity budget" in why and "not judged" in why


def test_without_any_budget_the_fastest_is_kept_and_the_reason_says_so():
    rows = [_row("a", 1.0, None, value=0.9), _row("b", 3.0, None, value=0.95)]
    best = tune._best(rows, "latency")
    assert best["backend"] == "a"
    assert "with no parity budget recorded to meet" in tune._why(best, rows, "latency")
    # a row that meets a budget wins over one that has none to meet
    assert tune._best([_row("a", 1.0, None, value=0.9), _row("b", 3.0, True)], "latency")["backend"] == "b"
