"""The progress line of ``edge-infer score`` and ``shadow`` (stderr): a bar or a parseable line."""

from __future__ import annotations

import time


class Progress:
    """A bar with rate and ETA on a terminal; a parseable line every few seconds otherwise."""

    def __init__(self, total: int | None, stream, enabled: bool = True, every_s: float = 5.0):
        self.total, self.stream, self.enabled = total, stream, enabled
        self.tty = enabled and hasattr(stream, "isatty") and stream.isatty()
        self.every_s = 0.2 if self.tty else every_s
        self.t0 = time.perf_counter()
        self.last = 0.0

    def update(self, done: int, scored: int, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not final and now - self.last < self.every_s:
            return
        self.last = now
        elapsed = max(now - self.t0, 1e-9)
        rate = scored / elapsed
        eta = (self.total - done) / rate if self.total and rate > 0 else None
        if self.tty:
            frac = min(done / self.total, 1.0) if self.total else 0.0
            bar = "#" * int(frac * 30)
            self.stream.write(f"\r[{bar:<30}] {done}/{self.total or '?'} {rate:7.1f}/s ETA "
                              f"{'-' if eta is None else f'{eta:5.0f}s'}" + ("\n" if final else ""))
        else:
            self.stream.write(f"progress done={done} total={self.total if self.total is not None else '-'} "
                              f"rate={rate:.1f}/s eta_s={'-' if eta is None else round(eta, 1)}\n")
        self.stream.flush()
