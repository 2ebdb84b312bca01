"""CPU vendor, model, cores and int8-relevant ISA features, as the OS reports them.

Linux: ``/proc/cpuinfo`` (x86 ``flags``, ARM ``Features`` and the
implementer/part codes); on AArch64 the process's own HWCAPs from
``/proc/self/auxv`` win for the ISA features. Under user-mode emulation
(qemu-user running an arm64 userland on an x86 kernel) ``/proc/cpuinfo``
describes the host's CPU, not this process's: the record then says so
(``emulated``, ``note``), names no model or vendor, and takes the features
from the HWCAPs qemu gives the process. On x86 the process's own view is
CPUID, which the vendor libraries dispatch on: numpy reads it at import (its
runtime dispatch), and where it lacks a feature ``/proc/cpuinfo`` lists
(``qemu-x86_64 -cpu EPYC-Rome`` on a VNNI host, or a hypervisor that masks
CPUID) the features are CPUID's (``cpuid_differs``, ``note``): the int8 class
must be the one the kernels see. macOS: ``sysctl`` values (``machdep.cpu.brand_string``,
``hw.optional.*``), read through an injectable lookup so tests need no Mac.
Nothing here imports an ML framework or starts a process.
"""

from __future__ import annotations

import os

# what the OS calls a feature -> our name (only the ones that matter for int8 inference)
LINUX_FLAGS = {
    "avx2": "avx2", "avx512f": "avx512f", "avx512_vnni": "avx512_vnni", "avx_vnni": "avx_vnni",
    "avx512_bf16": "avx512_bf16", "amx_tile": "amx_tile", "amx_int8": "amx_int8", "amx_bf16": "amx_bf16",
    "asimd": "neon", "neon": "neon", "asimddp": "dotprod", "i8mm": "i8mm", "sve": "sve", "sve2": "sve2",
    "bf16": "bf16",
}
DARWIN_SYSCTL_FLAGS = {
    "hw.optional.neon": "neon", "hw.optional.arm.FEAT_DotProd": "dotprod", "hw.optional.arm.FEAT_I8MM": "i8mm",
    "hw.optional.arm.FEAT_BF16": "bf16", "hw.optional.avx2_0": "avx2", "hw.optional.avx512f": "avx512f",
}
INT8_DOT = ("avx512_vnni", "avx_vnni", "amx_int8", "dotprod", "i8mm")
FEATURE_ORDER = tuple(dict.fromkeys(list(LINUX_FLAGS.values()) + list(DARWIN_SYSCTL_FLAGS.values())))

# ARM "CPU implementer" / "CPU part" codes (the Linux kernel prints these instead of a model name)
ARM_IMPLEMENTERS = {"0x41": "ARM", "0x42": "Broadcom", "0x48": "HiSilicon", "0x4e": "NVIDIA", "0x51": "Qualcomm",
                    "0x61": "Apple", "0xc0": "Ampere"}
ARM_PARTS = {"0xd03": "Cortex-A53", "0xd04": "Cortex-A35", "0xd05": "Cortex-A55", "0xd07": "Cortex-A57",
             "0xd08": "Cortex-A72", "0xd09": "Cortex-A73", "0xd0a": "Cortex-A75", "0xd0b": "Cortex-A76",
             "0xd0c": "Neoverse-N1", "0xd0d": "Cortex-A77", "0xd40": "Neoverse-V1", "0xd41": "Cortex-A78",
             "0xd42": "Cortex-A78AE", "0xd4f": "Neoverse-V2", "0x004": "Carmel"}


# AArch64 HWCAP bits (linux arch/arm64/include/uapi/asm/hwcap.h) -> our names
ARM64_HWCAP = {1: "neon", 20: "dotprod", 22: "sve"}              # ASIMD, ASIMDDP, SVE
ARM64_HWCAP2 = {1: "sve2", 13: "i8mm", 14: "bf16"}
AT_HWCAP, AT_HWCAP2 = 16, 26
ARM_MACHINES = ("aarch64", "arm64")
X86_MACHINES = ("x86_64", "amd64", "i386", "i686")


def read_auxv(root) -> bytes:
    """This process's auxiliary vector (``/proc/self/auxv`` under ``root``), or b"" when absent."""
    try:
        with open(os.path.join(os.fspath(root), "proc", "self", "auxv"), "rb") as fh:
            return fh.read(8192)
    except OSError:
        return b""


def auxv_hwcaps(raw: bytes) -> tuple[int, int] | None:
    """(AT_HWCAP, AT_HWCAP2) from a 64-bit little-endian auxv; None without AT_HWCAP."""
    import struct

    found: dict[int, int] = {}
    for i in range(0, len(raw) - 15, 16):
        key, value = struct.unpack_from("<QQ", raw, i)
        if key == 0:
            break
        found[key] = value
    if AT_HWCAP not in found:
        return None
    return found[AT_HWCAP], found.get(AT_HWCAP2, 0)


def arm64_features(hwcap: int, hwcap2: int) -> set[str]:
    return ({name for bit, name in ARM64_HWCAP.items() if hwcap >> bit & 1}
            | {name for bit, name in ARM64_HWCAP2.items() if hwcap2 >> bit & 1} | {"neon"})


# numpy's CPUID names -> ours: the int8-relevant x86 features numpy's dispatcher checks itself
# (AMX and AVX-VNNI it does not: where CPUID and /proc/cpuinfo disagree those count as unconfirmed)
NUMPY_CPUID = {"AVX2": "avx2", "AVX512F": "avx512f", "AVX512VNNI": "avx512_vnni", "AVX512BF16": "avx512_bf16"}


