"""Isolated-worker recovery (``isolate=True``): a worker that dies while idle, calls that wait for a
restart, whose deadline may kill a worker, ``close()`` during a restart, and the restart back-off.

Every scenario bounds its calls with deadlines and its threads with joins; every runtime is closed
and the test checks that no child process of this one is left."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import edge_runtime as er
from conftest import ZOO

SLACK_S = 0.05          # scheduling slack on top of "deadline + 10%" (the one tests/test_isolate.py allows)


@pytest.fixture
def art(make_artifact):
    return make_artifact("text-classification")


def _children() -> set[int]:
    """This process's isolated workers, live or zombie (not multiprocessing's resource tracker, a
    helper that lives as long as the process): none may outlive a runtime's close()."""
    me, out = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == me and (fields[0] == "Z" or b"_child_entry" in cmdline):
            out.add(int(entry.name))
    return out


@pytest.fixture
def no_leaked_children():
    before = _children()
    yield
    t_end = time.monotonic() + 5
    while _children() - before and time.monotonic() < t_end:
        time.sleep(0.05)
    assert not _children() - before, "a worker outlived its runtime"


def _worker(rt):
    return rt._sessions[0]._worker


def _pid(rt):
    return rt.info()["sessions"][0]["worker_pid"]


def _wait_dead(pid: int, timeout: float = 5.0) -> None:
    """Until ``pid`` has exited (a zombie, not yet reaped by the runtime, counts as exited)."""
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)
    raise AssertionError(f"worker {pid} did not die")


def _slow_restarts(monkeypatch, rt, delay_s: float) -> None:
    """Every later worker start takes ``delay_s`` longer (a heavy model's load), in the host's
    restart path, old code or new."""
    cls = type(_worker(rt))
    start = cls._start

    def slow_start(self, *a, **kw):
        time.sleep(delay_s)
        return start(self, *a, **kw)

    monkeypatch.setattr(cls, "_start", slow_start)


def _slow_python(tmp_path, monkeypatch, delay_s: float) -> None:
    """Workers started from now on sit ``delay_s`` in their own process before the interpreter
    loads: a worker that is loading when close() comes (the same pid: it execs, no grandchild)."""
    real = sys.executable
    shim = tmp_path / "slow-python"
    shim.write_text(f"#!{real}\nimport os, sys, time\ntime.sleep({delay_s})\n"
                    f"os.execv({real!r}, [{real!r}] + sys.argv[1:])\n")
    shim.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(shim))


def _call(rt, x, deadline_ms):
    """(outcome, seconds): ``"ok"`` or the typed error's code; anything untyped fails the test."""
    t0 = time.perf_counter()
    try:
        rt.infer(x, deadline_ms=deadline_ms)
        out = "ok"
    except er.EdgeRuntimeError as exc:
        out = exc.code
    return out, time.perf_counter() - t0


# -- finding 4: a worker that dies while idle -------------------------------------------------------

def test_a_worker_killed_while_idle_is_one_crash_then_a_new_worker_serves(art, no_leaked_children):
    with er.load(art, device="fake", isolate=True, warmup=False) as rt:
        assert rt.infer("good").prediction
        pid = _pid(rt)
        os.kill(pid, signal.SIGKILL)          # the OOM killer, an operator's kill -9: no call in flight
        _wait_dead(pid)
        with pytest.raises(er.InferenceRuntimeError) as ei:
            rt.infer("good", deadline_ms=10_000)
        assert ei.value.code == "backend_crashed" and "SIGKILL" in ei.value.message, ei.value.message
        assert pid not in _children()           # the dead worker was reaped, not left a zombie
        for _ in range(3):                      # the new worker serves every later call
            assert rt.infer("good", deadline_ms=20_000).prediction in ("negative", "positive")
        s = rt.info()["sessions"][0]
        assert s["restarts"] == 1 and s["crashes"] == ["signal SIGKILL"] and s["worker_pid"] not in (None, pid)
        assert {e["code"]: e["count"] for e in rt.metrics()["errors"]} == {"backend_crashed": 1}


# -- finding 1: a deadline shorter than the worker's start ------------------------------------------

