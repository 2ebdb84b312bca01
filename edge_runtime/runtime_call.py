"""The per-call path of a ``Runtime``: ``infer``, ``infer_batch`` and what each call runs.

limits → task.prepare → session.run (inline with the watchdog, or on the worker pool, bounded by the
deadline) → the non-finite guard → task.finish → result and metrics. ``Runtime`` (``runtime.py``) loads,
verifies, chooses and warms up, then serves through these methods; nothing here runs at load but the warm-up call.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from edge_runtime.devices.base import SessionCrashed

from . import error_codes as ec
from .batch_path import run_grouped
from .errors import ArtifactError, EdgeRuntimeError, InferenceRuntimeError, InferenceTimeout, InputError, exc_text
from .limits import Limits, deadline_value
from .metrics import RuntimeMetrics
from .output_contract import output_problems
from .result import InferenceResult, check_trace_id, new_trace_id
from .watchdog import WATCHDOG

_SMALL = 256      # outputs up to this many values are checked for NaN/inf in Python


class CallPath:
    """The call path's methods; ``Runtime`` sets these attributes at load."""

    limits: Limits
    task: Any
    artifact: Any
    variant: Any
    device: str
    _sessions: list
    _drive: list[tuple[bool, bool]]
    _batched: bool
    _bucket_names: list[str]
    _nonfinite_ok: bool
    _metrics: RuntimeMetrics
    _pool: Any      # concurrent.futures.ThreadPoolExecutor once a non-inline session has run
    _workers: int
    _closed: bool
    _lock: Any
    _forked: tuple[int, int] | None = None   # (pid that loaded it, this pid) in a forked child: refused here
    _loaded_pid: int = 0
    _consts: tuple | None = None     # (target, model, version) of every result, read on the first
    _bucket_devices: list[str]       # the device each bucket's session runs on (a result names its own)
    _outputs_checked: list[bool]     # per bucket: its outputs were checked against the manifest (output_contract)

    def infer(self, raw, *, deadline_ms: int | None = None, limits: dict | None = None,
              trace_id: str | None = None, options: dict | None = None) -> InferenceResult:
        """One result for ``raw``. ``options`` are the task's per-call settings (``Task.call_options``:
        a detector's thresholds), checked against the limits; a task without any refuses them."""
        t0 = time.perf_counter()
        try:
            lim = self.limits if limits is None else self.limits.merged(limits)    # a refusal is counted too
            deadline = lim.deadline_ms if deadline_ms is None else deadline_value(deadline_ms)
            opts = None if options is None else self._options(options, lim)
            if trace_id is not None:
                trace_id = check_trace_id(trace_id)
            res = self._infer_one(raw, lim, t0, t0 + deadline / 1000, deadline, trace_id, opts)
            self._metrics.ok(res.bucket, res.latency_ms, res.input_length, res.truncated)
            return res
        except EdgeRuntimeError as exc:
            self._metrics.error(exc)
            raise

    def _observe(self, res):
        if isinstance(res, EdgeRuntimeError):
            self._metrics.error(res)
        else:
            self._metrics.ok(res.bucket, res.latency_ms, res.input_length, res.truncated)
        return res

    def metrics(self) -> dict:
        """Latency histograms per bucket, input lengths, error counts, fallbacks (a snapshot);
        ``edge_runtime.metrics.prometheus_text(rt.metrics())`` renders it for a scrape."""
        return self._metrics.snapshot()

    def reset_metrics(self) -> None:
        """Forget the calls so far (calls that were not traffic: a server's own timing calls)."""
        self._metrics.reset()

    def _options(self, options, lim: Limits) -> dict | None:
        if options is None:
            return None
        if not isinstance(options, dict):
            raise InputError(f"options must be a dict, not {type(options).__name__}", code=ec.INPUT_WRONG_TYPE)
        return self.task.check_call_options(options, lim) if options else None

    def infer_batch(self, items, *, deadline_ms: int | None = None, limits: dict | None = None,
                    options: dict | None = None) -> list:
        """One ``InferenceResult`` or ``EdgeRuntimeError`` per item, in input order.

        The batch as a whole is checked first (item count, total size); the
        deadline applies to each item. Backends whose sessions run many
        requests at once (``run_many``: OpenVINO's THROUGHPUT queue) get the
        whole batch, bounded by ``deadline × items`` per bucket group.
        """
        try:
            results = self._batch(items, deadline_ms, limits, options)
        except EdgeRuntimeError as exc:       # the batch as a whole was refused
            self._metrics.error(exc)
            raise
        return [self._observe(r) for r in results]

    def _batch(self, items, deadline_ms, limits, options=None) -> list:
        if self._closed:        # the whole batch, on every backend (not one error per item on some)
            raise self._closed_error()
        lim = self.limits if limits is None else self.limits.merged(limits)
        opts = self._options(options, lim)
        if isinstance(items, np.ndarray) and items.ndim > 0:
            items = list(items)                  # a stacked array: one item per leading index
        if not isinstance(items, (list, tuple)):
            raise InputError(f"infer_batch takes a list of inputs, not {type(items).__name__}",
                             code=ec.INPUT_WRONG_TYPE)
        if len(items) > lim.max_batch_items:
            raise InputError(f"batch has {len(items)} items, over the limit of {lim.max_batch_items}",
                             code=ec.INPUT_BATCH_TOO_LARGE, limit=lim.max_batch_items)
        total = sum(self.task.request_bytes(x) for x in items)
        if total > lim.max_request_bytes:
            raise InputError(f"batch is {total} bytes, over the request limit of {lim.max_request_bytes}",
                             code=ec.INPUT_TOO_LARGE, limit=lim.max_request_bytes)
        deadline = lim.deadline_ms if deadline_ms is None else deadline_value(deadline_ms)
        if len(items) > 1 and self._batched:
            return run_grouped(self, list(items), lim, deadline, opts)
        out = []
        for raw in items:
            t0 = time.perf_counter()
            try:
                out.append(self._infer_one(raw, lim, t0, t0 + deadline / 1000, deadline, None, opts))
            except EdgeRuntimeError as exc:
                out.append(exc)
        return out

    def _infer_one(self, raw, lim: Limits, t0: float, t_end: float, deadline: float, trace_id, opts=None):
        out, prepared = self._task_output(raw, lim, t_end, deadline, opts)
        return self._result(out, prepared, t0, trace_id)

    def _task_output(self, raw, lim: Limits, t_end: float, deadline: float, opts=None):
        """(the task's ``TaskOutput``, the ``Prepared``) of one input: prepare, the device call, finish."""
        if self._closed:
            raise self._closed_error()
        prepared = self._prepare(raw, lim, opts)
        k = prepared.bucket
        try:
            sess = self._sessions[k]
        except IndexError as exc:   # close() emptied the list after the check above (no lock per call)
            raise self._fail(exc, prepared) from None       # runtime_closed
        try:
            remaining = t_end - time.perf_counter()
            if remaining <= 0:
                raise InferenceTimeout(f"deadline of {deadline} ms passed before the device call",
                                       code=ec.INFERENCE_TIMEOUT, deadline_ms=deadline)
            inline, cancellable = self._drive[k]
            if inline:
                outputs = self._run_inline(sess, prepared, t_end, deadline, cancellable)
            else:
                outputs = self._run_pooled(sess, prepared, remaining, deadline, cancellable)
            if type(outputs) is not dict and not isinstance(outputs, Mapping):     # a plugin session's bug
                raise self._fail(TypeError(f"run returned {type(outputs).__name__}, not outputs by name"), prepared)
            return self._finish(outputs, prepared), prepared
        except EdgeRuntimeError:
            # prepared, then failed on the device or after it: its length still feeds the drift histogram
            # (a long input that times out is the drift worth seeing); a try costs nothing when nothing raises
            self._metrics.length(prepared.length)
            raise

    def _probe_call(self, raw):
        """``infer(raw)`` for a probe sample (verify, tune): ``(result, task output)``. Parity compares the
        task's own output, which holds what a result leaves out (a detector's ``near_detections``: boxes
        just under the score threshold, so that a score drifting across it is not a different answer)."""
        t0 = time.perf_counter()
        lim, deadline = self.limits, self.limits.deadline_ms
        try:
            out, prepared = self._task_output(raw, lim, t0 + deadline / 1000, deadline)
            res = self._result(out, prepared, t0, None)
            self._metrics.ok(res.bucket, res.latency_ms, res.input_length, res.truncated)
            return res, out
        except EdgeRuntimeError as exc:
            self._metrics.error(exc)
            raise

    def _closed_error(self) -> InferenceRuntimeError:
        forked = self._forked
        if forked is not None:
            return InferenceRuntimeError(
                f"this runtime was loaded in process {forked[0]} and called in forked child {forked[1]}: a runtime "
                "does not survive fork() (the backend's native threads and the isolated worker's pipe stay with "
                "the parent): load the artifact in the child (er.load after the fork), or start children with "
                "multiprocessing's 'spawn' or 'forkserver'", code=ec.RUNTIME_CLOSED, device=self.device,
                variant=self.variant.target, loaded_in_pid=forked[0], pid=forked[1])
        return InferenceRuntimeError("runtime is closed", code=ec.RUNTIME_CLOSED, device=self.device,
                                     variant=self.variant.target)

    def _prepare(self, raw, lim: Limits, opts: dict | None = None):
        size = self.task.request_bytes(raw)        # infer()'s path: no call beyond the task's own
        if size > lim.max_request_bytes:
            raise _too_big(size, lim)
        try:
            prepared = self.task.prepare(raw, lim)
        except EdgeRuntimeError:
            raise
        except Exception as exc:  # a task bug or an exotic input must still be typed
            raise _typed(exc) from exc
        return _with_options(prepared, opts) if opts else prepared

    def _prepare_batch(self, raws: list, lim: Limits, opts: dict | None = None) -> list:
        """``_prepare`` of each input (a ``Prepared`` or its ``EdgeRuntimeError``), the task's
        ``prepare_batch`` doing the inputs within the size limit at once."""
        sizes = [self.task.request_bytes(raw) for raw in raws]
        out: list = [_too_big(n, lim) if n > lim.max_request_bytes else None for n in sizes]
        todo = [i for i, e in enumerate(out) if e is None]
        try:
            done = self.task.prepare_batch([raws[i] for i in todo], lim)
        except Exception as exc:        # a task bug in its batch path: every input gets the error
            done = [exc] * len(todo)
        for i, p in zip(todo, done):
            out[i] = _typed(p) if isinstance(p, Exception) else _with_options(p, opts) if opts else p
        return out

    def _result(self, res, prepared, t0, trace_id) -> InferenceResult:
        consts = self._consts
        if consts is None:      # read once: the variant and model are fixed once sessions load
            consts = self._consts = (self.variant.target, self.artifact.name, self.artifact.version)
        target, model, version = consts
        return InferenceResult._make({
            "prediction": res.prediction, "scores": res.scores, "embedding": res.embedding,
            "latency_ms": (time.perf_counter() - t0) * 1000, "device": self._bucket_devices[prepared.bucket],
            "target": target,
            "model": model, "version": version, "trace_id": new_trace_id() if trace_id is None else trace_id,
            "bucket": self._bucket_names[prepared.bucket], "truncated": prepared.truncated,
            "input_length": prepared.length, "outputs": res.outputs, "class_id": res.class_id, "top_k": res.top_k,
            "raw_outputs": res.raw_outputs, "detections": res.detections, "keypoints": res.keypoints,
        })

    def _finish(self, outputs, prepared):
        if not self._outputs_checked[prepared.bucket]:      # the bucket's first outputs: one flag test after
            self.check_outputs(outputs, prepared.bucket)
        if not self._nonfinite_ok:
            self._check_finite(outputs, prepared)
        try:
            return self.task.finish(outputs, prepared)
        except EdgeRuntimeError:
            # the task's own typed refusal (a class id past the labels: the artifact's, exit 3) keeps its layer
            # and code; before 2026-12-07 it reached the caller as our inference_failed
            raise
        except Exception as exc:
            raise InferenceRuntimeError(f"post-processing failed: {exc_text(exc, typed=True)}",
                                        device=self.device, variant=self.variant.target) from exc

    def check_outputs(self, outputs, bucket: int) -> None:
        """``ArtifactError`` (``output_contract_mismatch``) when a bucket's outputs are not the manifest's
        (``output_contract``): every answer would be read wrongly; checked once per bucket."""
        spec = self.variant["buckets"][bucket]
        problems = output_problems(outputs, spec["outputs"])
        if problems:
            raise ArtifactError(f"{self.device} returned outputs for {self.variant.target} bucket {spec['name']} "
                                f"that are not the manifest's: {'; '.join(problems)}", file=spec["file"],
                                code=ec.OUTPUT_CONTRACT_MISMATCH)
        self._outputs_checked[bucket] = True

    def _check_finite(self, outputs, prepared) -> None:
        """A float output holding NaN or infinity is a failure of this device, never a result (a broken
        driver, a miscompiled kernel); integer (quantized) outputs cannot hold one and are not scanned."""
        for name, arr in outputs.items():
            if has_non_finite(arr):
                bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
                raise InferenceRuntimeError(
                    f"{self.device} returned {bad} non-finite value(s) (NaN or infinity) in output {name!r} of "
                    f"bucket {self.variant['buckets'][prepared.bucket]['name']}", code=ec.NON_FINITE_OUTPUT,
                    device=self.device, variant=self.variant.target, output=name)

    def _fail(self, exc, prepared):
        if self._closed:    # closed under the call: its session's objects are gone (SessionClosed, or whatever
            return self._closed_error()     # a half-released session raised); the failure is the close's
        return InferenceRuntimeError(f"{self.device} failed on {self.variant['target']} bucket "
                                     f"{self.variant['buckets'][prepared.bucket]['name']}: {exc_text(exc, typed=True)}",
                                     device=self.device, variant=self.variant.target,
                                     code=ec.BACKEND_CRASHED if isinstance(exc, SessionCrashed) else None)

    def _timeout(self, deadline):
        return InferenceTimeout(f"{self.device} did not answer within the {deadline} ms deadline",
                                code=ec.INFERENCE_TIMEOUT, deadline_ms=deadline, device=self.device)

    def _late(self, deadline):
        return InferenceTimeout(f"{self.device} answered after the {deadline} ms deadline",
                                code=ec.INFERENCE_TIMEOUT, deadline_ms=deadline, device=self.device)

    def _run_inline(self, sess, prepared, t_end, deadline, cancellable):
        if not cancellable:      # runs to the end in this thread; a late answer is a timeout, never a result
            try:
                outputs = sess.run(prepared.feeds)
            except Exception as exc:
                raise self._fail(exc, prepared) from exc
            if time.perf_counter() > t_end:
                raise self._late(deadline)
            return outputs
        token, entry = WATCHDOG.arm(t_end)
        try:
            outputs = sess.run(prepared.feeds, cancel=token)
            if token.fired:   # finished, but after the deadline (a session that could not stop in time)
                raise self._late(deadline)
            return outputs
        except InferenceTimeout:
            raise
        except Exception as exc:
            if token.fired:
                raise self._timeout(deadline) from None
            raise self._fail(exc, prepared) from exc
        finally:
            WATCHDOG.disarm(entry)

    def _run_pooled(self, sess, prepared, remaining, deadline, cancellable):
        token = entry = None
        if cancellable:          # the call returns at the deadline and the token stops the native work
            token, entry = WATCHDOG.arm(time.perf_counter() + remaining)
        try:
            future = self._executor().submit(sess.run, prepared.feeds, token)
        except RuntimeError as exc:  # pool shut down by a concurrent close()
            if entry is not None:
                WATCHDOG.disarm(entry)
            raise InferenceRuntimeError(f"runtime is closed: {exc}", code=ec.RUNTIME_CLOSED, device=self.device,
                                        variant=self.variant.target) from None
        try:
            return future.result(timeout=remaining)
        except TimeoutError:        # concurrent.futures.TimeoutError is this builtin since 3.11
            future.cancel()
            if token is not None:
                token.fire()
            raise self._timeout(deadline) from None
        except Exception as exc:
            raise self._fail(exc, prepared) from exc
        finally:
            if entry is not None:
                WATCHDOG.disarm(entry)


    def _executor(self):
        """The worker pool, made on the first pooled call (CPU sessions run inline: most runtimes
        never need it, and ``concurrent.futures`` cost 3.6 ms of every process start, 2-core AMD
        EPYC with AVX-512 VNNI). After ``close()`` it is a shut-down pool, whose ``submit`` raises ``RuntimeError``."""
        pool = self._pool
        if pool is None:
            from concurrent.futures import ThreadPoolExecutor

            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="edge-infer")
                    if self._closed:
                        self._pool.shutdown(wait=False)
                pool = self._pool
        return pool


