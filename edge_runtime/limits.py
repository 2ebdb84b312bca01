"""Strict input limits, checked before any device work.

Defaults come from our design notes. An artifact may override them in its
manifest (``limits``) and a caller per call; a limit can be raised or lowered
but never removed: ``None``, zero, negative or non-integer values are refused.
The deadline (``deadline_ms``, in ``limits`` or as ``infer(deadline_ms=)``) is a
positive number of milliseconds, whole or not; the other limits are positive
integers. numpy's integers and floats count as numbers; ``True`` does not.

Each limit also has a ceiling (``CEILINGS``), refused above it with the same
``limit_invalid`` (``ArtifactError`` from a manifest, ``InputError`` from a
caller): a limit that large is no limit (``max_text_chars: 10**30``), a huge
integer overflows the numpy and C code it later reaches, and a deadline of
``1e300`` ms (or infinity) is no deadline. The ceilings are generous, far past
any edge request, each with its reason:

- ``max_request_bytes``, ``max_image_bytes`` ≤ 4 GiB: a request is held whole in
  memory, and 2**32 is where 32-bit sizes in decoders and backends wrap;
- ``max_text_chars`` ≤ 2**32 (4 Gi characters): no text is longer than the
  largest request can carry (a character is at least a byte);
- ``max_image_pixels`` ≤ 10**9: a gigapixel RGB image decodes to 3 GB, and
  ``width × height × channels`` stays within a 32-bit count;
- ``max_batch_items`` and ``max_detections`` ≤ 10**6: a million items a call (or
  boxes a result) is past any batch or scene a device answers in one call;
- ``max_json_depth`` ≤ 500: Python's json decoder recurses and fails near its
  recursion limit (1000) before a deeper limit could be reached;
- ``deadline_ms`` ≤ 86,400,000 (a day), in ``limits`` and as ``infer(deadline_ms=)``:
  one call waiting longer has no deadline; infinity is refused too.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping

from . import error_codes as ec
from .errors import ArtifactError, InputError
from .value import Frozen

MiB = 1024 * 1024
GiB = 1024 * MiB
DEADLINE_MAX_MS = 86_400_000        # a day

# the most each limit may be set to (the module docstring says why each)
CEILINGS = {"max_request_bytes": 4 * GiB, "max_batch_items": 1_000_000, "max_text_chars": 2 ** 32,
            "max_image_bytes": 4 * GiB, "max_image_pixels": 1_000_000_000, "deadline_ms": DEADLINE_MAX_MS,
            "max_json_depth": 500, "max_detections": 1_000_000}


class Limits(Frozen):
    max_request_bytes: int
    max_batch_items: int
    max_text_chars: int
    max_image_bytes: int
    max_image_pixels: int
    deadline_ms: float                  # ms, whole or not (deadline_value)
    max_json_depth: int
    max_detections: int                # detections in one result (a detector's max_detections is capped to it)

    def __init__(self, max_request_bytes: int = 2 * MiB, max_batch_items: int = 500, max_text_chars: int = 10_000,
                 max_image_bytes: int = 20 * MiB, max_image_pixels: int = 40_000_000, deadline_ms: int = 5_000,
                 max_json_depth: int = 32, max_detections: int = 300) -> None:
        self.__dict__.update(max_request_bytes=max_request_bytes, max_batch_items=max_batch_items,
                             max_text_chars=max_text_chars, max_image_bytes=max_image_bytes,
                             max_image_pixels=max_image_pixels, deadline_ms=deadline_ms,
                             max_json_depth=max_json_depth, max_detections=max_detections)

    def merged(self, overrides: Mapping | None, *, source: str = "call") -> "Limits":
        """Return a copy with ``overrides`` (a mapping of limit name to value) applied, each one validated."""
        err = ArtifactError if source == "manifest" else InputError
        if overrides is None:
            return self
        if not isinstance(overrides, Mapping):
            raise err(f"limits must be a dict of limit name to value, not {type(overrides).__name__}",
                      code=ec.LIMIT_INVALID)
        if not overrides:
            return self
        known = set(self.FIELDS)
        clean = {}
        for key, value in overrides.items():
            if key not in known:
                raise err(f"unknown limit {key!r} (known: {', '.join(sorted(known))})", code=ec.LIMIT_UNKNOWN)
            if key == "deadline_ms":
                clean[key] = deadline_value(value, err, "limit deadline_ms")
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise err(f"limit {key} must be a positive integer, got {value!r}", code=ec.LIMIT_INVALID)
            if int(value) > CEILINGS[key]:
                raise err(f"limit {key} must be at most {CEILINGS[key]:,}, got {_shown(value)}: a limit that large "
                          "is no limit", code=ec.LIMIT_INVALID, limit=key, ceiling=CEILINGS[key])
            clean[key] = int(value)
        return self.replace(**clean)

    def lowered(self, overrides: dict | None, *, what: str = "limit") -> "Limits":
        """``merged(overrides)`` where each value may only lower (or keep) the current
        limit: what a caller who does not own the artifact may do (``edge-infer
        --limit``). A raise is an ``InputError`` naming the current value and the
        valid keys."""
        new = self.merged(overrides)
        for key, value in (overrides or {}).items():
            current = getattr(self, key)
            if value > current:
                raise InputError(f"{what} {key}={value} would raise the limit of {current}; limits can only be "
                                 f"lowered here (valid keys: {', '.join(sorted(self.to_dict()))})",
                                 code=ec.LIMIT_RAISE_REFUSED, limit=key, current=current, requested=value)
        return new


def deadline_value(ms, err: type = InputError, what: str = "deadline_ms") -> int | float:
    """``ms`` as a deadline: a positive number of milliseconds (an int, a float or a numpy scalar;
    infinity is no deadline of its own, the watchdog then waits an hour at a time), returned as a
    Python int or float; anything else, NaN, and a deadline over ``DEADLINE_MAX_MS`` (a day:
    infinity, ``1e300``, an integer too large for a float, which no clock could add, are no
    deadline) is ``err`` with ``limit_invalid``."""
    kind = type(ms)
    if kind is not int and kind is not float:      # the usual case costs two type tests
        if isinstance(ms, bool) or not isinstance(ms, numbers.Real):
            raise err(f"{what} must be a positive number, got {ms!r}", code=ec.LIMIT_INVALID)
        ms = int(ms) if isinstance(ms, numbers.Integral) else float(ms)
    if not ms > 0:      # NaN is not either
        raise err(f"{what} must be a positive number, got {ms!r}", code=ec.LIMIT_INVALID)
    if ms > DEADLINE_MAX_MS:       # inf, 1e300, 2**1100: no deadline (and no clock adds the last)
        raise err(f"{what} must be at most {DEADLINE_MAX_MS:,} ms (a day), got {_shown(ms)}",
                  code=ec.LIMIT_INVALID, ceiling=DEADLINE_MAX_MS)
    return ms


def _shown(value) -> str:
    """A refused value in a message: a huge integer by its size, never its thousand digits."""
    if isinstance(value, numbers.Integral) and abs(int(value)) >= 10 ** 30:
        return f"an integer of {int(value).bit_length()} bits"
    return repr(value)


DEFAULT_LIMITS = Limits()

# an image task's request: a camera frame as an array (1280x720 RGB is 2.6 MiB, 1920x1080 5.9,
# 3840x2160 23.7) or an encoded photo up to max_image_bytes (20 MiB); 2 MiB refused a 720p frame
IMAGE_LIMITS = {"max_request_bytes": 32 * MiB}


def json_depth(value, limit: int) -> int:
    """Depth of a decoded JSON value; raises ``InputError`` past ``limit``.

    Iterative so a hostile, deeply nested document cannot hit Python's
    recursion limit.
    """
    stack = [(value, 1)]
    deepest = 0
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                raise InputError(f"input nested deeper than {limit} levels", code=ec.INPUT_TOO_DEEP)
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend((v, depth + 1) for v in node)
    return deepest
