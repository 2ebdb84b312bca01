"""What a served request's errors and parameters become, for both protocols: a typed error's
status on the wire (``serve_error``; the code passes through), the refusals counted as rejections,
and a request's parameters split into the protocol's own and the task's call options."""

from __future__ import annotations

import logging

from . import error_codes as ec
from .errors import (ArtifactError, DeviceError, EdgeRuntimeError, InferenceRuntimeError, InferenceTimeout,
                     InputError)
from .serve_types import ServeError

log = logging.getLogger("edge_runtime.serve")

# what an inference error becomes on the wire; an input over a byte limit is a 413
STATUS_OF: tuple[tuple[type, str], ...] = (
    (InputError, "bad_request"), (InferenceTimeout, "timeout"), (DeviceError, "unavailable"),
    (ArtifactError, "internal"), (InferenceRuntimeError, "internal"), (EdgeRuntimeError, "internal"))
TOO_LARGE_CODES = frozenset({ec.INPUT_TOO_LARGE, ec.INPUT_BATCH_TOO_LARGE})
# refusals, counted in edge_serve_rejections_total{reason}: the server's before any model work, and the
# runtime's byte and item limits (413), which it checks before any device work
_REJECTION = {ec.SERVE_NOT_READY: "not_ready", ec.SERVE_OVERLOADED: "overloaded",
              ec.SERVE_MODEL_NOT_FOUND: "not_found", ec.SERVE_REQUEST_MALFORMED: "malformed",
              ec.INPUT_TOO_LARGE: "too_large", ec.INPUT_BATCH_TOO_LARGE: "too_large"}
# request parameters of the protocol and of its clients (Triton's reserved ones; `content_type`, the
# Open Inference Protocol's codec hint), never a task's call option: `timeout` is read (_deadline_ms), the
# rest are ignored (no sequences, no priorities); every other parameter goes to the runtime as a call
# option, which refuses one its task does not take (as in-process: a 400)
PROTOCOL_PARAMETERS = frozenset({"timeout", "sequence_id", "sequence_start", "sequence_end", "priority",
                                 "headers", "binary_data_output", "content_type"})
PROTOCOL_PREFIX = "triton_"


def serve_error(exc: BaseException, prefix: str = "") -> ServeError:
    """The ``ServeError`` for any exception raised while answering a request."""
    if isinstance(exc, ServeError):
        return exc
    if isinstance(exc, EdgeRuntimeError):
        status = next(s for cls, s in STATUS_OF if isinstance(exc, cls))
        if status == "bad_request" and exc.code in TOO_LARGE_CODES:
            status = "too_large"
        return ServeError(status, prefix + exc.message, exc.code)
    log.exception("unexpected error while serving a request")
    return ServeError("internal", f"{prefix}{type(exc).__name__}: {exc}", ec.UNEXPECTED)


def call_options(parameters: dict) -> dict | None:
    """The task's call options of a request: its parameters but the protocol's (``PROTOCOL_PARAMETERS``,
    ``triton_*``). Unknown keys are kept: ``rt.infer`` refuses them with its own ``InputError``."""
    return {k: v for k, v in parameters.items()
            if k not in PROTOCOL_PARAMETERS and not k.startswith(PROTOCOL_PREFIX)} or None
