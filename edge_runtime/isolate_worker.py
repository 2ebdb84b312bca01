"""The isolated worker's own side (``isolate=True``): what runs in the child process.

The host (``edge_runtime.isolate``) starts ``_child_entry`` in a fresh interpreter and sends it the
backend, the buckets and the names of the shared-memory blocks: one input and one output block per
bucket, and one control block of two int64 slots shared by the host and its worker:

- ``CTL_STARTED``: the sequence number of the call the worker has started (written just before the
  session runs it). The host reads it at a call's deadline: only a call that started is running
  past its deadline, and only then is the worker killed.
- ``CTL_CANCELLED``: the sequence number of a call whose deadline the host saw pass before the
  worker started it. The worker refuses that call.

A call arrives as ``("run", bucket, seq, deadline, needs)``: ``deadline`` is absolute on the
``time.perf_counter`` clock (CLOCK_MONOTONIC, one clock for every process of the machine) or
``None``; ``needs`` is the host's prediction of the run's seconds (``isolate_pace``), or ``None``.
The worker refuses a call already past its deadline, or cancelled, with ``("late",)``, one with
less time left than ``needs`` with ``("late", seconds left, needs)``, and stays ready for
the next one; otherwise it marks the call started and answers ``("ok", run seconds)`` (``None`` for
a bucket's first run in this worker: warm-up) or ``("err", class name, message)`` after the run.
Outputs are written to the output block; one that is not the block's dtype and shape (a float for a
quantized output, float16 for float32: the output contract accepts some) or missing comes in the answer
instead, ``("ok", run seconds, {name: array or None})``, so the host sees what an in-process session
returns. Every call gets exactly one answer while the worker lives: a host call that leaves without
reading its answer stops the worker (``edge_runtime.isolate``), never leaving it for the next call.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from multiprocessing import resource_tracker, shared_memory
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

CTL_STARTED, CTL_CANCELLED = 0, 1
CTL_SIZE = 16                   # two int64 slots


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


def ctl_view(buf) -> np.ndarray:
    """The control block's two slots (``CTL_STARTED``, ``CTL_CANCELLED``): aligned int64 stores, whole
    on every platform the runtime supports."""
    return np.ndarray((2,), dtype=np.int64, buffer=buf)


def _attach(name: str) -> shared_memory.SharedMemory:
    """A block the parent created: attached, and off this process's resource tracker (the parent owns
    and unlinks it)."""
    shm = shared_memory.SharedMemory(name=name)
    try:        # the tracker's key is the private ``_name`` (with the leading "/"), not ``name``
        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        pass
    return shm


def _child_entry() -> None:
    """The worker's ``__main__``: a fresh interpreter (no fork of the host's native
    state, no re-import of the host's main module), talking over the inherited socket."""
    conn = Connection(int(sys.argv[1]))
    _worker_main(conn, *conn.recv())


def _worker_main(conn, backend_name, buckets, sub, options, provenance, shm_names, ctl_name):   # runs in the child
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        from edge_runtime.devices import registry

        blocks, views = [], []
        for (in_name, out_name), (_, bucket) in zip(shm_names, buckets):
            shm_in, shm_out = _attach(in_name), _attach(out_name)
            blocks += [shm_in, shm_out]
            views.append((_views(shm_in.buf, _layout(bucket["inputs"])[0]),
                          _views(shm_out.buf, _layout(bucket["outputs"])[0])))
        ctl_block = _attach(ctl_name)
        blocks.append(ctl_block)
        ctl = ctl_view(ctl_block.buf)
        backend = registry.get_backend(backend_name)
        extra = {"provenance": dict(provenance)} if provenance else {}
        sessions = [backend.load(Path(path), bucket, sub, dict(options), **extra) for path, bucket in buckets]
        warm: set[int] = set()
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
        _, idx, seq, deadline, needs = msg
        # a call that never starts leaves the worker alive: its deadline passed on the way (the host's
        # queue, the pipe, this process's turn on a busy CPU), the host saw it pass, or the time left is
        # shorter than the bucket's recent runs took (the host's prediction: it would be killed)
        left = math.inf if deadline is None else deadline - time.perf_counter()
        if ctl[CTL_CANCELLED] == seq or left <= 0:
            conn.send(("late",))
            continue
        if needs is not None and left < needs:
            conn.send(("late", left, needs))
            continue
        ctl[CTL_STARTED] = seq
        try:
            ins, outs = views[idx]
            t0 = time.perf_counter()
            result = sessions[idx].run(dict(ins))
            took = time.perf_counter() - t0 if idx in warm else None     # a bucket's first run here: warm-up
            warm.add(idx)
            other: dict = {}        # what does not fit its block goes in the answer, judged by the host as in-process
            for name, view in outs.items():
                if name not in result:
                    other[name] = None
                    continue
                arr = np.asarray(result[name])
                if arr.shape != view.shape or arr.dtype != view.dtype:
                    other[name] = arr
                else:
                    view[...] = arr
            conn.send(("ok", took, other) if other else ("ok", took))
        except Exception as exc:  # noqa: BLE001
            conn.send(("err", type(exc).__name__, str(exc)))
    os._exit(0)     # no native teardown in the child: its crashes must not matter
