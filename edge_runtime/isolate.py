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
- Restarts run one at a time; deaths in a row with no answer between them back
  off (0.1 s doubling to 5 s). ``close()`` stops a restart under way.
- The worker exits with ``os._exit``: native teardown crashes (LiteRT on
  some models) never reach the host either.
"""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from multiprocessing import resource_tracker, shared_memory
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from edge_runtime.devices.base import Capabilities, DeviceSession, SessionCrashed

from . import error_codes as ec
from .errors import DeviceError

_READY_TIMEOUT_S = 300.0
_WAIT_POLL_S = 0.05         # a call waiting for the worker re-checks this often (its deadline wakes it sooner)
_BACKOFF_S, _BACKOFF_MAX_S = 0.1, 5.0   # the delay before the 2nd, 3rd... restart in a row without an answer
_CLOSE_WAIT_S = 30.0        # close(): how long the call in flight (and a restart) may take to end
# A load that fails in the worker comes back as the exception's class name, message and code (classes do
# not cross the pipe). The classes whose code the host keeps, by the name the worker sends: a backend's
# own DeviceError says what is missing; anything else is the load failing (``device_load_failed``).
_KEEPS_CODE: dict[str, type] = {cls.__name__: cls for cls in (DeviceError,)}


def _layout(specs: list[dict]) -> tuple[list[tuple[str, np.dtype, tuple, int]], int]:
    out, offset = [], 0
    for t in specs:
        dtype = np.dtype(t["dtype"])
        shape = tuple(int(d) for d in t["shape"])
        offset = (offset + 63) // 64 * 64
        out.append((t["name"], dtype, shape, offset))
        offset += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return out, max(offset, 1)


def _views(buf, layout) -> dict[str, np.ndarray]:
    return {name: np.ndarray(shape, dtype=dtype, buffer=buf, offset=off) for name, dtype, shape, off in layout}


def _signal_name(code: int | None) -> str:
    if code is None:
        return "unknown"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _child_entry() -> None:
    """The worker's ``__main__``: a fresh interpreter (no fork of the host's native
    state, no re-import of the host's main module), talking over the inherited socket."""
    conn = Connection(int(sys.argv[1]))
    _worker_main(conn, *conn.recv())


def _worker_main(conn, backend_name, buckets, sub, options, provenance, shm_names):   # runs in the child
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        from edge_runtime.devices import registry

        blocks, views = [], []
        for (in_name, out_name), (_, bucket) in zip(shm_names, buckets):
            pair = []
            for name in (in_name, out_name):
                shm = shared_memory.SharedMemory(name=name)
                try:                               # the parent owns (and unlinks) the blocks
                    # the tracker's key is the private ``_name`` (with the leading "/"), not ``name``
                    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
                except Exception:  # noqa: BLE001
                    pass
                blocks.append(shm)
                pair.append(shm)
            views.append((_views(pair[0].buf, _layout(bucket["inputs"])[0]),
                          _views(pair[1].buf, _layout(bucket["outputs"])[0])))
        backend = registry.get_backend(backend_name)
        extra = {"provenance": dict(provenance)} if provenance else {}
        sessions = [backend.load(Path(path), bucket, sub, dict(options), **extra) for path, bucket in buckets]
        conn.send(("ready", [s.device for s in sessions], [s.info() for s in sessions],
                   [s.fallback for s in sessions]))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, typed there
        conn.send(("error", type(exc).__name__, str(exc), getattr(exc, "code", None)))
        os._exit(1)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg[0] != "run":
            break
        idx = msg[1]
        try:
            ins, outs = views[idx]
            result = sessions[idx].run(dict(ins))
            for name, view in outs.items():
                arr = np.asarray(result[name])
                if arr.shape != view.shape or arr.dtype != view.dtype:
                    raise ValueError(f"output {name!r} is {arr.dtype}{list(arr.shape)}, the manifest says "
                                     f"{view.dtype}{list(view.shape)}")
                view[...] = arr
            conn.send(("ok",))
        except Exception as exc:  # noqa: BLE001
            conn.send(("err", type(exc).__name__, str(exc)))
    os._exit(0)     # no native teardown in the child: its crashes must not matter


