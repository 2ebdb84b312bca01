"""One CPU thread for a model too small to use two, by measurement at load.

A backend's default thread count (ONNX Runtime and OpenVINO: every core) is right for a
model of milliseconds and wrong for one of microseconds: on the 2-core Intel Xeon,
digits-cnn (~30 µs a call) ran at the same wall time with one thread or two, while
the second thread spun between calls and the process used **2x the CPU** (ORT
111 µs wall / 222 µs CPU per ``rt.infer`` against 88 / 88 with one thread; OpenVINO
146 / 290 against 122 / 122), CPU a board's other processes (a camera loop, the
server's event loop, its client) then lack. So when the caller and the artifact set
no thread count, after the warm-up each bucket is timed with the default
(``CALLS`` calls, median); if every bucket is under ``TINY_CALL_MS``, one-thread
sessions are opened and the two are timed call for call, alternating (``ROUNDS`` rounds,
the order flipped each round, medians), so a minute in which the machine slows down
weighs on both sides alike; they replace the default ones when no bucket is slower than
``KEEP_IF_WITHIN`` x. A verdict of "slower" is timed once more and decided on every round
(a sequential timing read 1.20x on a box whose speed drifts, for a model where one thread
is as fast). A bucket whose warm-up call took over ``WARMUP_SKIP_MS`` is not timed (a model of
milliseconds), unless its model files are under ``SMALL_MODEL_BYTES``: ONNX Runtime's first
run of digits-cnn takes 7 ms of one-off set-up, and the 2-thread session it then kept cost
each later call ~10-25 µs of waking the spinning worker (2-core AMD EPYC, 2026-12-06).
The record is ``rt.info()["threads_fit"]``. Whether the model runs on the CPU is read from the
devices its sessions report (``onnxruntime:cpu`` after ONNX Runtime dropped a GPU provider), not
from the planned tier; only a device that does not say (``openvino:auto`` not read back) defers
to the plan.
A machine where one thread is slower (many cores, a model near the bound) keeps its
default: the decision is measured where it runs, never assumed.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np


def _median(values) -> float:
    # numpy's, not ``statistics.median``: that module's fractions/decimal imports cost ~3 ms of every start
    return float(np.median(values))


log = logging.getLogger("edge_runtime.runtime")

TINY_CALL_MS = 1.0      # buckets whose default-thread call takes longer keep the default
KEEP_IF_WITHIN = 1.10   # one thread is kept when no bucket is slower than this x the default
CALLS = 7
SLOW_CALLS = 2          # calls that must all be over TINY_CALL_MS before a model is called slow
ROUNDS = 9              # alternating rounds per comparison (twice that when the first says slower)
WARMUP_SKIP_MS = 5.0    # a bucket whose warm-up (first) call took longer is not timed at all ...
SMALL_MODEL_BYTES = 1 << 20     # ... unless its model files are this small: a first call is then
# the backend's one-off set-up (ONNX Runtime's first run of digits-cnn: 7 ms, its later ones 0.02 ms),
# and the timed calls below, bounded by TINY_CALL_MS, cost two calls if the model is slow after all


def _feeds(bucket) -> dict:
    return {t.name: np.ones(t.shape, dtype=t.dtype) for t in bucket.inputs}


def _median_ms(sess, feeds, bound: float | None = None) -> float:
    """The median of ``CALLS`` timed calls; when the first ``SLOW_CALLS`` calls are all over ``bound``
    ms, the fastest of them is the answer (a model of milliseconds pays two calls at load, not
    seven). One call alone was not enough: a CI box's single 2.9 ms hiccup on a 0.03 ms digits call
    once decided "a model of milliseconds" and kept the spinning second thread."""
    times = []
    for _ in range(CALLS):
        t = time.perf_counter()
        sess.run(feeds)
        times.append((time.perf_counter() - t) * 1000)
        if bound is not None and len(times) == SLOW_CALLS and min(times) > bound:
            return min(times)
    return _median(times)


def _alternating_ms(pair, feeds, times: tuple[list, list]) -> tuple[float, float]:
    """Time ``pair`` (default, one-thread) call for call over ``ROUNDS`` rounds, flipping which goes
    first each round; the samples are appended to ``times``, the medians of all of them returned."""
    for r in range(ROUNDS):
        for side in ((0, 1) if r % 2 == 0 else (1, 0)):
            t = time.perf_counter()
            pair[side].run(feeds)
            times[side].append((time.perf_counter() - t) * 1000)
    return _median(times[0]), _median(times[1])


def _compare(default_sessions, one_sessions, feeds) -> tuple[list, list, float, int]:
    """Default and one-thread medians per bucket, the worst ratio, and the rounds it took."""
    samples: list[tuple[list, list]] = [([], []) for _ in feeds]
    for attempt in (1, 2):
        medians = [_alternating_ms((d, o), f, ts)
                   for d, o, f, ts in zip(default_sessions, one_sessions, feeds, samples)]
        worst = max(o / d if d > 0 else 1.0 for d, o in medians)
        if worst <= KEEP_IF_WITHIN:
            break
    default_ms = [round(d, 4) for d, _ in medians]
    one_ms = [round(o, 4) for _, o in medians]
    return default_ms, one_ms, worst, ROUNDS * attempt


def _small(rt, bucket) -> bool:
    """Whether the bucket's model files (the manifest's byte counts) total under SMALL_MODEL_BYTES."""
    files = getattr(getattr(rt, "artifact", None), "manifest", {}).get("files") or {}
    names = [getattr(bucket, "file", None), *(getattr(bucket, "extra_files", None) or ())]
    sizes = [(files.get(n) or {}).get("bytes") for n in names if n]
    known = [n for n in sizes if isinstance(n, int)]
    return bool(sizes) and len(known) == len(sizes) and sum(known) < SMALL_MODEL_BYTES


def session_devices(rt) -> list[str]:
    """The device each of ``rt``'s sessions reports it runs on (after any fallback: ONNX Runtime's
    session reads back the providers it kept), else the runtime's ``device``."""
    found = [getattr(s, "device", None) for s in getattr(rt, "_sessions", None) or ()]
    devices = [d for d in found if isinstance(d, str) and d]
    if len(devices) == len(found) and devices:
        return devices
    return [str(getattr(rt, "device", None) or "")]


