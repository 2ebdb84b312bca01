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
from edge_runtime.errors import DeviceError, exc_text

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


def _shown(ref) -> str:
    """How an entry is named in an error: its ``module:attr`` (or the callable given to ``register``)."""
    if isinstance(ref, str):
        return ref
    return getattr(ref, "__module__", "?") + ":" + getattr(ref, "__qualname__", repr(ref))


_NEEDS = ("name", "family", "targets", "options")     # the Backend protocol (devices/protocol.py)
_CALLS = ("suitability", "load")


def _not_a_backend(backend) -> str | None:
    """Why what a factory returned is not a backend the runtime can use, or None."""
    try:
        missing = [a for a in _NEEDS if not hasattr(backend, a)]
        missing += [m for m in _CALLS if not callable(getattr(backend, m, None))]
        if missing:
            return f"it gave {type(backend).__name__} {repr(backend)[:80]}, which lacks {', '.join(missing)}"
        targets = backend.targets
        if isinstance(targets, str) or not isinstance(targets, (tuple, list)) or \
                not all(isinstance(t, str) and t for t in targets):
            # a string is iterated as its characters: "mydev-int8" declared the targets "m", "y", ...
            return f"its targets are {targets!r}, not a tuple of target names"
    except Exception as exc:        # a property that raises
        return f"reading its protocol raised {type(exc).__name__}: {exc}"
    return None


def not_a_session(sess) -> str | None:
    """Why what a backend's ``load`` returned is not a session the runtime can drive, or None (the
    Session protocol: ``device``, ``capabilities`` a ``Capabilities``, ``fallback``, ``run``, ``info``,
    ``close``; before 2026-12-07 a ``None`` or a dict crashed ``load()`` with an untyped AttributeError)."""
    from .protocol import Capabilities

    try:
        missing = [a for a in ("device", "capabilities", "fallback") if not hasattr(sess, a)]
        missing += [m for m in ("run", "info", "close") if not callable(getattr(sess, m, None))]
        if missing:
            return f"{type(sess).__name__} {repr(sess)[:80]}, which lacks {', '.join(missing)}"
        if not isinstance(sess.capabilities, Capabilities):
            return f"a session whose capabilities are {sess.capabilities!r}, not a Capabilities"
        if not isinstance(sess.device, str) or not sess.device:
            return f"a session whose device is {sess.device!r}, not a device string"
    except Exception as exc:        # a property that raises
        return f"a session whose protocol raised {type(exc).__name__}: {exc}"
    return None


def get_backend(name: str):
    with _lock:
        _discover()
        if name in _instances:
            return _instances[name]
        if name not in _factories:
            raise DeviceError(f"unknown device backend {name!r} (known: {', '.join(sorted(_factories))})",
                              code=ec.DEVICE_UNKNOWN)
        ref = _factories[name]
        try:
            backend = _resolve(ref)()
        except Exception as exc:
            # an exception of no text is named by its type (": " ended the line before 2026-12-07)
            raise DeviceError(f"device backend {name!r} failed to initialise: {exc_text(exc)}",
                              code=ec.DEVICE_BACKEND_BROKEN) from exc
        why = _not_a_backend(backend)
        if why is not None:
            # before 2026-12-07 it was used as it was: `edge-infer devices` crashed on a dict with an
            # untyped AttributeError (exit 1), a string's characters became targets
            raise DeviceError(f"device backend {name!r} (entry point {_shown(ref)}) is not a backend: {why} "
                              "(the protocol: README, How to add a backend)", code=ec.DEVICE_BACKEND_BROKEN)
        _instances[name] = backend
        return backend


def backend_error(device: str | None) -> DeviceError | None:
    """The ``device_backend_broken`` error of the backend a device string names (``"mydev"``,
    ``"mydev:npu"``) where it is registered and fails to load; None for ``auto``, a backend that loads,
    and a name that is not registered (that is ``device_unknown``, said elsewhere)."""
    name = device.partition(":")[0] if isinstance(device, str) and device != "auto" else None
    if not name or name not in available_backends():
        return None
    try:
        get_backend(name)
    except DeviceError as exc:
        return exc
    return None


def _declared(ref) -> tuple[str, ...] | None:
    """The targets a backend that failed to load declares where its class says so without loading
    (a class attribute: it imported and failed in ``__init__``); None where that cannot be known
    (it does not import, a clash, a callable)."""
    try:
        obj = _resolve(ref)
    except Exception:
        return None
    targets = getattr(obj, "targets", None) if isinstance(obj, type) else None
    if isinstance(targets, (tuple, list)) and all(isinstance(t, str) for t in targets):
        return tuple(targets)
    return None


class KnownTargets(dict):
    """``known_targets()``: target -> names of the backends that load and declare it; ``broken``:
    name -> (its ``device_backend_broken`` error, the targets it declares or None: unknown) of each
    backend that fails to load."""

    broken: dict[str, tuple[DeviceError, tuple[str, ...] | None]]


def broken_for(known: dict, target: str) -> DeviceError | None:
    """For a target no working backend in ``known`` (``known_targets()``) knows: the ``device_backend_broken``
    error naming each broken backend that declares it (or may: its targets cannot be read), or None. Such a
    target is that plug-in's fault, not the artifact's (``selection.check_targets``)."""
    broken = getattr(known, "broken", {})
    if target in known:
        return None
    suspects = {n: e for n, (e, declared) in broken.items() if declared is None or target in declared}
    if not suspects:
        return None
    names = ", ".join(sorted(suspects))
    return DeviceError(f"no working device backend knows target {target!r}: device backend(s) {names} failed "
                       f"to load and " + ("declare" if all(broken[n][1] for n in suspects) else "may declare")
                       + f" it ({'; '.join(e.message for e in suspects.values())}); fix or uninstall the plug-in "
                       f"(`edge-infer devices` lists every backend; known targets: "
                       f"{', '.join(sorted(known)) or 'none'})", code=ec.DEVICE_BACKEND_BROKEN)


def known_targets() -> KnownTargets:
    """target -> backend names that declare it; the backends that fail to load are kept, with their
    errors, in ``.broken`` (before 2026-12-07 they were left out, silently: an artifact of a target
    only a broken plug-in declares was refused as ``artifact_target_unknown``, blamed on the artifact)."""
    out = KnownTargets()
    out.broken = {}
    for name in available_backends():
        try:
            backend = get_backend(name)
        except DeviceError as exc:
            with _lock:
                ref = _factories.get(name)
            out.broken[name] = (exc, _declared(ref) if ref is not None else None)
            continue
        for target in backend.targets:
            out.setdefault(target, []).append(name)
    return out
