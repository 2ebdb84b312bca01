"""Which models ``edge-infer serve`` runs on the event loop itself (``serve_core``).

A call handed to the thread pool costs two thread switches and a future
(about 0.1-0.2 ms on a 2-core box), more than a sub-millisecond model's whole
call. A model whose measured call takes at most ``INLINE_MAX_MS`` per item
therefore runs on the loop thread, with the runtime's own limits, deadline and
watchdog; any other model, and any request whose items would take longer,
goes to the pool, and so does a request holding an item larger than
``INLINE_MAX_ITEM_BYTES`` and four times the timed sample (its raw size as the
task counts it): the time was measured on the sample, and decoding scales with
the input (a 6000x6000 JPEG sent to digits held the loop 211 ms before the
stall rule moved the model off it, with every other model's requests waiting).

A stall sends the model to the pool, logged and shown in ``/metrics``: one
inline call over ``INLINE_STALL_MS``, or ``INLINE_SLOW_CALLS`` calls over
``INLINE_DEMOTE_MS`` within its last ``INLINE_WINDOW`` inline calls. A one-off
pause is not a stall, nor are a few spread over hours of traffic, nor a call
during which the kernel preempted the loop's thread while the call itself used
little CPU (``machine_paused``: the machine was busy, and the pool would not
have run the call any sooner; a CPU-bound slow call, or a wait on a device,
still counts). A demoted model comes back to the loop
after ``PROMOTE_CALLS`` pool calls in a row none of which was slow (twice as
many after each further demotion); its ``MAX_DEMOTIONS``-th demotion is for
good. The loop is thus blocked by a stalling model at most ``MAX_DEMOTIONS``
times, each for at most that call's deadline (the runtime's watchdog), while a
busy minute on the machine no longer costs a fast model the loop for the rest
of the process's life.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from typing import Any, Callable

log = logging.getLogger("edge_runtime.serve")

INLINE_MAX_MS = 1.0      # a request whose items take at most this (measured) runs on the loop
INLINE_DEMOTE_MS = 5.0   # a call slower than this is slow (per item on the pool)
INLINE_SLOW_CALLS = 3    # this many slow inline calls ...
INLINE_WINDOW = 1000     # ... within this many inline calls move the model to the pool
INLINE_STALL_MS = 50.0   # one inline call slower than this moves its model to the pool at once
PROMOTE_CALLS = 1000     # pool calls in a row, none slow, that bring a demoted model back (x2 per demotion)
MAX_DEMOTIONS = 3        # the one that stays: the model keeps the pool for good
INLINE_MAX_ITEM_BYTES = 8192   # an item larger than this, and than 4x the timed sample, goes to the pool
_SAMPLES = 7


def _thread_usage_fn() -> Callable[[], Any]:
    try:
        import resource

        who = resource.RUSAGE_THREAD            # Linux: this thread's counters
        resource.getrusage(who)
    except (ImportError, AttributeError, OSError, ValueError):  # elsewhere: no preemption is ever seen
        return lambda: None
    return lambda: resource.getrusage(who)


thread_usage = _thread_usage_fn()
"""The calling thread's ``getrusage(RUSAGE_THREAD)`` (0.5 µs), or None where the platform has no
per-thread counters. Read before each inline call, for ``machine_paused``."""


def machine_paused(before) -> bool:
    """Whether a slow call since ``before`` (``thread_usage()``) was the machine's doing: the kernel
    preempted the thread (its involuntary context switches went up) and the call itself used at most
    ``INLINE_DEMOTE_MS`` of CPU. A CPU-bound slow call, or one that waited on a device or a lock
    (voluntary switches), is the model's."""
    after = thread_usage()
    if before is None or after is None or after.ru_nivcsw == before.ru_nivcsw:
        return False
    cpu_ms = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000
    return cpu_ms <= INLINE_DEMOTE_MS


