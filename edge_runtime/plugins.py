"""The one way the registries read entry points (devices, converters, tasks).

A group's entries come from every installed distribution: this project's own
first, then any other's over them, so a plug-in may replace a built-in by name.
Broken metadata never breaks the built-ins: it reads as no entries.
"""

from __future__ import annotations

from importlib import metadata

OWN_DIST = "edge-runtime"


def _dist_name(ep) -> str:
    try:
        return (ep.dist.metadata["Name"] or "").lower().replace("_", "-") if ep.dist is not None else ""
    except Exception:  # unreadable metadata: not this distribution
        return ""


def entry_point_refs(group: str) -> dict[str, str]:
    """name -> "module:attr" for ``group``, this distribution's entries first and any other's over them."""
    try:
        eps = list(metadata.entry_points(group=group))
    except Exception:  # broken metadata must not break the built-ins
        eps = []
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
