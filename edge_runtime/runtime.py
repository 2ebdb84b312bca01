"""``load()`` and the ``Runtime``: verify, choose, load the buckets, fit threads, warm up.

The per-call path (limits → task.prepare → session.run → the non-finite guard →
task.finish → result) is ``runtime_call.CallPath``, which ``Runtime`` extends.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import cast

import numpy as np

from edge_runtime.devices import registry
from edge_runtime.devices.base import BatchSession, Session
from edge_runtime.models import get_task

from . import error_codes as ec
from . import hardware as hw
from . import tune_cache
from .artifact import BackgroundVerify, check_unchanged, load_artifact, variant_files, verify_files
from .errors import DeviceError, EdgeRuntimeError, exc_text
from .limits import DEFAULT_LIMITS, Limits
from .measured_here import isa_note, tuned_summary
from .metrics import RuntimeMetrics
from .records import Variant
from .runtime_call import CallPath, has_non_finite  # noqa: F401 (has_non_finite: its public home was here)
from .runtime_fork import track
from .selection import choose, for_options, session_fallback
from .runtime_options import device_options_for, quota_threads
from .runtime_tuned import not_applied, tuned_entry
from .threads_fit import fit_threads

log = logging.getLogger("edge_runtime")
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
    failed: dict[tuple[str, str], str] = {}
    first: DeviceError | None = None
    while True:
        try:
            return Runtime(path, device=device, strict=strict, target=target, limits=limits,
                           device_options=device_options, warmup=warmup, hardware=hardware, workers=workers,
                           isolate=isolate, verify=verify, tune=tune, tuned_for=tuned_for, failed=failed)
        except DeviceError as exc:
            # the chosen path would not load or warm up here (a package the Core ML loader refuses, a
            # delegate that cannot open its device): without strict, the next candidate, said as a
            # fallback, as when a backend falls back by itself; strict, or nothing left: the first error
            pair = getattr(exc, "failed_path", None)
            if first is None:
                first = exc
            if strict or pair is None or pair in failed or len(failed) >= 16:
                raise first from None
            failed[pair] = f"{pair[1]} for {pair[0]}: {exc.message}"
        except EdgeRuntimeError:
            if first is not None:   # the next candidate refused otherwise (a device option only the first takes)
                raise first from None
            raise


class Runtime(CallPath):
    """A loaded artifact on one device: ``load()`` builds it; the call path (``infer``,
    ``infer_batch``, ``metrics``) is :class:`~edge_runtime.runtime_call.CallPath`."""

    def __init__(self, path, *, device="auto", strict=False, target=None, limits=None, device_options=None,
                 warmup=True, hardware=None, workers=4, isolate=False, verify=False, tune=False,
                 tuned_for="latency", failed=None):
        t0 = time.perf_counter()
        self.artifact = load_artifact(path, verify=False)
        man = self.artifact.manifest
        self.hardware = hardware if hardware is not None else hw.detect_cached()
        self.tuned, self.tune_lookup_ms = tuned_entry(self.artifact, self.hardware, path, device, tune, tuned_for,
                                                      {"limits": limits, "workers": workers, "isolate": isolate})
        self.choice = choose(man["variants"], self.hardware, device=device, strict=strict, target=target,
                             measured=tune_cache.measured_choice(self.tuned, tuned_for), failed=failed)
        self.tune_not_applied: str | None = None
        if self.choice.decided_by == "measurement" and self.tuned is not None:
            # a tune never turns a load that worked into an error: options of the caller's that the
            # measured path's backend refuses (precision=bf16 of OpenVINO, a measured tflite) keep
            # the static policy for this load, as before the tune, and info()["tuned"] says why
            refused = tune_cache.options_refused(self.choice.backend_name, device_options)
            if refused is not None:
                self.tune_not_applied = not_applied(self.tuned, tuned_for, device_options, refused)
                self.choice = choose(man["variants"], self.hardware, device=device, strict=strict, target=target,
                                     failed=failed)
        # the measured path runs with the options it was measured with, under the caller's own keys
        # ({} from a CLI without --device-option, or Ray's threads, kept the measured precision out)
        if self.choice.decided_by == "measurement" and self.tuned is not None:
            decided = self.tuned["decision"][tuned_for]
            tuned_opts = dict(decided["device_options"])
            if tuned_opts and not set(tuned_opts) & set(device_options or {}):
                # the measured options are the tune's, not the caller's: their provenance says so (an
                # OpenVINO precision chosen by tune read "requested", as if the caller had asked for it)
                tuned_opts["why"] = f"measured here by tune: {decided['why']}"
            device_options = {**tuned_opts, **(device_options or {})} or None
        if failed:      # load() is trying the next candidate: the ones that failed here say why
            self.choice = self.choice.replace(fallback="; ".join(
                [f"{w}; tried the next candidate" for w in failed.values()] + [self.choice.fallback or ""]).strip("; "))
        backend = registry.get_backend(self.choice.backend_name)
        # validated before anything is read or built: the caller's options (an unknown key or a bad
        # value is an InputError naming the valid ones) over the ones the converter measured and recorded
        self.device_options, self.runtime_provenance, self.recorded_options_ignored = \
            device_options_for(backend, self.choice.variant, device_options)
        # placed for the device the options make (Core ML's compute_units), not the device string's
        self.choice = for_options(self.choice, backend, self.hardware, self.device_options)
        self.threads_from_quota = quota_threads(self.hardware, backend, self.device_options, self.choice)
        if self.threads_from_quota:
            self.device_options = {**self.device_options, "threads": self.threads_from_quota["threads"]}
        if self.tune_not_applied:      # logged once the static path took the options (else the error says it)
            msg = f"{self.artifact.root}: {self.tune_not_applied}"
            if msg not in _logged_fallbacks:
                _logged_fallbacks.add(msg)
                log.warning(msg)
        # verify what this process will run (the chosen variant's files and the shared ones:
        # tokenizer, labels) before any of it is read; the other variants' files are hashed
        # on a thread while the device loads and warms up, and load() refuses the artifact
        # if any of them is corrupt too: an artifact is one snapshot
        t_verify = time.perf_counter()
        self.verified_files = variant_files(man, self.choice.variant)
        stamps = verify_files(self.artifact, self.verified_files)
        self.verify_ms = (time.perf_counter() - t_verify) * 1000
        rest = BackgroundVerify(self.artifact, [f for f in man["files"] if f not in set(self.verified_files)])
        self.variant = cast(Variant, self.choice.variant)
        task = get_task(man.task)
        self.limits: Limits = DEFAULT_LIMITS.merged(task.default_limits, source="manifest") \
            .merged(man.get("limits"), source="manifest").merged(limits)
        self.task = task(man, self.artifact.read_bytes, self.variant.buckets)
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
                    raise DeviceError(f"{self.choice.backend_name} could not load {bucket['file']}: {exc_text(exc)}",
                                      code=ec.DEVICE_LOAD_FAILED) from exc
                why = registry.not_a_session(sess)
                if why is not None:         # the device seam's protocol (README: How to add a backend)
                    raise DeviceError(f"{self.choice.backend_name} could not load {bucket['file']}: its load gave "
                                      f"{why}", code=ec.DEVICE_LOAD_FAILED)
                self._sessions.append(sess)
            dropped = session_fallback(self.choice, self._sessions, strict)   # DeviceError under strict
        except BaseException as exc:
            self._close_sessions()
            self._mark_failed_path(exc)
            raise
        # how each bucket's session is driven, read once: (inline, cancellable) per bucket
        self.capabilities = [s.capabilities for s in self._sessions]
        self._drive = [(c.inline, c.cancellable) for c in self.capabilities]
        self._batched = all(c.batched for c in self.capabilities)
        self.device = self._sessions[0].device
        # where each bucket's session runs: a result names its own bucket's (one bucket's session may
        # have fallen back alone: TensorRT refusing one shape, say), not the first session's
        self._bucket_devices = [s.device for s in self._sessions]
        self._bucket_names = [b.name for b in self.variant.buckets]
        self._outputs_checked = [False] * len(self._sessions)
        if dropped:     # the choice is a record: what the sessions said makes a new one
            self.choice = self.choice.replace(fallback="; ".join(
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
        self._workers = workers
        self._pool = None       # the worker pool of non-inline sessions, made on their first call
        self._closed = False
        self._lock = threading.Lock()
        track(self)             # refused in a process forked from this one (runtime_call: no per-call cost)
        self.warmup_ms: dict[str, float] = {}
        self.threads_fit: dict | None = None
        try:
            if warmup:
                # with verify, the probe set's first call runs the whole path (decoders, tokenizer) at
                # load anyway: the task's warm-up sample would be one more call of the same
                self._warm_up(pipeline=not verify)
                if not isolate:         # a sub-millisecond model on one thread, if that is as fast (threads_fit)
                    self.threads_fit = fit_threads(self, backend, lambda b, opts: backend.load(
                        self.artifact.path(b.file), b, sub, opts, **extra))
                    if self.threads_from_quota:     # "the default" is the quota's count here
                        self.threads_fit = {**self.threads_fit, "default_threads": self.threads_from_quota}
                    if self.threads_fit.get("threads"):       # new sessions: their capabilities, read once
                        self.capabilities = [s.capabilities for s in self._sessions]
                        self._drive = [(c.inline, c.cancellable) for c in self.capabilities]
                        self._batched = all(c.batched for c in self.capabilities)
                self._metrics.reset()       # the warm-up call is not traffic
            self.other_files_verify_ms = rest.wait()     # ArtifactError if another variant is corrupt
            # every file is loaded now: one changed since its hash (edited in place, replaced) ran unverified
            check_unchanged(self.artifact, {**stamps, **rest.stamps})
        except BaseException as exc:
            self.close()
            self._mark_failed_path(exc)
            raise
        # every file of the artifact is now hashed: the chosen variant's before it loaded, the rest meanwhile
        self.artifact = self.artifact.replace(verified=True, verify_ms=self.verify_ms)
        self.isa = isa_note(man, self.hardware, self.device, self.variant.target, dict(self.device_options))
        self.verified_here: dict | None = None
        if verify:
            self._verify_here()
        self.load_ms = (time.perf_counter() - t0) * 1000

    def _mark_failed_path(self, exc: BaseException) -> None:
        """A device's failure to load or warm up names the path that failed (``load`` tries the next)."""
        # not a fallback after loading (strict's refusal), nor a backend broken in this process (OpenVINO in
        # a child forked after it compiled: the way out is spawn, said by the error, never another backend)
        if isinstance(exc, DeviceError) and exc.code not in (ec.DEVICE_FELL_BACK, ec.DEVICE_BACKEND_BROKEN):
            exc.failed_path = (self.variant.target, self.choice.backend_name)  # type: ignore[attr-defined]

    def _verify_here(self) -> None:
        from .verify import refuse, verify_runtime

        try:
            row = verify_runtime(self)
        except BaseException:
            self.close()
            raise
        self.verified_here = row
        self._metrics.reset()                   # the probe calls are not traffic
        if "pipeline" not in self.warmup_ms and row.get("first_ms") is not None:
            self.warmup_ms["pipeline"] = row["first_ms"]      # the verify's first call warmed the path
        tune_cache.remember_verify(self.artifact.manifest.get("manifest_sha256"), self.hardware, row)
        self.isa = isa_note(self.artifact.manifest, self.hardware, self.device, self.variant.target,
                            dict(self.device_options))
        if row["passed"] is False:
            self.close()
            raise refuse(row)

    # -- lifecycle ---------------------------------------------------------
    def _warm_up(self, pipeline: bool = True):
        """Every bucket's first call, and the whole path once (decoder/tokenizer first-use costs stay
        out of infer()). The task's warm-up sample goes first: the bucket it ran needs no separate
        device call (one call less at load: 5.5 ms of MobileNetV2 on LiteRT here), its time is that
        bucket's first call. A failing sample is only a warning; every bucket then gets its device
        call, whose failure is the ``DeviceError``."""
        done: set[int] = set()
        sample = self.task.warmup_sample() if pipeline else None
        if sample is not None:
            t0 = time.perf_counter()
            bucket = None
            try:
                bucket = self.infer(sample).bucket
            except EdgeRuntimeError as exc:
                if exc.code == ec.OUTPUT_CONTRACT_MISMATCH:     # the device's, not the sample's: refused now
                    raise
                log.warning("pre/post-processing warm-up failed: %s", exc.message)
            self.warmup_ms["pipeline"] = round((time.perf_counter() - t0) * 1000, 3)
            if bucket is not None:          # that call was its bucket's first
                done.add(self._bucket_names.index(bucket))
                self.warmup_ms[bucket] = self.warmup_ms["pipeline"]
        for k, (sess, bucket) in enumerate(zip(self._sessions, self.variant.buckets)):
            if k in done:
                continue
            feeds = {t.name: np.ones(t.shape, dtype=t.dtype) for t in bucket.inputs}
            t0 = time.perf_counter()
            try:
                outputs = sess.run(feeds)
            except Exception as exc:
                raise DeviceError(f"warm-up of bucket {bucket['name']} failed on {self.device}: {exc_text(exc)}",
                                  code=ec.DEVICE_WARMUP_FAILED) from exc
            self.check_outputs(outputs, k)
            self.warmup_ms[bucket.name] = round((time.perf_counter() - t0) * 1000, 3)

    def warm_batch(self) -> dict[str, float]:
        """Get the batch path ready before a long ``infer_batch`` job (``edge-infer
        score``): sessions with a separate throughput path (OpenVINO's THROUGHPUT
        model) compile and warm it now rather than inside the first batch. Not part
        of ``load()``: an ``infer()``-only app should not pay for it. Returns ms per bucket."""
        if self._forked is not None:        # the parent's sessions: OpenVINO's queue blocks in a child
            raise self._closed_error()
        out = {}
        for sess, bucket, caps in zip(self._sessions, self.variant.buckets, self.capabilities):
            if caps.batch_warmup:
                t0 = time.perf_counter()
                try:
                    cast(BatchSession, sess).prepare_many()    # batch_warmup declares the batch protocol
                except Exception as exc:
                    raise DeviceError(f"batch-path warm-up of bucket {bucket['name']} failed on {self.device}: "
                                      f"{exc_text(exc)}", code=ec.DEVICE_WARMUP_FAILED) from exc
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
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._close_sessions()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

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
            "device_options": dict(self.device_options),        # copies: a caller's edit is not the runtime's
            "runtime_provenance": dict(self.runtime_provenance),
            "threads_from_quota": self.threads_from_quota,      # the CPU quota's thread count, when it set one
            "recorded_options_ignored": list(self.recorded_options_ignored),
            "capabilities": [c.fields_dict() for c in self.capabilities],
            "quantization": self.variant.quantization,
            "parity": self.variant.parity,
            "limits": self.limits.to_dict(),
            "verify_ms": round(self.verify_ms, 3),
            "verified_files": len(self.verified_files),
            "other_files_verify_ms": round(self.other_files_verify_ms, 3),
            "load_ms": round(self.load_ms, 3),
            "warmup_ms": dict(self.warmup_ms),
            "isa": self.isa,
            "verified_here": self.verified_here,
            "tuned": {**(tuned_summary(self.tuned, self.choice) or {}), "not_applied": self.tune_not_applied}
            if self.tuned else None,
            "threads_fit": self.threads_fit,
        }
