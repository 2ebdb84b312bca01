"""Backend registry fed by the ``edge_runtime.devices`` entry-point group, apart from the devices.

One table, name → lazy import path: the built-in backends register through the
same entry-point group as third-party ones (``pyproject.toml``; ``_BUILTIN``
below is the same table for a source tree without installed metadata). A new
backend is one module plus one entry point (``name = "package.module:Class"``);
tests register theirs the same way, from a temporary distribution, or with
``register()``. Listing names imports nothing; ``get_backend`` imports one
backend module (which itself never imports its framework until a session
loads) and instantiates it once.
"""

from __future__ import annotations

import threading
from edge_runtime.plugins import entry_point_refs, resolve_ref

from edge_runtime import error_codes as ec
from edge_runtime.errors import DeviceError

GROUP = "edge_runtime.devices"
# Used only when the distribution's metadata is not installed (running from a
# source tree without `pip install`); the entry points are the real registry.
_BUILTIN = {
    "onnxruntime": "edge_runtime.devices.onnxruntime_backend:OnnxRuntimeBackend",
    "openvino": "edge_runtime.devices.openvino_backend:OpenVinoBackend",
    "tflite": "edge_runtime.devices.tflite_backend:TfliteBackend",
    "edgetpu": "edge_runtime.devices.tflite_backend:EdgeTpuBackend",
    "coreml": "edge_runtime.devices.coreml_backend:CoremlBackend",
}

_lock = threading.Lock()
_factories: dict[str, object] = {}   # name -> "module:attr" string or a callable
_instances: dict[str, object] = {}
_discovered = False


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    found = dict(_BUILTIN)
    found.update(entry_point_refs(GROUP))
    for name, ref in found.items():
        _factories.setdefault(name, ref)
    _discovered = True


def register(name: str, factory) -> None:
    """Register (or replace) a backend: a class/callable or "module:attr"."""
    with _lock:
        _discover()
        _factories[name] = factory
        _instances.pop(name, None)


def unregister(name: str) -> None:
    with _lock:
        _factories.pop(name, None)
        _instances.pop(name, None)


def available_backends() -> list[str]:
    with _lock:
        _discover()
        return sorted(_factories)


def _resolve(ref):
    if callable(ref):
        return ref
    return resolve_ref(ref)


def get_backend(name: str):
    with _lock:
        _discover()
        if name in _instances:
            return _instances[name]
        if name not in _factories:
            raise DeviceError(f"unknown device backend {name!r} (known: {', '.join(sorted(_factories))})",
                              code=ec.DEVICE_UNKNOWN)
        try:
            backend = _resolve(_factories[name])()
        except Exception as exc:
            raise DeviceError(f"device backend {name!r} failed to initialise: {exc}", code=ec.DEVICE_BACKEND_BROKEN) from exc
        _instances[name] = backend
        return backend


def known_targets() -> dict[str, list[str]]:
    """target -> backend names that declare it."""
    out: dict[str, list[str]] = {}
    for name in available_backends():
        try:
            backend = get_backend(name)
        except DeviceError:
            continue
        for target in backend.targets:
            out.setdefault(target, []).append(name)
    return out
