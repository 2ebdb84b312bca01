"""Crash isolation (``isolate=True``) never answers wrongly: a hunt for wrong answers with exit 0.

The first eight tests fail on the code before their fixes (each says what it got then); the last two
guard what was found correct: concurrent callers' own answers, bit for bit; the non-finite guard through
the worker; bad feeds refused before the worker; shared memory kept across restarts and released at close.
"""

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import edge_runtime as er
import edge_runtime.isolate_process as iproc
from edge_runtime.isolate import IsolatedWorker
from fake_backend import FakeBackend, FakeSession, write_fake_model

_ENTRY = "from edge_runtime.isolate_worker import _child_entry; _child_entry()"
# a backend that dequantizes its integer outputs itself and hands one output back flattened, as some do
# (the output contract accepts both): in the worker it is this patch, run before the worker's entry
_DEQUANT = '''
import numpy as np, fake_backend
_plain_run = fake_backend.FakeSession._run
def _dequantizing_run(self, feeds, cancel):
    out = _plain_run(self, feeds, cancel)
    return {k: v.astype(np.float32) * np.float32(0.5) if v.dtype.kind in "iu" else v.ravel() if k == "flat" else v
            for k, v in out.items()}
fake_backend.FakeSession._run = _dequantizing_run
'''


@pytest.fixture
def tensors_art(make_artifact):
    return make_artifact("tensors")


def _t(name, dtype, shape):
    return {"name": name, "dtype": dtype, "shape": list(shape)}


def _buckets(tmp_path):
    """Two buckets of different sizes, three inputs and four outputs each (float32, int8, float16, float32)."""
    out = []
    for i, n in enumerate((4, 9)):
        b = {"name": f"len{n}", "inputs": [_t("ids", "int32", [1, n]), _t("x", "float32", [1, n, 2]),
                                           _t("m", "uint8", [n])],
             "outputs": [_t("logits", "float32", [1, 3]), _t("codes", "int8", [1, n]), _t("half", "float16", [2, n]),
                         _t("flat", "float32", [1, n, 2])]}
        path = tmp_path / f"{b['name']}.npz"
        write_fake_model(path, b, seed=i, scale=2.0)
        b["file"] = path.name
        out.append((str(path), b))
    return out


def _feeds(bucket, seed):
    rng = np.random.default_rng(seed)
    n = bucket["inputs"][0]["shape"][1]
    x = rng.standard_normal((2, n, 1)).astype(np.float32).transpose(2, 1, 0)     # (1, n, 2), not contiguous
    assert not x.flags.c_contiguous
    return {"ids": rng.integers(0, 50, (1, n), dtype=np.int32), "x": x, "m": rng.integers(0, 255, n, dtype=np.uint8)}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
                                        and a[k].tobytes() == b[k].tobytes() for k in a)


def _created_blocks(monkeypatch) -> list[str]:
    """The names of the shared-memory blocks the isolated runtime creates from now on."""
    names: list[str] = []
    real = iproc.shared_memory.SharedMemory

    class Recorded(real):  # type: ignore[misc, valid-type]
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            if kw.get("create"):
                names.append(self.name)

    monkeypatch.setattr(iproc.shared_memory, "SharedMemory", Recorded)
    return names


def _left(names) -> list[str]:
    return [n for n in names if Path("/dev/shm", n.lstrip("/")).exists()]