def _too_big(size: int, lim: Limits) -> InputError:
    return InputError(f"request is {size} bytes, over the limit of {lim.max_request_bytes}",
                      code=ec.INPUT_TOO_LARGE, limit=lim.max_request_bytes)


def _with_options(prepared, opts: dict):
    prepared.meta = {**(prepared.meta or {}), "options": opts}
    return prepared


def _typed(exc: Exception) -> EdgeRuntimeError:
    """A preparation failure as a typed error: a task bug or an exotic input is an ``InputError``."""
    if isinstance(exc, EdgeRuntimeError):
        return exc
    err = InputError(f"input could not be prepared: {exc_text(exc, typed=True)}", code=ec.INPUT_INVALID)
    err.__cause__ = exc
    return err


def has_non_finite(arr) -> bool:
    """True when a float (or complex) array holds a NaN or an infinity. A sum is NaN or infinite
    whenever an element is (one reduction, no boolean array); when it is, the exact scan decides
    (a sum of large finite values may overflow). Up to ``_SMALL`` values (a classifier's scores)
    Python sums them (exact float64 of float32/16 values): 0.5 µs where numpy's sum takes 2.7."""
    dtype = getattr(arr, "dtype", None)
    if dtype is None or dtype.kind not in "fc":
        return False
    if arr.size <= _SMALL and dtype.kind == "f":
        if math.isfinite(sum(arr.ravel().tolist())):
            return False
    else:
        with np.errstate(over="ignore", invalid="ignore"):       # an overflowing sum is not news
            if np.isfinite(arr.sum()):
                return False
    return not bool(np.isfinite(arr).all())
