"""OpenVINO in this process: one ``openvino.Core`` (imported on first use, never at module
import), the refusal of a child forked after a model was compiled here, the compiled-model cache
directory and the precision a session runs at. ``openvino_backend`` holds the session and backend.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from edge_runtime import error_codes as ec
from edge_runtime.errors import DeviceError

from .base import cache_dir as _cache_dir

_DEVICES = {"cpu": "CPU", "gpu": "GPU", "npu": "NPU", "auto": "AUTO"}
PRECISIONS = ("auto", "f32", "bf16", "f16")
_core = None
_core_lock = threading.Lock()


# OpenVINO does not run in a child forked from a process where it compiled a model: once such a model
# was released before the fork (a closed runtime, the sessions threads_fit drops at load), the child's
# compile_model blocks for ever, with a new Core too (OpenVINO 2026.4 CPU plugin, raw API; a model kept
# alive let it compile, but an inherited session's batch queue blocked). A child forked after a model
# was compiled here is refused at load with a DeviceError, never left to hang; sessions loaded before
# the fork are refused by the runtime (``runtime_call``).
_compiled_in: int | None = None             # the pid that compiled a model (set at each session's load)
_forked_after: tuple[int, int] | None = None  # in a child forked after that: (that pid, this pid)


def _after_fork_in_child() -> None:
    global _core_lock, _forked_after
    _core_lock = threading.Lock()       # one another thread held at the fork is never released in the child
    if _forked_after is not None:
        _forked_after = (_forked_after[0], os.getpid())
    elif _compiled_in is not None:
        _forked_after = (_compiled_in, os.getpid())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _mark_compiling() -> None:
    """A child forked from now on cannot compile (``_refuse_forked_child``)."""
    global _compiled_in
    _compiled_in = os.getpid()


def _refuse_forked_child() -> None:
    if _forked_after is not None:
        raise DeviceError(f"OpenVINO compiled models in process {_forked_after[0]}, and this process "
                          f"({_forked_after[1]}) is a child forked from it: OpenVINO's compile_model blocks for "
                          "ever in such a child. Start the child with multiprocessing's 'spawn' or 'forkserver' "
                          "(or the OpenVINO work before any fork), load with isolate=True (its worker is a fresh "
                          "process), or use another device here (device='onnxruntime')",
                          code=ec.DEVICE_BACKEND_BROKEN, pid=_forked_after[1], compiled_in_pid=_forked_after[0])


def _ov():
    import openvino

    return openvino


def core():
    global _core
    with _core_lock:
        if _core is None:
            _core = _ov().Core()
        return _core


def cache_dir(options) -> Path | None:
    """The compiled-model cache directory, or None when switched off."""
    return _cache_dir(options, "openvino", "EDGE_RUNTIME_OV_CACHE")


def choose_precision(options, why: str | None = None) -> tuple[str, str]:
    """(precision, why). An artifact records the precision its converter
    measured fastest within the parity budget (``variant.runtime``, its reason as
    provenance); without one, ``auto`` is f32, the closest to the fp32 reference."""
    want = str(options.get("precision") or "auto").lower()
    if want not in PRECISIONS:
        raise ValueError(f"unknown OpenVINO precision {want!r} ({', '.join(PRECISIONS)})")
    if want != "auto":
        return want, str(why or "requested")
    return "f32", "no measured choice recorded: f32, the closest to the fp32 reference"


def precision_candidates() -> list[dict]:
    """Precisions worth measuring on this CPU (the converter picks by measurement)."""
    try:
        caps = set(core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    except Exception:
        caps = set()
    return [{"precision": "f32"}] + ([{"precision": "bf16"}] if "BF16" in caps else [])


# -- AUTO: where a compiled model runs ------------------------------------------------
def execution_devices(compiled, default: str) -> list[str]:
    """EXECUTION_DEVICES of ``compiled``, read now (``[default]`` where unreadable)."""
    try:
        return [str(d) for d in compiled.get_property("EXECUTION_DEVICES")]
    except Exception:
        return [default]


def auto_candidates(compiled) -> list[str]:
    """The devices an AUTO model may run on: its MULTI_DEVICE_PRIORITIES, else the devices present."""
    try:
        found = str(compiled.get_property("MULTI_DEVICE_PRIORITIES"))
    except Exception:
        found = ""
    if not found.strip():
        try:
            found = ",".join(core().available_devices)
        except Exception:
            found = ""
    return [d.strip() for d in found.split(",") if d.strip()]


def auto_device(executed: list[str], candidates: list[str]) -> str:
    """The device an AUTO session names: ``cpu`` where AUTO chose the CPU (EXECUTION_DEVICES ``CPU``:
    nothing to switch to), else ``auto:`` and every device it may run on (``auto:gpu,cpu``). AUTO runs
    on its CPU helper (``(CPU)``) until the device it chose has compiled, then switches, and retries a
    request that failed there on the next candidate; the session is read once at load and a result
    names its device without a per-call read, so no result is said to have run on one of them."""
    if [d.upper() for d in executed] == ["CPU"]:
        return "cpu"
    names = [c.lower() for c in candidates]
    for d in executed:
        d = d.strip("()").lower()
        if d not in ("", "auto") and d not in names and d.split(".")[0] not in names:
            names.append(d)
    return "auto:" + ",".join(dict.fromkeys(names)) if names else "auto"
