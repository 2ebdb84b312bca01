"""Ray Data actors that score with an edge-runtime artifact: ``EdgeScorer``.

::

    import ray
    from edge_runtime.ray import EdgeScorer, to_rows

    ds = ray.data.from_items(to_rows(records))           # or rows you build: {"index", "meta"}
    out = ds.map_batches(EdgeScorer, fn_constructor_kwargs={"artifact": "/shared/digits-int8"},
                         compute=ray.data.ActorPoolStrategy(size=2), num_cpus=1, batch_size=32)

One ``Runtime`` per actor, made in ``__init__``: the artifact is sha256-verified
(every file, the manifest's seal), optionally probe-verified on this node
(``verify=True``: the artifact's own probe set through the chosen path, once), and
warmed (``warm_batch``) before the first batch. The backend's threads are sized to
the CPUs Ray gave the actor (``threads`` device option: ONNX Runtime intra-op
threads, OpenVINO ``INFERENCE_NUM_THREADS`` — its THROUGHPUT hint derives streams
from it —, LiteRT ``num_threads``), because ORT sizes its pool from the machine's
cores whatever ``OMP_NUM_THREADS`` says (ray#28044).

Rows in: ``{"index": int, "meta": str}``, ``meta`` the JSON of ``{"id", "line",
"value", "error"}`` (``to_rows`` builds them from ``score_inputs.Record``s; a bytes
value travels as its base64 text with ``"b64": true`` beside it, so an input's own
``{"$b64": ...}`` object stays an object, refused as local score refuses it; ids and
values with lone surrogates as JSON escapes). Rows out: ``{"index": int, "ok": bool,
"text": str, "where": str}``, ``text`` the exact JSONL line local ``edge-infer score``
writes for that input (``{"index", "id", "line", "ok", "result" | "error"}``), ``where``
what answered it: ``"NODE:PID DEVICE verify=passed|none|off"`` (``verify=none``: the
artifact has no probe set, an imported model, so it loads unverified as ``serve`` loads
it) or ``"NODE:PID load-failed"``. A bad row, a batch the runtime refuses, a bug in a
batch: every row gets its own typed error line, nothing raises out of ``__call__``.

A node whose copy of the artifact differs never scores: when the load fails
(a file's sha256, a missing file, a broken seal: the ``ArtifactError`` names the
file) or its seal is not ``expect_seal`` (the driver's copy: ``artifact_copy_differs``,
naming ``manifest.json`` and this node), the actor stays up and answers every row
with that error, so the run ends with the failure on every line instead of a
silently different model (or a crash loop Ray would retry forever).

``import ray`` here is the real Ray (absolute imports); nothing in this module
imports it at import time.
"""

from __future__ import annotations

import base64
import json
import os
import socket
from typing import Any

from . import error_codes as ec
from .errors import ArtifactError, EdgeRuntimeError, InferenceRuntimeError, InputError

__all__ = ["EdgeScorer", "to_rows", "encode_meta", "actor_cpus"]


def _enc_value(value: Any) -> Any:
    if hasattr(value, "tolist") and not isinstance(value, (bytes, bytearray, memoryview)):
        return value.tolist()               # a numpy array (a Parquet list column)
    return value


def _dec_value(meta: dict) -> Any:
    value = meta.get("value")
    if meta.get("b64") and isinstance(value, str):
        return base64.b64decode(value)
    return value


def _dumps(obj) -> str:
    """JSON text Arrow can hold: UTF-8 as it is, a lone surrogate (an undecodable id kept by the
    readers) as its ``\\udXXX`` escape, which ``json.loads`` gives back."""
    text = json.dumps(obj, ensure_ascii=False, default=str)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(obj, ensure_ascii=True, default=str)
    return text


def encode_meta(record) -> str:
    """One input row's ``meta``: the record's id, line, value and reader error, as JSON."""
    err = None
    if record.error is not None:
        d = record.error.to_dict()
        err = {"type": d["type"], "code": d["code"], "message": d["message"]}
    value = None if err else record.value
    meta = {"id": record.id, "line": getattr(record, "line", None), "value": _enc_value(value), "error": err}
    if isinstance(value, (bytes, bytearray, memoryview)):
        meta.update(value=base64.b64encode(bytes(value)).decode("ascii"), b64=True)
    return _dumps(meta)


def to_rows(records) -> list[dict]:
    """Ray Data input rows (``{"index", "meta"}``) for ``score_inputs.Record``s."""
    return [{"index": int(r.index), "meta": encode_meta(r)} for r in records]


def actor_cpus() -> int:
    """The CPUs Ray assigned to this worker (1 at least); outside Ray, ``OMP_NUM_THREADS`` or 1."""
    try:
        import ray

        if ray.is_initialized():
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
            if cpus:
                return max(1, int(cpus))
    except Exception:     # noqa: BLE001 - sizing is best effort; 1 thread is always safe
        pass
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1


class _Rebuilt(InputError):
    """A reader's error carried as its dict (type, code, message): ``to_dict`` gives them back unchanged."""

    def __init__(self, d: dict):
        super().__init__(d.get("message", ""), code=d.get("code", ec.UNKNOWN))
        self._type = d.get("type", "EdgeRuntimeError")

    def to_dict(self) -> dict:
        return {"type": self._type, "code": self.code, "message": self.message}


