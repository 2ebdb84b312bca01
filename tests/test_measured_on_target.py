"""Issue #17: the probe set, `edge-infer verify`, `load(verify=True)`, measured choice
(`tune`, its cache), the ISA note, on fake backends whose behaviour the test controls
and on real converted artifacts."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from click.testing import CliRunner

import edge_runtime as er
from edge_runtime import host, probe, tune
from edge_runtime.cli import main
from edge_runtime.devices import registry
from edge_runtime.errors import ArtifactError, InferenceRuntimeError, ParityError
from edge_runtime.models.base import Outputs, Scores, TaskOutput
from fake_backend import FakeBackend, FakeSession


pytestmark = pytest.mark.usefixtures("own_cache")


# -- the probe set's format ---------------------------------------------------------------
def test_probe_round_trips_every_kind_of_raw_input_and_result(tmp_path):
    raws = ["héllo wörld", b"\x89PNG\r\n\x1a\nrest", np.arange(6, dtype=np.uint8).reshape(2, 3),
            {"x": np.ones((1, 4), np.float32), "k": np.array([[1, 2]], np.int32)}]
    res = [TaskOutput(prediction="positive", scores=Scores({"positive": 0.9, "negative": 0.1}, class_id=1,
                                                           top_k=[{"index": 1, "label": "positive", "score": 0.9}])),
           TaskOutput(embedding=np.linspace(0, 1, 8, dtype=np.float32)),
           TaskOutput(outputs=Outputs({"y.a/b": np.full((1, 3), 2.5, np.float32)})),
           TaskOutput(prediction=[1, 2], class_id=4)]
    ins, ref, section = probe.build(raws, res, count=10)
    assert section["samples"] == 4 and section["bytes"] > 0

    class Art:
        manifest = {"probe": {**section}}

        @staticmethod
        def read_bytes(rel):
            return {probe.INPUTS: ins, probe.REFERENCE: ref}[rel]

    got = probe.read(Art)
    assert got.inputs[0] == raws[0] and got.inputs[1] == raws[1]
    assert np.array_equal(got.inputs[2], raws[2]) and got.inputs[2].dtype == np.uint8
    assert set(got.inputs[3]) == {"x", "k"} and got.inputs[3]["k"].dtype == np.int32
    r0, r1, r2, r3 = got.reference
    assert r0.prediction == "positive" and r0.class_id == 1 and list(r0.scores) == ["positive", "negative"]
    assert r0.top_k[0]["index"] == 1
    assert np.array_equal(r1.embedding, res[1].embedding)
    assert np.array_equal(r2.outputs["y.a/b"], res[2].outputs["y.a/b"])
    assert r3.prediction == [1, 2] and r3.class_id == 4


@pytest.mark.parametrize("arr", [
    np.arange(12, dtype=np.float32).reshape(3, 4), np.array(3.5), np.zeros((0, 5), np.int8), np.array([True, False]),
    np.arange(6, dtype=">i4"), np.array([1.5, np.nan], np.float16), np.frombuffer("é".encode() * 200, np.uint8),
    np.arange(6, dtype=np.int64).reshape(2, 3).T,                                  # Fortran order: numpy reads it
    np.zeros(2, dtype=[("a", np.int32), ("b", np.float32)]),                      # structured: numpy reads it
])
def test_probe_files_read_as_numpy_reads_them(arr):
    import io

    buf = io.BytesIO()
    np.savez_compressed(buf, allow_pickle=False, a=arr, b=np.ones(3, np.float64))
    got = probe._load_npz(buf.getvalue())
    assert set(got) == {"a", "b"}
    assert got["a"].dtype == arr.dtype and got["a"].shape == arr.shape
    np.testing.assert_array_equal(got["a"], arr)
    assert got["a"].flags.writeable                          # as np.load returns it
    one = io.BytesIO()
    np.save(one, arr, allow_pickle=False)
    plain = arr.dtype.fields is None and (arr.flags.c_contiguous or arr.ndim < 2)
    assert (probe._npy_fast(one.getvalue()) is not None) == plain      # the fast path reads the plain case


def test_a_probe_file_holding_objects_or_cut_short_is_refused():
    import io

    buf = io.BytesIO()
    np.savez(buf, a=np.array([{"x": 1}], dtype=object))
    with pytest.raises(ValueError):                         # never unpickled
        probe._load_npz(buf.getvalue())
    one = io.BytesIO()
    np.save(one, np.arange(10, dtype=np.int32))
    assert probe._npy_fast(one.getvalue()[:-4]) is None       # short data: left to numpy, which refuses it
    with pytest.raises(ValueError):
        np.load(io.BytesIO(one.getvalue()[:-4]))


def test_probe_is_capped_in_count_and_bytes():
    raws = ["x" * 1000] * 50
    res = [TaskOutput(embedding=np.zeros(256, np.float32))] * 50
    _, _, by_count = probe.build(raws, res, count=32)
    assert by_count["samples"] == 32 and by_count["offered"] == 50
    _, _, by_bytes = probe.build(raws, res, count=32, max_bytes=10_000)
    assert by_bytes["samples"] == 4 and by_bytes["bytes"] <= 10_000 and by_bytes["max_bytes"] == 10_000


def test_an_artifact_without_a_probe_set_says_how_to_get_one(make_artifact):
    art = make_artifact("image-classification")
    res = CliRunner().invoke(main, ["verify", str(art)])
    assert res.exit_code == 3, res.output
    assert "probe_missing" in res.stderr and "re-convert" in res.stderr


def test_a_corrupt_probe_file_is_refused_like_any_other_file(make_artifact):
    art = make_artifact("image-classification", probe=8)
    p = art / probe.REFERENCE
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))
    with pytest.raises(ArtifactError) as exc:
        er.load(art)
    assert exc.value.file == probe.REFERENCE and exc.value.code == "artifact_hash_mismatch"


def test_a_probe_section_naming_an_unlisted_file_is_refused(make_artifact):
    from factories import rewrite_manifest

    art = make_artifact("image-classification", probe=4)
    rewrite_manifest(art, lambda m: m["probe"].update(inputs="probe/elsewhere.npz"))
    with pytest.raises(ArtifactError, match="probe.inputs"):
        er.load(art)


# -- verify ---------------------------------------------------------------------------------
@pytest.mark.parametrize("task", ["text-classification", "text-embedding", "image-classification", "tensors"])
def test_verify_passes_on_a_faithful_backend_for_every_task(make_artifact, task):
    art = make_artifact(task, probe=8)
    res = CliRunner().invoke(main, ["verify", str(art), "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    row = rep["chosen"]
    assert row["passed"] is True and row["value"] >= 0.9999 and row["samples"] == 8
    assert row["recorded"] == 1.0 and row["budget"] == 0.99 and row["latency_ms_median"] > 0


def test_a_backend_that_perturbs_its_outputs_fails_verify_with_exit_7(make_artifact):
    art = make_artifact("image-classification", probe=16)
    res = CliRunner().invoke(main, ["verify", str(art), "--device-option", "perturb=50"])
    assert res.exit_code == 7, res.output
    assert "UNDER BUDGET" in res.output
    assert res.stderr.startswith("error [parity_below_budget_here]: on fake:cpu the fake variant measures "
                                 "top1_agreement")
    with pytest.raises(ParityError) as exc:
        er.load(art, verify=True, device_options={"perturb": 50.0})
    assert exc.value.code == "parity_below_budget_here" and exc.value.exit_code == 7
    assert exc.value.details["budget"] == 0.99 and exc.value.details["value"] < 0.99


def test_verify_at_load_reports_its_figures_and_cost(make_artifact):
    art = make_artifact("text-embedding", probe=8)
    with er.load(art, verify=True) as rt:
        info = rt.info()
    v = info["verified_here"]
    assert v["metric"] == "cosine_mean" and v["passed"] is True and v["samples"] == 8 and v["ms"] > 0
    assert v["ms"] <= info["load_ms"]
    with er.load(art) as rt:
        assert rt.info()["verified_here"] is None       # verify=False runs nothing


def test_verify_at_load_is_the_pipeline_warm_up_and_not_traffic(make_artifact, monkeypatch):
    """With verify=True the probe set's first call warms the pre/post path (the task's warm-up sample
    would be one more call of the same at load), and the probe calls leave no trace in the metrics."""
    art = make_artifact("text-embedding", probe=8)
    calls: list = []
    probes: list = []
    real, real_probe = er.Runtime.infer, er.Runtime._probe_call

    def counting(self, raw, **kw):
        calls.append(raw)
        return real(self, raw, **kw)

    def probing(self, raw):         # a probe runs infer()'s path, keeping the task's output for parity
        probes.append(raw)
        return real_probe(self, raw)

    monkeypatch.setattr(er.Runtime, "infer", counting)
    monkeypatch.setattr(er.Runtime, "_probe_call", probing)
    with er.load(art) as rt:
        plain = list(calls)
        assert set(rt.info()["warmup_ms"]) >= {"pipeline"} and len(plain) == 1 and not probes  # the warm-up sample
    calls.clear()
    with er.load(art, verify=True) as rt:
        info = rt.info()
        assert len(probes) == 8 and not calls and plain[0] not in probes        # the probes only
        assert info["warmup_ms"]["pipeline"] == info["verified_here"]["first_ms"] > 0
        m = rt.metrics()
        assert sum(h["count"] for h in m["latency_seconds"].values()) == 0, m


def test_a_backend_that_returns_nan_is_non_finite_output_in_verify(make_artifact):
    art = make_artifact("text-embedding", probe=8)
    with pytest.raises(InferenceRuntimeError) as exc:
        er.load(art, verify=True, device_options={"nan_after": 2})
    assert exc.value.code == "non_finite_output"
    res = CliRunner().invoke(main, ["verify", str(art), "--device-option", "nan_after=2"])
    assert res.exit_code == 6 and "non_finite_output" in res.stderr


# -- tune: two backends whose latencies the test controls ----------------------------------------
class _Timed(FakeBackend):
    """The fake with a class-level stall: the test sets how slow each backend is."""
    STALL_MS = 0.0

    def open(self, model_path, bucket, sub, options):
        return FakeSession(model_path, bucket, {**dict(options.values), "stall_ms": type(self).STALL_MS})


class FakeA(_Timed):
    name = "fake-a"


class FakeB(_Timed):
    name = "fake-b"


@pytest.fixture
def two_backends():
    registry.register("fake-a", FakeA)
    registry.register("fake-b", FakeB)
    yield
    registry.unregister("fake-a")
    registry.unregister("fake-b")


@pytest.mark.parametrize("slow", ["fake-a", "fake-b"])
def test_tune_picks_the_faster_of_two_backends_and_auto_uses_it(make_artifact, two_backends, slow):
    art = make_artifact("image-classification", probe=6)
    FakeA.STALL_MS, FakeB.STALL_MS = (4.0, 0.0) if slow == "fake-a" else (0.0, 4.0)
    fast = "fake-b" if slow == "fake-a" else "fake-a"
    with er.load(art) as rt:
        static = rt.choice.backend_name
        assert rt.choice.decided_by == "policy" and rt.info()["tuned"] is None
    entry = tune.tune(art, rounds=2, batch=False)
    rows = {r["backend"]: r for r in entry["rows"]}
    assert {"fake", "fake-a", "fake-b"} <= set(rows)
    assert rows[slow]["latency_ms_median"] > rows[fast]["latency_ms_median"] + 2
    assert entry["decision"]["latency"]["backend"] != slow
    assert entry["static"]["backend"] == static
    with er.load(art) as rt:
        info = rt.info()
        assert rt.choice.decided_by == "measurement" and rt.choice.backend_name == entry["decision"]["latency"][
            "backend"]
        assert info["decided_by"] == "measurement" and "fastest within the parity budget" in rt.choice.measured
        assert info["tuned"]["static"]["backend"] == static
        assert rt.tune_lookup_ms < 50
    with er.load(art, device="fake") as rt:      # a named device is never overridden by a measurement
        assert rt.choice.decided_by == "forced"


def test_tune_skips_a_candidate_under_budget(make_artifact, two_backends, monkeypatch):
    art = make_artifact("image-classification", probe=12)
    FakeA.STALL_MS = FakeB.STALL_MS = 3.0          # "fake" is the fastest, but it computes wrongly here

    def wrong(self, model_path, bucket, sub, options):
        return FakeSession(model_path, bucket, {**dict(options.values), "perturb": 50.0})

    monkeypatch.setattr(FakeBackend, "open", wrong)
    entry = tune.tune(art, rounds=1, batch=False)
    rows = {r["backend"]: r for r in entry["rows"]}
    assert rows["fake"]["passed"] is False
    assert entry["decision"]["latency"]["backend"] in ("fake-a", "fake-b")
    why = entry["decision"]["latency"]["why"]            # the failed row is named as such, not as in budget
    assert "fastest within the parity budget (every candidate:" in why
    (failed,) = [part for part in why.split("; ") if " on fake:" in part]      # not "on fake-a:"
    assert "under budget" in failed, why


def test_the_cache_entry_is_ignored_for_another_machine_artifact_or_backend_version(make_artifact, two_backends,
                                                                                  monkeypatch):
    art = make_artifact("image-classification", probe=4)
    FakeA.STALL_MS, FakeB.STALL_MS = 3.0, 0.0
    tune.tune(art, rounds=1, batch=False)
    here = er.load(art).hardware
    seal = json.loads((art / "manifest.json").read_text())["manifest_sha256"]
    assert tune.lookup(seal, here) is not None
    # another hardware fingerprint
    other_hw = {**here, "cpu": {**here["cpu"], "features": ["avx2", "avx512_vnni"]}}
    assert host.fingerprint(other_hw) != host.fingerprint(here)
    assert tune.lookup(seal, other_hw) is None
    with er.load(art, hardware=other_hw) as rt:
        assert rt.choice.decided_by == "policy"
    # another artifact seal (the same model, rebuilt)
    art2 = make_artifact("image-classification", probe=4, seed=7)
    with er.load(art2) as rt:
        assert rt.choice.decided_by == "policy"
    # another backend version
    real = host.backend_versions()
    monkeypatch.setattr(host, "backend_versions", lambda: {**real, "onnxruntime": "0.0"})
    assert tune.lookup(seal, here) is None
    with er.load(art) as rt:
        assert rt.choice.decided_by == "policy"


def test_a_cached_decision_whose_backend_is_gone_falls_back_to_the_policy(make_artifact, two_backends):
    art = make_artifact("image-classification", probe=4)
    FakeA.STALL_MS, FakeB.STALL_MS = 3.0, 0.0
    entry = tune.tune(art, rounds=1, batch=False)
    assert entry["decision"]["latency"]["backend"] in ("fake", "fake-b")
    registry.unregister("fake-b")
    registry.unregister("fake")
    try:
        with er.load(art) as rt:
            assert rt.choice.decided_by == "policy" and rt.choice.backend_name == "fake-a"
    finally:
        registry.register("fake", "fake_backend:FakeBackend")
        registry.register("fake-b", FakeB)


def test_tune_cli_and_devices_show_the_measured_choice_beside_the_static_one(make_artifact, two_backends):
    art = make_artifact("image-classification", probe=4)
    FakeA.STALL_MS, FakeB.STALL_MS = 3.0, 3.0
    res = CliRunner().invoke(main, ["devices", "--artifact", str(art)])
    assert res.exit_code == 0 and "not tuned here" in res.output
    res = CliRunner().invoke(main, ["tune", str(art), "--rounds", "1"])
    assert res.exit_code == 0, res.output
    assert "measured (latency): fake on fake" in res.output and "static policy:" in res.output
    assert "cached: " in res.output
    res = CliRunner().invoke(main, ["devices", "--artifact", str(art), "--json"])
    data = json.loads(res.output)["artifact"]
    assert data["chosen"]["decided_by"] == "measurement" and data["chosen"]["backend"] == "fake"
    assert data["static"]["decided_by"] == "policy"
    assert {r["backend"] for r in data["measured"]["measured"]} >= {"fake", "fake-a", "fake-b"}
    res = CliRunner().invoke(main, ["devices", "--artifact", str(art)])
    assert "static policy would run:" in res.output and "ms/call" in res.output


def test_tune_with_load_measures_once_then_reuses(make_artifact, two_backends):
    art = make_artifact("image-classification", probe=4)
    FakeA.STALL_MS, FakeB.STALL_MS = 0.0, 0.0
    with er.load(art, tune=True) as rt:
        assert rt.choice.decided_by == "measurement"
        created = rt.info()["tuned"]["created"]
    t0 = time.perf_counter()
    with er.load(art, tune=True) as rt:
        assert rt.info()["tuned"]["created"] == created        # the cache, not a new measurement
        assert rt.tune_lookup_ms < 50
    assert time.perf_counter() - t0 < 5


# -- the ISA note -----------------------------------------------------------------------------
def test_the_isa_note_says_when_the_parity_came_from_another_int8_class(make_artifact, caplog):
    art = make_artifact("image-classification", probe=4,
                        host_info={"int8_class": "x86-vnni", "cpu": "Intel Xeon (test)"})
    hw = {**er.load(art).hardware}
    hw["cpu"] = {**hw["cpu"], "features": ["avx2"]}
    with caplog.at_level("WARNING", logger="edge_runtime"), er.load(art, hardware=hw) as rt:
        isa = rt.info()["isa"]
    assert isa["built_on"] == "x86-vnni" and isa["here"] == "x86-avx2" and isa["same"] is False
    assert "measured on x86-vnni (Intel Xeon (test))" in isa["note"] and "not verified here" in isa["note"]
    assert any("not verified here" in r.getMessage() for r in caplog.records)
    with er.load(art, hardware=hw, verify=True) as rt:
        isa = rt.info()["isa"]
    assert isa["verified_here"]["passed"] is True and "verified here: top1_agreement 1.0" in isa["note"]
    same = make_artifact("image-classification", probe=4, host_info={"int8_class": "x86-avx2", "cpu": "AMD EPYC"})
    with er.load(same, hardware=hw) as rt:
        assert rt.info()["isa"]["same"] is True and "note" not in rt.info()["isa"]


def test_int8_classes():
    x86 = {"machine": "x86_64"}
    assert host.cpu_int8_class({**x86, "cpu": {"features": ["avx2"]}}) == "x86-avx2"
    assert host.cpu_int8_class({**x86, "cpu": {"features": ["avx2", "avx512f", "avx512_vnni"]}}) == "x86-vnni"
    assert host.cpu_int8_class({**x86, "cpu": {"features": ["avx2", "avx512f"]}}) == "x86-avx512-no-vnni"
    assert host.cpu_int8_class({**x86, "cpu": {"features": ["amx_int8", "avx512_vnni"]}}) == "x86-amx"
    arm = {"machine": "aarch64"}
    assert host.cpu_int8_class({**arm, "cpu": {"features": ["neon", "dotprod"]}}) == "arm-dotprod"
    assert host.cpu_int8_class({**arm, "cpu": {"features": ["neon"]}}) == "arm"
    assert host.int8_class({**x86, "cpu": {"features": ["avx2"]}}, "onnxruntime:tensorrt") == "nvidia-gpu"
    assert host.int8_class({**x86, "cpu": {"features": ["avx2"]}}, "edgetpu:usb:0") == "edgetpu"
    assert host.int8_class({**arm, "cpu": {"features": ["neon"]}}, "coreml:cpu") == "arm"
    assert host.int8_class({**x86, "cpu": {"features": ["avx2"]}}, "onnxruntime:cpu") == "x86-avx2"


# -- real artifacts -----------------------------------------------------------------------------
def test_a_converted_artifact_keeps_a_probe_set_and_its_build_host(digits_artifact):
    man = json.loads((digits_artifact / "manifest.json").read_text())
    pr = man["probe"]
    assert pr["samples"] == 32 and pr["max_samples"] == 32 and pr["bytes"] <= pr["max_bytes"]
    assert pr["inputs"] in man["files"] and pr["reference"] in man["files"]
    assert "held-out" in pr["source"]
    built = man["build"]["host_info"]
    assert built["int8_class"] == host.cpu_int8_class(er.load(digits_artifact).hardware)
    assert built["fingerprint"] and "onnxruntime" in built["backends"]


def test_verify_a_real_artifact_on_its_real_backend(ov_digits_artifact):
    res = CliRunner().invoke(main, ["verify", str(ov_digits_artifact), "--all", "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    by = {(r["target"], r["backend"]): r for r in rep["rows"]}
    assert ("openvino", "openvino") in by and ("onnx-int8", "onnxruntime") in by
    for r in rep["rows"]:
        if "error" in r:
            continue
        assert r["passed"] is True and r["value"] >= r["budget"] and r["samples"] == 32
        # the probe is a subset of the held-out set the convert measured: the figures agree closely
        assert abs(r["value"] - r["recorded"]) <= 0.05


def test_tune_a_real_two_variant_artifact(ov_digits_artifact):
    entry = tune.tune(ov_digits_artifact, rounds=2)
    ok = [r for r in entry["rows"] if "error" not in r]
    assert len(ok) >= 2 and all(r["passed"] for r in ok)
    best = min(ok, key=lambda r: r["latency_ms_median"])
    assert (entry["decision"]["latency"]["target"], entry["decision"]["latency"]["backend"]) == \
        (best["target"], best["backend"])
    assert all(r["batch_items_per_s"] > 0 for r in ok)
    with er.load(ov_digits_artifact) as rt:
        assert rt.choice.decided_by == "measurement" and rt.variant.target == best["target"]


def test_a_few_probe_disagreements_are_judged_by_their_sampling_error():
    """32 probes cannot tell 0.97 from 0.99 top-1 agreement: a path exactly at a 0.99 budget shows one
    or more disagreements 27% of the time, so one of 32 holds and two (p = 0.041) do not. A mean
    (cosine) has no such allowance; nor does a share that reaches its budget need one."""
    from edge_runtime.cli_devices import tune_row_text
    from edge_runtime.verify import holds, refuse

    def fig(agree, n=32, metric="top1_agreement"):
        return {"metric": metric, "value": agree / n, "samples": n}

    f = fig(32)
    assert holds(f, 0.99) and "p_value" not in f
    one = fig(31)
    assert holds(one, 0.99) and one["disagreements"] == 1 and one["p_value"] == pytest.approx(0.275, abs=1e-3)
    two = fig(30)
    assert not holds(two, 0.99) and two["disagreements"] == 2 and two["p_value"] == pytest.approx(0.0407, abs=1e-4)
    assert not holds(fig(31, metric="cosine_mean"), 0.99)
    assert not holds({"metric": "top1_agreement", "value": None, "samples": 0}, 0.99)
    assert holds(fig(800, n=872), 0.99) is False                   # many samples: 72 disagreements is under
    row = {"target": "openvino", "backend": "openvino", "device": "openvino:cpu", "budget": 0.99, "recorded": 0.9966,
           **one, "passed": True, "latency_ms_median": 5.0}
    assert "(budget 0.99, pass: 1 of 32 probes disagree, p=0.275 at the budget (within sampling error))" in tune_row_text(row)
    row2 = {**row, **two, "passed": False}
    assert "UNDER: 2 of 32 probes disagree, p=0.041 at the budget" in tune_row_text(row2)
    assert "(2 of 32 probes disagree: p=0.041 for a path at the budget)" in refuse(row2).message
