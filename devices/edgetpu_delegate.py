"""The Edge TPU delegate's lifecycle for the ``edgetpu`` backend (``tflite_backend``): one live
delegate per (vendor module, library, device) in the process, shared by every session and pooled
interpreter on that Edge TPU, its load failures typed (the library missing vs a device it refuses),
and where a compiled model's ops run (``edgetpu_placement``)."""

from __future__ import annotations

import os
import threading
import weakref
from pathlib import Path

from edge_runtime import error_codes as ec
from edge_runtime.errors import DeviceError

EDGETPU_OP = b"edgetpu-custom-op"


def load_edgetpu_delegate(mod, lib: str, sub: str | None):
    """The live delegate of that library and device (one per Edge TPU in the process), else
    ``mod.load_delegate(lib, {"device": sub})``, its failures typed: ``device_delegate_missing`` when the
    library itself cannot be loaded, ``device_unavailable`` (naming the device) when it loads but refuses
    to open the Edge TPU (absent, unplugged, in use by another process, a device string it does not know)."""
    # "usb" is libedgetpu's first USB Edge TPU, "usb:0" too: one device under two names held two delegates,
    # and a libedgetpu that opens a device exclusively refused the second
    key = (id(mod), lib, f"{sub}:0" if sub in ("usb", "pci") else (sub or ""))
    with _DELEGATES_LOCK:
        live = _DELEGATES.get(key)
        if live is not None and live[0] is mod:
            delegate = live[1]()
            if delegate is not None:
                return delegate
        delegate = _load_delegate(mod, lib, sub)
        try:
            _DELEGATES[key] = (mod, weakref.ref(delegate))
        except TypeError:           # a delegate type that cannot be weakly referenced: not shared
            pass
        return delegate


# the live delegate per (vendor module, library, device): every session and pooled interpreter on one
# Edge TPU shares it while any holds it (buckets of one artifact, runtimes of one process included)
_DELEGATES: dict = {}
_DELEGATES_LOCK = threading.Lock()


def _delegates_after_fork() -> None:
    """A forked child opens its own: the parent's device handles are not the child's, and a lock
    another thread held at the fork is never released there."""
    global _DELEGATES_LOCK
    _DELEGATES_LOCK = threading.Lock()
    _DELEGATES.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_delegates_after_fork)


def _load_delegate(mod, lib: str, sub: str | None):
    opts = {"device": sub} if sub else {}
    try:
        return mod.load_delegate(lib, opts)
    except (ValueError, OSError, RuntimeError) as exc:
        _defuse_delegate(exc.__traceback__)
        detail = " ".join(str(exc).split()) or type(exc).__name__
        missing = isinstance(exc, OSError) or not _library_loads(lib)
    # raised outside the handler: the vendor's exception (and the half-made Delegate its traceback holds)
    # is not kept alive as this error's context
    if missing:
        raise DeviceError(f"cannot load the Edge TPU delegate library {lib} ({detail}): is libedgetpu installed? "
                          "(see `edge-infer doctor`)", code=ec.DEVICE_DELEGATE_MISSING)
    where = f"Edge TPU {sub!r}" if sub else "any Edge TPU"
    raise DeviceError(f"libedgetpu ({lib}) loaded but refused to open {where} ({detail}): the device is absent, "
                      "unplugged, held by another process, or closed to this user (see `edge-infer doctor`)",
                      code=ec.DEVICE_UNAVAILABLE, device=sub)


def _library_loads(lib: str) -> bool:
    import ctypes

    try:
        ctypes.CDLL(lib)
        return True
    except OSError:
        return False


def _defuse_delegate(tb) -> None:
    """LiteRT's ``Delegate.__init__`` that failed leaves an object whose ``__del__`` raises AttributeError
    (``_library`` unset: the library did not load) or destroys a null delegate: mark it destroyed, so its
    collection prints no "Exception ignored in ... Delegate.__del__" traceback (TOOLCHAINS.md)."""
    while tb is not None:
        obj = tb.tb_frame.f_locals.get("self")
        if obj is not None and type(obj).__name__ == "Delegate":
            state = getattr(obj, "__dict__", {})
            if "_library" not in state or state.get("_delegate_ptr", 0) is None:
                try:
                    obj._library = None
                except Exception:  # noqa: BLE001 - not LiteRT's class after all: leave it
                    pass
        tb = tb.tb_next


def edgetpu_placement(model_path: Path) -> dict | None:
    """Where a compiled model's ops run: its ``edgetpu-custom-op`` segments on the Edge TPU, every other
    op (a partially compiled model's CPU tail) on the CPU, read from the file; None without the ``tflite``
    flatbuffer package (or when it cannot read the file: LiteRT judges it)."""
    try:
        from edge_runtime.converters.tflite_inspect import inspect_tflite

        ins = inspect_tflite(model_path)
    except Exception:  # noqa: BLE001 - the tflite package is absent (an optional extra); LiteRT judges the file
        return None
    ops = [op["op"] for sg in ins["subgraphs"] for op in sg["operators"]]
    cpu = [o for o in ops if o != EDGETPU_OP.decode()]
    types: dict[str, int] = {}
    for o in cpu:
        types[o] = types.get(o, 0) + 1
    return {"edgetpu_segments": len(ops) - len(cpu), "cpu_ops": len(cpu), "cpu_op_types": dict(sorted(types.items())),
            "fully_on_edgetpu": not cpu}
