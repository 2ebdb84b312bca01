"""edge-runtime: verified int8 artifacts, one ``infer()`` across devices.

``import edge_runtime`` imports numpy and the standard library only; a
backend's framework is imported when that device is loaded.
"""

from .errors import (ArtifactError, DeviceError, EdgeRuntimeError, InferenceRuntimeError, InferenceTimeout,
                     InputError, ParityError)
from .limits import DEFAULT_LIMITS, Limits
from .result import InferenceResult

__version__ = "0.1.0"

__all__ = [
    "load", "Runtime", "InferenceResult", "Limits", "DEFAULT_LIMITS",
    "EdgeRuntimeError", "InputError", "ArtifactError", "DeviceError", "InferenceTimeout",
    "InferenceRuntimeError", "ParityError", "__version__",
]


def __getattr__(name):  # lazy: the runtime pulls in the task/device registries
    if name in ("load", "Runtime"):
        from . import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'edge_runtime' has no attribute {name!r}")
