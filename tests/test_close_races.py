"""close() racing calls, a runtime in a forked child, and per-call argument checks (bug hunt findings
2, 3, 5, 6, 7, 8 of the in-process API).

The races are forced, not hoped for: a hook runs ``close()`` at the exact point of the call where the
old code broke (between the session's closed check and its pool's ``acquire``; between the runtime's
closed check and its session lookup), or the test holds a pool's only object while a call waits for
it. Every thread and child process is bounded: a hang is a failed assertion, never a stuck run.
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import edge_runtime as er
from conftest import need_litert, need_openvino
from edge_runtime.devices.pool import Pool

HELD_OUT = Path(__file__).resolve().parents[1] / "models" / "zoo" / "digits-cnn" / "held_out"
JOIN_S = 10.0


def _digits(n: int = 3) -> list[bytes]:
    return [p.read_bytes() for p in sorted(HELD_OUT.glob("*/*.png"))[:n]]


def _in_thread(fn):
    """Run ``fn`` on a daemon thread; (thread, box) where box gets ("ok", value) or ("err", exc)."""
    box: list = []

    def run():
        try:
            box.append(("ok", fn()))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box.append(("err", exc))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def _closed_code(box) -> str:
    kind, value = box[0]
    assert kind == "err", f"expected an error, got {value!r}"
    assert isinstance(value, er.EdgeRuntimeError), f"untyped {type(value).__name__}: {value}"
    return value.code


def _closed_errors(rt) -> int:
    return sum(e["count"] for e in rt.metrics()["errors"] if e["code"] == "runtime_closed")


# -- Pool: a closed state --------------------------------------------------------------------------

def test_pool_close_wakes_every_waiter_and_refuses_later_acquires():
    """Finding 2's mechanism: every object the pool may make exists (limit reached, all in use), so
    a waiter waits for a release. ``close()`` must wake it with ``SessionClosed``, and an acquire
    after it must raise at once; an object handed back after the close is dropped."""
    from edge_runtime.devices.session import SessionClosed

    pool = Pool(object, limit=1)
    held = pool.acquire()
    waiters = [_in_thread(pool.acquire) for _ in range(3)]
    deadline = time.monotonic() + JOIN_S
    while pool._waiting < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert pool._waiting == 3
    pool.close()
    for t, box in waiters:
        t.join(JOIN_S)
        assert not t.is_alive(), "a waiter stayed blocked in Pool.acquire after close()"
        assert box[0][0] == "err" and isinstance(box[0][1], SessionClosed)
    pool.release(held)                          # a call that held it across the close
    t0 = time.perf_counter()
    with pytest.raises(SessionClosed):
        pool.acquire()
    assert time.perf_counter() - t0 < 1.0 and pool.closed


def _pooled_artifact(request, backend: str):
    if backend == "tflite":
        return request.getfixturevalue("tflite_digits_artifact"), "tflite", {"max_interpreters": 1}
    need_openvino()
    return request.getfixturevalue("ov_digits_artifact"), "openvino", {"max_requests": 1}


@pytest.mark.parametrize("backend", ["tflite", "openvino"])
def test_close_between_the_session_check_and_acquire_never_hangs(request, backend):
    """Finding 2, forced: close() runs after the session's closed check and before its pool's
    acquire (the feed check's slot), with the pool's only object made. The old code waited for ever
    in Pool.acquire; now the call ends at once with runtime_closed, counted in the metrics."""
    path, device, opts = _pooled_artifact(request, backend)
    img = _digits(1)[0]
    rt = er.load(path, device=device, device_options=opts)
    try:
        assert rt.infer(img).prediction is not None
        sess = rt._sessions[0]
        check = sess._check

        def check_then_close(feeds):
            check(feeds)
            rt.close()                      # the pool closes under the call

        sess._check = check_then_close
        t, box = _in_thread(lambda: rt.infer(img))
        t.join(JOIN_S)
        assert not t.is_alive(), f"infer() blocked in Pool.acquire after close() ({backend})"
        assert _closed_code(box) == "runtime_closed"
        assert _closed_errors(rt) == 1
    finally:
        rt.close()


@pytest.mark.parametrize("backend", ["tflite", "openvino"])
def test_a_call_waiting_for_the_pool_when_close_runs_gets_runtime_closed(request, backend):
    """Finding 2, the waiter: the test holds the pool's only object, a call waits for it, close()
    runs. The waiter must end with runtime_closed (old: blocked until the object came back)."""
    path, device, opts = _pooled_artifact(request, backend)
    img = _digits(1)[0]
    rt = er.load(path, device=device, device_options=opts)
    pool = rt._sessions[0]._pool
    held = pool.acquire()
    try:
        t, box = _in_thread(lambda: rt.infer(img))
        deadline = time.monotonic() + JOIN_S
        while pool._waiting < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert pool._waiting == 1
        rt.close()
        t.join(JOIN_S)
        assert not t.is_alive(), f"a call waiting for the pool stayed blocked after close() ({backend})"
        assert _closed_code(box) == "runtime_closed"
    finally:
        pool.release(held)          # the old code's waiter gets it and ends: no thread left behind
        rt.close()


# -- the session list emptied under a call: IndexError ---------------------------------------------

def _close_after(rt, step: str) -> None:
    """Make ``rt.<step>`` (a preparation step) close the runtime once it returns: the close lands
    between infer()'s closed check and its session lookup, every time."""
    real = getattr(rt, step)

    def then_close(*a, **kw):
        out = real(*a, **kw)
        rt.close()
        return out

    setattr(rt, step, then_close)


def test_infer_racing_close_is_runtime_closed_never_index_error(image_art):
    """Finding 3, forced: close() runs after infer()'s closed check and before its session lookup
    (``_sessions`` is then ``[]``). The old code raised IndexError, untyped and uncounted."""
    img = np.full((12, 12, 3), 100, np.uint8)
    for batch in (False, True):
        rt = er.load(image_art, device="fake")
        _close_after(rt, "_prepare")
        try:
            if batch:                       # infer_batch's one-by-one path: each item's own error
                out = rt.infer_batch([img, img])
                assert [getattr(r, "code", r) for r in out] == ["runtime_closed", "runtime_closed"]
            else:
                with pytest.raises(er.InferenceRuntimeError) as ei:
                    rt.infer(img)
                assert ei.value.code == "runtime_closed"
            assert _closed_errors(rt) >= 1
        finally:
            rt.close()


def test_batched_infer_batch_racing_close_is_runtime_closed(ov_digits_artifact):
    """Finding 3 on OpenVINO's grouped batch path (``batch_path.run_grouped``): close() after the
    items are prepared. The old code's ``rt._sessions[bucket]`` raised IndexError out of infer_batch."""
    need_openvino()
    imgs = _digits(3)
    rt = er.load(ov_digits_artifact, device="openvino")
    try:
        assert rt._batched
        _close_after(rt, "_prepare_batch")
        out = rt.infer_batch(imgs)
        assert [getattr(r, "code", None) for r in out] == ["runtime_closed"] * 3
        assert _closed_errors(rt) == 3
    finally:
        rt.close()


def test_ort_session_released_under_a_call_is_runtime_closed(digits_artifact):
    """ONNX Runtime, forced: close() releases the session after its closed check (the feed check's
    slot), so the call finds its native session gone. The old code reported inference_failed
    (AttributeError on None); a failure of a closed runtime's call is runtime_closed."""
    img = _digits(1)[0]
    rt = er.load(digits_artifact, device="onnxruntime:cpu")
    try:
        sess = rt._sessions[0]
        check = sess._check

        def check_then_close(feeds):
            check(feeds)
            rt.close()

        sess._check = check_then_close
        with pytest.raises(er.InferenceRuntimeError) as ei:
            rt.infer(img)
        assert ei.value.code == "runtime_closed"
    finally:
        rt.close()


# -- fork --------------------------------------------------------------------------------------------

def _in_fork(fn, timeout_s: float = 20.0):
    """Run ``fn()`` in a child made by fork (multiprocessing's 'fork': the child ends with os._exit);
    its return value, or "HANG" if it did not finish in ``timeout_s`` (the child is then killed)."""
    ctx = mp.get_context("fork")
    q = ctx.SimpleQueue()

    def child():
        try:
            q.put(fn())
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            q.put(("untyped", type(exc).__name__, str(exc)[:300]))

    p = ctx.Process(target=child, daemon=True)
    p.start()
    p.join(timeout_s)
    if p.is_alive():
        p.kill()
        p.join(5)
        return "HANG"
    return q.get() if not q.empty() else ("no answer", p.exitcode)


def _codes(fn):
    try:
        out = fn()
    except er.EdgeRuntimeError as exc:
        return ("typed", exc.code, exc.message)
    return ("ok", [getattr(r, "code", None) or getattr(r, "prediction", None) for r in out]
            if isinstance(out, list) else getattr(out, "prediction", out))


def test_openvino_runtime_is_refused_in_a_forked_child(ov_digits_artifact):
    """Finding 5: OpenVINO's threads do not survive fork; infer_batch in the child blocked for ever.
    Every call of an inherited runtime is refused there at once (runtime_closed, naming both pids),
    and the parent keeps serving."""
    need_openvino()
    imgs = _digits(3)
    import os

    with er.load(ov_digits_artifact, device="openvino") as rt:
        ref = rt.infer(imgs[0]).prediction
        parent = os.getpid()

        def child():
            return [_codes(lambda: rt.infer_batch(imgs)), _codes(lambda: rt.infer(imgs[0])),
                    _codes(lambda: rt.warm_batch()), rt.close(), _codes(lambda: rt.infer(imgs[0])),
                    _closed_errors(rt)]

        got = _in_fork(child)
        assert got != "HANG", "a call of the inherited OpenVINO runtime blocked in the forked child"
        batch, one, warm, closed, after_close, counted = got
        for res in (batch, one, warm, after_close):
            assert res[:2] == ("typed", "runtime_closed"), res
        assert f"loaded in process {parent}" in batch[2] and "forked child" in batch[2]
        assert counted == 3                 # infer_batch and both infer calls (warm_batch is not a call)
        assert rt.infer(imgs[0]).prediction == ref           # the parent is untouched
        assert [r.prediction for r in rt.infer_batch(imgs)][0] == ref


def test_openvino_load_in_a_child_forked_after_it_compiled_is_refused(ov_digits_artifact):
    """After OpenVINO compiled (and released) a model, a forked child's compile_model blocks for ever
    (OpenVINO's, with a fresh Core too). Loading OpenVINO there is a DeviceError naming the way out."""
    need_openvino()
    with er.load(ov_digits_artifact, device="openvino"):
        pass                                  # compiled, run and released in this process

    def child():
        try:
            er.load(ov_digits_artifact, device="openvino")
        except er.DeviceError as exc:
            return ("typed", exc.code, exc.message)
        return ("loaded",)

    got = _in_fork(child)
    assert got != "HANG", "er.load(openvino) blocked in a child forked after OpenVINO ran"
    assert got[:2] == ("typed", "device_backend_broken") and "spawn" in got[2], got


def test_fake_runtime_in_a_forked_child_is_refused_and_a_new_load_keeps_its_deadline(make_artifact):
    """A runtime is the loading process's, on every backend (the fake one here: no native threads at
    all, so the refusal is the rule, not a symptom). The child loads its own, and that one's deadline
    holds: the watchdog thread of the parent does not exist in the child, and the old watchdog never
    started one there (the stall ran to its end and came back as a result)."""
    path = make_artifact("tensors")
    x = {"x": np.ones((1, 4), np.float32), "k": np.ones((1, 2), np.int32)}
    opts = {"stall_ms": 3000, "cancellable": True}
    with er.load(path, device="fake", device_options={"cancellable": True}) as rt:
        rt.infer(x, deadline_ms=1000)         # the parent's watchdog thread runs

        def child():
            inherited = _codes(lambda: rt.infer(x))
            own = er.load(path, device="fake", device_options=opts, warmup=False)
            t0 = time.perf_counter()
            late = _codes(lambda: own.infer(x, deadline_ms=100))
            took = time.perf_counter() - t0
            own.close()
            return inherited, late, took

        got = _in_fork(child, timeout_s=30)
        assert got != "HANG"
        inherited, late, took = got
        assert inherited[:2] == ("typed", "runtime_closed") and "forked child" in inherited[2]
        assert late[:2] == ("typed", "inference_timeout"), late
        assert took < 1.0, f"the child's deadline of 100 ms took {took:.2f} s: no watchdog thread in the child"
        assert rt.infer(x).outputs["y"].shape == (1, 3)


# -- per-call arguments -----------------------------------------------------------------------------

@pytest.mark.parametrize("kw, code", [
    ({"deadline_ms": 2 ** 1100}, "limit_invalid"),          # OverflowError: t0 + deadline / 1000
    ({"limits": "notadict"}, "limit_invalid"),              # AttributeError: no .items()
    ({"limits": [("deadline_ms", 5)]}, "limit_invalid"),
    ({"limits": []}, "limit_invalid"),                      # silently ignored before
    ({"deadline_ms": np.bool_(True)}, "limit_invalid"),
    ({"deadline_ms": True}, "limit_invalid"),
    ({"limits": {"deadline_ms": float("nan")}}, "limit_invalid"),
    ({"limits": {"max_batch_items": 2.0}}, "limit_invalid"),
])
def test_bad_call_arguments_are_typed_and_counted(image_art, kw, code):
    """Findings 6 and 7: each is an InputError with a code, on infer and infer_batch, and both
    count in rt.metrics() (infer's limit refusals were not counted)."""
    img = np.full((12, 12, 3), 100, np.uint8)
    with er.load(image_art, device="fake") as rt:
        for call in (lambda: rt.infer(img, **kw), lambda: rt.infer_batch([img], **kw)):
            with pytest.raises(er.InputError) as ei:
                call()
            assert ei.value.code == code
        assert {e["code"]: e["count"] for e in rt.metrics()["errors"]} == {code: 2}


def test_infer_limit_refusals_are_counted(image_art):
    """Finding 7 as the hunter ran it: 3 infer + 3 infer_batch refusals are 6 in the metrics."""
    img = np.full((12, 12, 3), 100, np.uint8)
    with er.load(image_art, device="fake") as rt:
        for _ in range(3):
            for call in (rt.infer, lambda v, **kw: rt.infer_batch([v], **kw)):
                with pytest.raises(er.InputError):
                    call(img, limits={"bogus": 1})
        assert [(e["code"], e["count"]) for e in rt.metrics()["errors"]] == [("limit_unknown", 6)]


def test_deadlines_are_numbers_the_same_way_everywhere(make_artifact):
    """Finding 8: the keyword and limits={"deadline_ms": ...} take the same values: any positive
    number, numpy's included (np.int64(5) and np.float32(5) were refused); a sub-millisecond
    deadline in limits (refused as "must be a positive integer") times out as the keyword does."""
    path = make_artifact("tensors")
    x = {"x": np.ones((1, 4), np.float32), "k": np.ones((1, 2), np.int32)}
    with er.load(path, device="fake", device_options={"stall_ms": 50, "cancellable": True}) as rt:
        for v in (np.int64(5000), np.float32(5000.0), np.uint16(5000), 5000, 5000.5):
            assert rt.infer(x, deadline_ms=v).outputs["y"].shape == (1, 3)
            assert rt.infer(x, limits={"deadline_ms": v}).outputs["y"].shape == (1, 3)
        for how in ({"deadline_ms": 0.001}, {"limits": {"deadline_ms": 0.001}}):
            with pytest.raises(er.InferenceTimeout):
                rt.infer(x, **how)
        with pytest.raises(er.InferenceTimeout) as ei:
            rt.infer(x, deadline_ms=np.float32(1.0))
        assert type(ei.value.details["deadline_ms"]) is float        # JSON-safe, not a numpy scalar
        assert rt.infer(x, limits={"max_request_bytes": np.int64(1 << 20)}).outputs["y"].shape == (1, 3)


def test_info_returns_copies(image_art):
    """Finding 8: rt.info()'s dicts are the caller's; editing them changes nothing the runtime reports."""
    keys = ("device_options", "warmup_ms", "runtime_provenance", "recorded_options_ignored")
    with er.load(image_art, device="fake", device_options={"stall_ms": 0.0}) as rt:
        before = {k: copy.deepcopy(rt.info()[k]) for k in keys}
        i = rt.info()
        i["device_options"]["stall_ms"] = 99
        i["warmup_ms"]["x"] = 1
        i["runtime_provenance"]["y"] = 2
        i["recorded_options_ignored"].append("z")
        after = rt.info()
        for key in keys:
            assert after[key] == before[key], key
