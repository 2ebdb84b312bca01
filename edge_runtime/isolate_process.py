"""The isolated worker's processes, host side (``isolate=True``): shared memory, start, restart, close.

``WorkerProcesses`` owns the shared-memory blocks and every worker process: the first one (started
by the constructor), the restarts (one at a time, in a background thread, with a back-off after
deaths in a row), ``close()`` and the reaping. The calls themselves (who owns the worker, the
deadline) are ``edge_runtime.isolate.IsolatedWorker``, built on this class.
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
from multiprocessing import shared_memory
from multiprocessing.connection import Connection

import numpy as np

from . import error_codes as ec
from .errors import ArtifactError, DeviceError, InputError
from .isolate_worker import CTL_SIZE, _layout, _views, ctl_view

_READY_TIMEOUT_S = 300.0
_BACKOFF_S, _BACKOFF_MAX_S = 0.1, 5.0   # the delay before the 2nd, 3rd... restart in a row without an answer
_CLOSE_WAIT_S = 30.0        # close(): how long the call in flight (and a restart) may take to end
# A load that fails in the worker comes back as the exception's class name, message and code (classes do
# not cross the pipe). The classes the host raises again, with their code, by the name the worker sends: a
# backend's own DeviceError says what is missing, its ArtifactError (a model file the backend refuses) and
# InputError (options that disagree) are what they are in-process (not a device failure that load() would
# fall back from); anything else is the load failing (``device_load_failed``).
_KEEPS_CODE: dict[str, type] = {cls.__name__: cls for cls in (DeviceError, ArtifactError, InputError)}
_CHILD_CODE = "from edge_runtime.isolate_worker import _child_entry; _child_entry()"


class _StderrTail:
    """A worker's stderr: passed on to the host's as it comes, its last bytes kept for the errors that
    report the worker's death (a native abort's message: "free(): double free detected")."""

    KEEP = 4096

    def __init__(self, pipe) -> None:
        self._buf = bytearray()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, args=(pipe,), name="edge-runtime-worker-stderr",
                                         daemon=True)
        self._thread.start()

    def _pump(self, pipe) -> None:
        try:
            fd = pipe.fileno()
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                with self._lock:
                    self._buf += chunk
                    del self._buf[:-self.KEEP]
                try:
                    while chunk:
                        chunk = chunk[os.write(2, chunk):]
                except OSError:
                    pass
        except (OSError, ValueError):
            pass
        finally:
            pipe.close()

    def wait(self, wait_s: float = 0.5) -> None:
        """Until the worker's stderr closed and all of it was passed on (at most ``wait_s``)."""
        self._thread.join(wait_s)

    def text(self, wait_s: float = 0.5) -> str:
        """The last lines written (up to ~500 characters), once the worker's stderr closed (or ``wait_s``)."""
        self.wait(wait_s)
        with self._lock:
            lines = [ln.strip() for ln in bytes(self._buf).decode("utf-8", "replace").splitlines() if ln.strip()]
        out: list[str] = []
        for ln in reversed(lines):
            if out and sum(map(len, out)) + len(ln) > 500:
                break
            out.insert(0, ln[-500:])
        return " | ".join(out)


_TAILS: "weakref.WeakKeyDictionary[subprocess.Popen, _StderrTail]" = weakref.WeakKeyDictionary()


def stderr_of(proc: subprocess.Popen) -> str:
    """``"; its stderr ended: ..."`` with a dead worker's last stderr lines, or ``""`` when it wrote none."""
    tail = _TAILS.get(proc)
    text = tail.text() if tail is not None else ""
    return f"; its stderr ended: {text}" if text else ""


