"""The gRPC half of #19's bounded load test, on loopback only.

10,000 ModelInfer requests at concurrency 16 through the real ``tritonclient.grpc``
against a real ``edge-infer serve`` process serving the digits artifact:
- every request is answered with the right label (no INTERNAL, no UNAVAILABLE, no
  error of any kind: 16 in flight is within the default bounds 4 + 64);
- the server's RSS grows by less than 5% from after a warm-up to the end;
- the test stops by itself: a bounded count, and a wall-clock cap
  (``EDGE_GRPC_LOAD_MAX_S``, default 300 s) after which the workers stop and the
  test fails saying how far it got.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("grpc")
tg = pytest.importorskip("tritonclient.grpc")

from grpc_harness import ServeProcess, rss_bytes  # noqa: E402

pytestmark = pytest.mark.slow

REQUESTS = 10_000
CONCURRENCY = 16
WARMUP = 500
MAX_S = float(os.environ.get("EDGE_GRPC_LOAD_MAX_S", "300"))
DIGITS = Path(__file__).resolve().parents[1] / "models" / "zoo" / "digits-cnn" / "held_out"


def test_grpc_load_10k_at_16(digits_artifact):
    from tritonclient.utils import InferenceServerException

    name = json.loads((digits_artifact / "manifest.json").read_text())["model"]["name"]
    images = [next(iter(sorted((DIGITS / str(d)).glob("*.png")))).read_bytes() for d in range(10)]
    srv = ServeProcess([digits_artifact])
    try:
        # the expected label of each image, from the server itself (correctness vs in-process is test_serve_grpc's)
        probe = tg.InferenceServerClient(srv.target)
        want = []
        for img in images:
            t = tg.InferInput("image", [1], "BYTES")
            t.set_data_from_numpy(np.array([img], dtype=object))
            want.append(probe.infer(name, [t]).as_numpy("label")[0])
        probe.close()

        lock = threading.Lock()
        issued = [0]
        errors: Counter = Counter()
        wrong = [0]
        warm = threading.Event()
        rss = {}
        stop_at = time.monotonic() + MAX_S

        def next_index() -> int | None:
            with lock:
                if issued[0] >= REQUESTS or time.monotonic() > stop_at:
                    return None
                issued[0] += 1
                if issued[0] == WARMUP:
                    rss["warm"] = rss_bytes(srv.proc.pid)
                    warm.set()
                return issued[0]

        def worker(w: int) -> None:
            client = tg.InferenceServerClient(srv.target)
            inputs = []
            for img in images:
                t = tg.InferInput("image", [1], "BYTES")
                t.set_data_from_numpy(np.array([img], dtype=object))
                inputs.append(t)
            outputs = [tg.InferRequestedOutput("label")]
            while (i := next_index()) is not None:
                k = (i + w) % len(images)
                try:
                    res = client.infer(name, [inputs[k]], outputs=outputs, client_timeout=30)
                    if res.as_numpy("label")[0] != want[k]:
                        with lock:
                            wrong[0] += 1
                except InferenceServerException as e:
                    with lock:
                        errors[str(e.status())] += 1
            client.close()

        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(CONCURRENCY)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(MAX_S + 60)
        wall = time.perf_counter() - t0
        rss["end"] = rss_bytes(srv.proc.pid)
        done = issued[0]
        print(f"\ngRPC load: {done} requests at concurrency {CONCURRENCY} in {wall:.1f} s "
              f"({done / wall:.0f} req/s); server RSS {rss.get('warm', 0) / 2**20:.1f} -> "
              f"{rss['end'] / 2**20:.1f} MiB; errors {dict(errors)}")
        assert not any(th.is_alive() for th in threads), "a load worker did not stop"
        assert done == REQUESTS, f"only {done} of {REQUESTS} requests within {MAX_S:.0f} s ({done / wall:.0f} req/s)"
        assert not errors, f"errors under load: {dict(errors)}"
        assert wrong[0] == 0, f"{wrong[0]} wrong labels under load"
        assert rss["end"] < rss["warm"] * 1.05, f"server RSS grew {rss['warm']} -> {rss['end']} bytes"
        assert srv.proc.poll() is None, "the server died under load"
    finally:
        code = srv.close()
    assert code == 0, srv.output()
