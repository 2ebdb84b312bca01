"""Hardening of `edge-infer verify` / `tune` / `load(verify=True, tune=True)`: tuned options with
no caller options, an empty or hostile probe set, a named device never certified by another, a
damaged tune cache, the "verified here" record, the parity budget's validation, tune with no
decision, and `verify --all` around a failing path. Fake backends and tiny artifacts only."""

from __future__ import annotations

import hashlib
import io
import json
import time

import numpy as np
import pytest
from click.testing import CliRunner

import edge_runtime as er
from edge_runtime import probe, tune
from edge_runtime.cli import main
from edge_runtime.devices import registry
from edge_runtime.errors import ArtifactError, InputError
from edge_runtime.models.base import TaskOutput
from factories import rewrite_manifest, seal_of
from fake_backend import FakeBackend, FakeSession


pytestmark = pytest.mark.usefixtures("own_cache")


def _hw(art):
    with er.load(art, warmup=False) as rt:
        return rt.hardware


def _store_tune(art, decision: dict, rows: list | None = None) -> None:
    """A tune entry for this artifact here, written as tune writes it."""
    entry = {"artifact": str(art), "model": "m", "version": "3", "seal": seal_of(art), "created": "2026-12-07T00:00:00Z",
             "here": {}, "static": {"target": "fake", "backend": "fake"}, "decision": decision,
             "rows": rows if rows is not None else [], "rounds": 1, "probe_samples": 4, "seconds": 0.1}
    tune.store(seal_of(art), _hw(art), entry)


def _put_probe(art, inputs: bytes | None = None, reference: bytes | None = None, **section) -> None:
    """Replace probe files (their hashes re-recorded, the manifest re-sealed): a probe set the
    converter could have written, or a hand-made hostile one."""
    def mutate(m):
        for rel, data in ((probe.INPUTS, inputs), (probe.REFERENCE, reference)):
            if data is not None:
                (art / rel).write_bytes(data)
                m["files"][rel] = {**m["files"][rel], "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        m["probe"].update(section)

    rewrite_manifest(art, mutate)


# -- 1. no options given runs the tuned ones ---------------------------------------------------
def test_empty_device_options_run_the_tuned_options_and_info_agrees(make_artifact):
    art = make_artifact("image-classification", probe=4)
    _store_tune(art, {"latency": {"target": "fake", "backend": "fake", "device_options": {"stall_ms": 0.5},
                                  "why": "measured here (test)"}})
    for given in (None, {}):
        with er.load(art, device_options=given) as rt:
            info = rt.info()
            assert info["decided_by"] == "measurement"
            assert info["device_options"] == {"stall_ms": 0.5}, given          # the measured options ran
            assert rt._sessions[0]._options["stall_ms"] == 0.5
    with er.load(art, device_options={"stall_ms": 0.0}) as rt:        # the caller's options still win
        assert rt.info()["device_options"] == {"stall_ms": 0.0}
    with er.load(art, device_options={"perturb": 0.0}) as rt:         # key by key (Ray passes threads)
        assert rt.info()["device_options"] == {"stall_ms": 0.5, "perturb": 0.0}


def test_the_infer_cli_without_device_options_runs_the_tuned_options(make_artifact):
    art = make_artifact("text-classification", probe=4)
    _store_tune(art, {"latency": {"target": "fake", "backend": "fake", "device_options": {"perturb": 5.0},
                                  "why": "measured here (test)"}})

    def scores(*extra):
        res = CliRunner().invoke(main, ["infer", str(art), "--text", "good movie", "--json", *extra])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)["scores"]

    assert scores() != scores("--device", "fake")              # the CLI passes {}: the tuned (perturbed) path ran
    assert scores() == scores("--device", "fake", "--device-option", "perturb=5.0")


def test_load_passes_tuned_for_to_the_decision(make_artifact):
    art = make_artifact("image-classification", probe=4)
    _store_tune(art, {"latency": {"target": "fake", "backend": "fake", "device_options": {"stall_ms": 0.5},
                                  "why": "latency"},
                      "throughput": {"target": "fake", "backend": "fake", "device_options": {"stall_ms": 0.25},
                                     "why": "throughput"}})
    with er.load(art, tuned_for="throughput") as rt:
        assert rt.info()["device_options"] == {"stall_ms": 0.25}
    with pytest.raises(InputError) as exc:                 # the caller's argument, not a limit
        er.load(art, tuned_for="bogus")
    assert exc.value.code == "input_invalid"