def test_calls_waiting_for_a_restart_time_out_on_time_and_never_kill_it(art, monkeypatch, no_leaked_children):
    deadline_ms = 300       # a fake call takes ~1 ms: only a restart is slower than this
    bound = deadline_ms / 1000 * 1.1 + SLACK_S
    with er.load(art, device="fake", isolate=True, warmup=False, device_options={"segfault_after": 2}) as rt:
        assert rt.infer("good").prediction and rt.infer("good").prediction
        _slow_restarts(monkeypatch, rt, 1.5)          # a restart takes > 1.5 s: 5 deadlines of 300 ms
        out, _ = _call(rt, "good", 20_000)           # the worker's 3rd run: SIGSEGV
        assert out == "backend_crashed"
        seen, results, t_end = [], 0, time.monotonic() + 8
        while results < 2 and time.monotonic() < t_end:       # the new worker segfaults on its 3rd run
            out, took = _call(rt, "good", deadline_ms)
            seen.append((out, round(took * 1000)))
            results += out == "ok"
        slow = [s for s in seen if s[1] > bound * 1000]
        assert not slow, f"calls over deadline + 10%: {slow}"
        assert results == 2, f"no results after the restart: {seen[-5:]} ({len(seen)} calls)"
        assert {o for o, _ in seen} == {"ok", "inference_timeout"}, seen
        assert sum(o == "inference_timeout" for o, _ in seen) >= 3     # they did wait on the restart
        s = rt.info()["sessions"][0]
        assert s["restarts"] == 1, s            # the calls that timed out killed nothing
        assert s["crashes"] == ["signal SIGSEGV"]


def test_threads_with_short_deadlines_ride_out_one_crash(art, monkeypatch, no_leaked_children):
    """The hunter's 4-thread run: the worker is killed once under load, a restart takes > 1 s, every
    thread keeps calling with a deadline far shorter than that; one crash, one restart, results after."""
    deadline_ms = 300
    bound = deadline_ms / 1000 * 1.1 + SLACK_S
    with er.load(art, device="fake", isolate=True) as rt:
        _slow_restarts(monkeypatch, rt, 1.5)
        seen: list[tuple[str, float, float]] = []
        stop = threading.Event()

        def caller():
            while not stop.is_set():
                out, took = _call(rt, "good", deadline_ms)
                seen.append((out, took, time.monotonic()))

        threads = [threading.Thread(target=caller, daemon=True) for _ in range(4)]
        for th in threads:
            th.start()
        time.sleep(0.3)
        pid = _pid(rt)
        os.kill(pid, signal.SIGKILL)
        t_kill = time.monotonic()
        time.sleep(4.0)
        stop.set()
        for th in threads:
            th.join(10)
        assert not any(th.is_alive() for th in threads)
        after = [(o, t) for o, t, at in seen if at > t_kill]
        codes = [o for o, _ in after]
        s = rt.info()["sessions"][0]
        runs = [[codes[0], 0]] if codes else []          # the outcomes in order, as runs: the failure's story
        for o in codes:
            if o == runs[-1][0]:
                runs[-1][1] += 1
            else:
                runs.append([o, 1])
        story = f"{runs[:12]}, restarts {s['restarts']}, crashes {s['crashes']}"
        assert codes.count("backend_crashed") == 1, story
        assert set(codes) <= {"ok", "backend_crashed", "inference_timeout"}, story
        assert "inference_timeout" in codes and codes[-1] == "ok", story    # waited on the restart, then served
        slow = [round(t * 1000) for o, t in after if t > bound]
        assert not slow, f"calls over deadline + 10%: {slow}; {story}"
        assert s["restarts"] == 1 and len(s["crashes"]) == 1, story


def test_a_deadline_kills_only_the_worker_running_that_call(art, no_leaked_children):
    """A call waiting while another runs times out at its own deadline and leaves the running call's
    worker alone: the running call gets its result, nothing restarts."""
    deadline_ms = 100
    with er.load(art, device="fake", isolate=True, warmup=False, device_options={"stall_ms": 800}) as rt:
        pid, box = _pid(rt), {}
        long_call = threading.Thread(target=lambda: box.update(r=_call(rt, "good", 20_000)), daemon=True)
        long_call.start()
        time.sleep(0.2)                         # the long call now owns the worker
        out, took = _call(rt, "good", deadline_ms)
        assert out == "inference_timeout" and took < deadline_ms / 1000 * 1.1 + SLACK_S, (out, took)
        long_call.join(10)
        assert box["r"][0] == "ok", box
        s = rt.info()["sessions"][0]
        assert s["restarts"] == 0 and s["worker_pid"] == pid, s


# -- close() and restart storms -----------------------------------------------------------------------

def test_close_during_a_restart_stops_it_at_once_and_leaves_no_child(art, tmp_path, monkeypatch,
                                                                    no_leaked_children):
    rt = er.load(art, device="fake", isolate=True, warmup=False, device_options={"segfault_after": 0})
    try:
        _slow_python(tmp_path, monkeypatch, 5.0)      # the next worker takes > 5 s to load
        assert _call(rt, "good", 20_000)[0] == "backend_crashed"
        time.sleep(0.3)                                   # the restart is under way: its child is loading
    finally:
        t0 = time.perf_counter()
        rt.close()
        took = time.perf_counter() - t0
    assert took < 2.0, f"close() waited {took:.1f} s for a restart"
    names = _worker(rt)._names if rt._sessions else []
    for a, b in names:
        assert not Path("/dev/shm", a).exists() and not Path("/dev/shm", b).exists()


