"""Hardening of the measured choice (`edge-infer tune`, `device="auto"` with a cached decision):

1. a second `tune` records the static policy's choice as "static", not the first tune's measured
   path, and never needs the cached path to load;
2. a cached decision never turns a load that worked into an error: device options the caller gives
   that the measured path's backend refuses keep the static policy for that load, and say why;
3. the cache's writes: threads storing one key never share a temp file (nor leave one behind), and
   verifies run at once (threads or processes) keep every remembered row.

Fake backends and tiny artifacts only."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import edge_runtime as er
from factories import seal_of
from edge_runtime import tune, tune_cache
from edge_runtime.cli import main
from edge_runtime.cli_devices import artifact_choice
from edge_runtime.devices import registry
from edge_runtime.devices.base import Option
from edge_runtime.errors import DeviceError, InputError
from fake_backend import FakeBackend, FakeSession


pytestmark = pytest.mark.usefixtures("own_cache")


def _hw(art):
    with er.load(art, warmup=False, device="fake") as rt:
        return rt.hardware


# -- backends the test controls ------------------------------------------------------------------
_FAKE_DEFAULTS = {o.name: o.default for o in FakeBackend.options}


class _Timed(FakeBackend):
    """The fake with a class-level stall and load failure the test sets."""
    STALL_MS = 0.0
    FAIL_LOAD = False

    def open(self, model_path, bucket, sub, options):
        return FakeSession(model_path, bucket, {**dict(options.values), "stall_ms": type(self).STALL_MS,
                                                "fail_load": type(self).FAIL_LOAD})


class FastA(_Timed):
    name = "fake-tc-a"


class SlowB(_Timed):
    name = "fake-tc-b"


class Narrow(FakeBackend):
    """A backend of the same target that declares fewer options than ``fake`` (as tflite declares
    no ``precision`` where OpenVINO does): only ``stall_ms``."""
    name = "fake-narrow"
    options = (Option("stall_ms", float, 0.0, "sleep this long in every run", minimum=0),)

    def open(self, model_path, bucket, sub, options):
        return FakeSession(model_path, bucket, {**_FAKE_DEFAULTS, **dict(options.values)})


@pytest.fixture
def timed_backends(monkeypatch):
    FastA.STALL_MS, SlowB.STALL_MS, FastA.FAIL_LOAD, SlowB.FAIL_LOAD = 0.0, 4.0, False, False
    real_open = FakeBackend.open

    def slow_fake(self, model_path, bucket, sub, options):       # the policy's "fake" is slow here
        return FakeSession(model_path, bucket, {**dict(options.values), "stall_ms": 4.0})

    monkeypatch.setattr(FakeBackend, "open", slow_fake)
    registry.register("fake-tc-a", FastA)
    registry.register("fake-tc-b", SlowB)
    yield
    monkeypatch.setattr(FakeBackend, "open", real_open)
    registry.unregister("fake-tc-a")
    registry.unregister("fake-tc-b")


@pytest.fixture
def narrow_backend():
    registry.register("fake-narrow", Narrow)
    yield
    registry.unregister("fake-narrow")


def _store_decision(art, backend: str, device_options: dict | None = None, purposes=("latency",)) -> None:
    """A tune entry for this artifact here that chose ``backend``, written as tune writes it."""
    d = {"target": "fake", "backend": backend, "device_options": dict(device_options or {}),
         "why": "measured here (test)"}
    entry = {"artifact": str(art), "model": "m", "version": "3", "seal": seal_of(art), "created": "2026-12-07T00:00:00Z",
             "here": {}, "static": {"target": "fake", "backend": "fake"}, "decision": {p: d for p in purposes},
             "rows": [], "rounds": 1, "probe_samples": 4, "seconds": 0.1}
    tune.store(seal_of(art), _hw(art), entry)


# == 1. the static policy of a second tune ========================================================
def test_a_second_tune_records_the_static_policy_not_the_first_decision(make_artifact, timed_backends):
    art = make_artifact("image-classification", probe=6)
    policy = artifact_choice(art, _hw(art))["chosen"]
    assert policy["decided_by"] == "policy" and policy["backend"] == "fake"
    first = tune.tune(art, rounds=2, batch=False)
    assert first["decision"]["latency"]["backend"] == "fake-tc-a"          # the measurement overrides the policy
    assert first["static"] == {"target": "fake", "backend": "fake"}
    second = tune.tune(art, rounds=2, batch=False)              # a cached decision exists now
    assert second["static"] == {"target": "fake", "backend": "fake"}, second["static"]
    res = CliRunner().invoke(main, ["tune", str(art), "--rounds", "1", "--no-batch", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["static"] == {"target": "fake", "backend": "fake"}
    res = CliRunner().invoke(main, ["tune", str(art), "--rounds", "1", "--no-batch"])
    assert "static policy: fake on fake" in res.output, res.output
    with er.load(art) as rt:
        assert rt.info()["decided_by"] == "measurement" and rt.choice.backend_name == "fake-tc-a"
        assert rt.info()["tuned"]["static"] == {"target": "fake", "backend": "fake"}
    devices = json.loads(CliRunner().invoke(main, ["devices", "--artifact", str(art), "--json"]).output)["artifact"]
    assert devices["static"]["backend"] == "fake" and devices["chosen"]["backend"] == "fake-tc-a"


def test_a_tune_runs_when_the_cached_path_no_longer_loads(make_artifact, timed_backends):
    """Tune is what an operator runs when the cached path went bad: it must not load that path first."""
    art = make_artifact("image-classification", probe=6)
    assert tune.tune(art, rounds=1, batch=False)["decision"]["latency"]["backend"] == "fake-tc-a"
    FastA.FAIL_LOAD = True
    with er.load(art) as rt:        # auto follows the cache into the broken path, then the next candidate, said
        assert rt.choice.backend_name != "fake-tc-a" and "fake-tc-a" in rt.info()["fallback"]
    with pytest.raises(DeviceError):                  # strict: the broken path's own error
        er.load(art, strict=True)
    again = tune.tune(art, rounds=1, batch=False)
    rows = {r["backend"]: r for r in again["rows"]}
    assert "error" in rows["fake-tc-a"] and again["decision"]["latency"]["backend"] in ("fake", "fake-tc-b")
    assert again["static"] == {"target": "fake", "backend": "fake"}
    with er.load(art) as rt:                          # the new decision is the one a load uses
        assert rt.choice.backend_name == again["decision"]["latency"]["backend"]


# == 2. the caller's device options and the measured path ==========================================
def test_options_the_measured_backend_refuses_keep_the_static_policy(make_artifact, narrow_backend, caplog):
    art = make_artifact("image-classification", probe=4)
    with er.load(art, device_options={"perturb": 0.0}) as rt:         # before any tune: works, on the policy's path
        assert rt.choice.backend_name == "fake" and rt.info()["decided_by"] == "policy"
    _store_decision(art, "fake-narrow", {"stall_ms": 0.25})
    with er.load(art) as rt:
        assert rt.choice.backend_name == "fake-narrow" and rt.info()["decided_by"] == "measurement"
        assert rt.info()["tuned"].get("not_applied") is None
    with caplog.at_level(logging.WARNING, logger="edge_runtime"):
        for _ in range(2):
            with er.load(art, device_options={"perturb": 0.0}) as rt:     # was: InputError for fake-narrow
                info = rt.info()
                assert rt.choice.backend_name == "fake" and info["decided_by"] == "policy"
                assert info["device_options"] == {"perturb": 0.0}       # the measured options are not carried over
                assert info["tuned"]["decided_by"] == "policy" and rt.choice.measured is None
                why = info["tuned"]["not_applied"]
                assert "fake-narrow" in why and "perturb" in why and "static policy" in why, why
                assert info["tuned"]["decision"]["latency"]["backend"] == "fake-narrow"   # still shown
    said = [r for r in caplog.records if "is not used for this load" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING            # once, not per load
    # options the measured backend takes keep the measurement, under the caller's keys
    with er.load(art, device_options={"stall_ms": 0.0}) as rt:
        assert rt.choice.backend_name == "fake-narrow" and rt.info()["device_options"] == {"stall_ms": 0.0}
        assert rt.info()["tuned"]["not_applied"] is None
    with er.load(art, device_options={}) as rt:                         # what the CLI passes: none
        assert rt.choice.backend_name == "fake-narrow" and rt.info()["device_options"] == {"stall_ms": 0.25}


def test_options_no_path_takes_are_still_the_callers_error(make_artifact, narrow_backend, caplog):
    art = make_artifact("image-classification", probe=4)
    _store_decision(art, "fake-narrow")
    with caplog.at_level(logging.WARNING, logger="edge_runtime"), pytest.raises(InputError) as exc:
        er.load(art, device_options={"bogus": 1})
    assert exc.value.code == "device_option_unknown" and "for fake " in exc.value.message    # as without a tune
    assert not [r for r in caplog.records if "is not used for this load" in r.getMessage()]


def test_a_named_device_is_unaffected_by_the_cached_decision(make_artifact, narrow_backend):
    art = make_artifact("image-classification", probe=4)
    _store_decision(art, "fake-narrow")
    with pytest.raises(InputError) as exc:          # the caller named it: its own options' error
        er.load(art, device="fake-narrow", device_options={"perturb": 0.0})
    assert exc.value.code == "device_option_unknown"
    with er.load(art, device="fake", device_options={"perturb": 0.0}) as rt:
        assert rt.info()["decided_by"] == "forced" and rt.info()["tuned"] is None


def test_the_throughput_decision_is_held_to_the_same_rule(make_artifact, narrow_backend):
    art = make_artifact("image-classification", probe=4)
    _store_decision(art, "fake-narrow", purposes=("latency", "throughput"))
    with er.load(art, tuned_for="throughput", device_options={"perturb": 0.0}) as rt:
        assert rt.choice.backend_name == "fake" and "throughput" in rt.info()["tuned"]["not_applied"]
    with er.load(art, tuned_for="throughput") as rt:
        assert rt.choice.backend_name == "fake-narrow"


def test_infer_and_verify_with_a_device_option_still_work_after_tune(make_artifact, narrow_backend):
    art = make_artifact("text-classification", probe=4)
    _store_decision(art, "fake-narrow")
    res = CliRunner().invoke(main, ["infer", str(art), "--text", "good movie", "--json",
                                    "--device-option", "perturb=0"])
    assert res.exit_code == 0, res.output                       # was exit 2, device_option_unknown
    res = CliRunner().invoke(main, ["verify", str(art), "--json", "--device-option", "perturb=0"])
    assert res.exit_code == 0, res.output
    chosen = json.loads(res.stdout)["chosen"]
    assert chosen["backend"] == "fake" and chosen["decided_by"] == "policy"
    res = CliRunner().invoke(main, ["infer", str(art), "--text", "good movie", "--json"])
    assert res.exit_code == 0, res.output


# == 3. the cache's writes ========================================================================
def _slow_replace(monkeypatch, seconds: float = 0.0005):
    """os.replace with a pause before it: the window in which another writer's temp file can
    collide with this one's is widened, so a shared temp name fails every time, not by chance."""
    real = os.replace

    def slow(src, dst):
        time.sleep(seconds)
        return real(src, dst)

    monkeypatch.setattr(tune_cache.os, "replace", slow)


