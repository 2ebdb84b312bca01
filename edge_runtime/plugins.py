"""The one way the registries read entry points (devices, converters, tasks).

A group's entries come from every installed distribution: this project's own
first, then any other's over them, so a plug-in may replace a built-in by name.
Two other distributions that claim one name with different objects are a clash:
the name resolves to neither (``resolve_ref`` raises ``PluginClash`` naming both,
which each registry reports as its broken plug-in error), never silently to the
one whose folder came later on ``sys.path``. Broken metadata never breaks the
built-ins: it reads as no entries.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from typing import NamedTuple

OWN_DIST = "edge-runtime"
_METADATA_DIRS = (".dist-info", ".egg-info")


class EntryPoint(NamedTuple):
    group: str
    name: str
    value: str
    dist: str            # the distribution's normalised name ("edge-runtime")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_entry_points(text: str, dist: str) -> list[EntryPoint]:
    """The entries of an ``entry_points.txt`` (INI: ``[group]`` then ``name = module:attr [extra]``
    lines; ``#``/``;`` comments); a line that is not ``name = value`` is skipped."""
    out: list[EntryPoint] = []
    group = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line[0] == "[" and line[-1] == "]":
            group = line[1:-1].strip()
            continue
        name, sep, value = line.partition("=")
        if group is not None and sep and name.strip():
            out.append(EntryPoint(group, name.strip(), value.strip(), dist))
    return out


def _folder_dists(folder: str) -> list[tuple[str, str]]:
    """``(normalised name, metadata dir)`` of each distribution installed in ``folder``, sorted."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:       # a missing or unreadable path entry holds nothing
        return []
    return [(_normalise(n.rsplit(".", 1)[0].split("-", 1)[0]), os.path.join(folder, n))
            for n in names if n.endswith(_METADATA_DIRS)]


def _archive_dists(entry: str) -> list[tuple[str, list[EntryPoint]]]:
    """Distributions inside a zip or egg on ``sys.path`` (rare): importlib.metadata reads those."""
    from importlib import metadata

    out = []
    for dist in metadata.distributions(path=[entry]):
        name = _normalise(getattr(dist, "_normalized_name", None) or dist.metadata["Name"] or "")
        out.append((name, [EntryPoint(ep.group, ep.name, ep.value, name) for ep in dist.entry_points]))
    return out


def _read_dist(path: str, name: str) -> list[EntryPoint]:
    try:
        with open(os.path.join(path, "entry_points.txt"), encoding="utf-8") as f:
            return parse_entry_points(f.read(), name)
    except (OSError, UnicodeDecodeError):    # none, or unreadable: a distribution of no entries
        return []


_scan: tuple[tuple[str, ...], dict[str, list]] | None = None   # (sys.path it was read for, group -> entry points)
_scan_lock = threading.Lock()


def _all_entry_points() -> dict[str, list[EntryPoint]]:
    """One scan of every distribution's ``entry_points.txt`` on ``sys.path`` (the first distribution of
    a name wins, as ``importlib.metadata.entry_points()`` reads them), shared by the three registries
    and read again when ``sys.path`` changed (a distribution added at run time is seen). The
    ``.dist-info``/``.egg-info`` folders are listed and the files read directly: importing
    ``importlib.metadata`` and building its distribution objects cost ~50 ms of every process's
    start (a third of ``edge-infer infer``'s own time on a small image model)."""
    global _scan
    key = tuple(sys.path)
    with _scan_lock:
        if _scan is None or _scan[0] != key:
            groups: dict[str, list] = {}
            seen: set[str] = set()
            for entry in key:
                folder = entry or "."
                found: list = _archive_dists(folder) if os.path.isfile(folder) else _folder_dists(folder)
                for name, where in found:
                    if name in seen:
                        continue
                    seen.add(name)
                    eps = where if isinstance(where, list) else _read_dist(where, name)
                    for ep in eps:
                        groups.setdefault(ep.group, []).append(ep)
            _scan = (key, groups)
        return _scan[1]


def forget_scan() -> None:
    """Read the metadata again on the next lookup (a distribution changed in place)."""
    global _scan
    with _scan_lock:
        _scan = None


class PluginClash(ImportError):
    """Two installed distributions register one entry-point name (of one group) with different objects."""


class ClashRef(str):
    """What ``entry_point_refs`` gives for a name two other distributions claim: a readable string
    (``"dist-a: mod_a:Cls | dist-b: mod_b:Cls"``) that ``resolve_ref`` refuses with ``PluginClash``."""

    group: str
    name: str
    claims: tuple[tuple[str, str], ...]

    def __new__(cls, group: str, name: str, claims: list[tuple[str, str]]) -> "ClashRef":
        self = super().__new__(cls, " | ".join(f"{dist}: {value}" for dist, value in claims))
        self.group, self.name, self.claims = group, name, tuple(claims)
        return self

    def error(self) -> PluginClash:
        return PluginClash(f"entry point {self.name!r} of group {self.group} is registered {len(self.claims)} "
                           f"times, to different objects ({self}): uninstall all but one of these "
                           f"distributions, or give the plug-ins different names")


def entry_point_refs(group: str) -> dict[str, str]:
    """name -> "module:attr" for ``group``, this distribution's entries first and any other's over them.
    A name that two other distributions register with different values is a ``ClashRef`` (before
    2026-12-07 the one scanned last won, silently)."""
    eps = _all_entry_points().get(group, [])
    found: dict[str, str] = {ep.name: ep.value for ep in eps if ep.dist == OWN_DIST}
    claims: dict[str, list[tuple[str, str]]] = {}
    for ep in eps:
        if ep.dist != OWN_DIST:
            claims.setdefault(ep.name, [])
            if (ep.dist, ep.value) not in claims[ep.name]:
                claims[ep.name].append((ep.dist, ep.value))
    for name, claimed in claims.items():
        if len({value for _, value in claimed}) == 1:
            found[name] = claimed[0][1]
        else:
            found[name] = ClashRef(group, name, claimed)
    return found


# the entry-point object reference ``importlib.metadata.EntryPoint`` reads: "module", "module:attr.sub",
# whitespace around the parts, and an optional "[extra, ...]" (packaging metadata only: not loaded)
_REF = re.compile(r"(?P<module>[\w.]+)\s*(:\s*(?P<attr>[\w.]+)\s*)?((?P<extras>\[.*\])\s*)?$")


def resolve_ref(ref: str):
    """The object a "module:attr.sub" reference names (imports the module; raises what import/getattr raise).
    The reference is read as ``importlib.metadata`` reads it (``mod:Cls [extra]``, before 2026-12-07 an
    ``AttributeError``, loads ``mod.Cls``); one it cannot read is a ``ValueError``, a ``ClashRef`` a
    ``PluginClash``."""
    import importlib

    if isinstance(ref, ClashRef):
        raise ref.error()
    match = _REF.match(ref.strip()) if isinstance(ref, str) else None
    if match is None:
        raise ValueError(f"{ref!r} is not an entry-point reference (module or module:attr)")
    obj = importlib.import_module(match.group("module"))
    attr = match.group("attr")
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj
