"""This machine in the few words a measurement depends on: its int8 class, a
hardware fingerprint, the backend package versions, and the build-host record
a converter writes into the manifest (``build.host_info``).

The int8 class is what decides whether an int8 figure carries over from one
machine to another: x86 with VNNI/AMX dot products, AVX2 (or AVX-512) without
them (u8*s8 pairs saturate at int16), ARM with or without dotprod, or an
accelerator. Nothing here imports an ML framework.
"""

from __future__ import annotations

import hashlib
import json
import platform
from functools import lru_cache

# the distributions whose version changes what a backend computes
BACKEND_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu", "openvino", "ai-edge-litert", "tflite-runtime",
                         "coremltools", "numpy")


def cpu_int8_class(hw) -> str:
    cpu = hw.get("cpu") or {}
    feats = set(cpu.get("features") or ())
    machine = str(hw.get("machine", "")).lower()
    if machine in ("aarch64", "arm64", "armv7l", "armv8l"):
        if "i8mm" in feats:
            return "arm-i8mm"
        return "arm-dotprod" if "dotprod" in feats else "arm"
    if "amx_int8" in feats:
        return "x86-amx"
    if feats & {"avx512_vnni", "avx_vnni"}:
        return "x86-vnni"
    if "avx512f" in feats:
        return "x86-avx512-no-vnni"
    if "avx2" in feats:
        return "x86-avx2"
    return machine or "unknown"


# a device other than the CPU has its own int8 arithmetic (the part before ":" of the device)
_DEVICE_CLASSES = {"edgetpu": "edgetpu", "coreml": "apple", "cuda": "nvidia-gpu", "tensorrt": "nvidia-gpu",
                   "gpu": "gpu", "npu": "npu"}


def int8_class(hw, device: str | None = None) -> str:
    """The int8 class of ``device`` (``"onnxruntime:cpu"``, ``"edgetpu:usb:0"``...) on ``hw``:
    an accelerator's own, else this CPU's."""
    if device:
        backend, _, sub = device.lower().partition(":")
        # OpenVINO's AUTO names the device it ran on with its index ("openvino:gpu.0"), CUDA may be "cuda:1"
        sub = sub.partition(":")[0].partition(".")[0]
        for key in (sub, backend):
            if key in _DEVICE_CLASSES and not (backend == "coreml" and sub == "cpu"):
                return _DEVICE_CLASSES[key]
    return cpu_int8_class(hw)


def fingerprint(hw) -> str:
    """A short hash of what makes one machine's measurement another's: ISA, CPU model and cores, accelerators."""
    cpu = hw.get("cpu") or {}
    body = {"machine": hw.get("machine"), "system": hw.get("system"), "cpu": cpu.get("model"),
            "vendor": cpu.get("vendor"), "cores": cpu.get("cores"), "features": sorted(cpu.get("features") or ()),
            "gpus": list(hw.get("nvidia_gpus") or []), "jetson": bool(hw.get("jetson")),
            "edgetpus": len(hw.get("edgetpus") or []), "apple_silicon": bool(hw.get("apple_silicon"))}
    # fewer CPUs usable than the machine has (a container's quota, taskset): another machine for a
    # measurement (a tune result timed on all 64 cores is not the choice for 2); unlimited keeps the old hash
    if cpu.get("usable") not in (None, cpu.get("cores")):
        body["usable"] = cpu.get("usable")
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


@lru_cache(maxsize=1)
def backend_versions() -> dict[str, str]:
    """Installed versions of the backend distributions, read from the ``.dist-info`` folder
    names on ``sys.path`` (one directory listing each: nothing is imported or parsed)."""
    import os
    import sys

    wanted = {d.replace("-", "_").lower(): d for d in BACKEND_DISTRIBUTIONS}
    out: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if not name.endswith(".dist-info"):
                continue
            dist, _, version = name[: -len(".dist-info")].partition("-")
            key = dist.replace("-", "_").replace(".", "_").lower()
            if key in wanted and wanted[key] not in out and version:
                out[wanted[key]] = version
    return dict(sorted(out.items()))


def host_record(hw) -> dict:
    """The build host, as a manifest keeps it: where the recorded figures were measured."""
    cpu = hw.get("cpu") or {}
    return {"machine": hw.get("machine"), "system": hw.get("system"), "os": platform.platform(terse=True),
            "cpu": cpu.get("model"), "vendor": cpu.get("vendor"), "cores": cpu.get("cores"),
            "features": list(cpu.get("features") or ()), "int8_class": cpu_int8_class(hw),
            **({"usable": cpu.get("usable")} if cpu.get("usable") not in (None, cpu.get("cores")) else {}),
            "fingerprint": fingerprint(hw), "python": platform.python_version(), "backends": backend_versions()}