def test_outputs_the_block_cannot_hold_reach_the_host_bit_for_bit(tmp_path, monkeypatch):
    """Before: a session returning a dequantized (float) output for an int8 one, or an output of the right
    size in another shape (both accepted in-process by the output contract) failed every isolated call
    ("output 'codes' is float32[1, 4], the manifest says int8[1, 4]"). Now every output of both buckets
    equals the in-process session's, bit for bit, dtype and shape included; results are copies."""
    monkeypatch.setattr(iproc, "_CHILD_CODE", _DEQUANT + _ENTRY)
    ns: dict = {}
    exec(_DEQUANT.replace("fake_backend.FakeSession._run = _dequantizing_run", ""), ns)     # the same patch here
    monkeypatch.setattr(FakeSession, "_run", ns["_dequantizing_run"])
    buckets = _buckets(tmp_path)
    ref = [FakeBackend().load(path, b, None, {}) for path, b in buckets]
    worker = IsolatedWorker("fake", buckets, None, {})
    try:
        sessions = worker.sessions()
        for k, (_, b) in enumerate(buckets):
            f1, f2 = _feeds(b, 1), _feeds(b, 2)
            want1, want2 = ref[k].run(f1), ref[k].run(f2)
            assert want1["codes"].dtype == np.float32 and want1["flat"].ndim == 1    # the backend's own forms
            got1 = sessions[k].run(f1)
            keep = {n: a.copy() for n, a in got1.items()}
            got2 = sessions[k].run(f2)
            assert _same(got1, want1) and _same(got2, want2)
            assert _same(got1, keep)            # call 2 left result 1 as it was
            for arr in list(got1.values()) + list(got2.values()):
                assert all(not np.shares_memory(arr, v) for v in worker._views[k][1].values())
            assert _same(sessions[k].run({n: np.ascontiguousarray(a) for n, a in f1.items()}), want1)
    finally:
        worker.close()


def test_an_answer_left_unread_is_never_taken_as_the_next_calls(tensors_art):
    """A call left while the worker ran it (KeyboardInterrupt out of its wait). Before: the next call read
    the old call's "ok" and returned the old input's outputs as its own, exit 0. Now the worker that owes
    the unread answer is stopped and the next call is answered by a new one, for its own input."""
    x1 = {"x": np.ones((1, 4), np.float32), "k": np.zeros((1, 2), np.int32)}
    x2 = {"x": -np.ones((1, 4), np.float32), "k": np.full((1, 2), 3, np.int32)}
    with er.load(tensors_art, device="fake") as ref:
        want1, want2 = ref.infer(x1).outputs, ref.infer(x2).outputs
    assert not _same(want1, want2)
    with er.load(tensors_art, device="fake", isolate=True, device_options={"stall_ms": 150}) as rt:
        worker = rt._sessions[0]._worker
        real = worker.conn

        class Interrupted:          # the worker's connection, whose first wait is interrupted
            polls = 0

            def __getattr__(self, name):
                return getattr(real, name)

            def poll(self, timeout=0.0):
                Interrupted.polls += 1
                if Interrupted.polls == 1:
                    raise KeyboardInterrupt
                return real.poll(timeout)

        worker.conn = Interrupted()
        with pytest.raises(KeyboardInterrupt):
            rt.infer(x1, deadline_ms=20_000)
        if worker.conn.__class__ is Interrupted:
            worker.conn = real
        time.sleep(0.4)                     # the old call's answer is in the pipe by now (old code)
        assert _same(rt.infer(x2, deadline_ms=20_000).outputs, want2)
        assert _same(rt.infer(x1, deadline_ms=20_000).outputs, want1)
        s = rt.info()["sessions"][0]
        assert s["restarts"] == 1 and s["crashes"] == [], s


def test_a_failed_isolated_load_releases_its_shared_memory_at_once(text_art, monkeypatch):
    """Before: the blocks stayed in /dev/shm for as long as the load's error lived (``load()`` keeps its
    first error; a caller may keep it too): 5 blocks here. Now they go when the load fails."""
    names = _created_blocks(monkeypatch)
    with pytest.raises(er.DeviceError) as ei:
        er.load(text_art, device="fake", isolate=True, device_options={"fail_load": True})
    assert ei.value.code == "device_load_failed" and len(names) == 5
    assert _left(names) == []


