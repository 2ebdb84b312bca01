"""What this machine is, found without importing any ML framework (a few ms).

``detect()`` runs a table of small probes over an injectable filesystem root
(tests point it at fake sysfs/dev/proc trees of each board, see
``tests/boards.py``) and returns one JSON-safe dict. The keys other code reads:

- ``system``, ``machine``: ``platform.system()`` / ``platform.machine()`` (or as given)
- ``cpu``: vendor, model, cores, int8-relevant ``features``, ``int8_dot``
  (``hardware_cpu.py``); ``usable``: the CPUs this process may run on (affinity, cgroup quota;
  ``usable_limited_by`` says what limits it)
- ``probe_errors``: only when a probe raised: its key -> the error; that probe's value is "nothing found"
- ``apple_silicon``: bool (macOS on arm64, also an x86-64 Python under Rosetta);
  ``apple``: chip name and Rosetta flag on macOS, else None
- ``board``: device-tree model and kind (``jetson``, ``raspberry-pi``, ...) or None
- ``jetson``: model, L4T release, JetPack line, SoC and whether the installed
  onnxruntime can use the GPU, or None
- ``nvidia_gpus``: discrete-GPU device nodes (``nvidia0``..., or ``dxg``: WSL 2 with the NVIDIA
  driver's libcuda); ``nvidia``:
  driver version, GPU names, whether it is a Jetson's integrated GPU, or None
- ``edgetpus``: Coral USB (by USB id, before and after its firmware load) and
  PCIe/M.2 (``/dev/apex_N``), as the ``edgetpu`` backend reads them; ``coral``:
  USB firmware state and link speed, and Coral PCIe cards on the PCI bus with
  no ``/dev/apex_N`` (driver missing), or None
- ``packages``: backend packages importable (``find_spec``, never imported; a bare folder or one whose
  compiled extensions this interpreter cannot load is not); ``packages_unusable``: those installed
  but not importable here, with the reason;
  ``onnxruntime``: the installed ONNX Runtime build (distribution, providers);
  ``libraries``: vendor libraries found by file name (``hardware_packages.py``); ``cuda_runtimes``: the
  CUDA major versions of the ``libcudart.so.N`` found
"""

from __future__ import annotations

import os
import platform
import re
from functools import lru_cache
from pathlib import Path
from typing import Callable

from . import records
from .hardware_cpu import (X86_MACHINES, darwin_cpu, darwin_sysctl, linux_cpu, numpy_cpuid, read_auxv,
                           usable_cpus)
from .hardware_packages import (BACKEND_PACKAGES, cuda_runtimes, onnxruntime_build, packages_present, packages_unusable,
                                vendor_libraries)
from .value import Record

__all__ = ["detect", "detect_cached", "has_nvidia_gpu", "packages_present", "BACKEND_PACKAGES"]


class Probe(Record):
    root: Path
    system: str
    machine: str
    sysctl: Callable[[str], object]
    python_path: list | None
    env: dict | None
    cpuid: dict | None                  # x86: the features CPUID gives this process (hardware_cpu.numpy_cpuid)
    found: dict
    ioreg: Callable[[], str]            # macOS: `ioreg -p IOUSB -l -w0`'s text (the USB devices), read on demand

    def __init__(self, root: Path, system: str, machine: str, sysctl: Callable[[str], object],
                 python_path: list | None, env: dict | None, cpuid: dict | None = None,
                 found: dict | None = None) -> None:
        self.root, self.system, self.machine, self.sysctl = root, system, machine, sysctl
        self.python_path, self.env, self.cpuid = python_path, env, cpuid
        self.found = {} if found is None else found
        self.ioreg = _no_ioreg

    def read(self, rel: str, limit: int = 1 << 20) -> str:
        try:
            with open(self.root / rel, "rb") as fh:
                return fh.read(limit).decode("utf-8", "replace")
        except OSError:
            return ""

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.root / rel))
        except OSError:
            return []


def _no_sysctl(name: str):
    return None


