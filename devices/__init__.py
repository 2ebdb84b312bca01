"""Device backends behind one small protocol (see :mod:`.base`).

Backends register through the ``edge_runtime.devices`` entry-point group and
are imported only when asked for; no backend module imports its framework at
module level.
"""

from .base import Backend, Session, Suitability
from .registry import available_backends, get_backend, known_targets, register

__all__ = ["Backend", "Session", "Suitability", "available_backends", "get_backend", "known_targets", "register"]
