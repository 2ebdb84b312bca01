"""``load()`` and the ``Runtime``: verify, choose, warm up, serve ``infer()``.

Hot path per call: limits → task.prepare → session.run (on a worker thread,
bounded by the deadline) → task.finish → result. Nothing else.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import cast

import numpy as np

from edge_runtime.devices import registry
from edge_runtime.devices.base import PROVENANCE_KEYS, BatchSession, Session, SessionCrashed
from edge_runtime.models import get_task

from . import hardware as hw
from . import tune as tuning
from .artifact import BackgroundVerify, load_artifact, variant_files, verify_files
from . import error_codes as ec
from .errors import (ArtifactError, DeviceError, EdgeRuntimeError, InferenceRuntimeError, InferenceTimeout,
                     InputError)
from .batch_path import run_grouped
from .threads_fit import fit_threads
from .limits import DEFAULT_LIMITS, Limits
from .records import Manifest, Variant
from .measured_here import isa_note, tuned_summary
from .metrics import RuntimeMetrics
from .result import InferenceResult, new_trace_id
from .selection import choose, session_fallback
from .watchdog import WATCHDOG

log = logging.getLogger("edge_runtime")
_SMALL = 256      # outputs up to this many values are checked for NaN/inf in Python
_logged_fallbacks: set[str] = set()


def load(path, device: str = "auto", *, strict: bool = False, target: str | None = None,
         limits: dict | None = None, device_options: dict | None = None, warmup: bool = True,
         hardware: dict | None = None, workers: int = 4, isolate: bool = False, verify: bool = False,
         tune: bool = False, tuned_for: str = "latency") -> "Runtime":
    """Verify the artifact, pick variant and device, load every bucket, warm up.

    ``isolate=True`` runs the backend in a child process (``edge_runtime.isolate``):
    a native crash becomes an ``InferenceRuntimeError`` and the worker restarts.
    ``verify=True`` runs the artifact's probe set on the chosen path once loaded and
    refuses (``ParityError``) a device that breaks the parity budget here. With
    ``device="auto"`` a cached tune decision for this artifact on this machine
    (``edge_runtime.tune``) picks the path; ``tune=True`` measures one first when
    there is none; ``tuned_for`` is ``"latency"`` (``infer``) or ``"throughput"``.
    """
    return Runtime(path, device=device, strict=strict, target=target, limits=limits,
                   device_options=device_options, warmup=warmup, hardware=hardware, workers=workers,
                   isolate=isolate, verify=verify, tune=tune, tuned_for=tuned_for)


class Runtime:
    def __init__(self, path, *, device="auto", strict=False, target=None, limits=None, device_options=None,
                 warmup=True, hardware=None, workers=4, isolate=False, verify=False, tune=False,
                 tuned_for="latency"):
        t0 = time.perf_counter()
        self.artifact = load_artifact(path, verify=False)
        man = self.artifact.manifest
        self.hardware = hardware if hardware is not None else hw.detect_cached()
        self.tuned = self._tuned(path, device, tune, tuned_for, limits, workers, isolate)
        self.choice = choose(man["variants"], self.hardware, device=device, strict=strict, target=target,
                             measured=tuning.measured_choice(self.tuned, tuned_for))
        if self.choice.decided_by == "measurement" and device_options is None and self.tuned is not None:
            device_options = dict(self.tuned["decision"][tuned_for]["device_options"]) or None
        backend = registry.get_backend(self.choice.backend_name)
        # validated before anything is read or built: the caller's options (an unknown key or a bad
        # value is an InputError naming the valid ones) over the ones the converter measured and recorded
        self.device_options, self.runtime_provenance, self.recorded_options_ignored = \
            device_options_for(backend, self.choice.variant, device_options)
        # verify what this process will run (the chosen variant's files and the shared ones:
        # tokenizer, labels) before any of it is read; the other variants' files are hashed
        # on a thread while the device loads and warms up, and load() refuses the artifact
        # if any of them is corrupt too: an artifact is one snapshot
        t_verify = time.perf_counter()
        self.verified_files = variant_files(man, self.choice.variant)
        verify_files(self.artifact, self.verified_files)
        self.verify_ms = (time.perf_counter() - t_verify) * 1000
        rest = BackgroundVerify(self.artifact, [f for f in man["files"] if f not in set(self.verified_files)])
        self.variant = cast(Variant, self.choice.variant)
        self.limits: Limits = DEFAULT_LIMITS.merged(man.get("limits"), source="manifest").merged(limits)
        self.task = get_task(man.task)(man, self.artifact.read_bytes, self.variant.buckets)
        self._nonfinite_ok = self.task.allows_nonfinite_outputs      # the guard in _finish, read once
        sub = self.choice.suitability.device.partition(":")[2] or None
        self._sessions: list[Session] = []
        self.isolated = bool(isolate)
        try:
            if isolate:
                from .isolate import IsolatedWorker

                worker = IsolatedWorker(self.choice.backend_name,
                                        [(str(self.artifact.path(b.file)), b) for b in self.variant.buckets],
                                        sub, dict(self.device_options), dict(self.runtime_provenance))
                self._sessions.extend(worker.sessions())
            extra = {"provenance": dict(self.runtime_provenance)} if self.runtime_provenance else {}
            for bucket in ([] if isolate else self.variant.buckets):
                try:
                    sess = backend.load(self.artifact.path(bucket.file), bucket, sub, dict(self.device_options),
                                        **extra)
                except EdgeRuntimeError:
                    raise
                except Exception as exc:
                    raise DeviceError(f"{self.choice.backend_name} could not load {bucket['file']}: {exc}",
                                      code=ec.DEVICE_LOAD_FAILED) from exc
                self._sessions.append(sess)
            dropped = session_fallback(self.choice, self._sessions, strict)   # DeviceError under strict
        except BaseException:
            self._close_sessions()
            raise
        # how each bucket's session is driven, read once: (inline, cancellable) per bucket
        self.capabilities = [s.capabilities for s in self._sessions]
        self._drive = [(c.inline, c.cancellable) for c in self.capabilities]
        self._batched = all(c.batched for c in self.capabilities)
        self.device = self._sessions[0].device
        self._bucket_names = [b.name for b in self.variant.buckets]
        if dropped:     # the choice is a record: what the sessions said makes a new one
            self.choice = dataclasses.replace(self.choice, fallback="; ".join(
                x for x in (self.choice.fallback, dropped) if x))
        if self.choice.fallback:
            msg = f"{self.artifact.root}: {self.choice.fallback}; using {self.device}"
            if msg not in _logged_fallbacks:
                _logged_fallbacks.add(msg)
                log.warning(msg)
        self._metrics = RuntimeMetrics({"model": self.artifact.name, "version": self.artifact.version,
                                        "task": man.task, "target": self.variant.target, "device": self.device})
        if self.choice.fallback:
            self._metrics.fallback(self.choice.fallback)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="edge-infer")
        self._closed = False
        self._lock = threading.Lock()
        self.warmup_ms: dict[str, float] = {}
        self.threads_fit: dict | None = None
        try:
            if warmup:
                self._warm_up()
                if not isolate:         # a sub-millisecond model on one thread, if that is as fast (threads_fit)
                    self.threads_fit = fit_threads(self, backend, lambda b, opts: backend.load(
                        self.artifact.path(b.file), b, sub, opts, **extra))
                    if self.threads_fit.get("threads"):       # new sessions: their capabilities, read once
                        self.capabilities = [s.capabilities for s in self._sessions]
                        self._drive = [(c.inline, c.cancellable) for c in self.capabilities]
                        self._batched = all(c.batched for c in self.capabilities)
                self._metrics.reset()       # the warm-up call is not traffic
            self.other_files_verify_ms = rest.wait()     # ArtifactError if another variant is corrupt
        except BaseException:
            self.close()
            raise
        # every file of the artifact is now hashed: the chosen variant's before it loaded, the rest meanwhile
        self.artifact = dataclasses.replace(self.artifact, verified=True, verify_ms=self.verify_ms)
        self.isa = isa_note(man, self.hardware, self.device)
        self.verified_here: dict | None = None
        if verify:
            self._verify_here()
        self.load_ms = (time.perf_counter() - t0) * 1000

    def _tuned(self, path, device, tune, tuned_for, limits, workers, isolate) -> dict | None:
        """The cached tune decision for ``auto`` (measured now when ``tune`` and there is none)."""
        if tuned_for not in tuning.PURPOSES:
            raise InputError(f"tuned_for must be one of {', '.join(tuning.PURPOSES)}, got {tuned_for!r}",
                             code=ec.LIMIT_INVALID)
        if device not in (None, "auto"):
            return None
        t = time.perf_counter()
        entry = tuning.lookup(self.artifact.manifest.get("manifest_sha256"), self.hardware)
        if entry is None and tune:
            entry = tuning.tune(path, hardware=self.hardware, load_kw={"limits": limits, "workers": workers,
                                                                        "isolate": isolate})
        self.tune_lookup_ms = (time.perf_counter() - t) * 1000
        return entry

    def _verify_here(self) -> None:
        from .verify import refuse, verify_runtime

        try:
            row = verify_runtime(self)
        except BaseException:
            self.close()
            raise
        self.verified_here = row
        tuning.remember_verify(self.artifact.manifest.get("manifest_sha256"), self.hardware, row)
        self.isa = isa_note(self.artifact.manifest, self.hardware, self.device)
        if row["passed"] is False:
            self.close()
            raise refuse(row)

    # -- lifecycle ---------------------------------------------------------
    def _warm_up(self):
        for sess, bucket in zip(self._sessions, self.variant.buckets):
            feeds = {t.name: np.ones(t.shape, dtype=t.dtype) for t in bucket.inputs}
            t0 = time.perf_counter()
            try:
                sess.run(feeds)
            except Exception as exc:
                raise DeviceError(f"warm-up of bucket {bucket['name']} failed on {self.device}: {exc}",
                                  code=ec.DEVICE_WARMUP_FAILED) from exc
            self.warmup_ms[bucket.name] = round((time.perf_counter() - t0) * 1000, 3)
        sample = self.task.warmup_sample()
        if sample is not None:  # the whole path once: decoder/tokenizer first-use costs stay out of infer()
            t0 = time.perf_counter()
            try:
                self.infer(sample)
            except EdgeRuntimeError as exc:
                log.warning("pre/post-processing warm-up failed: %s", exc.message)
            self.warmup_ms["pipeline"] = round((time.perf_counter() - t0) * 1000, 3)

    def warm_batch(self) -> dict[str, float]:
        """Get the batch path ready before a long ``infer_batch`` job (``edge-infer
        score``): sessions with a separate throughput path (OpenVINO's THROUGHPUT
        model) compile and warm it now rather than inside the first batch. Not part
        of ``load()``: an ``infer()``-only app should not pay for it. Returns ms per bucket."""
        out = {}
        for sess, bucket, caps in zip(self._sessions, self.variant.buckets, self.capabilities):
            if caps.batch_warmup:
                t0 = time.perf_counter()
                try:
                    cast(BatchSession, sess).prepare_many()    # batch_warmup declares the batch protocol
                except Exception as exc:
                    raise DeviceError(f"batch-path warm-up of bucket {bucket['name']} failed on {self.device}: "
                                      f"{exc}", code=ec.DEVICE_WARMUP_FAILED) from exc
                out[bucket.name] = round((time.perf_counter() - t0) * 1000, 3)
        self.warmup_ms.update({f"batch:{k}": v for k, v in out.items()})
        return out

    def _close_sessions(self):
        for sess in getattr(self, "_sessions", []):
            try:
                sess.close()
            except Exception:  # closing must never raise
                log.debug("session close failed", exc_info=True)
        self._sessions = []

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._close_sessions()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- serving -----------------------------------------------------------
    def infer(self, raw, *, deadline_ms: int | None = None, limits: dict | None = None,
              trace_id: str | None = None, options: dict | None = None) -> InferenceResult:
        """One result for ``raw``. ``options`` are the task's per-call settings (``Task.call_options``:
        a detector's thresholds), checked against the limits; a task without any refuses them."""
        t0 = time.perf_counter()
        lim = self.limits if limits is None else self.limits.merged(limits)
        try:
            deadline = lim.deadline_ms if deadline_ms is None else _positive(deadline_ms)
            opts = None if options is None else self._options(options, lim)
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
        deadline = lim.deadline_ms if deadline_ms is None else _positive(deadline_ms)
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
        if self._closed:
            raise InferenceRuntimeError("runtime is closed", code=ec.RUNTIME_CLOSED, device=self.device,
                                        variant=self.variant.target)
        prepared = self._prepare(raw, lim, opts)
        k = prepared.bucket
        sess = self._sessions[k]
        remaining = t_end - time.perf_counter()
        if remaining <= 0:
            raise InferenceTimeout(f"deadline of {deadline} ms passed before the device call",
                                   code=ec.INFERENCE_TIMEOUT, deadline_ms=deadline)
        inline, cancellable = self._drive[k]
        if inline:
            outputs = self._run_inline(sess, prepared, t_end, deadline, cancellable)
        else:
            outputs = self._run_pooled(sess, prepared, remaining, deadline, cancellable)
        return self._result(self._finish(outputs, prepared), prepared, t0, trace_id)

    def _prepare(self, raw, lim: Limits, opts: dict | None = None):
        size = self.task.request_bytes(raw)
        if size > lim.max_request_bytes:
            raise InputError(f"request is {size} bytes, over the limit of {lim.max_request_bytes}",
                             code=ec.INPUT_TOO_LARGE, limit=lim.max_request_bytes)
        try:
            prepared = self.task.prepare(raw, lim)
            if opts:
                prepared.meta = {**(prepared.meta or {}), "options": opts}
            return prepared
        except EdgeRuntimeError:
            raise
        except Exception as exc:  # a task bug or an exotic input must still be typed
            raise InputError(f"input could not be prepared: {type(exc).__name__}: {exc}",
                             code=ec.INPUT_INVALID) from exc

    def _result(self, res, prepared, t0, trace_id) -> InferenceResult:
        return InferenceResult._make({
            "prediction": res.prediction, "scores": res.scores, "embedding": res.embedding,
            "latency_ms": (time.perf_counter() - t0) * 1000, "device": self.device, "target": self.variant.target,
            "model": self.artifact.name, "version": self.artifact.version, "trace_id": trace_id or new_trace_id(),
            "bucket": self._bucket_names[prepared.bucket], "truncated": prepared.truncated,
            "input_length": prepared.length, "outputs": res.outputs, "class_id": res.class_id, "top_k": res.top_k,
            "raw_outputs": res.raw_outputs, "detections": res.detections, "keypoints": res.keypoints,
        })

    def _finish(self, outputs, prepared):
        if not self._nonfinite_ok:
            self._check_finite(outputs, prepared)
        try:
            return self.task.finish(outputs, prepared)
        except Exception as exc:
            raise InferenceRuntimeError(f"post-processing failed: {type(exc).__name__}: {exc}",
                                        device=self.device, variant=self.variant.target) from exc

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
        return InferenceRuntimeError(f"{self.device} failed on {self.variant['target']} bucket "
                                     f"{self.variant['buckets'][prepared.bucket]['name']}: {type(exc).__name__}: {exc}",
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
            future = self._pool.submit(sess.run, prepared.feeds, token)
        except RuntimeError as exc:  # pool shut down by a concurrent close()
            if entry is not None:
                WATCHDOG.disarm(entry)
            raise InferenceRuntimeError(f"runtime is closed: {exc}", code=ec.RUNTIME_CLOSED, device=self.device,
                                        variant=self.variant.target) from None
        try:
            return future.result(timeout=remaining)
        except FutureTimeout:
            future.cancel()
            if token is not None:
                token.fire()
            raise self._timeout(deadline) from None
        except Exception as exc:
            raise self._fail(exc, prepared) from exc
        finally:
            if entry is not None:
                WATCHDOG.disarm(entry)

    # -- introspection -----------------------------------------------------
    def info(self) -> dict:
        man = self.artifact.manifest
        return {
            "artifact": str(Path(self.artifact.root).resolve()),
            "model": man.name,
            "version": man["model"]["version"],
            "task": man.task,
            "target": self.variant.target,
            "backend": self.choice.backend_name,
            "isolated": self.isolated,
            "device": self.device,
            "device_reason": self.choice.suitability.reason,
            "device_policy": self.choice.suitability.policy,
            "decided_by": self.choice.decided_by,
            "fallback": self.choice.fallback,
            "candidates": self.choice.candidates,
            "buckets": [{"name": b.name, "inputs": b.inputs, "outputs": b.outputs}
                        for b in self.variant.buckets],
            "sessions": [s.info() for s in self._sessions],
            "device_options": self.device_options,
            "runtime_provenance": self.runtime_provenance,
            "recorded_options_ignored": self.recorded_options_ignored,
            "capabilities": [dataclasses.asdict(c) for c in self.capabilities],
            "quantization": self.variant.quantization,
            "parity": self.variant.parity,
            "limits": self.limits.to_dict(),
            "verify_ms": round(self.verify_ms, 3),
            "verified_files": len(self.verified_files),
            "other_files_verify_ms": round(self.other_files_verify_ms, 3),
            "load_ms": round(self.load_ms, 3),
            "warmup_ms": self.warmup_ms,
            "isa": self.isa,
            "verified_here": self.verified_here,
            "tuned": tuned_summary(self.tuned, self.choice),
            "threads_fit": self.threads_fit,
        }


def device_options_for(backend, variant: dict, caller: dict | None) -> tuple[dict, dict, list[str]]:
    """(options, provenance, recorded keys ignored) for ``backend``: the options the converter
    recorded in the variant (``runtime``) under the caller's, both validated against the
    backend's declarations; the caller's mistakes are an ``InputError`` naming the valid
    options, a bad recorded value an ``ArtifactError``. Provenance (why the converter chose
    them) is kept apart and dropped when the caller overrides a recorded option; a recorded
    option this backend does not declare (another backend of the target's) is ignored, and
    listed."""
    from edge_runtime.devices.base import resolve_options

    recorded = dict(variant.get("runtime") or {})
    provenance = {k: recorded.pop(k) for k in PROVENANCE_KEYS if k in recorded}
    declared = {o.name for o in backend.options}
    ignored = sorted(k for k in recorded if k not in declared)
    try:
        rec = resolve_options(backend.options, {k: v for k, v in recorded.items() if k in declared},
                              backend.name).given
    except InputError as exc:
        raise ArtifactError(f"the variant's recorded runtime options: {exc.message}", file="manifest.json",
                            code=ec.MANIFEST_FIELD_INVALID) from None
    given = resolve_options(backend.options, caller, backend.name)
    if set(given.given) & set(rec):
        provenance = {}                      # the caller overrides the recorded choice
    provenance.update(given.provenance)      # a caller's "why" is a note too, never an option
    return {**rec, **given.given}, provenance, ignored


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


def _positive(ms) -> float:
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not ms > 0 or ms != ms:
        raise InputError(f"deadline_ms must be a positive number, got {ms!r}", code=ec.LIMIT_INVALID)
    return ms
