"""Device backends behind one protocol, on one shared skeleton (see :mod:`.base`).

Backends register through the ``edge_runtime.devices`` entry-point group and
are imported only when asked for; no backend module imports its framework at
module level. Which backend wins on which machine is the policy table in
``edge_runtime/selection.py``, not the backends' business.
"""

from .base import (Backend, BatchSession, Capabilities, DeviceBackend, DeviceOptions, DeviceSession, Option, Session,
                   SessionCrashed, Suitability)
from .registry import available_backends, get_backend, known_targets, register

__all__ = ["Backend", "BatchSession", "Capabilities", "DeviceBackend", "DeviceOptions", "DeviceSession", "Option",
           "Session", "SessionCrashed", "Suitability", "available_backends", "get_backend", "known_targets",
           "register"]