class WorkerDied(SessionCrashed):
    """The worker process died during a call (the runtime reports ``backend_crashed``)."""


class IsolatedWorker:
    """One worker process serving every bucket, one call at a time.

    Who may touch the worker: a call owns it from ``_acquire`` until its ``finally`` (``_busy``); the
    restart thread owns the starting one (``_starting``). A call waits for either without holding a
    lock across the wait, and its deadline bounds the wait (the cancel token wakes it): a call whose
    deadline passes while it waits gets a timeout and leaves the worker alone. Only the call a worker
    is running can kill it at its deadline.
    """

    def __init__(self, backend_name: str, buckets: list[tuple[str, dict]], sub: str | None, options: dict,
                 provenance: dict | None = None):
        self.backend_name, self.buckets, self.sub, self.options = backend_name, buckets, sub, dict(options)
        self.provenance = dict(provenance or {})
        self._cv = threading.Condition(threading.Lock())   # guards the fields below; never held across a pipe call
        self._blocks, self._views, names = [], [], []
        for _, bucket in buckets:
            in_layout, in_size = _layout(bucket["inputs"])
            out_layout, out_size = _layout(bucket["outputs"])
            shm_in = shared_memory.SharedMemory(create=True, size=in_size)
            shm_out = shared_memory.SharedMemory(create=True, size=out_size)
            self._blocks += [shm_in, shm_out]
            self._views.append((_views(shm_in.buf, in_layout), _views(shm_out.buf, out_layout)))
            names.append((shm_in.name, shm_out.name))
        self._names = names
        self._children: set[subprocess.Popen] = set()     # every worker not yet reaped, the loading one too
        # at exit or collection without close(): the blocks are unlinked and no worker outlives the host
        # (in this process only: a forked child that exits must not take its parent's blocks or workers)
        self._finalizer = weakref.finalize(self, IsolatedWorker._release, self._blocks, self._children, os.getpid())
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.restarts = 0
        self.crashes: list[str] = []
        self._closed = False
        self._busy = False                                  # a call owns the worker
        self._queue: collections.deque[object] = collections.deque()     # the calls waiting for it, in order
        self._starting: threading.Thread | None = None      # the restart in progress
        self._starting_proc: subprocess.Popen | None = None  # its child, for close() to stop
        self._failed_starts = 0         # restarts that failed, ever: a waiter sees the one it waited for fail
        self._start_error = ""
        self._strikes = 0               # worker deaths and failed starts since a call was last answered
        self._last_death = ""           # the latest one, in words
        self._last_start_failed = False     # ... and whether it was a restart that failed
        self._backoff_until = 0.0       # while a restart waits out its back-off: when it starts loading
        proc, conn, msg = self._start()
        self.proc, self.conn = proc, conn
        self.devices, self.infos, self.fallbacks = msg[1], msg[2], msg[3]

    # -- process lifecycle -------------------------------------------------
    def _start(self) -> tuple[subprocess.Popen, Connection, tuple]:
        """A new worker, loaded: ``(process, connection, its "ready" message)``. Runs without ``_cv``."""
        ours, theirs = socket.socketpair()
        code = "from edge_runtime.isolate import _child_entry; _child_entry()"
        proc = subprocess.Popen([sys.executable, "-c", code, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                stdin=subprocess.DEVNULL, close_fds=True)
        theirs.close()
        parent = Connection(ours.detach())
        with self._cv:
            self._starting_proc = proc
            self._children.add(proc)
        try:
            parent.send((self.backend_name, self.buckets, self.sub, self.options, self.provenance, self._names))
            t_end = time.monotonic() + _READY_TIMEOUT_S
            while not parent.poll(0.05):
                if self._closed:
                    raise RuntimeError(f"the isolated {self.backend_name} worker was closed while it loaded")
                if proc.poll() is not None and not parent.poll(0):
                    raise EOFError
                if time.monotonic() > t_end:
                    raise DeviceError(f"the isolated {self.backend_name} worker did not load within "
                                      f"{_READY_TIMEOUT_S:.0f} s", code=ec.DEVICE_WORKER_TIMEOUT)
            msg = parent.recv()
        except (EOFError, OSError):
            self._reap(proc, parent)
            raise DeviceError(f"the isolated {self.backend_name} worker died while loading "
                              f"({_signal_name(proc.returncode)})", code=ec.DEVICE_WORKER_DIED) from None
        except BaseException:
            self._reap(proc, parent)
            raise
        finally:
            with self._cv:
                self._starting_proc = None
        if msg[0] == "error":
            self._reap(proc, parent)
            raise DeviceError(f"{self.backend_name} could not load in its worker: {msg[1]}: {msg[2]}",
                              code=msg[3] if msg[1] in _KEEPS_CODE and msg[3] else ec.DEVICE_LOAD_FAILED)
        return proc, parent, msg

    def _restart_later(self) -> None:
        """Start a new worker in the background (called with ``_cv`` held). One restart at a time; after
        the first death in a row each waits longer (0.1 s doubling to 5 s), so a model that crashes or
        outruns its deadline on every call restarts at most once per 5 s."""
        if self._starting is not None or self._closed or self.proc is not None:
            return
        delay = 0.0 if self._strikes <= 1 else min(_BACKOFF_S * 2 ** (self._strikes - 2), _BACKOFF_MAX_S)
        self._backoff_until = time.monotonic() + delay if delay > 0 else 0.0
        thread = threading.Thread(target=self._restart, args=(delay,), name="edge-runtime-restart", daemon=True)
        self._starting = thread
        thread.start()

    def _restart(self, delay: float) -> None:
        with self._cv:
            if delay > 0:
                self._cv.wait_for(lambda: self._closed, delay)
            self._backoff_until = 0.0
            if self._closed:
                self._starting = None
                self._cv.notify_all()
                return
        try:
            proc, conn, _ = self._start()
        except Exception as exc:  # noqa: BLE001 - the calls waiting for it report it; the next call retries
            with self._cv:
                self._starting = None
                self._failed_starts += 1
                self._strikes += 1
                self._start_error = self._last_death = f"{type(exc).__name__}: {exc}"
                self._last_start_failed = True
                self._cv.notify_all()
            return
        if not self._adopt(proc, conn):
            self._reap(proc, conn)      # closed while it loaded: close() joins this thread, so nothing outlives it

    def _adopt(self, proc: subprocess.Popen, conn: Connection) -> bool:
        """The restarted worker serves from now on; False when the session closed while it loaded."""
        with self._cv:
            self._starting = None
            self._cv.notify_all()
            if self._closed:
                return False
            self.proc, self.conn = proc, conn
            self.restarts += 1
            return True

    # -- calls ---------------------------------------------------------------
    def _acquire(self, cancel) -> tuple[subprocess.Popen, Connection]:
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
                    if cancel is not None and cancel.fired:
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
                    self._cv.wait(_WAIT_POLL_S)
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
        proc, conn = self._acquire(cancel)
        ins, outs = self._views[idx]
        lost = None         # why the worker is gone, when it is
        answered = False
        try:
            for name, view in ins.items():
                view[...] = feeds[name]
            if cancel is not None and cancel.fired:
                raise TimeoutError("deadline passed before the call reached the worker; the worker was left running")
            try:
                conn.send(("run", idx))
            except (OSError, ValueError):   # died while idle (the OOM killer, a kill -9): the crash path below
                lost = "idle"
            msg = None
            while lost is None:
                if cancel is not None and cancel.fired:
                    lost = "deadline"               # this call's own deadline: its worker is stopped
                    break
                try:
                    if conn.poll(0.002):
                        msg = conn.recv()
                        break
                except (EOFError, OSError):
                    lost = "run"
                    break
                if proc.poll() is not None and not conn.poll(0):
                    lost = "run"
            if lost is None:
                answered = True
                assert msg is not None
                if msg[0] == "err":
                    raise RuntimeError(f"{msg[1]}: {msg[2]}")
                return {name: view.copy() for name, view in outs.items()}
            self._reap(proc, conn)
            why = _signal_name(proc.returncode)
            if lost == "deadline":
                raise TimeoutError("deadline passed: the worker was stopped and is restarting")
            if self._closed:
                raise RuntimeError("session is closed")
            when = "while idle, before" if lost == "idle" else "while"
            raise WorkerDied(f"the {self.backend_name} worker process died ({why}) {when} running bucket "
                             f"{self.buckets[idx][1]['name']}; a new worker is starting")
        finally:
            with self._cv:
                self._busy = False
                if lost is not None:
                    if self.proc is proc:
                        self.proc = self.conn = None
                    why = _signal_name(proc.returncode)
                    if lost != "deadline" and not self._closed:
                        self.crashes.append(why)
                    self._last_death = "stopped at its call's deadline" if lost == "deadline" else why
                    self._last_start_failed = False
                    self._strikes += 1
                    self._restart_later()
                    self._cv.notify_all()
                else:
                    if answered:
                        self._strikes = 0
                    if self._queue:
                        self._cv.notify_all()       # the first in line takes it (the others wait on)

    def _wake(self) -> None:
        """The cancel hook (the watchdog's thread): a call waiting in ``_acquire`` re-checks its token."""
        with self._cv:
            self._cv.notify_all()

    def sessions(self) -> list["IsolatedSession"]:
        return [IsolatedSession(self, i) for i in range(len(self.buckets))]

    @property
    def pid(self):
        proc = self.proc
        return proc.pid if proc is not None else None

    def close(self) -> None:
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
            restarting, starting_proc = self._starting, self._starting_proc
            if starting_proc is not None and starting_proc.poll() is None:
                starting_proc.kill()              # a restart under way stops now, not after its load
            # the call in flight ends by its own deadline; past this bound its worker is stopped under it
            self._cv.wait_for(lambda: not self._busy, _CLOSE_WAIT_S)
            proc, conn = self.proc, self.conn
            self.proc = self.conn = None
        if restarting is not None:
            restarting.join(_CLOSE_WAIT_S)
        if conn is not None:
            try:
                conn.send(("close",))
            except (OSError, ValueError):
                pass
        if proc is not None:
            try:
                proc.wait(2)
            except subprocess.TimeoutExpired:
                pass
            self._reap(proc, conn)
        self._finalizer()

    def _reap(self, proc: subprocess.Popen, conn: Connection | None) -> None:
        _reap(proc, conn)
        with self._cv:
            self._children.discard(proc)

    @staticmethod
    def _release(blocks, children=(), owner: int | None = None):
        if owner is not None and owner != os.getpid():
            return
        for proc in list(children):
            if proc.poll() is None:
                try:
                    proc.kill()
                    proc.wait(5)
                except (OSError, subprocess.TimeoutExpired):
                    pass
        for shm in blocks:
            try:
                shm.close()
                shm.unlink()
            except (FileNotFoundError, BufferError, OSError):
                pass


def _reap(proc: subprocess.Popen, conn: Connection | None) -> None:
    """Kill ``proc`` if it still runs, wait for it (no zombie) and close its connection."""
    if proc.poll() is None:
        try:
            proc.kill()
        except OSError:
            pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
    if conn is not None:
        try:
            conn.close()
        except OSError:
            pass


class IsolatedSession(DeviceSession):
    """One bucket, served by the shared worker (the ``Session`` protocol)."""

    capabilities = Capabilities(inline=True, cancellable=True)   # the deadline kills the worker: a hard deadline

    def __init__(self, worker: IsolatedWorker, idx: int):
        super().__init__(worker.buckets[idx][1], worker.devices[idx])
        self._worker, self._idx = worker, idx
        self.fallback = worker.fallbacks[idx]

    def _run(self, feeds, cancel):
        return self._worker.run(self._idx, feeds, cancel)

    def info(self) -> dict:
        w = self._worker
        return {**(w.infos[self._idx] or {}), "isolated": True, "worker_pid": w.pid, "restarts": w.restarts,
                "crashes": list(w.crashes)}

    def _release(self) -> None:
        self._worker.close()
