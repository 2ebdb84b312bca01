"""Crash isolation: the backend's sessions live in a child process.

``er.load(..., isolate=True)`` starts one worker process (a fresh interpreter:
no forked native state) that loads every bucket on the chosen backend. Tensors
cross through shared memory: static shapes mean each bucket's inputs and
outputs have fixed sizes, so one input block and one output block per bucket
are allocated once and reused; the pipe carries only "run bucket k" and
"done". Calls are serialised (one request in flight per worker).

- A native crash (SIGSEGV, abort) in the backend kills only the worker: the
  call in flight gets an ``InferenceRuntimeError`` naming the signal, a new
  worker is started in the background, later calls are served by it.
- A deadline is hard: when it passes the worker is killed and restarted
  (``InferenceTimeout``), so a stalled native call never holds the host.
- The worker exits with ``os._exit``: native teardown crashes (LiteRT on
  some models) never reach the host either.
"""

from __future__ import annotations

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
    def __init__(self, backend_name: str, buckets: list[tuple[str, dict]], sub: str | None, options: dict,
                 provenance: dict | None = None):
        self.backend_name, self.buckets, self.sub, self.options = backend_name, buckets, sub, dict(options)
        self.provenance = dict(provenance or {})
        self._lock = threading.Lock()
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
        self._finalizer = weakref.finalize(self, IsolatedWorker._release, self._blocks)
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.restarts = 0
        self.crashes: list[str] = []
        self._closed = False
        self.devices, self.infos, self.fallbacks = self._start()

    # -- process lifecycle -------------------------------------------------
    def _start(self):
        ours, theirs = socket.socketpair()
        code = "from edge_runtime.isolate import _child_entry; _child_entry()"
        proc = subprocess.Popen([sys.executable, "-c", code, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                stdin=subprocess.DEVNULL, close_fds=True)
        theirs.close()
        parent = Connection(ours.detach())
        try:
            parent.send((self.backend_name, self.buckets, self.sub, self.options, self.provenance, self._names))
            t_end = time.monotonic() + _READY_TIMEOUT_S
            while not parent.poll(0.05):
                if proc.poll() is not None and not parent.poll(0):
                    raise EOFError
                if time.monotonic() > t_end:
                    raise DeviceError(f"the isolated {self.backend_name} worker did not load within "
                                      f"{_READY_TIMEOUT_S:.0f} s", code=ec.DEVICE_WORKER_TIMEOUT)
            msg = parent.recv()
        except (EOFError, OSError):
            proc.kill()
            proc.wait(5)
            parent.close()
            raise DeviceError(f"the isolated {self.backend_name} worker died while loading "
                              f"({_signal_name(proc.returncode)})", code=ec.DEVICE_WORKER_DIED) from None
        except BaseException:
            proc.kill()
            proc.wait(5)
            parent.close()
            raise
        if msg[0] == "error":
            proc.wait(5)
            parent.close()
            raise DeviceError(f"{self.backend_name} could not load in its worker: {msg[1]}: {msg[2]}",
                              code=msg[3] if msg[1] in _KEEPS_CODE and msg[3] else ec.DEVICE_LOAD_FAILED)
        self.proc, self.conn = proc, parent
        return msg[1], msg[2], msg[3]

    def _kill(self):
        proc, conn = self.proc, self.conn
        self.proc = self.conn = None
        if proc is not None and proc.poll() is None:
            proc.kill()
        if proc is not None:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if conn is not None:
            conn.close()
        return proc

    def _restart_later(self):
        def restart():
            with self._lock:
                if self.proc is None and not self._closed:
                    try:
                        self._start()
                        self.restarts += 1
                    except Exception:  # noqa: BLE001 - the next call retries and reports it
                        pass

        threading.Thread(target=restart, name="edge-runtime-restart", daemon=True).start()

    # -- calls ---------------------------------------------------------------
    def run(self, idx: int, feeds, cancel=None) -> dict:
        with self._lock:
            if self._closed:
                raise RuntimeError("session is closed")
            if self.proc is None:             # a restart that failed or has not happened: start now
                self._start()
                self.restarts += 1
            proc, conn = self.proc, self.conn
            assert proc is not None and conn is not None     # _start() set both or raised
            ins, outs = self._views[idx]
            for name, view in ins.items():
                view[...] = feeds[name]
            conn.send(("run", idx))
            while True:
                if cancel is not None and cancel.fired:
                    self._kill()
                    self._restart_later()
                    raise TimeoutError("deadline passed: the worker was stopped and is restarting")
                try:
                    if conn.poll(0.002):
                        msg = conn.recv()
                        break
                except (EOFError, OSError):
                    msg = None
                    break
                if proc.poll() is not None and not conn.poll(0):
                    msg = None
                    break
            if msg is None:
                killed = self._kill()
                why = _signal_name(killed.returncode if killed is not None else None)
                self.crashes.append(why)
                self._restart_later()
                raise WorkerDied(f"the {self.backend_name} worker process died ({why}) while running bucket "
                                 f"{self.buckets[idx][1]['name']}; a new worker is starting")
            if msg[0] == "err":
                raise RuntimeError(f"{msg[1]}: {msg[2]}")
            return {name: view.copy() for name, view in outs.items()}

    def sessions(self) -> list["IsolatedSession"]:
        return [IsolatedSession(self, i) for i in range(len(self.buckets))]

    @property
    def pid(self):
        return self.proc.pid if self.proc is not None else None

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self.conn is not None:
                try:
                    self.conn.send(("close",))
                except (OSError, ValueError):
                    pass
            if self.proc is not None:
                try:
                    self.proc.wait(2)
                except subprocess.TimeoutExpired:
                    pass
            self._kill()
        self._finalizer()

    @staticmethod
    def _release(blocks):
        for shm in blocks:
            try:
                shm.close()
                shm.unlink()
            except (FileNotFoundError, BufferError, OSError):
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
