"""A numpy reference backend for tests, with fault injection.

Its model file (``.npz``) holds, per output ``O``: ``W__O`` of shape
[sum of flattened input sizes, prod(output shape)] and ``b__O``. Each output
is ``concat(flattened float inputs) @ W + b`` reshaped to the output shape and
cast to its dtype: deterministic, cheap, and shaped exactly like the
manifest says, so the runtime's whole path runs without a framework.

Options (``device_options`` of ``er.load``) inject faults: ``stall_ms``
(sleep in run), ``cancellable`` (the session takes a cancel token, like
ONNX Runtime, and its stall stops when the token fires), ``fail_after`` (raise after N successful runs),
``fail_load`` (raise while loading), ``segfault_after`` (the process dies of
SIGSEGV on run N+1: for the crash-isolation tests, only under ``isolate=True``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from .base import Suitability, check_feeds


class FakeSession:
    device = "fake:cpu"

    def __init__(self, model_path: Path, bucket: dict, options: dict):
        if options.get("fail_load"):
            raise RuntimeError("injected load failure")
        with np.load(model_path, allow_pickle=False) as data:
            self._weights = {k: data[k] for k in data.files}
        self._bucket = bucket
        self._options = options
        self._runs = 0
        self._lock = threading.Lock()
        self._closed = False
        self.cancellable = bool(options.get("cancellable"))
        for out in bucket["outputs"]:
            if f"W__{out['name']}" not in self._weights:
                raise ValueError(f"fake model has no weights for output {out['name']!r}")

    def run(self, feeds, cancel=None):
        if self._closed:
            raise RuntimeError("session is closed")
        check_feeds(feeds, self._bucket)
        with self._lock:
            self._runs += 1
            runs = self._runs
        crash_after = self._options.get("segfault_after")     # only ever under isolate=True
        if crash_after is not None and runs > int(crash_after):
            import os
            import signal

            os.kill(os.getpid(), signal.SIGSEGV)
        fail_after = self._options.get("fail_after")
        if fail_after is not None and runs > int(fail_after):
            raise RuntimeError("injected backend failure")
        stall = self._options.get("stall_ms")
        if stall:
            t_end = time.perf_counter() + float(stall) / 1000
            while time.perf_counter() < t_end:
                if cancel is not None and cancel.fired:
                    raise RuntimeError("cancelled")
                time.sleep(0.001)
        x = np.concatenate([feeds[t["name"]].astype(np.float32).ravel() for t in self._bucket["inputs"]])
        outs = {}
        for spec in self._bucket["outputs"]:
            w, b = self._weights[f"W__{spec['name']}"], self._weights[f"b__{spec['name']}"]
            y = (x @ w + b).reshape(spec["shape"])
            outs[spec["name"]] = y.astype(spec["dtype"])
        return outs

    def info(self) -> dict:
        return {"runs": self._runs}

    def close(self) -> None:
        self._closed = True


class FakeBackend:
    name = "fake"
    targets = ("fake",)

    def suitability(self, target: str, hardware: dict, device: str | None = None) -> Suitability:
        if target not in self.targets:
            return Suitability(0, self.name, f"the fake backend runs only 'fake' variants, not {target!r}")
        if device not in (None, "cpu"):
            return Suitability(0, f"{self.name}:{device}", f"unknown fake device {device!r} (cpu)")
        return Suitability(1, "fake:cpu", "numpy reference backend")

    def load(self, model_path: Path, bucket: dict, device: str | None = None, options: dict | None = None):
        return FakeSession(Path(model_path), bucket, dict(options or {}))


def write_fake_model(path: str | Path, bucket: dict, seed: int = 0, scale: float = 0.05) -> None:
    """Write random weights matching ``bucket``'s inputs/outputs (test helper)."""
    rng = np.random.default_rng(seed)
    n_in = sum(int(np.prod(t["shape"])) for t in bucket["inputs"])
    arrays = {}
    for out in bucket["outputs"]:
        n_out = int(np.prod(out["shape"]))
        arrays[f"W__{out['name']}"] = (rng.standard_normal((n_in, n_out)) * scale).astype(np.float32)
        arrays[f"b__{out['name']}"] = (rng.standard_normal(n_out) * scale).astype(np.float32)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
