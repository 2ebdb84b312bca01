"""A runtime belongs to the process that loaded it: the at-fork hook that refuses, in a forked
child, every runtime loaded before the fork (``runtime_closed`` naming both pids), and never tears
their native sessions down there."""

from __future__ import annotations

import os
import threading
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .runtime_call import CallPath

# -- fork: a runtime belongs to the process that loaded it ------------------------------------------
# The backends' native thread pools (OpenVINO's streams, ONNX Runtime's and LiteRT's threads), the
# watchdog's thread and the isolated worker's pipe do not carry over into a forked child: OpenVINO's
# infer_batch blocked there for ever, ONNX Runtime documents sessions as not fork-safe. The child's
# copy of every live runtime is marked closed by the at-fork hook (the call path's existing closed
# check refuses it, ``runtime_closed`` naming both pids: no per-call cost), and its sessions are
# never torn down in the child, not even at its exit (the parent owns their threads: a forked child
# that dropped an OpenVINO runtime at exit never exited; ONNX Runtime's own fix for that, #31961,
# abandons the inherited state too). ``close()`` there is a no-op.
_LIVE: "weakref.WeakSet[CallPath]" = weakref.WeakSet()
_INHERITED: list = []       # in a forked child: the parent's sessions, never torn down here


def track(rt: CallPath) -> None:
    """Called by ``Runtime`` once loaded: the runtime is refused in a child forked after this."""
    rt._loaded_pid = os.getpid()
    _LIVE.add(rt)


def _after_fork_in_child() -> None:
    child = os.getpid()
    for rt in list(_LIVE):
        rt._lock = threading.Lock()     # another thread may have held it at the fork
        if hasattr(rt._metrics, "_lock"):   # a refusal is counted: a lock held at the fork must not block it
            rt._metrics._lock = threading.Lock()
        if rt._forked is not None:      # a grandchild: the runtime was loaded further up
            rt._forked = (rt._forked[0], child)
        elif not rt._closed:            # (one the parent closed stays "runtime is closed")
            rt._forked = (rt._loaded_pid, child)
            rt._closed = True
            _abandon(list(getattr(rt, "_sessions", ())))


def _abandon(sessions: list) -> None:
    """Keep ``sessions`` alive for the rest of this (forked) process, interpreter teardown included:
    a reference the interpreter never drops, so no native destructor runs here."""
    if not sessions:
        return
    import ctypes

    _INHERITED.append(sessions)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(sessions))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
