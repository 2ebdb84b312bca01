"""Crash isolation: the backend's sessions live in a child process.

``er.load(..., isolate=True)`` starts one worker process (a fresh interpreter:
no forked native state) that loads every bucket on the chosen backend. Tensors
cross through shared memory: static shapes mean each bucket's inputs and
outputs have fixed sizes, so one input block and one output block per bucket
are allocated once and reused; the pipe carries only "run bucket k" and
"done". Calls are serialised (one request in flight per worker).

- A native crash (SIGSEGV, abort) in the backend kills only the worker: the
  call in flight gets an ``InferenceRuntimeError`` naming the signal, a new
  worker is started in the background, later calls are served by it. A worker
  that died while idle (the OOM killer, ``kill -9``) is found by the next call:
  the same crash for that call, the same restart.
- A deadline is hard: when it passes the worker running that call is killed and
  restarted (``InferenceTimeout``), so a stalled native call never holds the
  host. A call that waits for the worker (another call runs, a restart loads)
  waits at most until its deadline, then times out and leaves the worker alone.
  A call carries its absolute deadline to the worker, which refuses to start
  one already past it, or one with less time left than the bucket's recent
  runs took (``isolate_pace``): a timeout, the worker lives on. At a deadline
  the host kills the worker only when the worker marked that call started.
- Restarts run one at a time; deaths in a row with no answer between them back
  off (0.1 s doubling to 5 s). ``close()`` stops a restart under way.
- The worker exits with ``os._exit``: native teardown crashes (LiteRT on
  some models) never reach the host either.

The modules: ``isolate_worker`` (the child's side), ``isolate_process`` (the
host's processes and shared memory), ``isolate_pace`` (the run-time
prediction), this one (the calls).
"""

from __future__ import annotations

import math
import subprocess
import threading
import time
from multiprocessing.connection import Connection

from edge_runtime.devices.base import Capabilities, DeviceSession, SessionCrashed

from . import error_codes as ec
from .errors import InferenceTimeout
from .isolate_pace import Pace
from .isolate_process import WorkerProcesses, _kill, _reap, _signal_name, stderr_of
from .isolate_worker import CTL_CANCELLED, CTL_STARTED, _child_entry, _layout, _views, _worker_main

__all__ = ["IsolatedSession", "IsolatedWorker", "WorkerDied", "_child_entry", "_layout", "_reap", "_signal_name",
           "_views", "_worker_main"]

_WAIT_POLL_S = 0.05         # a call waiting for the worker re-checks this often (its deadline wakes it sooner)
_POLL_S = 0.002             # a call on the worker checks its deadline this often
# at a deadline, a call the worker has not started waits this long for the worker to refuse it (it answers
# in well under a millisecond); a worker that says nothing by then (stopped, starved) is killed as before
_VERDICT_GRACE_S = 0.02


class WorkerDied(SessionCrashed):
    """The worker process died during a call (the runtime reports ``backend_crashed``)."""


def _deadline_of(cancel) -> float | None:
    """The call's absolute deadline on the ``time.perf_counter`` clock (``CancelToken.deadline``,
    set by the watchdog when it arms the call), or None (no deadline)."""
    t_end = getattr(cancel, "deadline", None)
    return None if t_end is None or math.isinf(t_end) else float(t_end)


def _past(cancel, t_end: float | None) -> bool:
    """The call's deadline passed: its token fired, or the clock says so (on a busy host the watchdog's
    thread may fire the token late; ``run`` fires it then, so the runtime types the failure a timeout)."""
    return cancel is not None and (cancel.fired or (t_end is not None and time.perf_counter() >= t_end))


