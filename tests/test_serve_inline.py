"""A sub-millisecond model runs on the server's event loop (``serve_inline``), slow inline calls
send it to the thread pool, a long run of fast pool calls brings it back (up to the last demotion),
and a model measured slower never runs inline."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from edge_runtime import serve_inline
from edge_runtime.serve_inline import (INLINE_DEMOTE_MS, INLINE_MAX_MS, INLINE_SLOW_CALLS, INLINE_STALL_MS,
                                         INLINE_WINDOW, MAX_DEMOTIONS, PROMOTE_CALLS, Inline)
from edge_runtime.serve_types import InferRequest, Tensor

HELD_OUT = Path(__file__).resolve().parents[1] / "models" / "zoo" / "digits-cnn" / "held_out"


def _req(img: bytes) -> InferRequest:
    return InferRequest("digits-cnn", None, [Tensor("image", "BYTES", [1], [img])])


def _spy(m, delay_s: float = 0.0):
    """Wrap the model's infer and infer_batch (the core calls infer for a one-item request, infer_batch for
    more and for a dynamic batch): record the thread each call ran on, optionally sleep first."""
    seen: list[str] = []
    real = (m.rt.infer, m.rt.infer_batch)

    def spying(fn):
        def spy(x, **kw):
            seen.append(threading.current_thread().name)
            if delay_s:
                time.sleep(delay_s)
            return fn(x, **kw)
        return spy

    m.rt.infer, m.rt.infer_batch = spying(real[0]), spying(real[1])
    return seen, real


@pytest.mark.parametrize("artifact", ["digits_artifact", "ov_digits_artifact"])
def test_sub_millisecond_model_runs_on_the_loop_leaves_it_after_a_stall_and_comes_back(artifact, request,
                                                                                       monkeypatch):
    """On ONNX Runtime, and on OpenVINO, whose batch path would otherwise batch every request:
    inline wins over dynamic batching for a sub-ms model; once demoted, the model batches again."""
    from edge_runtime.serve_core import ServeCore

    img = sorted(HELD_OUT.rglob("*.png"))[0].read_bytes()
    label = sorted(HELD_OUT.rglob("*.png"))[0].parent.name
    core = ServeCore([request.getfixturevalue(artifact)])
    try:
        core.load_all()
        (m,) = core.models.values()
        assert m.batched == (artifact == "ov_digits_artifact")
        assert m.inline is not None and m.inline.on, m.inline.call_ms
        assert 0 < m.inline.call_ms <= INLINE_MAX_MS
        assert m.rt.metrics()["latency_seconds"] == {}            # the timing calls are not traffic
        seen, real = _spy(m)

        async def two():
            return [await core.infer(_req(img)) for _ in range(2)]

        loop_thread = []

        async def main():
            loop_thread.append(threading.current_thread().name)
            return await two()

        got = asyncio.run(main())
        assert [r.outputs[0].data[0].decode() for r in got] == [label, label]
        assert seen == loop_thread * 2                              # inline: the loop's own thread
        assert m.inline.calls == 2 and core._batches == 0
        text = core.metrics_text()
        assert 'edge_serve_inline{model="digits-cnn",version="1"} 1' in text
        # a stall: one inline call over the demotion bound, then the pool for good
        m.rt.infer, m.rt.infer_batch = real
        seen, _ = _spy(m, delay_s=(INLINE_STALL_MS + 5) / 1000)
        got = asyncio.run(two())
        assert [r.outputs[0].data[0].decode() for r in got] == [label, label]   # both answered
        assert not m.inline.on and "inline call took" in m.inline.demoted
        assert seen[0] == "MainThread" and seen[1].startswith("edge-serve"), seen
        assert 'edge_serve_inline{model="digits-cnn",version="1"} 0' in core.metrics_text()
        assert core._batches == (1 if m.batched else 0)             # demoted: the batch path again
        # fast again: after promote_after() pool calls in a row, none slow, the model is back on the loop
        m.rt.infer, m.rt.infer_batch = real
        monkeypatch.setattr(serve_inline, "PROMOTE_CALLS", 3)
        assert m.inline.promote_after() == 3 and m.inline.demotions == 1
        seen, _ = _spy(m)
        # one at a time until it is back (a pool call over 5 ms on a busy box starts the count again)
        for _ in range(50):
            got = asyncio.run(main_n(core, img, 1, loop_thread))
            assert got[0].outputs[0].data[0].decode() == label
            if m.inline.on:
                break
        assert m.inline.on and m.inline.demoted is None and m.inline.promotions == 1
        assert len(seen) >= 3 and all(t.startswith("edge-serve") for t in seen), seen   # all on the pool
        asyncio.run(main_n(core, img, 1, loop_thread))
        assert seen[-1] == loop_thread[-1], seen                                        # then the loop
        text = core.metrics_text()
        assert 'edge_serve_inline{model="digits-cnn",version="1"} 1' in text
        assert 'edge_serve_inline_demotions_total{model="digits-cnn",version="1"} 1' in text
    finally:
        core.close()


async def main_n(core, img: bytes, n: int, loop_thread: list):
    loop_thread.append(threading.current_thread().name)
    return [await core.infer(_req(img)) for _ in range(n)]


def test_inline_off_on_request_and_for_a_slow_model(digits_artifact):
    from edge_runtime.serve_core import ServeCore

    core = ServeCore([digits_artifact], inline=False)
    try:
        core.load_all()
        (m,) = core.models.values()
        assert m.inline is None
        seen, _ = _spy(m)
        img = sorted(HELD_OUT.rglob("*.png"))[0].read_bytes()
        asyncio.run(core.infer(_req(img)))
        assert seen[0].startswith("edge-serve")
    finally:
        core.close()
    slow = Inline(INLINE_MAX_MS * 3)
    assert not slow.on and not slow.admits(1)
    assert not Inline(None).on                                      # no sample to time: the pool
    fast = Inline(INLINE_MAX_MS / 4)
    assert fast.admits(4) and not fast.admits(5)                    # items x call time within the bound
    for i in range(INLINE_SLOW_CALLS - 1):                          # one-off pauses: still inline
        fast.observe(INLINE_DEMOTE_MS + 1, "m")
        fast.observe(0.1, "m")
    assert fast.on and fast.slow == INLINE_SLOW_CALLS - 1
    fast.observe(INLINE_DEMOTE_MS + 1, "m")                         # the last slow call it takes
    assert not fast.on and f"the last of {INLINE_SLOW_CALLS} over" in fast.demoted and fast.demotions == 1


def test_slow_calls_spread_over_hours_of_traffic_do_not_demote():
    """The count is over the latest INLINE_WINDOW inline calls, not the process's life: pauses of a
    busy machine, one every thousand calls, never add up to a demotion; clustered, they do."""
    spread = Inline(0.1)
    for _ in range(INLINE_SLOW_CALLS * 4):
        spread.observe(INLINE_DEMOTE_MS + 1, "m")
        for _ in range(INLINE_WINDOW // (INLINE_SLOW_CALLS - 1)):
            spread.observe(0.1, "m")
    assert spread.on and spread.demotions == 0 and spread.slow == INLINE_SLOW_CALLS * 4
    close = Inline(0.1)
    for _ in range(INLINE_SLOW_CALLS):
        close.observe(INLINE_DEMOTE_MS + 1, "m")
        for _ in range(INLINE_WINDOW // INLINE_SLOW_CALLS - 1):
            close.observe(0.1, "m")
    assert not close.on and close.demotions == 1


def test_a_demoted_model_comes_back_after_fast_pool_calls_with_backoff_and_stays_after_the_last():
    inl = Inline(0.1)
    inl.observe(INLINE_STALL_MS + 1, "m")                           # a stall: off the loop at once
    assert not inl.on and inl.demotions == 1 and inl.promote_after() == PROMOTE_CALLS
    for _ in range(PROMOTE_CALLS - 1):
        inl.observe_pooled(0.2, "m")
    inl.observe_pooled(INLINE_DEMOTE_MS + 1, "m")                   # one slow pool call: the count starts again
    assert not inl.on and inl.streak == 0
    for _ in range(PROMOTE_CALLS - 1):
        inl.observe_pooled(0.2, "m")
    assert not inl.on
    inl.observe_pooled(0.2, "m")
    assert inl.on and inl.promotions == 1 and inl.demoted is None
    inl.observe_pooled(0.2, "m")                                   # inline again: pool observations are ignored
    for n in range(2, MAX_DEMOTIONS + 1):
        inl.observe(INLINE_STALL_MS + 1, "m")
        assert not inl.on and inl.demotions == n
        if n < MAX_DEMOTIONS:
            assert inl.promote_after() == PROMOTE_CALLS * 2 ** (n - 1)   # twice as many each time
            for _ in range(inl.promote_after()):
                inl.observe_pooled(0.2, "m")
            assert inl.on
    for _ in range(PROMOTE_CALLS * 2 ** MAX_DEMOTIONS):             # the last demotion is for good
        inl.observe_pooled(0.2, "m")
    assert not inl.on and inl.promotions == MAX_DEMOTIONS - 1
    never = Inline(INLINE_MAX_MS * 3)                               # measured slow: never on the loop
    for _ in range(PROMOTE_CALLS):
        never.observe_pooled(0.2, "m")
    assert not never.on


class _TimedRt:
    """A runtime whose calls take the given seconds, in order (the last one repeats)."""

    def __init__(self, delays, sample=b"x"):
        self.delays, self.calls, self.resets = list(delays), 0, 0
        self.task = type("T", (), {"warmup_sample": staticmethod(lambda: sample)})()
        self.artifact = type("A", (), {"name": "m"})()

    def infer(self, raw):
        d = self.delays[min(self.calls, len(self.delays) - 1)]
        self.calls += 1
        if d is None:
            raise ValueError("cannot take the sample")
        time.sleep(d)

    def reset_metrics(self):
        self.resets += 1


def test_call_timing_ignores_a_cold_first_call_and_stops_early_only_on_two_slow_calls():
    from edge_runtime.serve_inline import measure_call_ms

    slow_s = INLINE_MAX_MS * 3 / 1000
    cold_first = _TimedRt([slow_s, 0.0])                        # one slow cold call, then fast ones
    ms = measure_call_ms(cold_first)
    assert ms is not None and ms <= INLINE_MAX_MS and cold_first.calls == 8 and cold_first.resets == 1
    one_pause = _TimedRt([0.0, slow_s, 0.0])                      # one slow timed call among seven
    assert measure_call_ms(one_pause) <= INLINE_MAX_MS and one_pause.calls == 8
    slow = _TimedRt([slow_s])                                      # a slow model: timed twice, not seven times
    assert measure_call_ms(slow) > INLINE_MAX_MS and slow.calls == 3
    assert measure_call_ms(_TimedRt([0.0], sample=None)) is None  # no sample: the pool
    failing = _TimedRt([None])
    assert measure_call_ms(failing) is None and failing.resets == 1


def test_a_slow_call_while_the_kernel_preempted_the_loop_is_not_the_model_s():
    """A busy machine, not a slow model: slow calls during which the loop's thread was preempted
    do not count (the pool would not have run them sooner); a stall still demotes."""
    inl = Inline(0.1)
    for _ in range(INLINE_SLOW_CALLS * 2):
        inl.observe(INLINE_DEMOTE_MS + 1, "m", paused=True)
    assert inl.on and inl.slow == 0
    inl.observe(INLINE_STALL_MS + 1, "m", paused=True)
    assert not inl.on and inl.demotions == 1


def _usage(nivcsw: int, cpu_s: float):
    return type("U", (), {"ru_nivcsw": nivcsw, "ru_utime": cpu_s, "ru_stime": 0.0})()


def test_a_pause_is_the_machine_s_only_when_preempted_and_the_call_used_little_cpu(monkeypatch):
    from edge_runtime import serve_inline as si

    after = {"u": None}
    monkeypatch.setattr(si, "thread_usage", lambda: after["u"])
    before = _usage(10, 1.0)
    after["u"] = _usage(11, 1.0 + (INLINE_DEMOTE_MS - 1) / 1000)      # preempted, little CPU: the machine
    assert si.machine_paused(before)
    after["u"] = _usage(11, 1.0 + (INLINE_DEMOTE_MS + 1) / 1000)      # preempted but CPU-bound: the model
    assert not si.machine_paused(before)
    after["u"] = _usage(10, 1.0)                                      # never preempted (a device wait): the model
    assert not si.machine_paused(before)
    assert not si.machine_paused(None)                                # no counters on this platform: the model


def test_involuntary_switches_count_a_preemption_of_this_thread():
    """The real counter (Linux ``ru_nivcsw``): this thread spins on one CPU beside a process spinning
    on the same CPU, so the kernel must preempt it; sleeping (a voluntary switch) does not count.
    The spin is CPU-bound, so it is the model's slowness, not the machine's pause."""
    import os
    import subprocess
    import sys

    from edge_runtime.serve_inline import machine_paused, thread_usage

    def involuntary_switches() -> int:
        return thread_usage().ru_nivcsw

    if not hasattr(os, "sched_setaffinity") or thread_usage() is None:
        pytest.skip("no per-thread counters or CPU affinity on this platform")
    before_mask = os.sched_getaffinity(0)
    cpu = min(before_mask)
    a = involuntary_switches()
    time.sleep(0.05)
    assert involuntary_switches() - a <= 1                         # a sleep is voluntary
    spinner = subprocess.Popen([sys.executable, "-c", "import os, time\nos.sched_setaffinity(0, {%d})\n"
                                "t = time.time()\nwhile time.time() - t < 3: pass" % cpu])
    try:
        os.sched_setaffinity(0, {cpu})                             # this thread only (pid 0)
        time.sleep(0.2)                                            # the spinner is on the CPU by now
        a = involuntary_switches()
        usage = thread_usage()
        t = time.perf_counter()
        while time.perf_counter() - t < 0.3:
            pass
        assert involuntary_switches() - a > 0
        assert not machine_paused(usage)                           # ~150 ms of its own CPU: the model's
    finally:
        os.sched_setaffinity(0, before_mask)
        spinner.kill()
        spinner.wait()


def test_the_core_ignores_slow_inline_calls_of_a_preempted_loop(digits_artifact, monkeypatch):
    from edge_runtime import serve_core
    from edge_runtime.serve_core import ServeCore

    img = sorted(HELD_OUT.rglob("*.png"))[0].read_bytes()
    core = ServeCore([digits_artifact])
    try:
        core.load_all()
        (m,) = core.models.values()
        assert m.inline is not None and m.inline.on
        _spy(m, delay_s=(INLINE_DEMOTE_MS + 1) / 1000)
        monkeypatch.setattr(serve_core, "machine_paused", lambda before: True)    # preempted, little CPU
        asyncio.run(main_n(core, img, INLINE_SLOW_CALLS, []))
        assert m.inline.on and m.inline.slow == 0
        monkeypatch.setattr(serve_core, "machine_paused", lambda before: False)   # the model's own slowness
        asyncio.run(main_n(core, img, INLINE_SLOW_CALLS, []))
        assert not m.inline.on and m.inline.slow == INLINE_SLOW_CALLS and m.inline.demotions == 1
    finally:
        core.close()
