"""The session skeleton: the feed check (``FeedCheck``, ``check_feeds``), the model's I/O
names against the manifest (``check_io``) and ``DeviceSession`` (the closed guard and the
feed check around a backend's ``_run``; ``SessionClosed``, what a closed session raises).
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from .protocol import Capabilities


# -- the skeleton: sessions ------------------------------------------------------
class SessionClosed(RuntimeError):
    """``run`` on a session that is closed, or that was closed while the call waited for one of
    its pooled objects (``Pool``). The runtime reports a failure of a closed runtime's call as
    ``runtime_closed``."""


class FeedCheck:
    """The bucket's inputs, precomputed: feeds must match them exactly (names, arrays,
    shapes, dtypes). Raises ``ValueError`` (the runtime wraps it); input validation proper
    is the task contract's job, this only protects the native code."""

    __slots__ = ("_names", "_specs", "_wanted")

    def __init__(self, bucket: dict):
        self._specs = tuple((t["name"], tuple(int(d) for d in t["shape"]), np.dtype(t["dtype"]))
                            for t in bucket["inputs"])
        self._names = frozenset(n for n, _, _ in self._specs)
        self._wanted = [list(s) for _, s, _ in self._specs]

    def __call__(self, feeds: Mapping) -> None:
        if feeds.keys() != self._names:
            raise ValueError(f"feeds {sorted(feeds)} do not match model inputs {sorted(self._names)}")
        for (name, shape, dtype), wanted in zip(self._specs, self._wanted):
            arr = feeds[name]
            if not isinstance(arr, np.ndarray):
                raise ValueError(f"input {name!r} is not a numpy array")
            if arr.shape != shape:
                raise ValueError(f"input {name!r} has shape {list(arr.shape)}, model wants {wanted}")
            if arr.dtype != dtype:
                raise ValueError(f"input {name!r} has dtype {arr.dtype}, model wants {dtype}")


def check_feeds(feeds: Mapping[str, np.ndarray], bucket: dict) -> None:
    """One-off form of ``FeedCheck`` (sessions precompute theirs)."""
    FeedCheck(bucket)(feeds)


def check_io(inputs: Iterable[str], outputs: Iterable[str], bucket: dict, what: str = "model") -> None:
    """The model's own input names must be the manifest's, and it must have every output the
    manifest names (``ValueError`` otherwise: the runtime makes it a ``device_load_failed``)."""
    inputs, outputs = set(inputs), set(outputs)
    wanted = {t["name"] for t in bucket["inputs"]}
    if inputs != wanted:
        raise ValueError(f"{what} inputs {sorted(inputs)} differ from the manifest's {sorted(wanted)}")
    missing = [t["name"] for t in bucket["outputs"] if t["name"] not in outputs]
    if missing:
        raise ValueError(f"{what} has no output(s) {missing} (has {sorted(outputs)})")


class DeviceSession:
    """A session's skeleton: the closed guard and the feed check around ``_run``;
    ``capabilities`` (set per class, or per instance in ``__init__`` when an option decides)
    and ``fallback`` default to the plain case."""

    capabilities = Capabilities()
    fallback: str | None = None

    def __init__(self, bucket: dict, device: str):
        self.device = device
        self._bucket = bucket
        self._check = FeedCheck(bucket)
        self._closed = False

    def run(self, feeds, cancel=None):
        if self._closed:
            raise SessionClosed("session is closed")
        self._check(feeds)
        return self._run(feeds, cancel)

    def _run(self, feeds, cancel):
        raise NotImplementedError(f"session {type(self).__module__}.{type(self).__qualname__} on {self.device} does "
                                  "not implement DeviceSession._run(feeds, cancel)")

    def info(self) -> dict:
        return {}

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._release()

    def _release(self) -> None:
        """Drop native objects (after ``close``; runs once)."""
