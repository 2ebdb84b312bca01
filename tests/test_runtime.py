"""Runtime behaviour on the fake backend: routing, deadlines, failures, choice."""

import logging
import subprocess
import sys
import time

import numpy as np
import pytest

import edge_runtime as er


def test_finished_calls_release_their_watchdog_entries():
    """Each inline call arms the watchdog. A finished call must drop its token (and the
    backend's run options its cancel hook holds) at once, not when its deadline passes:
    with a 5 s deadline at 5,000 calls/s that was 25,000 live RunOptions and +26% RSS."""
    from edge_runtime.watchdog import Watchdog

    wd = Watchdog()
    entries = [wd.arm(time.perf_counter() + 60)[1] for _ in range(5000)]
    for e in entries:
        wd.disarm(e)
    assert wd.pending() <= Watchdog.COMPACT_AT and all(e[2] is None for e in entries)
    token, late = wd.arm(time.perf_counter() + 0.01)
    fired = []
    token.on_cancel(lambda: fired.append(1))
    time.sleep(0.2)
    assert token.fired and fired == [1] and late[2] is None
    wd.disarm(late)                               # a call that returns after it fired
    assert wd.pending() <= Watchdog.COMPACT_AT


@pytest.mark.parametrize("far", [1e13, float("inf")], ids=["past-TIMEOUT_MAX", "inf"])
def test_a_far_deadline_never_stops_the_watchdog(far):
    """A deadline past ``threading.TIMEOUT_MAX`` (``deadline_ms=9.3e12``) made the thread's
    ``Condition.wait`` raise ``OverflowError``: the watchdog died and every later deadline of the
    process was ignored. It now waits at most ``MAX_WAIT_S`` at a time and still fires the next."""
    from edge_runtime.watchdog import Watchdog

    wd = Watchdog()
    wd.arm(time.perf_counter() + far)
    time.sleep(0.05)                                # the thread is now waiting on the far entry
    token, entry = wd.arm(time.perf_counter() + 0.02)
    time.sleep(0.3)
    assert token.fired and wd._thread is not None and wd._thread.is_alive()


def test_length_aware_routing(make_artifact):
    with er.load(make_artifact("text-classification", buckets=(8, 16)), device="fake") as rt:
        short = rt.infer("good movie")                      # 4 tokens
        mid = rt.infer("the stock market rises " * 3)       # 14 tokens
        long = rt.infer("the movie is great " * 10)         # > 16 tokens
        assert (short.bucket, short.truncated) == ("seq8", False)
        assert (mid.bucket, mid.truncated) == ("seq16", False)
        assert (long.bucket, long.truncated) == ("seq16", True)
        prepared = rt.task.prepare("good movie", rt.limits)
        ids = prepared.feeds["input_ids"][0]
        assert list(ids[:4]) == [2, 4, 15, 3] and not ids[4:].any()   # [CLS] good movie [SEP] + padding
        assert prepared.feeds["attention_mask"][0].tolist() == [1] * 4 + [0] * 4


@pytest.mark.parametrize("cancellable", [False, True], ids=["worker-pool", "inline+watchdog"])
def test_deadline_on_a_stalling_backend_then_keeps_serving(make_artifact, cancellable):
    path = make_artifact("tensors")
    x = {"x": np.ones((1, 4), np.float32), "k": np.ones((1, 2), np.int32)}
    opts = {"stall_ms": 400, "cancellable": cancellable}
    with er.load(path, device="fake", device_options=opts, warmup=False) as rt:
        caps = rt._sessions[0].capabilities
        assert (caps.inline, caps.cancellable) == (cancellable, cancellable)
        t0 = time.perf_counter()
        with pytest.raises(er.InferenceTimeout) as ei:
            rt.infer(x, deadline_ms=100)
        elapsed = (time.perf_counter() - t0) * 1000
        assert ei.value.code == "inference_timeout"
        assert 100 <= elapsed <= 110 + 15   # deadline + 10% (+ scheduler slack)
        assert rt.infer(x, deadline_ms=2000).outputs["y"].shape == (1, 3)
    with pytest.raises(er.InputError):
        er.load(path, device="fake").infer(x, deadline_ms=-1)


def test_backend_failure_is_wrapped_with_device_and_variant(make_artifact):
    path = make_artifact("tensors")
    x = {"x": np.ones((1, 4), np.float32), "k": np.ones((1, 2), np.int32)}
    with er.load(path, device="fake", device_options={"fail_after": 1}, warmup=False) as rt:
        rt.infer(x)
        with pytest.raises(er.InferenceRuntimeError) as ei:
            rt.infer(x)
        assert ei.value.device == "fake:cpu" and ei.value.variant == "fake"
        assert isinstance(ei.value.__cause__, RuntimeError)
    with pytest.raises(er.DeviceError) as ei:
        er.load(path, device="fake", device_options={"fail_load": True})
    assert ei.value.code == "device_load_failed"


def test_device_choice_strict_and_fallback(make_artifact, caplog):
    path = make_artifact("tensors")
    with pytest.raises(er.DeviceError) as ei:
        er.load(path, device="onnxruntime", strict=True)
    assert "onnxruntime" in ei.value.message and ei.value.code == "device_unavailable"
    with pytest.raises(er.DeviceError):
        er.load(path, device="warp-drive")
    with caplog.at_level(logging.WARNING, logger="edge_runtime"):
        with er.load(path, device="onnxruntime") as rt:
            info = rt.info()
            assert rt.device == "fake:cpu"
            assert "unavailable" in info["fallback"]
    assert any("onnxruntime" in r.message for r in caplog.records)


def test_error_tree_and_codes():
    for cls, parent in [(er.InputError, er.EdgeRuntimeError), (er.ArtifactError, er.EdgeRuntimeError),
                        (er.DeviceError, er.EdgeRuntimeError), (er.InferenceTimeout, er.EdgeRuntimeError),
                        (er.InferenceRuntimeError, er.EdgeRuntimeError)]:
        assert issubclass(cls, parent)
    codes = {c.code for c in (er.InputError, er.ArtifactError, er.DeviceError, er.InferenceTimeout,
                              er.InferenceRuntimeError, er.ParityError)}
    exits = {c.exit_code for c in (er.InputError, er.ArtifactError, er.DeviceError, er.InferenceTimeout,
                                   er.InferenceRuntimeError, er.ParityError)}
    assert len(codes) == 6 and len(exits) == 6
    assert er.ArtifactError("bad", file="a.onnx").to_dict()["details"]["file"] == "a.onnx"


def test_import_pulls_in_no_ml_framework():
    code = ("import sys, time; t=time.perf_counter(); import edge_runtime; dt=time.perf_counter()-t; "
            "heavy={'onnxruntime','openvino','torch','tensorflow','coremltools','nncf','onnx','ai_edge_litert',"
            "'tflite_runtime','tokenizers','PIL'}; print(sorted({m.split('.')[0] for m in sys.modules} & heavy)); print(dt)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]"
    assert float(out[1]) < 1.0   # the bench measures the real figure; this guards regressions


def test_info_reports_what_ran(make_artifact):
    with er.load(make_artifact("text-embedding"), device="fake") as rt:
        info = rt.info()
        assert info["task"] == "text-embedding" and info["device"] == "fake:cpu"
        assert [b["name"] for b in info["buckets"]] == ["seq8", "seq16"]
        assert info["limits"]["max_batch_items"] == 500 and info["load_ms"] > 0