def _signal_name(code: int | None) -> str:
    if code is None:
        return "unknown"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class WorkerProcesses:
    """The worker processes of one isolated runtime and the shared memory they use.

    Who may touch the worker: a call owns it while ``_busy`` (``IsolatedWorker``); the restart thread
    owns the starting one (``_starting``). ``_cv`` guards the fields below and is never held across a
    pipe call."""

    def __init__(self, backend_name: str, buckets: list[tuple[str, dict]], sub: str | None, options: dict,
                 provenance: dict | None = None):
        self.backend_name, self.buckets, self.sub, self.options = backend_name, buckets, sub, dict(options)
        self.provenance = dict(provenance or {})
        self._cv = threading.Condition(threading.Lock())
        self._blocks: list[shared_memory.SharedMemory] = []
        self._views: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = []
        names = []
        for _, bucket in buckets:
            in_layout, in_size = _layout(bucket["inputs"])
            out_layout, out_size = _layout(bucket["outputs"])
            shm_in = shared_memory.SharedMemory(create=True, size=in_size)
            shm_out = shared_memory.SharedMemory(create=True, size=out_size)
            self._blocks += [shm_in, shm_out]
            self._views.append((_views(shm_in.buf, in_layout), _views(shm_out.buf, out_layout)))
            names.append((shm_in.name, shm_out.name))
        self._names = names
        ctl = shared_memory.SharedMemory(create=True, size=CTL_SIZE)    # which call started, which is cancelled
        self._blocks.append(ctl)
        self._ctl_name = ctl.name
        self._ctl = ctl_view(ctl.buf)
        self._ctl[:] = 0
        self._seq = 0                   # the last call sent to a worker (numbers never repeat, across restarts too)
        self._children: set[subprocess.Popen] = set()     # every worker not yet reaped, the loading one too
        # at exit or collection without close(): the blocks are unlinked and no worker outlives the host
        # (in this process only: a forked child that exits must not take its parent's blocks or workers)
        self._finalizer = weakref.finalize(self, WorkerProcesses._release, self._blocks, self._children, os.getpid())
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
        try:
            proc, conn, msg = self._start()
        except BaseException:
            self._finalizer()       # now, not when the error (its traceback holds this object) is dropped
            raise
        self.proc, self.conn = proc, conn
        self.devices, self.infos, self.fallbacks = msg[1], msg[2], msg[3]

    def _start(self) -> tuple[subprocess.Popen, Connection, tuple]:
        """A new worker, loaded: ``(process, connection, its "ready" message)``. Runs without ``_cv``."""
        ours, theirs = socket.socketpair()
        proc = subprocess.Popen([sys.executable, "-c", _CHILD_CODE, str(theirs.fileno())],
                                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                close_fds=True)
        theirs.close()
        _TAILS[proc] = _StderrTail(proc.stderr)
        parent = Connection(ours.detach())
        with self._cv:
            self._starting_proc = proc
            self._children.add(proc)
        try:
            parent.send((self.backend_name, self.buckets, self.sub, self.options, self.provenance, self._names,
                         self._ctl_name))
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
                              f"({_signal_name(proc.returncode)}){stderr_of(proc)}",
                              code=ec.DEVICE_WORKER_DIED) from None
        except BaseException:
            self._reap(proc, parent)
            raise
        finally:
            with self._cv:
                self._starting_proc = None
        if msg[0] == "error":
            self._reap(proc, parent)
            cls = _KEEPS_CODE.get(msg[1]) if msg[3] else None
            raise (cls or DeviceError)(f"{self.backend_name} could not load in its worker: {msg[1]}: {msg[2]}",
                                       code=msg[3] if cls else ec.DEVICE_LOAD_FAILED)
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
            in_flight = not self._cv.wait_for(lambda: not self._busy, _CLOSE_WAIT_S)
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
                proc.wait(0 if in_flight else 2)    # one still running its call cannot read "close"
            except subprocess.TimeoutExpired:
                pass
            self._reap(proc, conn)
            tail = _TAILS.get(proc)
            if tail is not None:
                tail.wait(0.5)      # what it wrote last reaches the host's stderr before close() returns
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
        # unlinked (gone from /dev/shm), never unmapped here: a call still in flight past close()'s bound (or
        # a daemon thread's at exit) may yet read its views, and a view of an unmapped block is a segfault of
        # the host. The mapping goes with the last reference to the blocks and their views.
        for shm in blocks:
            try:
                shm.unlink()
            except (FileNotFoundError, OSError):
                pass


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` if it still runs (no wait)."""
    if proc.poll() is None:
        try:
            proc.kill()
        except OSError:
            pass


def _reap(proc: subprocess.Popen, conn: Connection | None) -> None:
    """Kill ``proc`` if it still runs, wait for it (no zombie) and close its connection."""
    _kill(proc)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
    if conn is not None:
        try:
            conn.close()
        except OSError:
            pass
