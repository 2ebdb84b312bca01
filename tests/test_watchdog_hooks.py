"""The watchdog fires a call's cancel hooks without holding its lock: a slow hook (a backend whose
cancel blocks for a while) must not hold up arm()/disarm(), which every other call of the process
takes, nor the next deadline."""

from __future__ import annotations

import threading
import time

from edge_runtime.watchdog import Watchdog


def test_a_slow_cancel_hook_does_not_block_other_calls():
    wd = Watchdog()
    in_hook = threading.Event()

    def slow_hook():
        in_hook.set()
        time.sleep(0.5)

    token, _ = wd.arm(time.perf_counter() + 0.01)
    token.on_cancel(slow_hook)
    assert in_hook.wait(2), "the deadline did not fire"
    t = time.perf_counter()
    other, entry = wd.arm(time.perf_counter() + 10)       # another call starting while the hook runs
    wd.disarm(entry)
    took = time.perf_counter() - t
    assert took < 0.2, f"arm/disarm waited {took:.3f} s for another call's cancel hook"
    assert token.fired and not other.fired


def test_deadlines_still_fire_in_order_and_once():
    wd = Watchdog()
    fired: list[int] = []
    now = time.perf_counter()
    tokens = []
    for i, dt in enumerate((0.03, 0.01, 0.02)):
        tok, _ = wd.arm(now + dt)
        tok.on_cancel(lambda i=i: fired.append(i))
        tokens.append(tok)
    _, kept = wd.arm(now + 0.015)
    wd.disarm(kept)                                        # a finished call: never fired
    deadline = time.perf_counter() + 2
    while len(fired) < 3 and time.perf_counter() < deadline:
        time.sleep(0.005)
    time.sleep(0.05)
    assert fired == [1, 2, 0] and all(t.fired for t in tokens)
