"""Strict input limits, checked before any device work.

Defaults come from our design notes. An artifact may override them in its
manifest (``limits``) and a caller per call; a limit can be raised or lowered
but never removed: ``None``, zero, negative or non-integer values are refused.
"""

from __future__ import annotations


from . import error_codes as ec
from .errors import ArtifactError, InputError
from .value import Frozen

MiB = 1024 * 1024


class Limits(Frozen):
    max_request_bytes: int
    max_batch_items: int
    max_text_chars: int
    max_image_bytes: int
    max_image_pixels: int
    deadline_ms: int
    max_json_depth: int
    max_detections: int                # detections in one result (a detector's max_detections is capped to it)

    def __init__(self, max_request_bytes: int = 2 * MiB, max_batch_items: int = 500, max_text_chars: int = 10_000,
                 max_image_bytes: int = 20 * MiB, max_image_pixels: int = 40_000_000, deadline_ms: int = 5_000,
                 max_json_depth: int = 32, max_detections: int = 300) -> None:
        self.__dict__.update(max_request_bytes=max_request_bytes, max_batch_items=max_batch_items,
                             max_text_chars=max_text_chars, max_image_bytes=max_image_bytes,
                             max_image_pixels=max_image_pixels, deadline_ms=deadline_ms,
                             max_json_depth=max_json_depth, max_detections=max_detections)

    def merged(self, overrides: dict | None, *, source: str = "call") -> "Limits":
        """Return a copy with ``overrides`` applied, each one validated."""
        if not overrides:
            return self
        known = set(self.FIELDS)
        clean = {}
        for key, value in overrides.items():
            err = ArtifactError if source == "manifest" else InputError
            if key not in known:
                raise err(f"unknown limit {key!r} (known: {', '.join(sorted(known))})", code=ec.LIMIT_UNKNOWN)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise err(f"limit {key} must be a positive integer, got {value!r}", code=ec.LIMIT_INVALID)
            clean[key] = value
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