def test_a_worker_that_crashes_on_every_call_restarts_with_a_back_off(art, no_leaked_children):
    """A crash loop neither restarts the worker as fast as calls come nor makes every call wait for a
    load: while the restart waits out its back-off, calls fail at once with a typed crash."""
    with er.load(art, device="fake", isolate=True, warmup=False, device_options={"segfault_after": 0}) as rt:
        seen, t_end = [], time.monotonic() + 4
        while time.monotonic() < t_end:
            seen.append(_call(rt, "good", 5_000))
            time.sleep(0.01)
        codes = {o for o, _ in seen}
        assert codes == {"backend_crashed"}, codes
        fast = [t for _, t in seen if t < 0.05]
        restarts = rt.info()["sessions"][0]["restarts"]
        assert len(fast) >= 10, f"every call waited for a new worker ({len(seen)} calls, {restarts} restarts)"
        assert restarts <= 8, restarts         # 0, 0.1, 0.2 ... 3.2 s between them: at most 7 in 4 s
        t0 = time.perf_counter()
    assert time.perf_counter() - t0 < 2.0


def test_a_restart_that_fails_is_reported_then_retried_until_one_loads(art, monkeypatch, no_leaked_children):
    with er.load(art, device="fake", isolate=True, warmup=False) as rt:
        cls = type(_worker(rt))
        start, tries = cls._start, []

        def flaky_start(self, *a, **kw):       # the next two loads fail (a device gone for a moment)
            tries.append(time.monotonic())
            if len(tries) <= 2:
                raise er.DeviceError("injected: the device is gone", code="device_load_failed")
            return start(self, *a, **kw)

        monkeypatch.setattr(cls, "_start", flaky_start)
        pid = _pid(rt)
        os.kill(pid, signal.SIGKILL)
        _wait_dead(pid)
        seen, t_end = [], time.monotonic() + 10
        while not (seen and seen[-1][0] == "ok") and time.monotonic() < t_end:
            seen.append(_call(rt, "good", 5_000))
            time.sleep(0.02)
        codes = [o for o, _ in seen]
        assert codes[0] == "backend_crashed" and codes[-1] == "ok", codes
        assert set(codes) <= {"backend_crashed", "inference_failed", "ok"}, codes
        assert len(tries) == 3 and tries[2] - tries[1] >= 0.09, tries     # the retry waited out a back-off
        assert all(t < 5.0 for _, t in seen)
        s = rt.info()["sessions"][0]
        assert s["restarts"] == 1 and s["crashes"] == ["signal SIGKILL"], s
        assert rt.infer("good").prediction


_FORK = """
import os, signal, sys, time
import edge_runtime as er
rt = er.load(sys.argv[1], device="fake", isolate=True, warmup=False)
rt.infer("good")
child = os.fork()
if child == 0:
    sys.exit(0)         # a normal exit: the child's atexit handlers run (weakref.finalize among them)
os.waitpid(child, 0)
pid = rt.info()["sessions"][0]["worker_pid"]
os.kill(pid, signal.SIGKILL)
os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
for _ in range(3):
    try:
        rt.infer("good", deadline_ms=20_000)
        print("ok", flush=True)
    except er.EdgeRuntimeError as e:
        print(e.code, e.message, flush=True)
rt.close()
"""


def test_a_forked_child_that_exits_leaves_the_parents_worker_able_to_restart(art):
    """A child forked from the host that exits normally runs the host's exit handlers: they must not
    unlink the parent's shared memory (its next worker could not open it: no restart ever again)."""
    out = subprocess.run([sys.executable, "-c", _FORK, str(art)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("backend_crashed") and lines[1:] == ["ok", "ok"], out.stdout


# -- the hunter's scenario on a real backend --------------------------------------------------------

def test_onnxruntime_serves_again_after_a_kill_with_a_200ms_deadline(digits_artifact, no_leaked_children):
    pytest.importorskip("onnxruntime")
    x = sorted((ZOO / "digits-cnn" / "held_out").glob("*/*.png"))[0].read_bytes()
    with er.load(digits_artifact, device="onnxruntime", isolate=True) as rt:
        assert rt.infer(x, deadline_ms=200).prediction is not None
        pid = _pid(rt)
        os.kill(pid, signal.SIGKILL)
        _wait_dead(pid)
        seen, t_end = [], time.monotonic() + 4
        while time.monotonic() < t_end:
            seen.append(_call(rt, x, 200))
        codes = [o for o, _ in seen]
        assert codes[0] == "backend_crashed" and codes.count("backend_crashed") == 1, codes[:10]
        assert codes.count("ok") >= 10 and codes[-1] == "ok", codes[:10]
        worst = max(t for _, t in seen[1:])
        assert worst < 0.2 * 1.1 + SLACK_S, worst
        assert rt.info()["sessions"][0]["restarts"] == 1
