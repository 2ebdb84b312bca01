"""The device seam's protocol: what the runtime relies on and nothing else.

The facts a backend reports (``Suitability``, ``cannot``), how a session may be driven
(``Capabilities``), ``SessionCrashed``, and the ``Session``, ``BatchSession`` and ``Backend``
protocols. The seam as a whole is described in :mod:`.base`, which re-exports all of these.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Protocol, runtime_checkable

import numpy as np

from edge_runtime.value import Frozen

from .options import Option


# -- facts -----------------------------------------------------------------------
class Suitability(Frozen):
    """A backend's facts about one target on this hardware (and device, when asked for one).

    ``tier`` names the kind of path it would use ("accelerator", "gpu", "cpu", ...; None:
    cannot run here). The backend never ranks itself: ``score`` and ``policy`` are filled in
    by the policy table in ``edge_runtime.selection`` (0: cannot run, higher is better)."""

    tier: str | None
    device: str         # the concrete device it would use, e.g. "onnxruntime:cpu"
    reason: str         # why (shown in rt.info(), fallbacks, `edge-infer devices`)
    score: int
    policy: str | None

    def __init__(self, tier: str | None, device: str, reason: str, score: int = 0, policy: str | None = None) -> None:
        d = self.__dict__
        d["tier"], d["device"], d["reason"], d["score"], d["policy"] = tier, device, reason, score, policy

    @property
    def ok(self) -> bool:
        return self.tier is not None


def cannot(device: str, reason: str) -> Suitability:
    return Suitability(None, device, reason)


class Capabilities(Frozen):
    """How the runtime may drive a session; read once, when the session is loaded."""

    inline: bool        # run() may be called in the caller's thread (else the runtime's worker pool)
    cancellable: bool   # run(feeds, cancel=token) stops a running call when the token fires
    batched: bool       # run_many()/prepare_many() exist (the BatchSession protocol)
    batch_warmup: bool  # prepare_many() is worth calling before a batch job (a separate compile)

    def __init__(self, inline: bool = False, cancellable: bool = False, batched: bool = False,
                 batch_warmup: bool = False) -> None:
        d = self.__dict__
        d["inline"], d["cancellable"], d["batched"], d["batch_warmup"] = inline, cancellable, batched, batch_warmup


class SessionCrashed(RuntimeError):
    """The process that ran the backend died during a call (a native crash)."""


# -- the protocol ----------------------------------------------------------------
@runtime_checkable
class Session(Protocol):
    device: str
    capabilities: Capabilities
    fallback: str | None

    def run(self, feeds: Mapping[str, np.ndarray], cancel=None) -> dict[str, np.ndarray]: ...

    def info(self) -> dict: ...

    def close(self) -> None: ...


@runtime_checkable
class BatchSession(Protocol):
    def run_many(self, feeds_list: list, timeout_s: float | None = None) -> list: ...

    def prepare_many(self) -> None: ...


@runtime_checkable
class Backend(Protocol):
    name: str
    family: str
    targets: tuple[str, ...]
    options: tuple[Option, ...]

    def suitability(self, target: str, hardware: dict, device: str | None = None) -> Suitability: ...

    def load(self, model_path: Path, bucket: dict, device: str | None = None, options: dict | None = None, *,
             provenance: dict | None = None) -> Session: ...