# -- 2. an empty probe set ------------------------------------------------------------------------
def test_a_probe_budget_that_admits_no_sample_is_refused_at_convert():
    raws = ["x" * 100] * 3
    res = [TaskOutput(embedding=np.zeros(8, np.float32))] * 3
    with pytest.raises(InputError, match="admits no probe sample") as exc:
        probe.build(raws, res, max_bytes=1)
    assert exc.value.exit_code == 2
    assert probe.build([], [], max_bytes=1)[2]["samples"] == 0        # nothing offered: nothing to refuse


def test_an_empty_probe_set_is_a_typed_probe_error_in_verify_tune_and_load(make_artifact):
    art = make_artifact("image-classification", probe=4)
    ins, ref, _ = probe.build([], [])
    _put_probe(art, ins, ref, samples=0, bytes=0)
    res = CliRunner().invoke(main, ["verify", str(art)])
    assert res.exit_code == 3, res.output
    assert "probe_invalid" in res.stderr and "no sample" in res.stderr
    res = CliRunner().invoke(main, ["tune", str(art), "--rounds", "1"])
    assert res.exit_code == 3 and "probe_invalid" in res.stderr
    with pytest.raises(ArtifactError) as exc:
        er.load(art, verify=True)
    assert exc.value.code == "probe_invalid"
    empty = probe.ProbeSet([], [], {"inputs": probe.INPUTS})
    from edge_runtime.verify import verify_runtime

    with er.load(art) as rt, pytest.raises(ArtifactError):
        verify_runtime(rt, empty)


def test_refuse_formats_a_row_without_a_figure():
    from edge_runtime.verify import refuse

    err = refuse({"device": "fake:cpu", "target": "fake", "metric": "top1_agreement", "value": None,
                  "budget": 0.99, "recorded": 1.0})
    assert "no figure" in err.message and err.exit_code == 7