def test_threads_storing_one_key_never_share_a_temp_file(make_artifact, monkeypatch):
    art = make_artifact("image-classification", probe=4)
    seal, hw = seal_of(art), _hw(art)
    _slow_replace(monkeypatch)
    errors: list[BaseException] = []
    go = threading.Barrier(8)

    def writer(n):
        go.wait()
        for i in range(40):
            try:
                tune.store(seal, hw, {"paths": {f"t{n}": {"i": i}}}, kind="verify")
            except BaseException as exc:     # noqa: BLE001 - collected for the assertion
                errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"{len(errors)} of 320 stores failed, e.g. {errors[0]!r}"
    folder = tune.cache_root() / "verify"
    assert not list(folder.glob("*.tmp"))
    assert tune.lookup(seal, hw, kind="verify") is not None          # a whole entry, never a torn one


def test_a_store_that_fails_leaves_no_temp_file(make_artifact, monkeypatch):
    art = make_artifact("image-classification", probe=4)
    seal, hw = seal_of(art), _hw(art)

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tune_cache.os, "replace", refuse)
    with pytest.raises(OSError):
        tune.store(seal, hw, {"paths": {}}, kind="verify")
    assert not list((tune.cache_root() / "verify").glob("*.tmp"))


def _row(device: str) -> dict:
    return {"device": device, "target": "fake", "backend": device.partition(":")[0], "device_options": {},
            "metric": "top1_agreement", "value": 1.0, "budget": 0.99, "passed": True, "samples": 4}


