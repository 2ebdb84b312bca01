"""OpenVINO backend: int8 IR on CPU (GPU/NPU/AUTO when present and asked for).

One ``openvino.Core`` per process; per bucket one model compiled with the
LATENCY hint for ``infer()`` and, on first ``infer_batch()``, one compiled
with THROUGHPUT behind an ``AsyncInferQueue``. Infer requests are pooled and
reused, never created per call; each call holds its own request, so
concurrent ``infer()`` from many threads is safe. A running request stops
when the runtime's watchdog calls ``InferRequest.cancel()`` at the deadline.

Precision: OpenVINO's CPU default runs the float parts of a graph in bf16
where the CPU has it. The converter measures parity and speed for f32 and
(where supported) bf16 and records the fastest that meets the parity budget
in the variant (``runtime.precision``, with the reason as provenance); the
backend uses that, a caller's ``device_options={"precision": ...}`` overrides
it, and without either it runs f32. What actually ran is read back from the compiled model and shown
in ``rt.info()``.

Model cache: compiled blobs go to ``$EDGE_RUNTIME_CACHE_DIR/openvino`` (default
``$XDG_CACHE_HOME/edge-runtime/openvino``, else ``~/.cache/edge-runtime/openvino``)
so a second start skips compilation; ``cache=False`` or
``EDGE_RUNTIME_OV_CACHE=0`` switches it off.

``openvino`` is imported when a session loads or a non-CPU device is asked
for, never at module import.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np

from edge_runtime.watchdog import WATCHDOG

from .base import (Capabilities, DeviceBackend, DeviceSession, Option, Pool, Suitability, cache_options, check_io,
                   threads_option, writable_dir)
# one Core per process, the fork refusal, the cache dir and the precision choice: openvino_core
from .openvino_core import (_DEVICES, PRECISIONS, _mark_compiling, _ov, _refuse_forked_child, auto_candidates,
                            auto_device, cache_dir, choose_precision, core, execution_devices, precision_candidates)
from .session import SessionClosed

log = logging.getLogger("edge_runtime.openvino")
JOBS_PER_OPTIMAL = 2             # infer_batch's queue: requests per OPTIMAL_NUMBER_OF_INFER_REQUESTS (_throughput)
COPY_IN_MAX_BYTES = 64 * 1024    # inputs up to this size are copied into the request's own tensors


def _native_infer():
    """``InferRequest.infer`` of the native module: the request's own tensors, no per-call input
    dispatch (the Python wrapper's ``infer`` converts every feed and wraps the outputs)."""
    from openvino._pyopenvino import InferRequest

    return InferRequest.infer


class _Request:
    """A pooled infer request, its input buffers (numpy views of its own input tensors, or None
    when inputs go through OpenVINO's dispatch) and its output tensors."""

    __slots__ = ("req", "bufs", "outs", "native")

    def __init__(self, req, bufs, outs, native):
        self.req, self.bufs, self.outs, self.native = req, bufs, outs, native


def _cancel_jobs(g, again: bool = False) -> None:
    """``run_many``'s watchdog hook, ``g`` = [queue (None once the batch is past its wait: a late hook must
    not cancel the next batch), lock, fired]: cancels every job of the queue; ``again``: only if it fired."""
    with g[1]:
        if g[0] is not None and (g[2] or not again):
            g[2] = True
            for k in range(len(g[0])):
                try:
                    g[0][k].cancel()        # an idle request: a no-op
                except Exception:
                    pass


class OpenVinoSession(DeviceSession):
    # InferRequest.cancel() stops a running call: infer() runs inline under the watchdog;
    # infer_batch() has its own THROUGHPUT model, compiled on first use or by prepare_many()
    capabilities = Capabilities(inline=True, cancellable=True, batched=True, batch_warmup=True)

    def __init__(self, model_path: Path, bucket: dict, device: str, options, why: str | None = None):
        super().__init__(bucket, f"openvino:{device}")
        ov_device = _DEVICES[device]
        self._options = options
        self.precision, self.precision_reason = choose_precision(options, why)
        self.cache = cache_dir(options)
        self.cache_error = None
        self._config = {"INFERENCE_PRECISION_HINT": self.precision}
        if self.cache is not None:
            why_not = writable_dir(self.cache)
            if why_not:  # a read-only home on a board: run uncached, say so
                self.cache_error = f"model cache off: {why_not}"
                log.warning("openvino %s", self.cache_error)
                self.cache = None
            else:
                self._config["CACHE_DIR"] = str(self.cache)
        if options.get("threads"):
            self._config["INFERENCE_NUM_THREADS"] = options["threads"]
        self._ov_device = ov_device
        _mark_compiling()
        t0 = time.perf_counter()
        # compiling from the path lets a cache hit skip reading and hashing the graph
        self._model: str | None = str(model_path)     # None once released
        try:
            self._compiled = self._compile_latency(ov_device)
        except Exception as exc:
            if self.precision == "f32" or why is None:
                raise          # f32 itself, or a precision the caller asked for: the caller's error stands
            # the artifact's recorded hint (measured on the build host) has no kernels here, e.g. bf16
            # on a CPU without them: the recorded choice is advice, f32 is the reference precision
            first = str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else type(exc).__name__
            log.warning("openvino: the recorded precision %s does not compile here (%s); running f32",
                        self.precision, first)
            self.precision_reason = (f"the recorded {self.precision} ({why}) did not compile here: {first}; "
                                     "f32, the closest to the fp32 reference")
            self.precision = "f32"
            self._config["INFERENCE_PRECISION_HINT"] = "f32"
            self._compiled = self._compile_latency(ov_device)
        self.compile_ms = round((time.perf_counter() - t0) * 1000, 1)
        names = [o.get_any_name() for o in self._compiled.outputs]
        check_io((i.get_any_name() for i in self._compiled.inputs), names, bucket, "IR")
        wanted = [t["name"] for t in bucket["outputs"]]
        self._out_idx = [names.index(n) for n in wanted]
        self._out_names = wanted
        # small static inputs are copied into each request's own input tensors and the request runs
        # through the native call: the Python wrapper's per-call dispatch costs more than the copy
        self._copy_in = sum(int(np.prod(t["shape"])) * np.dtype(t["dtype"]).itemsize
                            for t in bucket["inputs"]) <= COPY_IN_MAX_BYTES
        self._pool = Pool(self._new_request, options.get("max_requests", 8))
        self.executed_on = execution_devices(self._compiled, ov_device)
        self.auto_candidates: list[str] | None = None
        self._tp_device = ov_device         # where infer_batch's THROUGHPUT model is compiled
        if ov_device == "AUTO":
            self.auto_candidates = auto_candidates(self._compiled)
            self.device = "openvino:" + auto_device(self.executed_on, self.auto_candidates)
            if self.device == "openvino:cpu":
                self._tp_device = "CPU"     # AUTO chose the CPU: the batch model runs where infer() does
        self._tp: list | None = None   # (compiled THROUGHPUT model, AsyncInferQueue), made on first run_many
        self._tp_lock = threading.Lock()

    def _compile_latency(self, ov_device: str):
        try:
            return core().compile_model(self._model, ov_device, {**self._config, "PERFORMANCE_HINT": "LATENCY"})
        except Exception as exc:
            if "CACHE_DIR" not in self._config:
                raise
            # a broken cache entry must not stop the model: compile once more without the cache. If
            # that fails too the model does not compile (its error is raised), and the cache is not blamed
            config = {k: v for k, v in self._config.items() if k != "CACHE_DIR"}
            compiled = core().compile_model(self._model, ov_device, {**config, "PERFORMANCE_HINT": "LATENCY"})
            first = " ".join(str(exc).split())          # OpenVINO's messages span lines: one log line
            self.cache_error = f"compiling with the model cache failed, compiled without it: {first}"
            log.warning("openvino %s", self.cache_error)
            self._config = config
            self.cache = None
            return compiled

    # -- infer() -------------------------------------------------------------
    def _new_request(self) -> "_Request":
        req = self._compiled.create_infer_request()
        outs = [req.get_output_tensor(i) for i in self._out_idx]
        bufs = None
        if self._copy_in:
            bufs = [(t["name"], req.get_tensor(t["name"]).data) for t in self._bucket["inputs"]]
            if any(b.shape != tuple(t["shape"]) or b.dtype != np.dtype(t["dtype"]) or not b.flags.writeable
                   for (_, b), t in zip(bufs, self._bucket["inputs"])):
                bufs = None          # the compiled input is not the bucket's tensor: let OpenVINO convert
        return _Request(req, bufs, outs, _native_infer() if bufs is not None else None)

    def _run(self, feeds, cancel):
        r = self._pool.acquire()
        req = r.req
        guard = None
        if cancel is not None:
            # the watchdog may fire after this call has handed its request back;
            # the guard makes a late cancel a no-op instead of hitting someone else's call
            guard = [req, threading.Lock()]

            def _cancel(g=guard):
                with g[1]:
                    if g[0] is not None:
                        g[0].cancel()

            cancel.on_cancel(_cancel)
        try:
            if r.native is not None:
                for name, buf in r.bufs:
                    np.copyto(buf, feeds[name], casting="no")
                r.native(req, {}, True, True)
            else:
                req.infer(feeds, share_inputs=True, share_outputs=True)
            return {n: t.data.copy() for n, t in zip(self._out_names, r.outs)}
        finally:
            if guard is not None:
                with guard[1]:
                    guard[0] = None
            self._pool.release(r)

    # -- infer_batch(): THROUGHPUT + AsyncInferQueue (the BatchSession protocol) -----
    def _throughput(self):
        with self._tp_lock:
            if self._tp is None:
                if self._closed:        # closed since run_many's check: its model is gone
                    raise SessionClosed("session is closed")
                ov = _ov()
                compiled = core().compile_model(self._model, self._tp_device,
                                                {**self._config, "PERFORMANCE_HINT": "THROUGHPUT"})
                # twice the plugin's optimum by default: a request already waiting in the plugin keeps a
                # stream busy while the thread that feeds the queue waits for the GIL, which another
                # thread tokenizing the next batch holds for 5 ms at a time (edge-infer score, served
                # batches); at the optimum the streams idled meanwhile (score / raw 0.87 -> 1.13)
                jobs = int(self._options.get("jobs") or
                           JOBS_PER_OPTIMAL * compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
                self._tp = [compiled, ov.AsyncInferQueue(compiled, max(1, jobs)), threading.Lock(), max(1, jobs)]
            return self._tp

    def prepare_many(self) -> None:
        """Compile the THROUGHPUT model and run each of its jobs once, so a batch
        job's first batch does not pay compile and first-inference costs."""
        jobs = self._throughput()[3]
        feeds = {t["name"]: np.ones(t["shape"], dtype=t["dtype"]) for t in self._bucket["inputs"]}
        for r in self.run_many([feeds] * jobs):
            if isinstance(r, BaseException):
                raise r

    def run_many(self, feeds_list, timeout_s: float | None = None) -> list:
        """Run many feeds at once; one output dict or Exception per item, in order.

        Items not started ``timeout_s`` after the start are not run: ``TimeoutError``. Running jobs get
        one item's share more (``timeout_s / items``), then the watchdog cancels every job of the queue
        (a hung device: ``start_async``/``wait_all`` have no bound); their items are ``TimeoutError`` and
        the queue (which re-raises a cancel later) is replaced. ``timeout_s`` None: no deadline.
        """
        if self._closed:
            raise SessionClosed("session is closed")
        for feeds in feeds_list:
            self._check(feeds)
        tp = self._throughput()
        results: list = [None] * len(feeds_list)
        names, idx = self._out_names, self._out_idx
        budget = timeout_s if timeout_s is not None and timeout_s > 0 else 0.0     # NaN: 0
        t_end = None if timeout_s is None else time.perf_counter() + budget

        def done(req, i):
            results[i] = {n: req.get_output_tensor(j).data.copy() for n, j in zip(names, idx)}

        with tp[2]:  # one batch at a time per queue; infer() keeps its own requests
            queue = tp[1]
            queue.set_callback(done)
            failed, late, stop = None, False, [queue, threading.Lock(), False]
            if t_end is not None and feeds_list:     # one watchdog entry per batch, not per item
                token, entry = WATCHDOG.arm(t_end + budget / len(feeds_list))
                token.on_cancel(lambda: _cancel_jobs(stop))
            try:
                for i, feeds in enumerate(feeds_list):
                    if t_end is not None and time.perf_counter() > t_end:
                        late = True
                        break
                    try:
                        queue.start_async(feeds, userdata=i, share_inputs=True)
                    except Exception as exc:  # an earlier job failed or was cancelled; its error surfaces here
                        failed = exc
                        break
                _cancel_jobs(stop, again=True)      # a job started while the hook ran: cancel it too
                try:
                    queue.wait_all()
                except Exception as exc:
                    failed = failed or exc
            finally:
                if t_end is not None and feeds_list:
                    WATCHDOG.disarm(entry)
                with stop[1]:
                    stop[0] = None
            if failed is not None or stop[2]:
                self._drain_and_renew(tp)
        for i, r in enumerate(results):
            if r is None:
                results[i] = TimeoutError("not done by the deadline: the jobs were cancelled") if stop[2] else \
                    TimeoutError("not started before the deadline") if late and failed is None else \
                    RuntimeError(str(failed) if failed is not None else "request did not complete")
        return results

    def _drain_and_renew(self, tp) -> None:
        # a failed job re-raises on the queue's next start_async: wait until every
        # job is idle, then replace the queue (the compiled model is kept)
        queue = tp[1]
        for k in range(len(queue)):
            try:
                queue[k].wait()
            except Exception:
                pass
        tp[1] = _ov().AsyncInferQueue(tp[0], tp[3])

    def _ran(self, name: str, devices: list[str] | None = None):
        """A property of what runs, read back (None when unreadable): the compiled model's own, else
        (AUTO exposes none of its devices' properties itself) the execution device's, from its
        DEVICE_PROPERTIES."""
        try:
            return self._compiled.get_property(name)
        except Exception:
            pass
        try:
            props = self._compiled.get_property("DEVICE_PROPERTIES")
            for dev in (self.executed_on if devices is None else devices) or []:
                dev = dev.strip("()")       # AUTO's CPU helper reads "(CPU)"
                for key in (dev, dev.split(".")[0]):
                    if key in props and name in props[key]:
                        return props[key][name]
        except Exception:
            pass
        return None

    def info(self) -> dict:
        auto, now = {}, None
        if self._ov_device == "AUTO" and self._compiled is not None:
            # AUTO may switch after load (its CPU helper answers while the chosen device compiles): read
            # again here, never per call; the session's device names every device it may run on
            now = execution_devices(self._compiled, self._ov_device)
            auto = {"auto_candidates": self.auto_candidates, "execution_devices_now": now}
        ran = self._ran("INFERENCE_PRECISION_HINT", now)
        threads = self._ran("INFERENCE_NUM_THREADS", now)
        return {
            "openvino_device": self._ov_device,
            "execution_devices": self.executed_on,      # at load
            **auto,
            "precision": "unknown" if ran is None else str(ran).replace("<Type: '", "").replace("'>", ""),
            "threads": threads if isinstance(threads, int) else None,       # INFERENCE_NUM_THREADS, read back
            "precision_requested": self.precision,
            "precision_reason": self.precision_reason,
            "performance_hint": "LATENCY (infer), THROUGHPUT (infer_batch)",
            "cache_dir": str(self.cache) if self.cache else None,
            "cache_error": self.cache_error,
            "compile_ms": self.compile_ms,
            "infer_requests": self._pool.size,
            "throughput_compiled": self._tp is not None,
            "batch_jobs": self._tp[3] if self._tp is not None else None,     # infer_batch's queue requests
        }

    def _release(self) -> None:
        self._tp = None
        self._pool.close()      # a call waiting for a request gets SessionClosed, never waits on
        self._compiled = None
        self._model = None


class OpenVinoBackend(DeviceBackend):
    name = "openvino"
    targets = ("openvino",)
    packages = ("openvino",)
    package_label = "openvino"
    install = "pip install 'edge-runtime[openvino]'"
    devices = ("cpu", "gpu", "npu", "auto")
    options = (
        Option("precision", str, "auto", "inference precision hint (auto: what the artifact recorded, else f32)",
               choices=PRECISIONS),
        *cache_options("compiled models", "openvino", "EDGE_RUNTIME_OV_CACHE"),
        threads_option("OpenVINO's, all cores"),
        Option("max_requests", int, 8, "infer requests per bucket for concurrent infer() calls", minimum=1),
        Option("jobs", int, None, "AsyncInferQueue jobs for infer_batch (default: twice the compiled model's "
                                  "OPTIMAL_NUMBER_OF_INFER_REQUESTS)", minimum=0),
    )

    def precision_hints(self, target: str, hardware: dict) -> list[dict]:
        """What the artifact recorded, then f32 and bf16 where this CPU has BF16 (without it f32 is
        the only precision the CPU plugin runs)."""
        others = [c for c in precision_candidates() if c["precision"] != "f32"]
        return [{}] + ([{"precision": "f32"}] + others if others else [])

    def assess(self, target, hardware, sub, forced, facts) -> Suitability:
        if sub != "cpu":
            try:
                present = [d.split(".")[0] for d in core().available_devices]
            except Exception as exc:
                return Suitability(None, f"{self.name}:{sub}", f"openvino failed to start: {exc}")
            if sub != "auto" and _DEVICES[sub] not in present:
                return Suitability(None, f"{self.name}:{sub}", f"no OpenVINO {_DEVICES[sub]} device here "
                                                               f"(found: {', '.join(present) or 'none'})")
            if sub == "auto" and set(present) == {"CPU"}:
                # AUTO picks among the devices present: with only the CPU it is the CPU plugin, placed as such
                return Suitability("cpu", f"{self.name}:auto", "OpenVINO AUTO requested; the only OpenVINO device "
                                                               "here is the CPU, so AUTO runs on the CPU")
            return Suitability("accelerator", f"{self.name}:{sub}", f"OpenVINO {_DEVICES[sub]} requested")
        cpu = hardware.get("cpu", {})
        x86 = str(hardware.get("machine", "")).lower() in ("x86_64", "amd64")
        if x86 and "avx2" in set(cpu.get("features") or []):
            if cpu.get("vendor") == "GenuineIntel":
                return Suitability("cpu", f"{self.name}:cpu", "Intel CPU: OpenVINO int8 is the fastest CPU path")
            return Suitability("cpu", f"{self.name}:cpu", "x86-64 CPU with AVX2: OpenVINO int8 measured faster "
                                                          "than ONNX Runtime int8 (bench/bench_openvino.py)")
        return Suitability("cpu", f"{self.name}:cpu", "OpenVINO CPU plugin on a CPU without AVX2")

    def open(self, model_path, bucket, sub, options):
        _refuse_forked_child()
        return OpenVinoSession(model_path, bucket, sub, options, options.provenance.get("why"))