# -- 3. a named device is verified there or not at all --------------------------------------------
def test_verify_of_a_named_device_that_falls_back_exits_4(make_artifact):
    art = make_artifact("image-classification", probe=4)
    res = CliRunner().invoke(main, ["verify", str(art), "--device", "onnxruntime:cuda"])
    assert res.exit_code == 4, res.output
    assert "pass" not in res.output
    res = CliRunner().invoke(main, ["verify", str(art), "--device", "fake", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["chosen"]["fallback"] is None


def test_a_fallback_is_in_the_row_json_and_text(make_artifact):
    from edge_runtime.cli_verify import _print_verify
    from edge_runtime.verify import verify_runtime

    art = make_artifact("image-classification", probe=4)
    with er.load(art, device="onnxruntime:cuda") as rt:          # the API's load still may fall back
        row = verify_runtime(rt)
    assert row["fallback"] and "onnxruntime:cuda" in row["fallback"] and row["device"] == "fake:cpu"
    rep = {"artifact": str(art), "model": "m", "version": "3", "probe_samples": 4, "built_on": None, "here": "x",
           "rows": [{**row, "chosen": True}], "chosen": {**row, "chosen": True, "decided_by": "policy"}}
    runner = CliRunner()
    import click

    out = runner.invoke(click.command()(lambda: _print_verify(rep)))
    assert "fallback: requested 'onnxruntime:cuda'" in out.output and "after a fallback" in out.output


# -- 4. a damaged tune cache entry is a miss --------------------------------------------------------
_GOOD = {"target": "fake", "backend": "fake", "device_options": {}, "why": "measured"}


@pytest.mark.parametrize("decision,rows", [
    ([], []),
    ({"latency": "x"}, []),
    ({"latency": {**_GOOD, "device_options": None}}, []),
    ({"latency": {**_GOOD, "device_options": "f32"}}, []),
    ({"latency": {k: v for k, v in _GOOD.items() if k != "backend"}}, []),
    ({"latency": {**_GOOD, "device_options": {"stall_ms": "fast"}}}, []),     # fails the backend's validation
    ({"latency": {**_GOOD, "device_options": {"precision": "bf06"}}}, []),    # not an option of this backend
    ({"latency": _GOOD}, "x"),
    ({"latency": _GOOD}, [{"target": "fake", "backend": "fake", "value": "x", "latency_ms_median": 1.0}]),
    ({"latency": _GOOD}, [{"target": "fake", "backend": "fake", "error": 3}]),
])
def test_a_malformed_tune_entry_is_a_cache_miss_with_a_warning(make_artifact, caplog, decision, rows):
    art = make_artifact("image-classification", probe=4)
    _store_tune(art, decision, rows)
    with caplog.at_level("WARNING", logger="edge_runtime"):
        assert tune.lookup(seal_of(art), _hw(art)) is None
        with er.load(art) as rt:
            assert rt.info()["decided_by"] == "policy" and rt.info()["tuned"] is None
    assert any("ignoring the cached tune entry" in r.getMessage() for r in caplog.records)
    res = CliRunner().invoke(main, ["devices", "--artifact", str(art)])
    assert res.exit_code == 0, res.output


def test_a_well_formed_entry_still_hits(make_artifact):
    art = make_artifact("image-classification", probe=4)
    _store_tune(art, {"latency": _GOOD}, [{"target": "fake", "backend": "fake", "value": 1.0, "budget": 0.99,
                                          "passed": True, "latency_ms_median": 0.1, "device_options": {}}])
    assert tune.lookup(seal_of(art), _hw(art)) is not None
    res = CliRunner().invoke(main, ["devices", "--artifact", str(art)])
    assert res.exit_code == 0 and "measured here" in res.output


# -- 5. the "verified here" record ------------------------------------------------------------------
def _other_isa(art):
    hw = dict(_hw(art))
    hw["cpu"] = {**hw["cpu"], "features": ["avx2"]}
    return hw


def test_verify_records_its_verdict_per_variant_and_options(make_artifact):
    from edge_runtime.verify import verify_artifact

    art = make_artifact("image-classification", probe=16,
                        host_info={"int8_class": "x86-vnni", "cpu": "Xeon (hardening test)"})
    hw = _other_isa(art)
    rep = verify_artifact(art, hardware=hw, load_kw={"device_options": {"perturb": 50.0}})
    assert rep["chosen"]["passed"] is False
    with er.load(art, hardware=hw, device_options={"perturb": 50.0}) as rt:
        note = rt.info()["isa"]["note"]
    assert "UNDER BUDGET" in note and rt.info()["isa"]["verified_here"]["passed"] is False
    with er.load(art, hardware=hw) as rt:           # other options: the failed verify is not this path's
        assert "not verified here" in rt.info()["isa"]["note"]
    verify_artifact(art, hardware=hw)
    with er.load(art, hardware=hw) as rt:
        note = rt.info()["isa"]["note"]
    assert "verified here: top1_agreement 1.0 against budget 0.99: pass" in note
    assert tune.lookup_verify(seal_of(art), hw, "fake:cpu", "other-variant", {}) is None


def test_the_verify_cli_records_its_result(make_artifact):
    art = make_artifact("image-classification", probe=4)
    assert tune.lookup_verify(seal_of(art), _hw(art), "fake:cpu", "fake", {}) is None
    res = CliRunner().invoke(main, ["verify", str(art)])
    assert res.exit_code == 0, res.output
    rec = tune.lookup_verify(seal_of(art), _hw(art), "fake:cpu", "fake", {})
    assert rec is not None and rec["passed"] is True


# -- 6. the parity budget is validated with the manifest ---------------------------------------------
@pytest.mark.parametrize("budget", ["0.99", 1.5, -1, True, float("nan"), float("inf")])
def test_a_budget_that_is_not_a_number_in_0_1_is_an_artifact_error(make_artifact, budget):
    art = make_artifact("image-classification", probe=4)
    rewrite_manifest(art, lambda m: m["variants"][0]["parity"].update(budget=budget))
    with pytest.raises(ArtifactError) as exc:
        er.load(art)
    assert exc.value.code == "manifest_field_invalid" and "budget" in exc.value.message
    res = CliRunner().invoke(main, ["verify", str(art), "--json"])
    assert res.exit_code == 3, res.output
    assert "NaN" not in res.output


def test_a_null_budget_is_no_budget_in_the_row_and_the_verdict(make_artifact):
    art = make_artifact("image-classification", probe=4)
    rewrite_manifest(art, lambda m: m["variants"][0]["parity"].update(budget=None))
    res = CliRunner().invoke(main, ["verify", str(art)])
    assert res.exit_code == 0, res.output
    assert "no budget recorded" in res.output and ", pass)" not in res.output


def test_verify_json_is_strict_json():
    from edge_runtime.cli_verify import json_safe

    out = json.dumps(json_safe({"a": [float("nan"), 1.0], "b": {"c": float("-inf")}}), allow_nan=False)
    assert json.loads(out) == {"a": [None, 1.0], "b": {"c": None}}


# -- 7. a bad probe set is the artifact's error, and is bounded -----------------------------------------
def test_probe_inputs_the_task_refuses_are_a_probe_error_exit_3(make_artifact):
    art = make_artifact("image-classification", probe=4)
    ins = probe._npz({f"{i}.bytes": np.frombuffer(b"not an image at all", np.uint8) for i in range(4)})
    _put_probe(art, ins)
    res = CliRunner().invoke(main, ["verify", str(art)])
    assert res.exit_code == 3, res.output
    assert "probe_invalid" in res.stderr and "probe sample 0" in res.stderr
    with pytest.raises(ArtifactError) as exc:
        er.load(art, verify=True)
    assert exc.value.code == "probe_invalid" and exc.value.file == probe.INPUTS
    with pytest.raises(ArtifactError):
        tune.tune(art, rounds=1, batch=False)


def test_a_probe_file_that_inflates_past_its_recorded_size_is_refused_before_inflating(make_artifact, monkeypatch):
    art = make_artifact("image-classification", probe=4)
    buf = io.BytesIO()
    np.savez_compressed(buf, **{"0.bytes": np.zeros(20_000_000, np.uint8)})
    _put_probe(art, buf.getvalue())
    import types
    import zipfile

    class NoInflate(zipfile.ZipFile):
        def read(self, *a, **kw):
            raise AssertionError("a member was inflated")

        open = read

    monkeypatch.setattr(probe, "zipfile", types.SimpleNamespace(ZipFile=NoInflate))     # the probe reader's only
    t = time.perf_counter()
    with pytest.raises(ArtifactError) as exc:
        er.load(art, verify=True)
    assert exc.value.code == "probe_invalid" and "bytes the manifest records" in exc.value.message
    assert time.perf_counter() - t < 5


def test_a_probe_within_its_recorded_size_still_reads(make_artifact):
    art = make_artifact("text-embedding", probe=8)
    with er.load(art, verify=True) as rt:
        assert rt.info()["verified_here"]["samples"] == 8


# -- 8. tune without a probe set, and tune with no decision ---------------------------------------------
def test_load_tune_of_an_artifact_without_a_probe_set_keeps_the_policy_with_a_warning(make_artifact, caplog):
    art = make_artifact("image-classification")
    with caplog.at_level("WARNING", logger="edge_runtime"), er.load(art, tune=True) as rt:
        assert rt.info()["decided_by"] == "policy"
    assert any("probe set" in r.getMessage() and "static policy" in r.getMessage() for r in caplog.records)
    res = CliRunner().invoke(main, ["tune", str(art)])
    assert res.exit_code == 3 and "probe_missing" in res.stderr        # asked for by name: the error stays


def _perturbing(monkeypatch):
    def wrong(self, model_path, bucket, sub, options):
        return FakeSession(model_path, bucket, {**dict(options.values), "perturb": 50.0})

    monkeypatch.setattr(FakeBackend, "open", wrong)


def test_tune_with_every_candidate_under_budget_exits_7_and_load_warns(make_artifact, monkeypatch, caplog):
    art = make_artifact("image-classification", probe=12)
    _perturbing(monkeypatch)
    res = CliRunner().invoke(main, ["tune", str(art), "--rounds", "1", "--no-batch"])
    assert res.exit_code == 7, res.output
    assert "parity_below_budget_here" in res.stderr and "no candidate met the parity budget" in res.output
    with caplog.at_level("WARNING", logger="edge_runtime"), er.load(art, tune=True) as rt:
        assert rt.info()["decided_by"] == "policy"
    assert any("no path within the parity budget" in r.getMessage() for r in caplog.records)
    res = CliRunner().invoke(main, ["devices", "--artifact", str(art)])
    assert res.exit_code == 0 and ": None" not in res.output
    assert "no candidate met the parity budget here" in res.output


# -- 9. verify --all around a failing path --------------------------------------------------------------
class _Other(FakeBackend):
    name = "fake-other"


class _Broken(FakeBackend):
    """Two hints that resolve to one path, which never loads: one error row, not two."""
    name = "fake-broken"

    def precision_hints(self, target, hardware):
        return [{}, {"stall_ms": None}]

    def open(self, model_path, bucket, sub, options):
        raise RuntimeError("driver missing")


@pytest.fixture
def more_backends():
    registry.register("fake-other", _Other)
    registry.register("fake-broken", _Broken)
    yield
    registry.unregister("fake-other")
    registry.unregister("fake-broken")


def test_verify_all_reports_the_other_rows_when_the_chosen_path_fails(make_artifact, more_backends):
    art = make_artifact("image-classification", probe=4)
    res = CliRunner().invoke(main, ["verify", str(art), "--all", "--device-option", "fail_load=true", "--json"])
    assert res.exit_code == 4, res.output
    rep = json.loads(res.stdout)
    assert rep["chosen"]["error"]["code"] == "device_load_failed" and rep["chosen_error"]["exit_code"] == 4
    ok = [r for r in rep["rows"] if "error" not in r]
    assert {r["backend"] for r in ok} >= {"fake", "fake-other"} and all(r["passed"] for r in ok)
    broken = [r for r in rep["rows"] if r["backend"] == "fake-broken"]
    assert len(broken) == 1 and broken[0]["error"]["code"] == "device_load_failed"
    res = CliRunner().invoke(main, ["verify", str(art), "--all", "--device-option", "fail_load=true"])
    assert res.exit_code == 4 and "chosen path: failed [device_load_failed]" in res.output
    assert "fake-other" in res.output


def test_verify_without_all_still_raises_the_chosen_paths_error(make_artifact):
    art = make_artifact("image-classification", probe=4)
    res = CliRunner().invoke(main, ["verify", str(art), "--device-option", "fail_load=true"])
    assert res.exit_code == 4 and "device_load_failed" in res.stderr



# -- 10. --json names its failure in the one document on stdout ------------------------------------
def test_verify_and_tune_json_carry_the_error_of_a_failing_exit(make_artifact, monkeypatch):
    art = make_artifact("image-classification", probe=8)
    res = CliRunner().invoke(main, ["verify", str(art), "--json"])
    assert res.exit_code == 0 and "error" not in json.loads(res.stdout)
    res = CliRunner().invoke(main, ["verify", str(art), "--json", "--device-option", "perturb=50"])
    assert res.exit_code == 7, res.output
    rep = json.loads(res.stdout)            # still one JSON document
    assert rep["chosen"]["passed"] is False
    assert rep["error"]["code"] == "parity_below_budget_here" and rep["error"]["type"] == "ParityError"
    assert rep["error"]["details"]["budget"] == 0.99
    res = CliRunner().invoke(main, ["verify", str(art), "--json", "--device-option", "fail_load=true"])
    assert res.exit_code == 4 and json.loads(res.stdout)["error"]["code"] == "device_load_failed"
    _perturbing(monkeypatch)
    res = CliRunner().invoke(main, ["tune", str(art), "--rounds", "1", "--no-batch", "--no-save", "--json"])
    assert res.exit_code == 7, res.output
    entry = json.loads(res.stdout)
    assert entry["decision"] == {} and entry["error"]["code"] == "parity_below_budget_here"


def test_a_named_device_that_fails_is_the_row_shown_with_the_recorded_build_host(make_artifact, more_backends):
    built = "x86-avx2"
    art = make_artifact("image-classification", probe=4, host_info={"int8_class": built, "cpu": "an AVX2 box"})
    res = CliRunner().invoke(main, ["verify", str(art), "--all", "--device", "fake-broken", "--json"])
    assert res.exit_code == 4, res.output
    rep = json.loads(res.stdout)
    assert rep["chosen"]["device"] == "fake-broken" and rep["chosen"]["error"]["code"] == "device_load_failed"
    assert rep["built_on"] == built and built


def test_an_imported_artifact_says_why_it_has_no_probe_set(make_artifact):
    from factories import rewrite_manifest

    art = make_artifact("image-classification")
    rewrite_manifest(art, lambda m: m["model"].update(source={**(m["model"].get("source") or {}), "imported": True}))
    res = CliRunner().invoke(main, ["verify", str(art)])
    assert res.exit_code == 3 and "probe_missing" in res.stderr
    assert "an imported model has none" in res.stderr and "re-convert" not in res.stderr