def _slow_reads(monkeypatch, seconds: float = 0.02):
    """The verify entry's read takes a while: two unserialised read-modify-writes then overlap
    every time (each writes what it read plus its own row, and the last one wins)."""
    real = tune_cache.lookup

    def slow(seal, hw, kind="tune"):
        got = real(seal, hw, kind)
        if kind == "verify":
            time.sleep(seconds)
        return got

    monkeypatch.setattr(tune_cache, "lookup", slow)


def test_verifies_remembered_at_once_by_threads_keep_every_row(make_artifact, monkeypatch):
    art = make_artifact("image-classification", probe=4)
    seal, hw = seal_of(art), _hw(art)
    _slow_reads(monkeypatch)
    devices = [f"dev{i}:cpu" for i in range(6)]
    go = threading.Barrier(len(devices))

    def remember(d):
        go.wait()
        tune.remember_verify(seal, hw, _row(d))

    threads = [threading.Thread(target=remember, args=(d,)) for d in devices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for d in devices:
        assert tune.lookup_verify(seal, hw, d, "fake", {}) is not None, d


def test_verifies_remembered_at_once_without_fcntl_still_keep_every_row(make_artifact, monkeypatch):
    """Where there is no fcntl (Windows) the threads of one process still serialise."""
    art = make_artifact("image-classification", probe=4)
    seal, hw = seal_of(art), _hw(art)
    monkeypatch.setattr(tune_cache, "fcntl", None)
    _slow_reads(monkeypatch)
    devices = [f"dev{i}:cpu" for i in range(4)]
    threads = [threading.Thread(target=tune.remember_verify, args=(seal, hw, _row(d))) for d in devices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(tune.lookup_verify(seal, hw, d, "fake", {}) for d in devices)


_CHILD = """
import json, os, sys, time
from edge_runtime import tune, tune_cache
hw = json.load(open(sys.argv[2]))
real = tune_cache.lookup
def slow(seal, hw, kind="tune"):
    got = real(seal, hw, kind)
    if kind == "verify":
        time.sleep(0.05)
    return got
tune_cache.lookup = slow
deadline = time.time() + 30
while not os.path.exists(sys.argv[3]) and time.time() < deadline:
    time.sleep(0.001)
tune.remember_verify(sys.argv[1], hw, {"device": sys.argv[4], "target": "fake", "backend": "x",
                                       "device_options": {}, "metric": "top1_agreement", "value": 1.0,
                                       "budget": 0.99, "passed": True, "samples": 4})
"""


@pytest.mark.skipif(sys.platform == "win32", reason="the advisory file lock is fcntl's")
def test_verifies_remembered_at_once_by_processes_keep_every_row(make_artifact, tmp_path):
    """Three `verify --device X` processes at once: each row is kept (the read-modify-write of the
    entry is serialised by a file lock beside it)."""
    art = make_artifact("image-classification", probe=4)
    seal, hw = seal_of(art), _hw(art)
    hw_file, go = tmp_path / "hw.json", tmp_path / "go"
    hw_file.write_text(json.dumps(hw))
    devices = ["tflite:cpu", "onnxruntime:cpu", "openvino:cpu"]
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, seal, str(hw_file), str(go), d],
                              env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for d in devices]
    time.sleep(1.0)                      # every child imported and waiting
    go.write_text("go")
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()
    kept = [d for d in devices if tune.lookup_verify(seal, json.loads(hw_file.read_text()), d, "fake", {})]
    assert kept == devices


