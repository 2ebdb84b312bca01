"""The one way the registries read entry points (devices, converters, tasks).

A group's entries come from every installed distribution: this project's own
first, then any other's over them, so a plug-in may replace a built-in by name.
Broken metadata never breaks the built-ins: it reads as no entries.
"""

from __future__ import annotations

import sys
import threading
from importlib import metadata

OWN_DIST = "edge-runtime"


def _dist_name_of(dist) -> str:
    try:
        return (dist.metadata["Name"] or "").lower().replace("_", "-")
    except Exception:  # unreadable metadata: a distribution of no name
        return ""


def _dist_name(ep) -> str:
    dist = ep.dist
    if dist is None:
        return ""
    # the name from the .dist-info folder (no parse of METADATA, which holds our whole README)
    return (getattr(dist, "_normalized_name", None) or _dist_name_of(dist)).replace("_", "-")


_scan: tuple[tuple[str, ...], dict[str, list]] | None = None   # (sys.path it was read for, group -> entry points)
_scan_lock = threading.Lock()


def _all_entry_points() -> dict[str, list]:
    """One scan of every distribution's metadata (~15 ms with a large environment) shared by the three
    registries; read again when ``sys.path`` changed (a distribution added at run time is seen)."""
    global _scan
    key = tuple(sys.path)
    with _scan_lock:
        if _scan is None or _scan[0] != key:
            groups: dict[str, list] = {}
            seen: set[str] = set()
            try:   # what metadata.entry_points() reads (the first distribution of a name on the path wins)
                for dist in metadata.distributions():
                    name = getattr(dist, "_normalized_name", None) or _dist_name_of(dist)
                    if name in seen:
                        continue
                    seen.add(name)
                    for ep in dist.entry_points:
                        groups.setdefault(ep.group, []).append(ep)
            except Exception:  # broken metadata must not break the built-ins
                groups = {}
            _scan = (key, groups)
        return _scan[1]


def forget_scan() -> None:
    """Read the metadata again on the next lookup (a distribution changed in place)."""
    global _scan
    with _scan_lock:
        _scan = None


def entry_point_refs(group: str) -> dict[str, str]:
    """name -> "module:attr" for ``group``, this distribution's entries first and any other's over them."""
    eps = _all_entry_points().get(group, [])
    found: dict[str, str] = {}
    for own in (True, False):
        for ep in eps:
            if (_dist_name(ep) == OWN_DIST) == own:
                found[ep.name] = ep.value
    return found


def resolve_ref(ref: str):
    """The object a "module:attr.sub" reference names (imports the module; raises what import/getattr raise)."""
    import importlib

    module, _, attr = ref.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj
