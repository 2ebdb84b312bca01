"""A backend's cache directory: where it is (``cache_dir``) and whether it is writable
(``writable_dir``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping


def cache_dir(options: Mapping, kind: str, switch_env: str) -> Path | None:
    """A backend's per-user cache directory (``$EDGE_RUNTIME_CACHE_DIR/<kind>``, default
    ``~/.cache/edge-runtime/<kind>``), ``options["cache_dir"]`` if given, or None when
    switched off by ``cache=false`` or ``<switch_env>=0``."""
    if options.get("cache") is False or os.environ.get(switch_env, "1").lower() in ("0", "false", "off"):
        return None
    if options.get("cache_dir"):
        return Path(options["cache_dir"])
    base = os.environ.get("EDGE_RUNTIME_CACHE_DIR")
    if base:
        return Path(base) / kind
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg or Path.home() / ".cache") / "edge-runtime" / kind


def writable_dir(path: Path) -> str | None:
    """Create ``path`` (0700) and check it is writable: None, or why not."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(f"{path} is not writable")
    except OSError as exc:
        return str(exc)
    return None