@pytest.mark.skipif(sys.platform == "win32", reason="the advisory file lock is fcntl's")
def test_a_lock_held_elsewhere_is_waited_for_a_bounded_time_then_a_warning(make_artifact, monkeypatch, caplog):
    import fcntl

    art = make_artifact("image-classification", probe=4)
    seal, hw = seal_of(art), _hw(art)
    entry = tune.cache_root() / "verify" / f"{tune.cache_key(seal, hw)['digest']}.json"
    entry.parent.mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(tune_cache, "LOCK_WAIT_S", 0.3)
    with open(entry.with_suffix(".lock"), "a+b") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)           # another verify holds the entry (and hangs)
        t0 = time.perf_counter()
        with caplog.at_level(logging.WARNING, logger="edge_runtime"):
            tune.remember_verify(seal, hw, _row("dev:cpu"))
        waited = time.perf_counter() - t0
    assert 0.25 <= waited < 5, waited                          # it waited, and not forever
    assert any("without its lock" in r.getMessage() for r in caplog.records)
    assert tune.lookup_verify(seal, hw, "dev:cpu", "fake", {}) is not None    # best effort: written all the same


def test_a_verify_whose_record_cannot_be_written_warns_and_passes(make_artifact, monkeypatch, caplog):
    art = make_artifact("image-classification", probe=4)

    def full(*a, **k):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tune_cache, "store", full)
    with caplog.at_level(logging.WARNING, logger="edge_runtime"):
        res = CliRunner().invoke(main, ["verify", str(art), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["chosen"]["passed"] is True
    assert any("was not remembered" in r.getMessage() and "Read-only" in r.getMessage() for r in caplog.records)


def test_ray_s_thread_sizing_never_keeps_the_tuned_path_out(make_artifact, narrow_backend, monkeypatch):
    """Ray adds ``threads`` (a sizing hint, not the caller's request) to the device options: a measured
    path whose backend has no such option (an accelerator) still runs, with its own defaults."""
    from edge_runtime.ray import EdgeScorer

    monkeypatch.setattr(FakeBackend, "options", FakeBackend.options + (Option("threads", int, None, "test"),))
    art = make_artifact("image-classification")
    _store_decision(art, "fake-narrow", purposes=("latency", "throughput"))
    s = EdgeScorer(str(art), verify=False, warm=False, threads=2)
    try:
        assert s.load_error is None and s.rt.choice.backend_name == "fake-narrow"
        assert s.rt.info()["tuned"]["not_applied"] is None
    finally:
        s.rt.close()
    # the caller's own option that the measured path refuses: the static policy, sized by Ray
    s = EdgeScorer(str(art), verify=False, warm=False, threads=2, device_options={"perturb": 0.0})
    try:
        assert s.load_error is None and s.rt.choice.backend_name == "fake"
        assert s.rt.device_options["threads"] == 2 and s.rt.info()["tuned"]["not_applied"]
    finally:
        s.rt.close()