class IsolatedWorker(WorkerProcesses):
    """One worker process serving every bucket, one call at a time.

    Who may touch the worker: a call owns it from ``_acquire`` until its ``finally`` (``_busy``); the
    restart thread owns the starting one (``_starting``). A call waits for either without holding a
    lock across the wait, and its deadline bounds the wait (the cancel token wakes it): a call whose
    deadline passes while it waits gets a timeout and leaves the worker alone. A call sent to the worker
    carries its deadline; the worker refuses one already past it. Only the call a worker has started
    can kill it at its deadline.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pace = [Pace() for _ in self.buckets]     # kept across restarts

    def _acquire(self, cancel, t_end: float | None) -> tuple[subprocess.Popen, Connection]:
        """Own the worker: wait while another call runs or a restart is under way, for as long as the
        call's deadline allows (its token wakes the wait). Raises without touching the worker. Calls
        take it in the order they came (a call that just finished queues behind those waiting: under
        the GIL it would otherwise take it back before a woken waiter runs, and starve it)."""
        me, queued = object(), False
        with self._cv:
            seen_failures = self._failed_starts
            try:
                while True:
                    if self._closed:
                        raise RuntimeError("session is closed")
                    if _past(cancel, t_end):
                        state = "restarting" if self.proc is None else "busy"
                        raise TimeoutError(f"deadline passed while the call waited for the {self.backend_name} "
                                           f"worker ({state}); no worker was stopped")
                    if self.proc is not None and not self._busy and (not self._queue or self._queue[0] is me):
                        assert self.conn is not None
                        self._busy = True
                        if queued:
                            self._queue.popleft()
                            queued = False
                        return self.proc, self.conn
                    if self.proc is None and self._starting is None:
                        if self._failed_starts != seen_failures:
                            raise RuntimeError(f"the {self.backend_name} worker could not be restarted: "
                                               f"{self._start_error}")
                        self._restart_later()     # none under way (a failed one, a death just seen): start one
                    wait = self._backoff_until - time.monotonic()
                    if self.proc is None and wait > 0:      # a sick worker: no call waits out its back-off
                        raise self._backing_off(wait)
                    if not queued:
                        self._queue.append(me)
                        queued = True
                    left = _WAIT_POLL_S if t_end is None else t_end - time.perf_counter()
                    self._cv.wait(min(_WAIT_POLL_S, max(left, 0.0005)))
            finally:
                if queued:                  # left without the worker: the next in line may take it
                    self._queue.remove(me)
                    self._cv.notify_all()

    def _backing_off(self, wait: float) -> Exception:
        """What a call gets while the restart waits out its back-off (called with ``_cv`` held)."""
        if self._last_start_failed:
            return RuntimeError(f"the {self.backend_name} worker could not be restarted ({self._start_error}); "
                                f"the next try is in {wait:.1f} s")
        return WorkerDied(f"the {self.backend_name} worker is restarting after {self._strikes} deaths in a row "
                          f"with no answer between (the last: {self._last_death}); the next one starts in "
                          f"{wait:.1f} s")

    def run(self, idx: int, feeds, cancel=None) -> dict:
        hook = getattr(cancel, "on_cancel", None)
        if hook is not None:
            hook(self._wake)
        try:
            return self._call(idx, feeds, cancel, _deadline_of(cancel))
        except TimeoutError:
            if cancel is not None and not cancel.fired:
                cancel.fire()       # the clock saw the deadline before the watchdog did: a timeout all the same
            raise

    def _call(self, idx: int, feeds, cancel, t_end: float | None) -> dict:
        proc, conn = self._acquire(cancel, t_end)
        ins, outs = self._views[idx]
        lost = None         # why the worker is gone, when it is
        answered = False
        owed = False        # the worker owes this call an answer not read yet (it may hold it, or be running it)
        try:
            for name, view in ins.items():
                view[...] = feeds[name]
            if _past(cancel, t_end):
                raise TimeoutError("deadline passed before the call reached the worker; the worker was left running")
            self._seq += 1
            seq, pace = self._seq, self._pace[idx]
            owed = True
            try:
                conn.send(("run", idx, seq, t_end, pace.predict()))
            except (OSError, ValueError):   # died while idle (the OOM killer, a kill -9): the crash path below
                lost = "idle"
            msg = None
            if lost is None:
                msg, lost = self._answer(proc, conn, seq, cancel, t_end)
                owed = False
                if lost == "deadline" or (msg is not None and msg[0] != "late"):
                    pace.started()
            if lost is None:
                assert msg is not None
                if msg[0] == "late":
                    if len(msg) == 3:       # the prediction: it could not have finished in time
                        raise TimeoutError(f"the worker did not start the call: {msg[1] * 1000:.1f} ms were left "
                                           f"and its recent runs took {msg[2] * 1000:.1f} ms (median); the worker "
                                           "was left running")
                    raise TimeoutError("deadline passed before the worker started the call; the worker was "
                                       "left running")
                answered = True
                if msg[0] == "err":
                    raise RuntimeError(f"{msg[1]}: {msg[2]}")
                pace.ran(msg[1])
                # copies (the next call overwrites the block); an output that is not its block's dtype and shape
                # came in the answer (None: the session returned none), for the runtime's output contract to judge
                sent = msg[2] if len(msg) > 2 else {}
                out = {}
                for name, view in outs.items():
                    arr = sent[name] if name in sent else view.copy()
                    if arr is not None:
                        out[name] = arr
                return out
            if lost == "deadline":
                # SIGKILL now, the wait on a thread: the kernel freeing a loaded model's memory (15-30 ms for
                # YOLOX-Nano on ONNX Runtime) was the caller's wait, past its deadline (20 ms answered at 37-55)
                _kill(proc)
                threading.Thread(target=self._reap, args=(proc, conn), name="edge-infer-reap", daemon=True).start()
                raise TimeoutError("deadline passed: the worker was stopped and is restarting")
            self._reap(proc, conn)
            why = _signal_name(proc.returncode)
            if self._closed:
                raise RuntimeError("session is closed")
            when = "while idle, before" if lost == "idle" else "while"
            raise WorkerDied(f"the {self.backend_name} worker process died ({why}) {when} running bucket "
                             f"{self.buckets[idx][1]['name']}; a new worker is starting{stderr_of(proc)}")
        finally:
            if owed and lost is None:
                # left before the worker's answer (an exception out of the wait: KeyboardInterrupt): that answer
                # would be read as the next call's, with its outputs. The worker is stopped instead
                lost = "abandoned"
                self._reap(proc, conn)
            with self._cv:
                self._busy = False
                if lost is not None:
                    if self.proc is proc:
                        self.proc = self.conn = None
                    why = _signal_name(proc.returncode)
                    if lost not in ("deadline", "abandoned") and not self._closed:
                        self.crashes.append(why)
                    self._last_death = {"deadline": "stopped at its call's deadline",
                                        "abandoned": "stopped: its call left before the answer"}.get(lost, why)
                    self._last_start_failed = False
                    self._strikes += 1
                    self._restart_later()
                    self._cv.notify_all()
                else:
                    if answered:
                        self._strikes = 0
                    if self._queue:
                        self._cv.notify_all()       # the first in line takes it (the others wait on)

    def _answer(self, proc: subprocess.Popen, conn: Connection, seq: int, cancel,
                t_end: float | None) -> tuple[tuple | None, str | None]:
        """The worker's answer to call ``seq``: ``(message, None)``, or ``(None, why the worker is lost)``:
        ``"run"`` (it died), ``"deadline"`` (the call it started outran its deadline: kill it).

        At the deadline a call the worker has not started (``CTL_STARTED``) is marked cancelled and the
        worker's verdict awaited: ``("late",)`` (it refused the call: the worker lives), or the call marked
        started after all (it is running past its deadline), or nothing within ``_VERDICT_GRACE_S``."""
        ctl = self._ctl
        grace_end: float | None = None
        while True:
            try:
                if conn.poll(_POLL_S if grace_end is None else _POLL_S / 4):
                    return conn.recv(), None
            except (EOFError, OSError):
                return None, "run"
            if proc.poll() is not None and not conn.poll(0):
                return None, "run"
            if grace_end is None:
                if not _past(cancel, t_end):
                    continue
                if ctl[CTL_STARTED] != seq:         # not started: the worker refuses it when it reads it
                    ctl[CTL_CANCELLED] = seq
                    grace_end = time.perf_counter() + _VERDICT_GRACE_S
                    continue
            elif ctl[CTL_STARTED] != seq and time.perf_counter() <= grace_end:
                continue
            if not conn.poll(0):        # (an answer that came meanwhile is a late one: the worker is fine)
                return None, "deadline"

    def _wake(self) -> None:
        """The cancel hook (the watchdog's thread): a call waiting in ``_acquire`` re-checks its token."""
        with self._cv:
            self._cv.notify_all()

    def sessions(self) -> list["IsolatedSession"]:
        return [IsolatedSession(self, i) for i in range(len(self.buckets))]


class IsolatedSession(DeviceSession):
    """One bucket, served by the shared worker (the ``Session`` protocol)."""

    capabilities = Capabilities(inline=True, cancellable=True)   # the deadline kills the worker: a hard deadline

    def __init__(self, worker: IsolatedWorker, idx: int):
        super().__init__(worker.buckets[idx][1], worker.devices[idx])
        self._worker, self._idx = worker, idx
        self.fallback = worker.fallbacks[idx]

    def _run(self, feeds, cancel):
        try:
            return self._worker.run(self._idx, feeds, cancel)
        except TimeoutError as exc:     # typed here, with its reason (a call refused early says why)
            raise InferenceTimeout(f"{self.device}: {exc}", code=ec.INFERENCE_TIMEOUT, device=self.device) from None

    def info(self) -> dict:
        w = self._worker
        return {**(w.infos[self._idx] or {}), "isolated": True, "worker_pid": w.pid, "restarts": w.restarts,
                "crashes": list(w.crashes)}

    def _release(self) -> None:
        self._worker.close()