def test_a_worker_that_dies_loading_is_typed_with_its_signal_and_last_stderr(text_art, monkeypatch):
    """Before: "died while loading (signal SIGKILL)", without what it wrote. Now its last stderr lines too."""
    monkeypatch.setattr(iproc, "_CHILD_CODE", "import os, signal\nos.write(2, b'native: cannot map model.bin\\n')\n"
                                              "os.kill(os.getpid(), signal.SIGKILL)")
    t0 = time.perf_counter()
    with pytest.raises(er.DeviceError) as ei:
        er.load(text_art, device="fake", isolate=True)
    assert time.perf_counter() - t0 < 20
    assert ei.value.code == "device_worker_died", ei.value
    assert "SIGKILL" in ei.value.message and "native: cannot map model.bin" in ei.value.message, ei.value.message


def test_a_crash_in_a_call_names_the_workers_last_stderr(text_art, monkeypatch):
    monkeypatch.setattr(iproc, "_CHILD_CODE", "import os\nos.write(2, b'libfake: heap corrupted\\n')\n" + _ENTRY)
    with er.load(text_art, device="fake", isolate=True, warmup=False, device_options={"segfault_after": 1}) as rt:
        assert rt.infer("good", deadline_ms=20_000).prediction
        with pytest.raises(er.InferenceRuntimeError) as ei:
            rt.infer("good", deadline_ms=20_000)
    assert ei.value.code == "backend_crashed" and "SIGSEGV" in ei.value.message
    assert "libfake: heap corrupted" in ei.value.message, ei.value.message


def test_a_backends_artifact_error_at_load_is_the_same_error_under_isolation(text_art, monkeypatch):
    """Before: a backend's ArtifactError (a model file it refuses) came back a DeviceError
    (``device_load_failed``, exit 4), which ``load()`` treats as a device to fall back from."""
    patch = ("from edge_runtime.errors import ArtifactError\nimport fake_backend\n"
             "def _refuse(self, *a):\n"
             "    raise ArtifactError('not compiled for this device', file='fake/seq8.npz', code='artifact_invalid')\n"
             "fake_backend.FakeBackend.open = _refuse\n")
    ns: dict = {}
    exec(patch.replace("fake_backend.FakeBackend.open = _refuse\n", ""), ns)
    monkeypatch.setattr(FakeBackend, "open", ns["_refuse"])
    with pytest.raises(er.ArtifactError) as inproc:
        er.load(text_art, device="fake")
    monkeypatch.setattr(iproc, "_CHILD_CODE", patch + _ENTRY)
    with pytest.raises(er.EdgeRuntimeError) as ei:
        er.load(text_art, device="fake", isolate=True)
    assert type(ei.value) is type(inproc.value) and ei.value.code == inproc.value.code == "artifact_invalid"
    assert "not compiled for this device" in ei.value.message


def test_close_during_a_call_is_runtime_closed_at_its_bound_and_releases_everything(text_art, monkeypatch):
    """Before: once the in-flight bound passed, close() still waited 2 s more for a worker that, running
    the call, could not read "close". Now it stops it then; the call gets ``runtime_closed``."""
    names = _created_blocks(monkeypatch)
    monkeypatch.setattr(iproc, "_CLOSE_WAIT_S", 0.2)
    rt = er.load(text_art, device="fake", isolate=True, warmup=False, device_options={"stall_ms": 5000})
    box: dict = {}

    def call():
        try:
            rt.infer("good", deadline_ms=30_000)
            box["r"] = "answered"
        except er.EdgeRuntimeError as exc:
            box["r"] = exc.code

    th = threading.Thread(target=call, daemon=True)
    th.start()
    time.sleep(0.5)                         # the worker runs the call
    t0 = time.perf_counter()
    rt.close()
    took = time.perf_counter() - t0
    th.join(10)
    assert box.get("r") == "runtime_closed", box
    assert took < 1.5, took
    assert len(names) == 5 and _left(names) == []


