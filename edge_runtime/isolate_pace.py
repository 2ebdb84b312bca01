"""The isolated worker's pace: a prediction of whether a call can finish before its deadline.

Under ``isolate=True`` a call that runs past its deadline costs a worker kill and a restart (a
fresh interpreter loading the model: hundreds of ms, during which the calls waiting for the worker
time out). A call that gets the worker with less time left than the model needs would most likely
cost that, so the worker does not start it: the host sends each call with the bucket's predicted run
time, and the worker refuses a call whose time left is shorter (a typed timeout, answered at once;
the worker lives on).

The prediction is the median of the bucket's last ``KEEP`` runs, timed in the worker around the
session's run: a call refused by it had less time left than half the recent runs took. It needs
``MIN_RUNS`` timed runs (a bucket's first run in each worker is warm-up and not one), survives
restarts (the host keeps it), and when no call has started for ``PROBE_AFTER_S`` one runs
unpredicted, so a model that became faster is seen to.
"""

from __future__ import annotations

import collections
import time


class Pace:
    """One bucket's recent run times (seconds)."""

    KEEP, MIN_RUNS, PROBE_AFTER_S = 8, 1, 1.0

    def __init__(self) -> None:
        self._runs: collections.deque[float] = collections.deque(maxlen=self.KEEP)
        self._last_start = 0.0

    def predict(self) -> float | None:
        """The run time a call must have left to be started, or None: no prediction (too few runs, or
        a probe after ``PROBE_AFTER_S`` without a start)."""
        if len(self._runs) < self.MIN_RUNS or time.perf_counter() - self._last_start > self.PROBE_AFTER_S:
            return None
        return sorted(self._runs)[len(self._runs) // 2]

    def started(self) -> None:
        """The worker started a call of this bucket (it answered, or was killed running it)."""
        self._last_start = time.perf_counter()

    def ran(self, seconds: float | None) -> None:
        if seconds is not None:
            self._runs.append(seconds)
