"""Deadlines without a thread hop: one watchdog thread cancels late calls.

Sessions whose capabilities say ``inline`` and ``cancellable`` (ONNX Runtime
through ``RunOptions.terminate``, OpenVINO through ``InferRequest.cancel()``,
the isolated worker) run in the caller's thread; the watchdog fires the call's
cancel hook when its deadline passes. An inline session that cannot cancel
(LiteRT) needs no watchdog: its deadline is checked when it returns. Handing
every call to a worker thread instead costs two thread wake-ups (~150 µs on
this machine, 3% of a 5 ms MiniLM call). Sessions that cannot cancel still
go through the runtime's worker pool, which returns at the deadline.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import threading
import time


class CancelToken:
    """Fired at the call's deadline; ``deadline`` is that moment on the ``time.perf_counter`` clock
    (None: no deadline), for a session that hands it on (the isolated worker refuses a call already
    past it)."""
    __slots__ = ("fired", "_hooks", "deadline")

    def __init__(self, deadline: float | None = None):
        self.fired = False
        self._hooks: list = []
        self.deadline = deadline

    def on_cancel(self, fn) -> None:
        self._hooks.append(fn)
        if self.fired:      # the deadline passed before the session hooked in: cancel now (the hook
            try:            # was never run, and ONNX Runtime ran the call to its end past the deadline)
                fn()
            except Exception:
                pass

    def fire(self) -> None:
        self.fired = True
        for fn in self._hooks:
            try:
                fn()
            except Exception:  # a failing hook must not kill the watchdog
                pass


class Watchdog:
    """A heap of [deadline, seq, token, active] entries. A finished call disarms its
    entry: the token (and the cancel hooks holding the backend's run options) is
    dropped at once, and the heap is compacted when most of it is disarmed, so
    memory tracks the calls in flight, not the calls of the last deadline period."""

    COMPACT_AT = 1024
    MAX_WAIT_S = 3600.0     # one wait's bound: a far deadline (deadline_ms=1e15, inf) is a wake-up an hour,
    # never a timeout Condition.wait cannot take (over threading.TIMEOUT_MAX: OverflowError killed the thread)

    def __init__(self):
        self._seq = itertools.count()
        self._fresh()

    def _fresh(self) -> None:
        """The state of a watchdog with no thread yet: at creation, and in a forked child, which has
        none of the parent's threads (a ``_thread`` left set there meant no deadline ever fired)
        and may hold the lock as another of the parent's threads held it at the fork."""
        self._lock = threading.Lock()           # arm/disarm take it directly (a C call, not the
        self._cv = threading.Condition(self._lock)  # Condition's Python-level __enter__/__exit__)
        self._heap: list = []       # a child drops the parent's entries: their calls are not in it
        self._wake_at = math.inf    # when the thread wakes by itself (inf: it waits for a notify)
        self._dead = 0          # disarmed entries still in the heap
        self._thread: threading.Thread | None = None

    def arm(self, t_end: float) -> tuple[CancelToken, list]:
        token = CancelToken(t_end)
        entry = [t_end, next(self._seq), token, True]     # [deadline, seq, token, active]
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="edge-infer-watchdog", daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, entry)
            if t_end < self._wake_at:
                self._wake_at = t_end       # one notify, however many calls arrive before it runs
                self._cv.notify()
        return token, entry

    def disarm(self, entry: list) -> None:
        with self._lock:
            if not entry[3]:
                return              # fired (and popped) already
            entry[3], entry[2] = False, None
            self._dead += 1
            if self._dead >= self.COMPACT_AT and self._dead * 2 > len(self._heap):
                self._heap = [e for e in self._heap if e[3]]
                heapq.heapify(self._heap)
                self._dead = 0

    def pending(self) -> int:
        """Entries held (armed or disarmed but not yet dropped): bounded by the calls in flight."""
        with self._cv:
            return len(self._heap)

    def _loop(self) -> None:
        with self._cv:
            while True:
                while self._heap and not self._heap[0][3]:
                    heapq.heappop(self._heap)
                    self._dead -= 1
                if not self._heap:
                    self._wake_at = math.inf
                    self._cv.wait()
                    continue
                wait = self._heap[0][0] - time.perf_counter()
                if wait > 0:
                    self._wake_at = self._heap[0][0]
                    self._cv.wait(min(wait, self.MAX_WAIT_S))
                    continue
                entry = heapq.heappop(self._heap)
                token, entry[3], entry[2] = entry[2], False, None
                # the hooks (a backend's cancel) run without the lock: a slow one must not hold up
                # arm()/disarm(), i.e. every other call of the process
                self._cv.release()
                try:
                    token.fire()
                finally:
                    self._cv.acquire()


WATCHDOG = Watchdog()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=WATCHDOG._fresh)      # the child's first armed call starts its thread
