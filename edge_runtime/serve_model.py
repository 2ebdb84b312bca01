"""The models of ``edge-infer serve`` (``serve_core``): where they are (a model repository's
artifacts), whether they load verified (a probe set), each one's state while serving (``_Model``,
with the requests queued for its next dynamic batch, ``_Job``) and its KServe v2 metadata."""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import error_codes as ec
from .errors import InputError
from .serve_inline import Inline
from .serve_tensors import ServedOutputs, io_metadata, served_outputs

log = logging.getLogger("edge_runtime.serve")


def artifacts_in(repository: str | Path) -> list[Path]:
    """The artifact directories of a model repository: each direct subfolder holding a manifest.json."""
    root = Path(repository)
    if not root.is_dir():
        raise InputError(f"model repository {root} is not a directory", code=ec.INPUT_MISSING)
    found = sorted(p for p in root.iterdir() if (p / "manifest.json").is_file())
    # said, never skipped in silence: a Triton-style name/1/manifest.json layout, a half-copied artifact
    skipped = sorted(p.name + "/" for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
                     and p not in found)
    if skipped:
        logging.getLogger("edge_runtime.serve").warning(
            "model repository %s: %d subfolder(s) without a manifest.json not served: %s", root, len(skipped),
            ", ".join(skipped[:10]) + (" ..." if len(skipped) > 10 else ""))
    if not found:
        raise InputError(f"model repository {root} holds no artifact (a subfolder with a manifest.json)",
                         code=ec.INPUT_MISSING)
    return found


_NUMERIC_VERSION = re.compile(r"[0-9]+(\.[0-9]+)*")


def latest_versions(models: dict) -> dict[str, str]:
    """Each model name's version that a request naming no version gets: the highest, versions ordered
    as numbers (``10`` after ``9``, ``1.10`` after ``1.9``), as Triton's default version policy has it,
    whatever order the artifacts loaded in; ``""`` where a name has several versions and one of them
    is not a number, or two are the same number (``1``, ``01``): no version is the latest, such a
    request must name one. Sets each model's
    metadata ``versions`` to every version of its name served here, in that order."""
    by_name: dict[str, list[str]] = {}
    for name, version in models:
        by_name.setdefault(name, []).append(version)
    latest: dict[str, str] = {}
    for name, versions in by_name.items():
        keys = {v: tuple(int(p) for p in v.split(".")) for v in versions if _NUMERIC_VERSION.fullmatch(v)}
        if len(keys) == len(versions) and len(set(keys.values())) == len(versions):   # not 1 and 01
            versions.sort(key=keys.__getitem__)
            latest[name] = versions[-1]
        else:
            versions.sort()
            latest[name] = versions[0] if len(versions) == 1 else ""
        for v in versions:
            models[(name, v)].metadata["versions"] = list(versions)
    return latest


def _has_probe_set(path: Path) -> bool:
    """Imported artifacts carry no probe set: they load unverified here (``edge-infer verify`` says why)."""
    from .artifact import load_artifact
    from .probe import section_of

    if section_of(load_artifact(path, verify=False).manifest) is not None:
        return True
    log.warning("%s has no probe set (imported): served without the parity check on this machine", path)
    return False


@dataclass
class _Job:
    items: list
    future: asyncio.Future
    t_end: float                      # perf_counter deadline
    nbytes: int = 0                   # the items' size as the runtime counts it (task.request_bytes)
    started: bool = False             # its batch took it (no longer queued)


@dataclass
class _Model:
    rt: Any
    name: str
    version: str
    kind: str
    inputs: list[dict]
    batched: bool
    metadata: dict = field(default_factory=dict)
    running: int = 0
    waiting: int = 0
    sem: asyncio.Semaphore | None = None
    pending: list[_Job] = field(default_factory=list)
    flush_handle: asyncio.TimerHandle | None = None
    batches_out: int = 0              # dynamic batches flushed and not finished
    inline: Inline | None = None      # sub-millisecond models run on the event loop (serve_inline)
    outputs: ServedOutputs | None = None   # what its answers hold, from its task (serve_tensors.served_outputs)

    def runs_inline(self, items: list, largest: list[int] | None = None) -> bool:
        """Whether this request runs on the event loop: few enough items, none much larger than the sample
        its call time was measured on (``Inline.admits``). ``largest``: the request's own cache of its
        largest item's ``request_bytes`` (empty until first needed): a request is asked up to three
        times on its way (``_run``, ``_alone``, ``_call``), its items measured once."""
        inl = self.inline
        if inl is None or not inl.admits(len(items)):
            return False
        if largest is None or not largest:
            size = int(max(map(self.rt.task.request_bytes, items), default=0))
            if largest is None:
                return inl.admits(len(items), size)
            largest.append(size)
        return inl.admits(len(items), largest[0])


def _metadata(m: _Model) -> dict:
    """The model's v2 metadata; sets ``m.outputs``. Both come from its task and manifest (the task
    kind, classes, top-k, an embedding's width, a tensors model's declared outputs), never from a
    sample's result: a sample showed one image's answer (a detector's boxes or none, one mask's size)."""
    m.outputs = served_outputs(m.rt.task, m.rt.limits)
    inputs, outputs = io_metadata(m.kind, m.inputs, m.outputs)
    m.rt.reset_metrics()             # the load's own calls (batch warm-up, inline timing) are not traffic
    return {"name": m.name, "versions": [m.version], "platform": f"edge-runtime_{m.rt.variant.target}",
            "inputs": inputs, "outputs": outputs}


def served_input_specs(rt) -> list[dict]:
    """The model's inputs as a client sends them (metadata and request decoding): the first bucket's
    specs, but a converted artifact's quantized ``tensors`` input (``tflite-int8``, ``edgetpu``) takes
    real values that the task quantizes (``Tensors.real_inputs``): FP32, not the INT8 of its codes."""
    specs = [dict(s) for s in rt.variant.buckets[0]["inputs"]]
    if getattr(rt.task, "real_inputs", False):
        for s in specs:
            if s.get("quantization"):
                s["dtype"] = "float32"
    return specs