_CLOSE_AT_THE_ANSWER = """
import sys, threading, time
import edge_runtime as er, edge_runtime.isolate as iso, edge_runtime.isolate_process as iproc
iproc._CLOSE_WAIT_S = 0.2
answer = iso.IsolatedWorker._answer
def answer_at_the_bound(self, *a):          # the worker's answer came just as close()'s bound passed
    out = answer(self, *a)
    if out[0] is not None and out[0][0] == "ok":
        time.sleep(1.0)                     # ... and its outputs are copied after close() went on
    return out
iso.IsolatedWorker._answer = answer_at_the_bound
rt = er.load(sys.argv[1], device="fake", isolate=True, warmup=False)
box = {}
def call():
    try:
        box["r"] = "answered %d" % len(rt.infer("good movie", deadline_ms=30_000).scores)
    except er.EdgeRuntimeError as exc:
        box["r"] = exc.code
th = threading.Thread(target=call)
th.start()
time.sleep(0.5)
rt.close()
th.join(10)
print(box.get("r"), flush=True)
print("host alive", flush=True)
"""


def test_close_never_unmaps_the_blocks_under_a_call_still_reading_them(text_art):
    """Before: close() unmapped the shared memory while the call in flight (past its bound) copied its
    outputs from it: the host died of SIGSEGV, the crash isolation is there to prevent. Now close()
    unlinks the blocks and the mapping goes with the last reference: the call ends, the host lives."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _CLOSE_AT_THE_ANSWER, str(text_art)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, (out.returncode, out.stderr[-1000:])
    assert out.stdout.splitlines() in (["answered 2", "host alive"], ["runtime_closed", "host alive"]), out.stdout


# -- guards: found correct (they pass on the old code too) ------------------------------------------------
def test_guard_threads_get_their_own_answers_and_nan_is_still_refused(tensors_art):
    rng = np.random.default_rng(7)
    inputs = [{"x": rng.standard_normal((1, 4)).astype(np.float32), "k": rng.integers(0, 9, (1, 2), dtype=np.int32)}
              for _ in range(24)]
    with er.load(tensors_art, device="fake") as ref:
        want = [ref.infer(x).outputs for x in inputs]
    bad: list = []
    with er.load(tensors_art, device="fake", isolate=True) as rt:
        def caller(k):
            for i in range(k, len(inputs), 4):
                for _ in range(3):
                    try:
                        if not _same(rt.infer(inputs[i], deadline_ms=20_000).outputs, want[i]):
                            bad.append(i)
                    except Exception as exc:  # noqa: BLE001
                        bad.append(exc)

        threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert bad == []
    with er.load(tensors_art, device="fake", isolate=True, warmup=False, device_options={"nan_after": 0}) as rt:
        with pytest.raises(er.InferenceRuntimeError) as ei:
            rt.infer(inputs[0], deadline_ms=20_000)
        assert ei.value.code == "non_finite_output"


def test_guard_bad_feeds_stop_before_the_worker_and_blocks_live_until_close(text_art, monkeypatch):
    names = _created_blocks(monkeypatch)
    rt = er.load(text_art, device="fake", isolate=True, warmup=False, device_options={"segfault_after": 1})
    try:
        sess = rt._sessions[0]
        good = {t["name"]: np.zeros(t["shape"], t["dtype"]) for t in sess._bucket["inputs"]}
        pid = rt.info()["sessions"][0]["worker_pid"]
        for name, arr in [("input_ids", good["input_ids"].astype(object)),
                          ("input_ids", good["input_ids"].astype(np.float64)),
                          ("input_ids", np.zeros((1, 64), np.int64)),
                          ("input_ids", good["input_ids"].astype(">i8"))]:
            with pytest.raises(ValueError):
                sess.run({**good, name: arr})
        assert sess.run(good)["logits"].shape == (1, 2)             # the worker's first run: it lives on
        assert rt.info()["sessions"][0]["worker_pid"] == pid
        with pytest.raises(er.InferenceRuntimeError):               # its second: SIGSEGV, a restart
            rt.infer("good", deadline_ms=20_000)
        assert len(names) == 5 and _left(names) == names            # the same blocks serve the new worker
    finally:
        rt.close()
    assert _left(names) == []