# -- probes ------------------------------------------------------------------
def _cpu(p: Probe) -> dict:
    if p.system == "Darwin":
        cpu = darwin_cpu(p.sysctl, p.machine)
        cpu["usable"] = cpu["cores"]
        return cpu
    # auxv: the HWCAPs of this process (arm64); cpuid: its CPUID (x86): what its libraries dispatch on
    # a 2-socket 768-thread EPYC's /proc/cpuinfo is ~1.2 MB: read it whole, or the cores are undercounted
    cpu = linux_cpu(p.read("proc/cpuinfo", 1 << 26), p.machine, read_auxv(p.root), p.cpuid)
    # ``cores`` is the machine's (every processor /proc/cpuinfo lists); ``usable`` what this process may
    # run on: a container limited to 2 CPUs on a 64-core host sees all 64 in /proc/cpuinfo
    cpu["usable"], limited_by = usable_cpus(p.read, cpu["cores"])
    if limited_by:
        cpu["usable_limited_by"] = limited_by
    return cpu


def _apple_silicon(p: Probe) -> bool:
    return p.system == "Darwin" and (p.machine == "arm64" or str(p.sysctl("sysctl.proc_translated")) == "1")


def _apple(p: Probe) -> dict | None:
    if p.system != "Darwin":
        return None
    rosetta = p.machine != "arm64" and str(p.sysctl("sysctl.proc_translated")) == "1"
    return {"chip": str(p.sysctl("machdep.cpu.brand_string") or ""), "rosetta": rosetta}


BOARD_KINDS = (("NVIDIA Jetson", "jetson"), ("Raspberry Pi", "raspberry-pi"), ("Phanbell", "coral-dev-board"),
               ("Coral", "coral-dev-board"))


def _board(p: Probe) -> dict | None:
    model = p.read("proc/device-tree/model").strip("\0 \n")
    if not model:
        return None
    kind = next((k for needle, k in BOARD_KINDS if needle.lower() in model.lower()), "other")
    return {"model": model, "kind": kind}


# L4T major release -> JetPack line (https://developer.nvidia.com/embedded/jetpack-archive)
JETPACK = {32: "4", 34: "5.0 (developer preview)", 35: "5", 36: "6", 38: "7"}