class EdgeScorer:
    """A callable class for ``Dataset.map_batches`` with an actor pool (see the module doc).

    ``artifact``: the artifact folder as this node sees it (shared storage). ``expect_seal``:
    the ``manifest_sha256`` the job was started with (the driver's copy); None accepts any
    valid sealed copy. ``device``/``target``/``strict``/``device_options``: as ``load``;
    ``threads`` (default: the actor's CPUs) is added to ``device_options`` unless given.
    ``verify``: run the artifact's probe set on this node once before scoring. ``job``: the run's key
    for ``ray_poison``'s marks (a record that kills the actor every time gets a ``backend_crashed``
    line); None: blocks are only retried.
    """

    def __init__(self, artifact: str, *, expect_seal: str | None = None, device: str = "auto",
                 target: str | None = None, strict: bool = False, device_options: dict | None = None,
                 deadline_ms: int | None = None, verify: bool = True, threads: int | None = None,
                 warm: bool = True, job: str | None = None):
        from .ray_poison import open_marks

        self.node = socket.gethostname()
        self.marks = open_marks(job)
        self.deadline_ms = deadline_ms
        self.rt: Any = None
        self.load_error: EdgeRuntimeError | None = None
        self.threads = threads or actor_cpus()
        self.verified = "off"
        try:
            self.rt = self._load(artifact, device=device, target=target, strict=strict,
                                 device_options=device_options, verify=verify)
            seal = self.rt.artifact.manifest.get("manifest_sha256")
            if expect_seal is not None and seal != expect_seal:
                self.rt.close()
                self.rt = None
                raise ArtifactError(
                    f"this node's copy of the artifact ({artifact} on {self.node}) is sealed {str(seal)[:12]}…, the "
                    f"job's is {expect_seal[:12]}…: another version; not scored", file="manifest.json",
                    code=ec.ARTIFACT_COPY_DIFFERS, node=self.node, seal=seal, expected=expect_seal)
            if warm:
                self.rt.warm_batch()
        except EdgeRuntimeError as exc:
            self.load_error = exc
            if isinstance(exc, ArtifactError) and self.node not in exc.message:
                exc.message = f"{exc.message} (on node {self.node})"
        except Exception as exc:     # noqa: BLE001 - a load bug fails the rows, typed, not the job
            self.load_error = InferenceRuntimeError(f"the runtime could not load on node {self.node}: "
                                                    f"{type(exc).__name__}: {exc}", code=ec.INFERENCE_FAILED)

    def _load(self, artifact, *, device, target, strict, device_options, verify):
        from .artifact import load_artifact
        from .probe import section_of
        from .runtime import load

        if verify:
            # an artifact without a probe set (an imported model) loads unverified, as serve loads it and as
            # local score scores it: refusing every row would fail a job local score runs
            self.verified = "passed" if section_of(load_artifact(artifact, verify=False).manifest) else "none"
            verify = self.verified == "passed"
        opts = dict(device_options or {})
        sized = "threads" not in opts
        if sized:
            opts["threads"] = self.threads
        try:
            rt = load(artifact, device=device, target=target, strict=strict, device_options=opts,
                      verify=verify, tuned_for="throughput")
        except InputError as exc:    # a backend with no ``threads`` option (an accelerator): its defaults
            if not (sized and exc.code == ec.DEVICE_OPTION_UNKNOWN):
                raise
        else:
            if not (sized and rt.tune_not_applied and rt.tuned):
                return rt
            # the sizing hint alone kept the tuned path out (an accelerator measured fastest has no
            # threads option): the tuned path, with its own defaults, as the caller's options allow
            from .tune_cache import options_refused

            if options_refused(rt.tuned["decision"]["throughput"]["backend"], device_options) is not None:
                return rt
            rt.close()
        return load(artifact, device=device, target=target, strict=strict, device_options=device_options or None,
                    verify=verify, tuned_for="throughput")

    def __call__(self, batch: dict) -> dict:
        from .score import _dump
        from .score_inputs import Record

        indexes = [int(i) for i in batch["index"]]
        metas = [json.loads(m) for m in batch["meta"]]
        records = []
        for i, m in zip(indexes, metas):
            err = _Rebuilt(m["error"]) if m.get("error") else None
            records.append(Record(i, m.get("id"), None if err else _dec_value(m), err, m.get("line")))
        if self.load_error is not None:
            pairs = [(r, r.error or self.load_error) for r in records]
        else:
            from .ray_poison import score_guarded

            pairs = score_guarded(records, self._run, self.marks, node=self.node, device=self.rt.device)
        texts, oks = [], []
        for record, outcome in pairs:
            line, text = _dump(record, outcome)
            texts.append(text)
            oks.append(bool(line["ok"]))
        return {"index": indexes, "ok": oks, "text": texts, "where": [self.where()] * len(indexes)}

    def _run(self, records: list) -> list:
        from .score import _run_batch

        try:
            return _run_batch(self.rt, records, self.deadline_ms)
        except Exception as exc:    # noqa: BLE001 - never out of a batch: each row gets the failure
            fail = exc if isinstance(exc, EdgeRuntimeError) else InferenceRuntimeError(
                f"the batch failed on node {self.node}: {type(exc).__name__}: {exc}",
                device=getattr(self.rt, "device", None), code=ec.INFERENCE_FAILED)
            return [(r, r.error or fail) for r in records]

    def where(self) -> str:
        """What answers this actor's rows: ``"NODE:PID DEVICE verify=passed|none|off"``, or ``"NODE:PID
        load-failed"`` (the PID tells the actors of a node apart, and a restarted actor from the one before)."""
        if self.rt is None:
            return f"{self.node}:{os.getpid()} load-failed"
        return f"{self.node}:{os.getpid()} {self.rt.device} verify={self.verified}"

    def __del__(self):
        rt = getattr(self, "rt", None)
        if rt is not None:
            try:
                rt.close()
            except Exception:    # noqa: BLE001 - an actor going away
                pass
