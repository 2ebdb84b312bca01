"""The tune decision a ``Runtime`` loads with: the cached one for ``device="auto"`` (measured now when
``tune=True`` and there is none), and why a load keeps the static policy over it. Read at load only."""

from __future__ import annotations

import logging
import time

from . import error_codes as ec
from . import tune_cache
from .errors import ArtifactError, InputError

log = logging.getLogger("edge_runtime")


def tuned_entry(artifact, hardware, path, device, tune: bool, tuned_for: str, load_kw: dict) -> tuple[dict | None, float]:
    """(the cached tune decision for ``auto``, or None; the lookup's ms)."""
    if tuned_for not in tune_cache.PURPOSES:
        raise InputError(f"tuned_for must be one of {', '.join(tune_cache.PURPOSES)}, got {tuned_for!r}",
                         code=ec.INPUT_INVALID)
    if device not in (None, "auto"):
        return None, 0.0
    t = time.perf_counter()
    entry = tune_cache.lookup(artifact.manifest.get("manifest_sha256"), hardware)
    if entry is None and tune:
        from . import tune as tuning      # the measurement: only when one is asked for

        try:
            entry = tuning.tune(path, hardware=hardware, load_kw=load_kw)
        except ArtifactError as exc:
            if exc.code != ec.PROBE_MISSING:
                raise
            # nothing to measure with (an imported artifact): auto keeps the static policy
            log.warning("%s: tune=True measured nothing: %s; device auto keeps the static policy",
                        artifact.root, exc.message)
    lookup_ms = (time.perf_counter() - t) * 1000
    if entry is not None and not entry.get("decision"):
        log.warning("%s: tune found no path within the parity budget here (%s); device auto keeps the static "
                    "policy, measured as the others", artifact.root, tune_cache.rows_text(entry))
    return entry, lookup_ms


def not_applied(tuned: dict | None, tuned_for: str, device_options: dict | None, refused: str) -> str:
    """Why this load keeps the static policy over the measured path (``info()["tuned"]["not_applied"]``)."""
    d = tuned["decision"][tuned_for] if tuned else {}
    return (f"the tune decision ({tuned_for}: {d.get('target')} on {d.get('backend')}) is not used for this "
            f"load: the device options asked for ({', '.join(sorted(map(str, device_options or {})))}) are not "
            f"all accepted by {d.get('backend')} ({refused}); the static policy decides, as without a tune")
