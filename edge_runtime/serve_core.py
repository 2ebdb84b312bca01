"""The server core of ``edge-infer serve``, protocol-neutral.

``serve_http`` and ``serve_grpc`` turn their wire format into an
:class:`~edge_runtime.serve_types.InferRequest` and call :meth:`ServeCore.infer`;
everything else happens here, once for both protocols:

- models: every artifact is loaded, verified on this machine (its probe set)
  and warmed before ``ready`` turns true; name and version come from the manifest
  (each model's record and metadata: ``serve_model``);
- limits: the runtime's own (items, bytes, text length, pixels) through
  ``rt.infer`` for a one-item request and ``rt.infer_batch`` for more; the deadline is the request's ``timeout`` parameter
  (microseconds, as Triton's clients send it) capped by the artifact's
  ``deadline_ms``, and the time spent queued counts against it;
- backpressure: per model at most ``max_in_flight`` requests run and at most
  ``max_queue`` wait; beyond that a request is refused at once
  (``overloaded``: HTTP 429, gRPC RESOURCE_EXHAUSTED), never queued unbounded;
- dynamic batching: for backends with a batch path (``capabilities.batched``:
  OpenVINO's AsyncInferQueue) a request to an idle model runs at once; while a
  batch runs, requests arriving within ``batch_delay_ms`` of the first waiting
  one are merged into ``infer_batch`` calls the runtime accepts whole (at most
  ``max_batch_items``, the runtime's item and byte limits), each request keeping
  its own deadline (the ``DynamicBatching`` mixin of ``serve_batch``);
- model calls run on a thread pool, except a sub-millisecond model's (measured at
  load), which runs on the event loop: the hand-off would cost more than the
  call (``serve_inline``: slow inline calls move the model to the pool, a long
  run of fast pool calls brings it back). Such a request skips dynamic
  batching too: digits on OpenVINO over HTTP, p50 1.54 ms batched vs 1.22
  inline, the same 0.9-1.0k requests/s at concurrency 16 (2-core Xeon,
  2026-12-05);
- errors: the runtime's typed errors map to a status (``STATUS_OF``), the code
  passes through.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from . import error_codes as ec
from .errors import EdgeRuntimeError, InferenceTimeout, InputError
from .serve_batch import DynamicBatching
from .serve_inline import INLINE_DEMOTE_MS, Inline, machine_paused, measure_call_ms, thread_usage
from .serve_model import _Model, _has_probe_set, _metadata, latest_versions, served_input_specs
from .serve_model import artifacts_in as artifacts_in          # re-exported: its old import path
# what a request's errors and parameters become (serve_error re-exported: its old import path)
from .serve_request import _REJECTION, call_options, serve_error as serve_error
from .serve_tensors import bad, request_items, response_outputs
from .serve_types import InferRequest, InferResponse, ServeError

log = logging.getLogger("edge_runtime.serve")

SERVER_NAME = "edge-runtime"
EXTENSIONS = ["binary_tensor_data", "classification", "model_repository_metadata_only", "statistics_prometheus"]
class ServeCore(DynamicBatching):
    def __init__(self, artifacts: list[str | Path], *, device: str = "auto", strict: bool = False,
                 device_options: dict | None = None,
                 max_in_flight: int = 4, max_queue: int = 64, batch_delay_ms: float = 1.0,
                 max_body_bytes: int = 8 * 1024 * 1024, max_batch_items: int = 32, verify: bool = True,
                 inline: bool = True):
        if not artifacts:
            raise InputError("serve needs at least one artifact", code=ec.INPUT_MISSING)
        for what, v in (("max_in_flight", max_in_flight), ("max_queue", max_queue),
                        ("max_body_bytes", max_body_bytes), ("max_batch_items", max_batch_items)):
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if what == "max_queue" else 1):
                raise InputError(f"{what} must be a positive integer, got {v!r}", code=ec.INPUT_INVALID)
        if not batch_delay_ms >= 0 or math.isinf(batch_delay_ms):
            raise InputError(f"batch_delay_ms must be >= 0, got {batch_delay_ms!r}", code=ec.INPUT_INVALID)
        self.artifacts = [Path(a) for a in artifacts]
        self.device, self.device_options, self.verify, self.inline = device, device_options, verify, inline
        self.strict = strict        # --require-device: a device that cannot run is exit 4, never a fallback
        self.max_in_flight, self.max_queue = max_in_flight, max_queue
        self.batch_delay_s = batch_delay_ms / 1000
        self.max_body_bytes, self.max_batch_items = max_body_bytes, max_batch_items
        self.models: dict[tuple[str, str], _Model] = {}
        self._latest: dict[str, str] = {}
        self._pool = ThreadPoolExecutor(max_workers=max_in_flight * len(self.artifacts) + 1,
                                        thread_name_prefix="edge-serve")
        self._lock = threading.Lock()
        self._ready = False
        self._draining = False
        self._closed = False
        self._active = 0
        self._idle: asyncio.Event | None = None
        self._tasks: set[asyncio.Task] = set()
        self._requests: Counter = Counter()        # (model, status) -> n
        self._rejections: Counter = Counter()      # reason -> n
        self._batches = 0
        self._batched_requests = 0
        self._received_bytes = 0
        self.accepted = 0                          # requests that reached infer()
        self.answered = 0                          # ... and got a response or a ServeError back
        self.cancelled = 0                         # ... or whose caller went away first
        self.load_s: float | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def load_all(self) -> None:
        """Load, verify (the probe set on this machine) and warm every artifact; then ready."""
        import edge_runtime as er

        t0 = time.perf_counter()
        try:
            for path in self.artifacts:
                try:
                    rt = er.load(path, device=self.device, strict=self.strict, device_options=self.device_options,
                                 verify=self.verify and _has_probe_set(path))
                except EdgeRuntimeError as exc:
                    _name_the_artifact(exc, path)     # which of the artifacts (or repository folders)
                    raise
                key = (rt.artifact.name, str(rt.artifact.version))
                if key in self.models:
                    rt.close()
                    raise InputError(f"two artifacts serve {key[0]} version {key[1]}: {path} and "
                                     f"{self.models[key].rt.artifact.root}", code=ec.INPUT_INVALID)
                batched = all(c.batched for c in rt.capabilities)
                if batched and self.batch_delay_s > 0:
                    rt.warm_batch()
                m = _Model(rt, key[0], key[1], rt.task.input_kind, served_input_specs(rt), batched)
                if self.inline:        # batched too: a sub-ms call inline beats any batch (see _run)
                    sample = rt.task.warmup_sample()
                    m.inline = Inline(measure_call_ms(rt), 0 if sample is None else rt.task.request_bytes(sample))
                m.metadata = _metadata(m)
                self.models[key] = m
            self._latest = latest_versions(self.models)
        except BaseException:
            self.close()
            raise
        self.load_s = time.perf_counter() - t0
        self._ready = not self._draining

    @property
    def loading(self) -> bool:
        """True until ``load_all`` has loaded every artifact (and the server is not closed)."""
        return self.load_s is None and not self._closed

    @property
    def live(self) -> bool:
        return not self._closed

    @property
    def ready(self) -> bool:
        return self._ready and not self._draining and not self._closed

    async def drain(self, timeout_s: float) -> None:
        """Readiness false, refuse new requests (``unavailable``), wait for the in-flight ones (bounded)."""
        self._draining = True
        self._ready = False
        if self._active == 0:
            return
        self._idle = self._idle or asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except asyncio.TimeoutError:
            log.warning("drain: %d request(s) still running after %.1f s", self._active, timeout_s)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._ready = False
        for m in self.models.values():
            m.rt.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- metadata ----------------------------------------------------------------------------
    def _model(self, name: str, version: str | None) -> _Model:
        if version in (None, ""):
            version = self._latest.get(name)
            if version == "":             # several versions that do not order as numbers: none is latest
                raise ServeError("bad_request", f"model {name!r} has versions " + ", ".join(
                    sorted(v for n, v in self.models if n == name)) + " that do not order as numbers: "
                    "name the version (/versions/{v}, model_version)", ec.SERVE_REQUEST_MALFORMED)
        m = self.models.get((name, str(version)))
        if m is None and self.loading:
            # the artifacts' names are known only once each one is in: until then any name may
            # still come (HTTP 503, like infer), never a 404 that a client would take as final
            raise ServeError("unavailable", f"model {name!r}" + (f" version {version!r}" if version else "")
                             + " is not ready: the models are loading", ec.SERVE_NOT_READY)
        if m is None:
            known = sorted(f"{n}/{v}" for n, v in self.models)
            raise ServeError("not_found", f"no model {name!r}" + (f" version {version!r}" if version else "")
                             + (f" (serving: {', '.join(known)})" if known else ""),
                             ec.SERVE_MODEL_NOT_FOUND)
        return m

    def model_ready(self, name: str, version: str | None) -> bool:
        """False while loading (whatever the name: it may still come) or draining; a name
        unknown once every artifact is in raises ``not_found``."""
        if self.loading:
            return False
        self._model(name, version)
        return self.ready

    def server_metadata(self) -> dict:
        from . import __version__

        return {"name": SERVER_NAME, "version": str(__version__), "extensions": list(EXTENSIONS)}

    def model_metadata(self, name: str, version: str | None) -> dict:
        return dict(self._model(name, version).metadata)

    # -- inference ---------------------------------------------------------------------------
    async def infer(self, req: InferRequest) -> InferResponse:
        """The response to ``req``, or a ``ServeError`` (every refusal and failure)."""
        self.accepted += 1
        try:
            resp = await self._infer(req)
        except ServeError:
            self.answered += 1
            raise
        except asyncio.CancelledError:
            self.cancelled += 1                   # the caller left before its answer; not lost by us
            raise
        self.answered += 1
        return resp

    async def _infer(self, req: InferRequest) -> InferResponse:
        t0 = time.perf_counter()
        name = ""                 # a metrics label: only a model we serve, never a name a client made up
        self._received_bytes += int(req.received_bytes or 0)
        try:
            name = self._metric_model(req.model, req.version)    # a refusal of a served name counts under it
            if not self.ready:
                raise ServeError("unavailable", "the server is draining" if self._draining else
                                 "the server is not ready (models are loading)", ec.SERVE_NOT_READY)
            m = self._model(req.model, req.version)
            name = m.name
            deadline_ms = self._deadline_ms(m, req.parameters)
            options = call_options(req.parameters)
            items = request_items(m.kind, m.inputs, req)
            if req.outputs and len(set(req.outputs)) != len(req.outputs):   # as Triton: its parameters would clash
                raise bad(f"output(s) {', '.join(sorted({repr(o) for o in req.outputs if req.outputs.count(o) > 1}))} "
                          "requested twice")
            if req.classification and m.outputs is not None:
                m.outputs.check_classification(req.classification)
            # a batched model runs up to max_batch_items requests per slot
            running_cap = self.max_in_flight * (self.max_batch_items if self._batches_on(m) else 1)
            if m.running + m.waiting >= running_cap + self.max_queue:
                raise ServeError("overloaded", f"model {m.name} has {m.running} request(s) running and {m.waiting} "
                                 f"queued (bounds {running_cap} + {self.max_queue}); retry later",
                                 ec.SERVE_OVERLOADED)
            self._enter()
            try:
                results = await self._run(m, items, t0 + deadline_ms / 1000, options)
            finally:
                self._leave()
            errors = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
            if errors:
                i, first = errors[0]
                raise serve_error(first, f"item {i}: " if len(results) > 1 else "")
            resp = self._response(m, req, results, t0)
        except asyncio.CancelledError:          # not an error of the request: the caller is gone
            self._requests[(name, "cancelled")] += 1
            raise
        except BaseException as exc:
            err = serve_error(exc)
            reason = _REJECTION.get(err.code)
            if reason is not None:
                self.count_rejection(reason)
            self._requests[(name, err.status)] += 1
            raise err from (None if exc is err else exc)
        self._requests[(name, "ok")] += 1
        return resp

    def _deadline_ms(self, m: _Model, params: dict) -> float:
        limit = float(m.rt.limits.deadline_ms)
        timeout = params.get("timeout")
        if timeout is None:
            return limit
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0 \
                or not math.isfinite(timeout):
            raise bad(f"parameter 'timeout' must be a positive number of microseconds, got {timeout!r}")
        return min(limit, timeout / 1000)

    def _enter(self) -> None:
        self._active += 1

    def _leave(self) -> None:
        self._active -= 1
        if self._active == 0 and self._idle is not None:
            self._idle.set()

    async def _run(self, m: _Model, items: list, t_end: float, options: dict | None) -> list:
        if m.sem is None:
            m.sem = asyncio.Semaphore(self.max_in_flight)
        largest: list[int] = []          # the items measured once for every inline check (runs_inline)
        if self._batches_on(m) and options is None and len(items) < self.max_batch_items and \
                not m.runs_inline(items, largest):
            return await self._batched(m, items, t_end, largest)
        return await self._alone(m, items, t_end, options, largest)    # its own slot, within its own deadline

    def _batches_on(self, m: _Model) -> bool:
        return m.batched and self.batch_delay_s > 0

    async def _call(self, m: _Model, items: list, t_end: float, options: dict | None,
                    largest: list[int] | None = None) -> list:
        remaining_ms = (t_end - time.perf_counter()) * 1000
        if remaining_ms <= 0:
            raise InferenceTimeout("the request's deadline passed while it was queued", code=ec.INFERENCE_TIMEOUT)
        inline = m.inline
        if inline is not None and m.runs_inline(items, largest):
            usage = thread_usage()
            t = time.perf_counter()
            try:
                return _infer_items(m.rt, items, remaining_ms, options)
            finally:
                ms = (time.perf_counter() - t) * 1000
                inline.observe(ms, m.name, ms > INLINE_DEMOTE_MS and machine_paused(usage))
        loop = asyncio.get_running_loop()
        t = time.perf_counter()
        fut = loop.run_in_executor(self._pool, _infer_items, m.rt, items, remaining_ms, options)
        try:
            results = await asyncio.shield(fut)
            if m.inline is not None and m.inline.demotions and not m.inline.on:   # fast again: back to the loop
                m.inline.observe_pooled((time.perf_counter() - t) * 1000 / len(items), m.name)
            return results
        except asyncio.CancelledError:
            # the caller went away (a gRPC deadline, a closed connection): the model thread still runs,
            # to its deadline at most, so its slot stays held until it returns; then the cancel goes on
            await asyncio.wait([fut])
            raise

    def _response(self, m: _Model, req: InferRequest, results: list, t0: float) -> InferResponse:
        params: dict[str, Any] = {
            "model_version": m.version, "device": results[0].device, "target": results[0].target,
            "trace_id": ",".join(r.trace_id for r in results),
            "truncated": any(r.truncated for r in results),
            "latency_ms": round((time.perf_counter() - t0) * 1000, 3),
        }
        outputs = response_outputs(results, req.outputs or None, m.outputs, req.classification)
        return InferResponse(m.name, m.version, outputs,
                             id=req.id, parameters=params)

    # -- metrics -----------------------------------------------------------------------------
    def count_rejection(self, reason: str) -> None:
        self._rejections[reason] += 1

    def count_refused(self, model: str, version: str | None, status: str, received_bytes: int) -> None:
        """An inference request a front end answered without calling ``infer`` (unauthorized, a body
        too large, late, cut off or malformed): counted once, as ``infer`` counts its own, in
        ``edge_serve_requests_total`` with its status (the model's label only for a model served here)
        and its bytes received in ``edge_serve_received_bytes_total``."""
        self._requests[(self._metric_model(model, version), status)] += 1
        self._received_bytes += int(received_bytes)

    def recount(self, model: str, version: str | None, status: str) -> None:
        """A request the core answered (counted ``ok``) whose answer its front end could not send
        (HTTP JSON cannot carry a BYTES element that is not UTF-8): counted under ``status`` instead.
        Called with no await since ``infer`` returned: no scrape saw the ``ok``, no counter goes down."""
        name = self._metric_model(model, version)
        key = (name, "ok")
        self._requests[key] -= 1
        if self._requests[key] <= 0:
            del self._requests[key]
        self._requests[(name, status)] += 1

    def _metric_model(self, model: str, version: str | None) -> str:
        """The ``model`` label of a request for ``model`` (``version``), as every refusal counts it, in
        the front ends and the core alike: the name when that version is served here, or, for a request
        naming no version, when the name is (a 400 for a name whose versions do not order as numbers
        counts under it); ``""`` for any other name, so a client cannot add labels by making names up."""
        known = (model, str(version)) in self.models if version else model in self._latest
        return model if known else ""

    def metrics_text(self) -> str:
        """Prometheus text: ``rt.metrics()`` of every model, then the server's counters (``serve_metrics``)."""
        from .serve_metrics import metrics_text

        return metrics_text(self)


def _name_the_artifact(exc: EdgeRuntimeError, path: Path) -> None:
    """Prefix a load error's message with the artifact's folder, unless it names it already."""
    if str(path) not in exc.message:
        exc.message = f"{path}: {exc.message}"
        exc.args = (exc.message,) + exc.args[1:]


def _infer_items(rt, items: list, deadline_ms: float, options: dict | None) -> list:
    """One result or typed error per item: ``rt.infer`` for one item (the same limits, metrics and
    errors as ``infer_batch`` of one, without the batch's bookkeeping), ``rt.infer_batch`` for more."""
    if len(items) == 1:
        try:
            return [rt.infer(items[0], deadline_ms=deadline_ms, options=options)]
        except EdgeRuntimeError as exc:
            return [exc]
    return rt.infer_batch(items, deadline_ms=deadline_ms, options=options)
