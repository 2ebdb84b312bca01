"""What this machine is, found without importing any ML framework.

A first, small probe: OS, architecture, CPU vendor and ISA features, NVIDIA
device nodes and which backend packages are importable (by ``find_spec``,
never by importing them). The filesystem root is injectable so tests can
point it at fake trees.
"""

from __future__ import annotations

import importlib.util
import os
import platform
from functools import lru_cache
from pathlib import Path

BACKEND_PACKAGES = ("onnxruntime", "openvino", "ai_edge_litert", "tflite_runtime", "coremltools")
_FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def _read(root: Path, rel: str, limit: int = 1 << 20) -> str:
    try:
        with open(root / rel, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def _cpu(root: Path, machine: str) -> dict:
    text = _read(root, "proc/cpuinfo")
    vendor, model, flags = "", "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    features = [f for f in _FLAGS_OF_INTEREST if f in flags]
    if "asimd" in flags or machine in ("arm64", "aarch64"):
        features.append("neon")
    return {
        "vendor": vendor,
        "model": model,
        "cores": os.cpu_count() or 1,
        "features": features,
        "int8_dot": bool({"avx512_vnni", "avx_vnni", "amx_int8"} & flags),
    }


def packages_present() -> dict[str, bool]:
    out = {}
    for name in BACKEND_PACKAGES:
        try:
            out[name] = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            out[name] = False
    return out


# Coral USB accelerator: 1a6e:089a before its firmware is loaded, 18d1:9302 after
_EDGETPU_USB = {("1a6e", "089a"), ("18d1", "9302")}


def edgetpus(root: Path) -> list[dict]:
    """Edge TPUs seen in sysfs (USB) and /dev (PCIe/M.2 ``apex_N``)."""
    found = []
    usb = root / "sys" / "bus" / "usb" / "devices"
    if usb.is_dir():
        for dev in sorted(usb.iterdir()):
            ids = (_read(dev, "idVendor").strip(), _read(dev, "idProduct").strip())
            if ids in _EDGETPU_USB:
                found.append({"type": "usb", "path": dev.name, "id": ":".join(ids)})
    dev_dir = root / "dev"
    if dev_dir.is_dir():
        found += [{"type": "pci", "path": f"/dev/{p.name}"} for p in sorted(dev_dir.glob("apex_[0-9]*"))]
    return found


def detect(root: str | os.PathLike = "/", *, system: str | None = None, machine: str | None = None) -> dict:
    root = Path(root)
    system = system or platform.system()
    machine = machine or platform.machine()
    nvidia = sorted(p.name for p in (root / "dev").glob("nvidia[0-9]*")) if (root / "dev").is_dir() else []
    return {
        "system": system,
        "machine": machine,
        "cpu": _cpu(root, machine),
        "nvidia_gpus": nvidia,
        "edgetpus": edgetpus(root),
        "packages": packages_present(),
    }


@lru_cache(maxsize=1)
def detect_cached() -> dict:
    return detect()
