"""A bounded HTTP load test on loopback (the gRPC half is in the gRPC tests): 10,000 requests at
concurrency 16 with the real tritonclient, no 5xx, server RSS grows < 5%; then SIGTERM during load:
every request the server accepted gets its answer, and it exits 0."""

from __future__ import annotations

import collections
import signal
import threading
import time

import numpy as np
import pytest

from serve_proc import ServerProc

th = pytest.importorskip("tritonclient.http")
pytest.importorskip("starlette")
from tritonclient.utils import InferenceServerException  # noqa: E402

from test_serve_http import bytes_input, digit_images  # noqa: E402

CONCURRENCY = 16


def drive(client, n: int, inputs, stop: threading.Event | None = None, max_s: float = 300.0) -> collections.Counter:
    """``n`` requests, ``CONCURRENCY`` in flight (a sliding window); outcome -> count. Stops by itself."""
    outcomes: collections.Counter = collections.Counter()
    window: collections.deque = collections.deque()
    sent, end = 0, time.monotonic() + max_s
    while (sent < n or window) and time.monotonic() < end:
        while sent < n and len(window) < CONCURRENCY and not (stop is not None and stop.is_set()):
            try:
                window.append(client.async_infer("digits-cnn", inputs))
            except Exception as exc:                  # noqa: BLE001 - the server went away
                outcomes[f"send:{type(exc).__name__}"] += 1
            sent += 1
        if not window:
            break
        try:
            window.popleft().get_result(timeout=60)
            outcomes[200] += 1
        except InferenceServerException as exc:
            outcomes[int(exc.status()) if exc.status() else f"client:{exc.message()[:40]}"] += 1
        except Exception as exc:                      # noqa: BLE001 - connection closed at shutdown
            outcomes[f"conn:{type(exc).__name__}"] += 1
    return outcomes


@pytest.mark.slow
def test_10k_requests_then_sigterm_during_load(digits_artifact):
    images, _ = digit_images(1)
    inputs = [bytes_input("image", images)]
    srv = ServerProc(digits_artifact, args=("--drain-timeout", "20"))
    try:
        client = th.InferenceServerClient(srv.http, concurrency=CONCURRENCY, connection_timeout=60,
                                          network_timeout=60)
        warm = drive(client, 500, inputs)             # allocator and caches settle before the RSS baseline
        assert warm == {200: 500}, warm
        rss0 = srv.rss_kb()
        t0 = time.monotonic()
        out = drive(client, 10_000, inputs)
        rate = 10_000 / (time.monotonic() - t0)
        rss1 = srv.rss_kb()
        assert out == {200: 10_000}, out                               # no 5xx, nothing refused
        assert rss1 < rss0 * 1.05, (rss0, rss1)
        print(f"10,000 requests at concurrency {CONCURRENCY}: {rate:.0f} req/s; RSS {rss0} -> {rss1} kB")

        # SIGTERM during load: the load runs on, the server drains and exits 0
        stop = threading.Event()
        result: list = []
        loader = threading.Thread(target=lambda: result.append(drive(client, 50_000, inputs, stop, max_s=60)))
        loader.start()
        time.sleep(1.0)
        rc, stopped = srv.stop(signal.SIGTERM, timeout=60)
        stop.set()
        loader.join(90)
        client.close()
        assert rc == 0, (rc, "".join(srv.stderr)[-2000:])
        fields = dict(p.split("=") for p in stopped.split()[1:])
        assert int(fields["requests"]) > 0 and fields["unanswered"] == "0", stopped
        (during,) = result
        assert during[200] > 0, during
        assert not [k for k in during if isinstance(k, int) and k >= 500 and k != 503], during
        print(f"SIGTERM during load: {dict(during)}; {stopped}")
    finally:
        srv.kill()