def numpy_cpuid() -> dict[str, bool] | None:
    """The x86 features CPUID gives this process, as numpy's dispatcher read them (None when unreadable)."""
    try:
        try:
            from numpy._core._multiarray_umath import __cpu_features__ as feats  # type: ignore[import-not-found]
        except ImportError:             # numpy 1.x
            from numpy.core._multiarray_umath import __cpu_features__ as feats  # type: ignore[no-redef]
    except Exception:
        return None
    if not all(k in feats for k in NUMPY_CPUID):
        return None
    return {ours: bool(feats[k]) for k, ours in NUMPY_CPUID.items()}


def _features(found: set[str]) -> list[str]:
    return [f for f in FEATURE_ORDER if f in found]


def linux_cpu(cpuinfo: str, machine: str, auxv: bytes = b"", cpuid: dict[str, bool] | None = None) -> dict:
    fields: dict[str, str] = {}
    flags: set[str] = set()
    processors = 0
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "processor":
            processors += 1
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
        else:
            fields.setdefault(key, value)
    # which architecture /proc/cpuinfo describes: the kernel's, which is not this process's under emulation
    described = "x86" if "vendor_id" in fields else "arm" if "CPU implementer" in fields else None
    foreign = ((machine in ARM_MACHINES and described == "x86")
               or (machine in X86_MACHINES and described == "arm"))
    found = set() if foreign else {LINUX_FLAGS[f] for f in flags if f in LINUX_FLAGS}
    hwcaps = auxv_hwcaps(auxv) if machine in ARM_MACHINES else None
    if hwcaps is not None:
        found = arm64_features(*hwcaps)     # what is true for this process (qemu: the emulated CPU's)
    if machine in ARM_MACHINES:
        found.add("neon")       # Advanced SIMD is mandatory on AArch64
    if foreign:
        rec = _record("", "", processors or os.cpu_count() or 1, found)
        rec["emulated"] = True
        rec["note"] = (f"/proc/cpuinfo describes an {described} CPU, not this {machine} process (user-mode "
                       "emulation such as qemu-user): CPU model unknown; features from "
                       + ("the process's HWCAPs" if hwcaps is not None else "nothing readable"))
        return rec
    vendor = fields.get("vendor_id") or ARM_IMPLEMENTERS.get(fields.get("CPU implementer", "").lower(), "")
    model = fields.get("model name") or ""
    if not model and fields.get("CPU part"):
        part = fields["CPU part"].lower()
        model = " ".join(x for x in (vendor, ARM_PARTS.get(part, f"part {part}")) if x)
    differs = sorted(f for f in found if cpuid and cpuid.get(f) is False) if machine in X86_MACHINES else []
    if not differs:
        return _record(vendor, model, processors or os.cpu_count() or 1, found)
    confirmed = {f for f in found if cpuid and cpuid.get(f) is True}
    unconfirmed = _features(found - confirmed - set(differs))       # AMX, AVX-VNNI: numpy does not check them
    rec = _record(vendor, model, processors or os.cpu_count() or 1, confirmed)
    rec["cpuid_differs"] = differs
    rec["note"] = (f"CPUID, which this process's libraries dispatch on, lacks {', '.join(differs)} that "
                   "/proc/cpuinfo lists (user-mode emulation such as qemu-x86_64 -cpu, or a hypervisor masking "
                   "CPUID): features from CPUID"
                   + (f", {', '.join(unconfirmed)} unconfirmed and left out" if unconfirmed else "")
                   + f"; the model name is the host's ({model or '?'})")
    return rec


def darwin_cpu(sysctl, machine: str) -> dict:
    found = {name for key, name in DARWIN_SYSCTL_FLAGS.items() if str(sysctl(key) or "0") not in ("0", "")}
    x86 = " ".join(str(sysctl(k) or "") for k in ("machdep.cpu.features", "machdep.cpu.leaf7_features")).lower()
    found |= {LINUX_FLAGS[f] for f in x86.replace("avx512vnni", "avx512_vnni").split() if f in LINUX_FLAGS}
    if machine == "arm64":
        found.add("neon")
    brand = str(sysctl("machdep.cpu.brand_string") or "")
    vendor = "Apple" if brand.startswith("Apple") or machine == "arm64" else str(sysctl("machdep.cpu.vendor") or "")
    cores = int(sysctl("hw.ncpu") or os.cpu_count() or 1)
    return _record(vendor, brand, cores, found)


def _record(vendor: str, model: str, cores: int, found: set[str]) -> dict:
    features = _features(found)
    return {"vendor": vendor, "model": model, "cores": int(cores), "features": features,
            "int8_dot": any(f in found for f in INT8_DOT)}


_INT_SYSCTLS = ("hw.optional.", "hw.ncpu", "sysctl.proc_translated")


def darwin_sysctl(name: str):
    """``sysctlbyname`` through libc (no subprocess); None when the name does not exist.

    Not exercised on a Mac in this project's tests: they inject a dict lookup instead.
    """
    import ctypes

    libc = ctypes.CDLL(None)
    size = ctypes.c_size_t(0)
    key = name.encode()
    if libc.sysctlbyname(key, None, ctypes.byref(size), None, 0) != 0 or not size.value:
        return None
    buf = ctypes.create_string_buffer(size.value)
    if libc.sysctlbyname(key, buf, ctypes.byref(size), None, 0) != 0:
        return None
    raw = buf.raw[:size.value]
    if name.startswith(_INT_SYSCTLS):
        return int.from_bytes(raw, "little")
    return raw.rstrip(b"\0").decode("utf-8", "replace")
