"""Which models ``edge-infer serve`` runs on the event loop itself (``serve_core``).

A call handed to the thread pool costs two thread switches and a future
(about 0.1-0.2 ms on a 2-core box), more than a sub-millisecond model's whole
call. A model whose measured call takes at most ``INLINE_MAX_MS`` per item
therefore runs on the loop thread, with the runtime's own limits, deadline and
watchdog; any other model, and any request whose items would take longer,
goes to the pool. A stall sends the model to the pool for good, logged and
shown in ``/metrics``: one inline call over ``INLINE_STALL_MS``, or the
``INLINE_SLOW_CALLS``-th over ``INLINE_DEMOTE_MS`` (a one-off pause, the
collector's or the machine's, is not a stall). The loop is thus blocked by a
stalled model once, for at most that call's deadline (the runtime's watchdog).
"""

from __future__ import annotations

import logging
import statistics
import time

log = logging.getLogger("edge_runtime.serve")

INLINE_MAX_MS = 1.0      # a request whose items take at most this (measured) runs on the loop
INLINE_DEMOTE_MS = 5.0   # the INLINE_SLOW_CALLS-th inline call slower than this moves its model to the pool
INLINE_SLOW_CALLS = 3
INLINE_STALL_MS = 50.0   # one inline call slower than this moves its model to the pool at once
_SAMPLES = 7


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
    """One model's inline state: its measured call time and whether it is still inline."""

    __slots__ = ("call_ms", "on", "calls", "slow", "demoted")

    def __init__(self, call_ms: float | None):
        self.call_ms = call_ms
        self.on = call_ms is not None and call_ms <= INLINE_MAX_MS
        self.calls = 0
        self.slow = 0                 # inline calls over INLINE_DEMOTE_MS
        self.demoted: str | None = None

    def admits(self, items: int) -> bool:
        return self.on and self.call_ms is not None and items * self.call_ms <= INLINE_MAX_MS

    def observe(self, ms: float, name: str) -> None:
        self.calls += 1
        if ms <= INLINE_DEMOTE_MS or not self.on:
            return
        self.slow += 1
        if ms > INLINE_STALL_MS or self.slow >= INLINE_SLOW_CALLS:
            self.on = False
            self.demoted = (f"an inline call took {ms:.1f} ms" + (f" (> {INLINE_STALL_MS:g} ms)" if ms > INLINE_STALL_MS
                            else f", the {self.slow}th over {INLINE_DEMOTE_MS:g} ms"))
            log.warning("serve: model %s leaves the event loop for the thread pool: %s", name, self.demoted)
