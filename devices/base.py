"""The device protocol every backend implements.

A *backend* knows which artifact targets it can run and how well it can run
them on the detected hardware (a score: 0 means it cannot, higher is better,
with the reason). It loads one bucket's model file into a *session*; a
session runs named numpy tensors and reports where it actually ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class Suitability:
    score: int          # 0: cannot run here; higher is better
    device: str         # the concrete device it would use, e.g. "onnxruntime:cpu"
    reason: str         # why (shown in rt.info(), fallbacks, `edge-infer devices`)

    @property
    def ok(self) -> bool:
        return self.score > 0


@runtime_checkable
class Session(Protocol):
    device: str

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def info(self) -> dict: ...

    def close(self) -> None: ...


@runtime_checkable
class Backend(Protocol):
    name: str
    targets: tuple[str, ...]

    def suitability(self, target: str, hardware: dict, device: str | None = None) -> Suitability: ...

    def load(self, model_path: Path, bucket: dict, device: str | None = None, options: dict | None = None) -> Session: ...


def check_feeds(feeds: Mapping[str, np.ndarray], bucket: dict) -> None:
    """Shared guard: feeds must match the bucket's declared inputs exactly.

    Raises ``ValueError`` (the runtime wraps it); input validation proper is
    the task contract's job, this only protects the native code.
    """
    expected = {t["name"]: t for t in bucket["inputs"]}
    if set(feeds) != set(expected):
        raise ValueError(f"feeds {sorted(feeds)} do not match model inputs {sorted(expected)}")
    for name, spec in expected.items():
        arr = feeds[name]
        if not isinstance(arr, np.ndarray):
            raise ValueError(f"input {name!r} is not a numpy array")
        if list(arr.shape) != list(spec["shape"]):
            raise ValueError(f"input {name!r} has shape {list(arr.shape)}, model wants {spec['shape']}")
        if arr.dtype != np.dtype(spec["dtype"]):
            raise ValueError(f"input {name!r} has dtype {arr.dtype}, model wants {spec['dtype']}")


def cache_dir(options: dict, kind: str, switch_env: str):
    """A backend's per-user cache directory (``$EDGE_RUNTIME_CACHE_DIR/<kind>``, default
    ``~/.cache/edge-runtime/<kind>``), ``options["cache_dir"]`` if given, or None when
    switched off by ``cache=false`` or ``<switch_env>=0``."""
    import os

    if options.get("cache") is False or os.environ.get(switch_env, "1").lower() in ("0", "false", "off"):
        return None
    if options.get("cache_dir"):
        return Path(options["cache_dir"])
    base = os.environ.get("EDGE_RUNTIME_CACHE_DIR")
    if base:
        return Path(base) / kind
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg or Path.home() / ".cache") / "edge-runtime" / kind


def int_option(options: dict, key: str, default=None, *, minimum: int = 0, env: str | None = None):
    """An integer device option (``threads``, ``max_requests``, ...), or ``default`` when
    neither the option nor ``env`` is set. A bad value from the caller is an
    ``InputError`` naming the option ("device option threads must be an integer, got
    'abc'"); a bad ``env`` value is the operator's, a ``DeviceError`` naming the variable."""
    import os
    import re

    from edge_runtime.errors import DeviceError, InputError

    value, what, err = options.get(key), f"device option {key}", InputError
    if value is None and env and os.environ.get(env):
        value, what, err = os.environ[env], f"environment variable {env}", DeviceError
    if value is None:
        return default
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        value = int(value)
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise err(f"{what} must be an integer, got {value!r}", code="device_option_invalid", option=key)
    if value < minimum:
        raise err(f"{what} must be an integer >= {minimum}, got {value!r}", code="device_option_invalid", option=key)
    return value