def measure_call_ms(rt) -> float | None:
    """The median time of ``rt.infer`` on the task's warm-up sample (the whole path: decode, pre,
    device, post), or None when the task has no sample. One untimed call first: the load's warm-up
    ran the device, not the task's decoders, and that first call's one-off costs must not decide
    (one cold call over 1 ms sent digits to the pool on a loaded CI box). Timing stops after two
    calls when both are over ``INLINE_MAX_MS``: a slow model is not timed seven times. The calls
    are not traffic: the runtime's metrics are reset after them."""
    sample = rt.task.warmup_sample()
    if sample is None:
        return None
    times: list[float] = []
    try:
        rt.infer(sample)
        for _ in range(_SAMPLES):
            t = time.perf_counter()
            rt.infer(sample)
            times.append((time.perf_counter() - t) * 1000)
            if len(times) == 2 and min(times) > INLINE_MAX_MS:
                break
    except Exception as exc:  # a sample the task cannot take: the model runs on the pool
        log.warning("serve: timing %s on its warm-up sample failed (%s); it runs on the thread pool",
                    rt.artifact.name, exc)
        return None
    finally:
        rt.reset_metrics()
    return statistics.median(times)


class Inline:
    """One model's inline state: its measured call time, whether it is inline now, and its
    demotions (``observe`` sees each inline call, ``observe_pooled`` a demoted model's pool calls)."""

    __slots__ = ("call_ms", "max_item_bytes", "on", "calls", "slow", "demoted", "demotions", "promotions", "streak",
                 "_recent")

    def __init__(self, call_ms: float | None, sample_bytes: int = 0):
        self.call_ms = call_ms
        self.max_item_bytes = max(INLINE_MAX_ITEM_BYTES, 4 * sample_bytes)
        self.on = call_ms is not None and call_ms <= INLINE_MAX_MS
        self.calls = 0
        self.slow = 0                 # inline calls over INLINE_DEMOTE_MS, all told
        self.demoted: str | None = None     # why it left the loop, while it is off it
        self.demotions = 0
        self.promotions = 0
        self.streak = 0               # pool calls in a row, none slow, since the last demotion
        self._recent: deque[int] = deque(maxlen=INLINE_SLOW_CALLS)    # call numbers of the latest slow calls

    def admits(self, items: int, largest_bytes: int = 0) -> bool:
        """Whether ``items`` inputs, the largest ``largest_bytes`` (the task's ``request_bytes``), run inline."""
        return self.on and self.call_ms is not None and items * self.call_ms <= INLINE_MAX_MS and \
            largest_bytes <= self.max_item_bytes

    def observe(self, ms: float, name: str, paused: bool = False) -> None:
        """An inline call took ``ms``; ``paused``: the machine's doing, not the model's (``machine_paused``)."""
        self.calls += 1
        if ms <= INLINE_DEMOTE_MS or not self.on or (paused and ms <= INLINE_STALL_MS):
            return
        self.slow += 1
        self._recent.append(self.calls)
        clustered = len(self._recent) == INLINE_SLOW_CALLS and self.calls - self._recent[0] < INLINE_WINDOW
        if ms > INLINE_STALL_MS or clustered:
            self._demote(f"an inline call took {ms:.1f} ms" + (f" (> {INLINE_STALL_MS:g} ms)" if ms > INLINE_STALL_MS
                         else f", the last of {INLINE_SLOW_CALLS} over {INLINE_DEMOTE_MS:g} ms within "
                              f"{self.calls - self._recent[0] + 1} inline calls"), name)

    def _demote(self, why: str, name: str) -> None:
        self.on = False
        self.demotions += 1
        self.streak = 0
        self._recent.clear()
        self.demoted = why
        after = ("for good" if self.demotions >= MAX_DEMOTIONS else
                 f"until {self.promote_after()} calls in a row there are none over {INLINE_DEMOTE_MS:g} ms")
        log.warning("serve: model %s leaves the event loop for the thread pool (%s): %s", name, after, why)

    def promote_after(self) -> int:
        """Pool calls in a row, none slow, that bring the model back to the loop now."""
        return PROMOTE_CALLS * 2 ** max(0, self.demotions - 1)

    def observe_pooled(self, ms_per_item: float, name: str) -> None:
        """A pool call of a model that left the loop (its wall time per item): enough fast ones
        in a row bring it back, one slow one starts the count again."""
        if self.on or self.demotions == 0 or self.demotions >= MAX_DEMOTIONS:
            return
        if ms_per_item > INLINE_DEMOTE_MS:
            self.streak = 0
            return
        self.streak += 1
        if self.streak >= self.promote_after():
            log.warning("serve: model %s is back on the event loop: %d pool calls in a row, none over %g ms "
                        "(demotion %d of %d)", name, self.streak, INLINE_DEMOTE_MS, self.demotions, MAX_DEMOTIONS)
            self.on, self.streak, self.demoted = True, 0, None
            self.promotions += 1
