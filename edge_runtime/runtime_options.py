"""The options a ``Runtime``'s sessions open with: the caller's over the ones the converter recorded
(``device_options_for``), and the thread count a container's CPU quota gives when nothing set one
(``quota_threads``). Read at load only, never per call."""

from __future__ import annotations

import os

from edge_runtime.devices.base import PROVENANCE_KEYS

from . import error_codes as ec
from .errors import ArtifactError, InputError


def quota_threads(hardware, backend, options: dict, choice) -> dict | None:
    """``{"threads": n, "why": ...}`` for a CPU session when this process may use fewer CPUs than the
    machine has (a container's cgroup quota, an affinity mask: ``hardware.cpu.usable``) and nothing
    set the thread count (the caller, the artifact, ``$EDGE_RUNTIME_THREADS``): the backends' default
    is a thread per core the machine shows (ONNX Runtime: 64 on a 64-core host under ``docker
    --cpus 2``), threads the quota throttles while they spin. None otherwise."""
    opt = next((o for o in backend.options if o.name == "threads"), None)
    if "threads" in options or opt is None:
        return None
    if opt.env and os.environ.get(opt.env):     # the operator's count, as the backend reads it: never overridden
        return None     # (before 2026-12-07 a quota replaced EDGE_RUNTIME_THREADS=2 by its usable count, silently)
    if choice.suitability.tier != "cpu":
        return None
    try:
        cpu = hardware["cpu"]
        usable, cores, limited_by = cpu.get("usable"), cpu.get("cores"), cpu.get("usable_limited_by")
    except (KeyError, TypeError, AttributeError):
        return None
    if not limited_by or not isinstance(usable, int) or not isinstance(cores, int) or not 0 < usable < cores:
        return None
    return {"threads": usable, "why": f"this process may use {usable} of the {cores} CPUs ({limited_by}): "
                                      "the backend's default would start a thread per CPU the machine shows"}


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
