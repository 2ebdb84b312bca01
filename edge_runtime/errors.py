"""One error tree, typed by layer.

- ``InputError``: the caller's fault (bad, oversized or undecodable input).
- ``ArtifactError`` / ``DeviceError``: the operator's (a corrupt or unknown
  artifact, a missing device or backend).
- ``InferenceTimeout`` / ``InferenceRuntimeError``: ours (a backend that
  stalled or failed while running a valid input).

Every error carries a stable ``code`` string (for metrics, logs and the JSON
output of the CLI; each a constant in ``error_codes.py``, whose ``CODES`` gives
its layer and meaning) and an ``exit_code`` used by ``edge-infer``.
"""

from __future__ import annotations

from . import error_codes as ec


class EdgeRuntimeError(Exception):
    code = ec.EDGE_RUNTIME_ERROR
    exit_code = 1

    def __init__(self, message: str, *, code: str | None = None, **details):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details = details

    def to_dict(self) -> dict:
        out: dict = {"type": type(self).__name__, "code": self.code, "message": self.message}
        if self.details:
            out["details"] = {k: _json_safe(v) for k, v in self.details.items()}
        return out


class InputError(EdgeRuntimeError):
    """The caller's input was rejected before or while preparing it."""

    code = ec.INPUT_INVALID
    exit_code = 2


class ArtifactError(EdgeRuntimeError):
    """The artifact is missing, corrupt, tampered with or not understood."""

    code = ec.ARTIFACT_INVALID
    exit_code = 3

    def __init__(self, message: str, *, file: str | None = None, code: str | None = None, **details):
        if file is not None:
            details["file"] = file
            if file not in message:
                message = f"{file}: {message}"
        super().__init__(message, code=code, **details)
        self.file = file


class DeviceError(EdgeRuntimeError):
    """No backend/device can run the artifact (or the one asked for is absent)."""

    code = ec.DEVICE_UNAVAILABLE
    exit_code = 4


class InferenceTimeout(EdgeRuntimeError):
    """The call did not finish within its deadline."""

    code = ec.INFERENCE_TIMEOUT
    exit_code = 5


class InferenceRuntimeError(EdgeRuntimeError):
    """A backend failed while running a valid input; wraps the cause."""

    code = ec.INFERENCE_FAILED
    exit_code = 6

    def __init__(self, message: str, *, device: str | None = None, variant: str | None = None, code: str | None = None, **details):
        super().__init__(message, code=code, device=device, variant=variant, **details)
        self.device = device
        self.variant = variant


class ParityError(EdgeRuntimeError):
    """A conversion measured int8-vs-fp32 parity under its budget."""

    code = ec.PARITY_BELOW_BUDGET
    exit_code = 7


def _json_safe(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    return str(value)


def exc_text(exc: BaseException, *, typed: bool = False) -> str:
    """An exception's text for a message (``typed``: "Type: text"), its type's name where it has no text:
    messages ended in ": " for ``NotImplementedError()`` and the like before 2026-12-07."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    return f"{type(exc).__name__}: {exc}" if typed else str(exc)
