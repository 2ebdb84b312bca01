"""A numpy reference backend for tests, with fault injection: test code, not shipped.

It registers at test time (``conftest.py``: an entry point of a temporary
distribution, so child processes find it too) and is written on the shared
skeleton (``edge_runtime.devices.base``) the way a third-party backend would
be: one file, what is unique to it.

Its model file (``.npz``) holds, per output ``O``: ``W__O`` of shape
[sum of flattened input sizes, prod(output shape)] and ``b__O``. Each output
is ``concat(flattened float inputs) @ W + b`` reshaped to the output shape and
cast to its dtype: deterministic, cheap, and shaped exactly like the
manifest says, so the runtime's whole path runs without a framework.

Options inject faults: ``stall_ms`` (sleep in run), ``cancellable`` (the
session runs inline and takes a cancel token, like ONNX Runtime, and its stall
stops when the token fires), ``fail_after`` (raise after N successful runs),
``fail_load`` (raise while loading), ``nan_after`` (NaN in float outputs after N runs), ``perturb``
(Gaussian noise of that scale on float outputs: a device that computes differently), ``segfault_after`` (the process dies of
SIGSEGV on run N+1: for the crash-isolation tests, only under ``isolate=True``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from edge_runtime.devices.base import Capabilities, DeviceBackend, DeviceSession, Option, Suitability


class FakeSession(DeviceSession):
    def __init__(self, model_path: Path, bucket: dict, options):
        super().__init__(bucket, "fake:cpu")
        if options["fail_load"]:
            raise RuntimeError("injected load failure")
        with np.load(model_path, allow_pickle=False) as data:
            self._weights = {k: data[k] for k in data.files}
        for out in bucket["outputs"]:
            if f"W__{out['name']}" not in self._weights:
                raise ValueError(f"fake model has no weights for output {out['name']!r}")
        self._options = options
        self._runs = 0
        self._lock = threading.Lock()
        cancellable = bool(options["cancellable"])
        self.capabilities = Capabilities(inline=cancellable, cancellable=cancellable)

    def _run(self, feeds, cancel):
        with self._lock:
            self._runs += 1
            runs = self._runs
        crash_after = self._options["segfault_after"]     # only ever under isolate=True
        if crash_after is not None and runs > crash_after:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGSEGV)
        poison = self._options["segfault_if_first"]      # one input that kills its process every time
        if poison is not None and any(float(feeds[t["name"]].ravel()[0]) == poison for t in self._bucket["inputs"]):
            # a real native crash, in this thread: os.kill's signal may reach another thread of a threaded host
            # (a Ray actor) while this one runs on and returns a result
            import ctypes

            ctypes.string_at(0)
        fail_after = self._options["fail_after"]
        if fail_after is not None and runs > fail_after:
            raise RuntimeError("injected backend failure")
        stall = self._options["stall_ms"]
        if stall:
            t_end = time.perf_counter() + stall / 1000
            while time.perf_counter() < t_end:
                if cancel is not None and cancel.fired:
                    raise RuntimeError("cancelled")
                time.sleep(0.001)
        x = np.concatenate([feeds[t["name"]].astype(np.float32).ravel() for t in self._bucket["inputs"]])
        outs = {}
        for spec in self._bucket["outputs"]:
            w, b = self._weights[f"W__{spec['name']}"], self._weights[f"b__{spec['name']}"]
            outs[spec["name"]] = (x @ w + b).reshape(spec["shape"]).astype(spec["dtype"])
        perturb = self._options["perturb"]
        if perturb:           # a device whose arithmetic differs from the reference's: deterministic noise
            rng = np.random.default_rng(self._runs)
            for name, arr in outs.items():
                if arr.dtype.kind == "f":
                    arr += (rng.standard_normal(arr.shape) * perturb).astype(arr.dtype)
        nan_after = self._options["nan_after"]
        if nan_after is not None and runs > nan_after:      # a broken driver: NaN where a number should be
            for name, arr in outs.items():
                if arr.dtype.kind == "f":
                    arr.flat[:: max(arr.size // 3, 1)] = np.nan
        return outs

    def info(self) -> dict:
        return {"runs": self._runs}


class FakeBackend(DeviceBackend):
    name = "fake"
    targets = ("fake",)
    options = (
        Option("stall_ms", float, 0.0, "sleep this long in every run", minimum=0),
        Option("cancellable", bool, False, "run inline and stop a stall when the cancel token fires"),
        Option("fail_after", int, None, "raise after this many successful runs", minimum=0),
        Option("fail_load", bool, False, "raise while loading"),
        Option("segfault_after", int, None, "die of SIGSEGV after this many runs (isolate=True only)", minimum=0),
        Option("segfault_if_first", float, None, "crash (a NULL read) on an input whose first value is this"),
        Option("nan_after", int, None, "return NaN in float outputs after this many runs", minimum=0),
        Option("perturb", float, 0.0, "add Gaussian noise of this scale to float outputs", minimum=0),
    )

    devices = ("cpu", "gpu")

    def assess(self, target, hardware, sub, forced, facts) -> Suitability:
        if sub == "gpu":        # a device the backend knows and this host lacks: forcing it falls back
            return Suitability(None, "fake:gpu", "no fake GPU on this host")
        return Suitability("cpu", "fake:cpu", "numpy reference backend")

    def open(self, model_path, bucket, sub, options):
        return FakeSession(model_path, bucket, options)


def write_fake_model(path: str | Path, bucket: dict, seed: int = 0, scale: float = 0.05) -> None:
    """Write random weights matching ``bucket``'s inputs/outputs."""
    rng = np.random.default_rng(seed)
    n_in = sum(int(np.prod(t["shape"])) for t in bucket["inputs"])
    arrays = {}
    for out in bucket["outputs"]:
        n_out = int(np.prod(out["shape"]))
        arrays[f"W__{out['name']}"] = (rng.standard_normal((n_in, n_out)) * scale).astype(np.float32)
        arrays[f"b__{out['name']}"] = (rng.standard_normal(n_out) * scale).astype(np.float32)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