def on_cpu(device: str) -> bool | None:
    """Whether a session's device is the host CPU: True for ``onnxruntime:cpu``, ``openvino:cpu``,
    ``tflite:cpu``; False for ``onnxruntime:cuda:1``, ``openvino:gpu``, ``edgetpu:usb:0``; None
    where it does not say (``openvino:auto`` whose execution device was not read back, no device)."""
    _, _, sub = device.partition(":")
    sub = sub.partition(":")[0].lower()
    if sub == "cpu":
        return True
    return None if sub in ("", "auto") else False


def usable_cpus(rt) -> int:
    """The CPUs this process may run on (``hardware.cpu.usable``: affinity and cgroup quota; a
    container given 2 CPUs of a 64-core host has 2), else ``os.cpu_count()``."""
    try:
        usable = rt.hardware["cpu"].get("usable")
    except (AttributeError, KeyError, TypeError):
        usable = None
    return int(usable) if isinstance(usable, int) and usable > 0 else (os.cpu_count() or 1)


def eligible(rt, backend) -> str | None:
    """Why the thread count is not fitted here, or None when it is."""
    if "threads" in rt.device_options and not getattr(rt, "threads_from_quota", None):
        return "the thread count is set (by the caller or the artifact)"
    if os.environ.get("EDGE_RUNTIME_THREADS"):
        return "$EDGE_RUNTIME_THREADS is set"
    if not any(o.name == "threads" for o in backend.options):
        return f"{backend.name} has no threads option"
    # where the sessions run, not the plan: ONNX Runtime falls back from a GPU provider to the CPU
    devices = session_devices(rt)
    placed = [on_cpu(d) for d in devices]
    if False in placed:
        return f"not a CPU device (the session runs on {devices[placed.index(False)]})"
    if None in placed and rt.choice.suitability.tier != "cpu":      # "openvino:auto" not read back: the plan
        return "not a CPU device"
    if usable_cpus(rt) < 2:
        return "one usable CPU (affinity or cgroup quota included)"
    return None


def fit_threads(rt, backend, open_bucket) -> dict:
    """The record of the fit; swaps ``rt._sessions`` for one-thread ones when they are kept.
    ``open_bucket(bucket, options)`` opens a session as the runtime does."""
    why_not = eligible(rt, backend)
    if why_not:
        return {"threads": None, "why": why_not}
    buckets = list(rt.variant.buckets)
    warm = getattr(rt, "warmup_ms", {}) or {}
    slow = [(b.name, warm[b.name]) for b in buckets if getattr(b, "name", None) in warm
            and warm[b.name] > WARMUP_SKIP_MS and not _small(rt, b)]
    if slow:      # a first call this slow: a model of milliseconds, not worth a timed call at load
        return {"threads": None, "why": f"bucket {slow[0][0]}'s warm-up call took {slow[0][1]:.1f} ms "
                                        f"(> {WARMUP_SKIP_MS:g} ms): the default thread count"}
    feeds = [_feeds(b) for b in buckets]
    default_ms = []
    for sess, f in zip(rt._sessions, feeds):
        default_ms.append(round(_median_ms(sess, f, bound=TINY_CALL_MS), 4))
        if default_ms[-1] > TINY_CALL_MS:
            return {"threads": None, "default_ms": default_ms,
                    "why": f"a call takes {default_ms[-1]:.3f} ms (> {TINY_CALL_MS} ms): the default thread count"}
    one: list = []
    try:
        for b, f in zip(buckets, feeds):
            s = open_bucket(b, {**rt.device_options, "threads": 1})
            one.append(s)
            s.run(f)                                  # its first call, as the warm-up gave the others
        default_ms, one_ms, worst, rounds = _compare(rt._sessions, one, feeds)
    except Exception as exc:                          # the default sessions stay, as they are
        for s in one:
            s.close()
        log.debug("one-thread sessions could not be measured: %s", exc)
        return {"threads": None, "default_ms": default_ms, "why": f"one-thread sessions failed: {exc}"}
    if worst > KEEP_IF_WITHIN:
        for s in one:
            s.close()
        return {"threads": None, "default_ms": default_ms, "one_thread_ms": one_ms, "rounds": rounds,
                "why": f"one thread was {worst:.2f}x slower here: the default thread count"}
    old, rt._sessions = rt._sessions, one
    for s in old:
        s.close()
    return {"threads": 1, "default_ms": default_ms, "one_thread_ms": one_ms, "rounds": rounds,
            "why": f"every bucket's call is under {TINY_CALL_MS} ms and one thread is as fast "
                   f"({worst:.2f}x the default): a second thread would only spin"}