def _l4t(text: str) -> str | None:
    m = re.search(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", text)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def _jetson(p: Probe) -> dict | None:
    model = p.read("proc/device-tree/model").strip("\0 \n")
    compatible = p.read("proc/device-tree/compatible").split("\0")
    release = p.read("etc/nv_tegra_release")
    soc = next((c.split(",", 1)[1] for c in compatible if c.startswith("nvidia,tegra")), None)
    if "jetson" not in model.lower() and not release and soc is None:
        return None
    l4t = _l4t(release)
    major = int(l4t.split(".")[0]) if l4t else None
    ort = p.found.get("onnxruntime")
    return {"model": model or "NVIDIA Jetson (model not in the device tree)", "l4t": l4t,
            "jetpack": JETPACK.get(major) if major else None, "soc": soc,
            "onnxruntime_gpu": bool(ort and ort["gpu"] and not ort.get("unusable")),
            "onnxruntime": None if ort is None else f"{ort['distribution']} {ort['version'] or ''}".strip()}


# WSL 2 has no /dev/nvidiaN: CUDA reaches the GPU through /dev/dxg and the libcuda the NVIDIA
# driver of the Windows host mounts into /usr/lib/wsl/lib (other vendors' drivers mount no libcuda)
WSL_LIBCUDA = ("usr/lib/wsl/lib/libcuda.so.1", "usr/lib/wsl/lib/libcuda.so")


def _nvidia_gpus(p: Probe) -> list[str]:
    dev = p.listdir("dev")
    nodes = [n for n in dev if re.fullmatch(r"nvidia\d+", n)]
    if not nodes and "dxg" in dev and any(os.path.exists(p.root / lib) for lib in WSL_LIBCUDA):
        nodes = ["dxg"]
    return nodes


def _nvidia(p: Probe) -> dict | None:
    version = p.read("proc/driver/nvidia/version")
    m = re.search(r"Kernel Module(?: for \S+)?\s+([\d.]+)", version)
    names = []
    for gpu in p.listdir("proc/driver/nvidia/gpus"):
        info = p.read(f"proc/driver/nvidia/gpus/{gpu}/information")
        mm = re.search(r"^Model:\s*(.+)$", info, re.M)
        if mm:
            names.append(mm.group(1).strip())
    if not (p.found["nvidia_gpus"] or m or p.found.get("jetson")):
        return None
    wsl = p.found["nvidia_gpus"] == ["dxg"]
    return {"driver": m.group(1) if m else None, "gpus": names or (["through WSL 2 (/dev/dxg)"] if wsl else []),
            "integrated": p.found.get("jetson") is not None, "device_nodes": p.found["nvidia_gpus"],
            **({"wsl": True} if wsl else {})}


# Coral USB accelerator: 1a6e:089a (Global Unichip) before its firmware is loaded, 18d1:9302 (Google) after;
# libedgetpu loads the firmware on first use and the device re-enumerates
EDGETPU_USB = {("1a6e", "089a"): "firmware not loaded yet (libedgetpu loads it on first use)",
               ("18d1", "9302"): "firmware loaded"}
CORAL_PCI = ("0x1ac1", "0x089a")


def _coral_usb(p: Probe) -> list[dict]:
    if p.system == "Darwin":
        return _coral_usb_darwin(p)
    found = []
    for dev in p.listdir("sys/bus/usb/devices"):
        base = f"sys/bus/usb/devices/{dev}"
        ids = (p.read(f"{base}/idVendor").strip(), p.read(f"{base}/idProduct").strip())
        if ids in EDGETPU_USB:
            speed = p.read(f"{base}/speed").strip()
            bus, num = p.read(f"{base}/busnum").strip(), p.read(f"{base}/devnum").strip()
            node = f"dev/bus/usb/{int(bus):03d}/{int(num):03d}" if bus.isdigit() and num.isdigit() else None
            found.append({"path": dev, "id": ":".join(ids), "firmware_loaded": ids == ("18d1", "9302"),
                          "state": EDGETPU_USB[ids], **({"node": "/" + node} if node else {}), **_access(p, node),
                          "speed_mbps": int(float(speed)) if speed.replace(".", "", 1).isdigit() else None})
    return found


def _coral_usb_darwin(p: Probe) -> list[dict]:
    """macOS has no sysfs: the USB registry (``ioreg``, ids in decimal), read only where the Edge TPU
    runtime is installed (a subprocess of ~30 ms is no cost every load of every Mac should pay)."""
    if not (p.found.get("libraries") or {}).get("libedgetpu"):
        return []
    found = []
    for block in re.split(r"\n\s*\+-o ", p.ioreg()):
        vid, pid = re.search(r'"idVendor" = (\d+)', block), re.search(r'"idProduct" = (\d+)', block)
        if not (vid and pid):
            continue
        ids = (f"{int(vid.group(1)):04x}", f"{int(pid.group(1)):04x}")
        if ids in EDGETPU_USB:
            loc = re.search(r'"locationID" = (\d+)', block)
            found.append({"path": f"0x{int(loc.group(1)):08x}" if loc else "?", "id": ":".join(ids),
                          "firmware_loaded": ids == ("18d1", "9302"), "state": EDGETPU_USB[ids], "speed_mbps": None})
    return found


def _no_ioreg() -> str:
    return ""


def darwin_ioreg() -> str:
    """The USB device tree of this Mac (``ioreg -p IOUSB -l -w0``); empty when it cannot be read."""
    import subprocess

    try:
        return subprocess.run(["ioreg", "-p", "IOUSB", "-l", "-w0"], capture_output=True, text=True,
                              timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _access(p: Probe, node: str | None) -> dict:
    """``access: "denied"`` when this process may not read and write ``node`` (the device file libusb or
    libedgetpu opens): the device is there, but opening it fails (no udev rule, not in the apex or plugdev
    group), which the delegate reports only as "failed to open"."""
    if node is None or not os.path.exists(p.root / node) or ACCESS(p.root / node, os.R_OK | os.W_OK):
        return {}
    return {"access": "denied"}


ACCESS = os.access      # tests replace it: as root every file is readable and writable


def _edgetpus(p: Probe) -> list[dict]:
    found = [{"type": "usb", "path": d["path"], "id": d["id"], **({"access": d["access"]} if "access" in d else {})}
             for d in _coral_usb(p)]
    return found + [{"type": "pci", "path": f"/dev/{n}", **_access(p, f"dev/{n}")} for n in p.listdir("dev")
                    if re.fullmatch(r"apex_\d+", n)]


def _coral(p: Probe) -> dict | None:
    """Details the backend does not need: USB firmware state and link speed, PCIe cards without a driver."""
    usb = _coral_usb(p)
    has_apex = any(t["type"] == "pci" for t in p.found["edgetpus"])
    orphans = [] if has_apex else [
        d for d in p.listdir("sys/bus/pci/devices")
        if p.read(f"sys/bus/pci/devices/{d}/vendor", 16).strip() == CORAL_PCI[0]
        and p.read(f"sys/bus/pci/devices/{d}/device", 16).strip() == CORAL_PCI[1]]
    if not (usb or has_apex or orphans):
        return None
    return {"usb": usb, "pcie": [t["path"] for t in p.found["edgetpus"] if t["type"] == "pci"],
            "pcie_without_driver": orphans}


# key -> probe, in order (later probes may read earlier results from ``Probe.found``)
PROBES: tuple[tuple[str, Callable[[Probe], object]], ...] = (
    ("cpu", _cpu),
    ("apple_silicon", _apple_silicon),
    ("apple", _apple),
    ("packages", lambda p: packages_present(p.python_path)),
    ("packages_unusable", lambda p: packages_unusable(p.python_path)),
    ("onnxruntime", lambda p: onnxruntime_build(p.python_path)),
    ("libraries", lambda p: vendor_libraries(p.root, p.env)),
    ("cuda_runtimes", lambda p: cuda_runtimes(p.root, p.env)),
    ("board", _board),
    ("jetson", _jetson),
    ("nvidia_gpus", _nvidia_gpus),
    ("nvidia", _nvidia),
    ("edgetpus", _edgetpus),
    ("coral", _coral),
)


def detect(root: str | os.PathLike = "/", *, system: str | None = None, machine: str | None = None,
           sysctl: Callable[[str], object] | dict | None = None, python_path: list | None = None,
           env: dict | None = None, cpuid: dict | None = None,
           ioreg: Callable[[], str] | str | None = None) -> records.Hardware:
    """Probe the machine under ``root``. ``sysctl`` (a dict or a callable) replaces macOS's
    sysctl lookup, ``python_path`` the folders searched for packages, ``env`` the environment
    (``LD_LIBRARY_PATH``), ``cpuid`` the x86 features CPUID gives the process, ``ioreg`` (text, or
    a callable giving it) macOS's USB registry; each defaults to the real thing (CPUID only for the
    real root on this x86 machine, ioreg only for the real root of a Mac, never for a fake one)."""
    system = system or platform.system()
    if isinstance(sysctl, dict):
        sysctl = sysctl.get
    if sysctl is None:
        sysctl = darwin_sysctl if system == "Darwin" and Path(root) == Path("/") else _no_sysctl
    if cpuid is None and Path(root) == Path("/") and machine in (None, platform.machine()) \
            and platform.machine() in X86_MACHINES:
        cpuid = numpy_cpuid()
    p = Probe(Path(root), system, machine or platform.machine(), sysctl, python_path, env, cpuid)
    if isinstance(ioreg, str):
        text = ioreg
        p.ioreg = lambda: text
    elif ioreg is not None:
        p.ioreg = ioreg
    elif system == "Darwin" and Path(root) == Path("/"):
        p.ioreg = darwin_ioreg
    p.ioreg = lru_cache(maxsize=1)(p.ioreg)     # read once: the edgetpus and coral probes both ask
    p.found.update(system=p.system, machine=p.machine)
    errors: dict[str, str] = {}
    for key, probe in PROBES:
        try:
            p.found[key] = probe(p)
        except Exception as e:      # one unreadable source is "unknown, and why", never a crash of devices/doctor
            errors[key] = f"{type(e).__name__}: {e}"
            p.found[key] = _unknown(key, errors[key])
    if errors:
        p.found["probe_errors"] = errors
    return records.hardware(p.found)     # typed and read-only: one probe, one record, never changed after


def _unknown(key: str, why: str) -> object:
    """What a probe that failed leaves: nothing found (an empty list or mapping: ``packages`` then
    asks the backend itself), and for the CPU a record that says it is unknown."""
    if key == "cpu":
        cores = os.cpu_count() or 1
        return {"vendor": "", "model": "", "cores": cores, "features": [], "int8_dot": False, "usable": cores,
                "note": f"CPU features unknown: the probe failed ({why})"}
    return {"apple_silicon": False, "nvidia_gpus": [], "edgetpus": [], "packages": {}, "packages_unusable": {},
            "libraries": {}, "cuda_runtimes": []}.get(key)


@lru_cache(maxsize=1)
def detect_cached() -> records.Hardware:
    return detect()


def has_nvidia_gpu(hardware: dict) -> bool:
    """A discrete NVIDIA GPU (device nodes) or a Jetson's integrated one."""
    return bool(hardware.get("nvidia_gpus") or hardware.get("jetson"))


def edgetpus(root) -> list[dict]:
    """Edge TPUs under ``root`` (kept for callers of the first probe)."""
    return detect(root)["edgetpus"]
