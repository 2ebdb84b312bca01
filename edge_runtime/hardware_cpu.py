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
from typing import Callable

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
ARM_FEATURES = frozenset({"neon", "dotprod", "i8mm", "sve", "sve2", "bf16"})
INT8_DOT = ("avx512_vnni", "avx_vnni", "amx_int8", "dotprod", "i8mm")
FEATURE_ORDER = tuple(dict.fromkeys(list(LINUX_FLAGS.values()) + list(DARWIN_SYSCTL_FLAGS.values())))

# ARM "CPU implementer" / "CPU part" codes (the Linux kernel prints these instead of a model name)
ARM_IMPLEMENTERS = {"0x41": "ARM", "0x42": "Broadcom", "0x48": "HiSilicon", "0x4e": "NVIDIA", "0x51": "Qualcomm",
                    "0x53": "Samsung", "0x61": "Apple", "0xc0": "Ampere"}
ARM_PARTS = {"0xd03": "Cortex-A53", "0xd04": "Cortex-A35", "0xd05": "Cortex-A55", "0xd07": "Cortex-A57",
             "0xd08": "Cortex-A72", "0xd09": "Cortex-A73", "0xd0a": "Cortex-A75", "0xd0b": "Cortex-A76",
             "0xd0c": "Neoverse-N1", "0xd0d": "Cortex-A77", "0xd40": "Neoverse-V1", "0xd41": "Cortex-A78",
             "0xd42": "Cortex-A78AE", "0xd46": "Cortex-A510", "0xd47": "Cortex-A710", "0xd48": "Cortex-X2",
             "0xd49": "Neoverse-N2", "0xd4d": "Cortex-A715", "0xd4e": "Cortex-X3", "0xd4f": "Neoverse-V2",
             "0xd80": "Cortex-A520", "0xd81": "Cortex-A720", "0xd82": "Cortex-X4"}
# part codes are each implementer's own (NVIDIA's 0x004 is Carmel, Samsung's 0x004 a Mongoose M5)
VENDOR_PARTS = {"0x41": ARM_PARTS, "0x4e": {"0x000": "Denver", "0x003": "Denver 2", "0x004": "Carmel"}}


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
    blocks: list[set[str]] = []         # each processor's flags/Features line
    cores: list[tuple[str, str]] = []   # each processor's (CPU implementer, CPU part), ARM
    implementer = ""
    processors = 0
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "processor":
            processors += 1
        elif key in ("flags", "Features"):
            blocks.append(set(value.split()))
        else:
            if key == "CPU implementer":
                implementer = value.lower()
            elif key == "CPU part":
                cores.append((implementer, value.lower()))
            fields.setdefault(key, value)
    # a feature only some cores have (Exynos 9810's A55s have dotprod, its M3s do not; a hypervisor
    # giving vCPUs different flags) is not usable: a thread migrates to any core, so only the
    # features every processor lists count, and the rest are said
    flags = set.intersection(*blocks) if blocks else set()
    partial = sorted({LINUX_FLAGS[f] for b in blocks for f in b - flags if f in LINUX_FLAGS})
    # which architecture /proc/cpuinfo describes: the kernel's, which is not this process's under emulation
    described = "x86" if "vendor_id" in fields else "arm" if "CPU implementer" in fields else None
    # an armv7l or riscv64 process under qemu-user on an x86 kernel is as foreign to it as an aarch64 one
    family = ("x86" if machine.lower() in X86_MACHINES else
              "arm" if machine.lower().startswith(("arm", "aarch64")) else machine)
    foreign = described is not None and family != described
    found = set() if foreign else {LINUX_FLAGS[f] for f in flags if f in LINUX_FLAGS}
    hwcaps = auxv_hwcaps(auxv) if machine in ARM_MACHINES else None
    if hwcaps is not None:
        found = arm64_features(*hwcaps)     # what is true for this process (qemu: the emulated CPU's)
    if machine in ARM_MACHINES:
        found.add("neon")       # Advanced SIMD is mandatory on AArch64
    emulated_cpuid = foreign and machine in X86_MACHINES and bool(cpuid)
    if emulated_cpuid and cpuid:        # FEX, box64: the emulator's CPUID is what this x86 process dispatches on
        found = {f for f, ok in cpuid.items() if ok}
    if foreign:
        rec = _record("", "", processors or os.cpu_count() or 1, found)
        rec["emulated"] = True
        rec["note"] = (f"/proc/cpuinfo describes an {described} CPU, not this {machine} process (user-mode "
                       "emulation such as qemu-user): CPU model unknown; features from "
                       + ("the process's HWCAPs" if hwcaps is not None else
                          "the emulated CPUID (AVX-VNNI and AMX unchecked)" if emulated_cpuid else "nothing readable"))
        return rec
    if not blocks and hwcaps is None:
        # no flags to read (/proc not mounted in a chroot or sandbox): an empty list would say "no AVX2"
        if machine in X86_MACHINES and cpuid:
            found = {f for f, ok in cpuid.items() if ok}
            how = ("features from CPUID as numpy's dispatcher read it (AVX-VNNI and AMX, which it does not "
                   "check, unknown)")
        else:
            how = "CPU features unknown" + (" (NEON is mandatory on AArch64)" if found else "")
        rec = _record("", "", processors or os.cpu_count() or 1, found)
        rec["note"] = "/proc/cpuinfo lists no CPU flags (not mounted, or unreadable here): " + how
        return rec
    vendor = fields.get("vendor_id") or ARM_IMPLEMENTERS.get(fields.get("CPU implementer", "").lower(), "")
    model = fields.get("model name") or ""
    if not model and cores:
        # big.LITTLE: every kind of core, in the order the kernel lists them (not only cpu0's)
        kinds = list(dict.fromkeys(cores))
        names = [" ".join(x for x in (ARM_IMPLEMENTERS.get(impl, ""),
                                      VENDOR_PARTS.get(impl, {}).get(part, f"part {part}")) if x)
                 for impl, part in kinds]
        model = " + ".join(f"{n} x{cores.count(k)}" if len(kinds) > 1 else n for n, k in zip(names, kinds))
    differs = sorted(f for f in found if cpuid and cpuid.get(f) is False) if machine in X86_MACHINES else []
    if not differs:
        return _partial(_record(vendor, model, processors or os.cpu_count() or 1, found), partial, hwcaps)
    confirmed = {f for f in found if cpuid and cpuid.get(f) is True}
    unconfirmed = _features(found - confirmed - set(differs))       # AMX, AVX-VNNI: numpy does not check them
    rec = _record(vendor, model, processors or os.cpu_count() or 1, confirmed)
    rec["cpuid_differs"] = differs
    rec["note"] = (f"CPUID, which this process's libraries dispatch on, lacks {', '.join(differs)} that "
                   "/proc/cpuinfo lists (user-mode emulation such as qemu-x86_64 -cpu, or a hypervisor masking "
                   "CPUID): features from CPUID"
                   + (f", {', '.join(unconfirmed)} unconfirmed and left out" if unconfirmed else "")
                   + f"; the model name is the host's ({model or '?'})")
    return _partial(rec, partial, hwcaps)


def _partial(rec: dict, partial: list[str], hwcaps) -> dict:
    """Say which features only some of the processors list (left out of ``features``)."""
    if not partial or hwcaps is not None:       # the HWCAPs are the kernel's system-wide view already
        return rec
    rec["features_not_on_every_core"] = partial
    said = (" " + rec["note"]) if rec.get("note") else ""
    rec["note"] = (f"/proc/cpuinfo lists {', '.join(partial)} on some processors only: left out (a thread may "
                   f"run on any core).{said}")
    return rec


def cpu_list_count(text: str) -> int | None:
    """How many CPUs a kernel CPU list names (``0-3,8,10-11`` -> 7); None when it is not one."""
    n = 0
    for part in text.strip().split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and (not hi.isdigit() or int(hi) < int(lo))):
            return None
        n += int(hi) - int(lo) + 1 if sep else 1
    return n or None


def _quota(text: str) -> tuple[int, int] | None:
    """(quota, period) from cgroup v2 ``cpu.max`` (``200000 100000``; ``max ...`` is no limit)."""
    parts = text.split()
    if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit() and int(parts[1]) > 0:
        return int(parts[0]), int(parts[1])
    return None


def usable_cpus(read: Callable[[str], str], cores: int) -> tuple[int, list[str]]:
    """How many CPUs this process may run on, and what limits it below ``cores``: its affinity
    (``/proc/self/status`` ``Cpus_allowed_list``: taskset, ``docker --cpuset-cpus``) and its
    cgroup's CPU quota (v2 ``cpu.max`` up the process's cgroup path, v1 ``cpu.cfs_quota_us``:
    ``docker --cpus``, a Kubernetes CPU limit). ``read(rel)`` returns a file under the root, or ""."""
    usable, why = cores, []
    listed = next((line.split(":", 1)[1].strip() for line in read("proc/self/status").splitlines()
                   if line.startswith("Cpus_allowed_list:")), "")
    allowed = cpu_list_count(listed) if listed else None
    if allowed is not None and allowed < usable:
        usable = allowed
        why.append(f"affinity: CPUs {listed} ({allowed})")
    quotas: list[tuple[str, tuple[int, int]]] = []
    for line in read("proc/self/cgroup").splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        path = "/" + path.strip().strip("/")
        if hier == "0" and controllers == "":           # cgroup v2: every level up to the root may limit
            parts = [x for x in path.split("/") if x]
            for i in range(len(parts), -1, -1):
                rel = "/".join(["sys/fs/cgroup", *parts[:i], "cpu.max"])
                q = _quota(read(rel))
                if q:
                    quotas.append((rel, q))
        elif "cpu" in controllers.split(","):          # cgroup v1
            for base in dict.fromkeys((f"sys/fs/cgroup/{controllers}{path}".rstrip("/"),
                                       f"sys/fs/cgroup/{controllers}", "sys/fs/cgroup/cpu")):
                q = _quota(read(f"{base}/cpu.cfs_quota_us") + " " + read(f"{base}/cpu.cfs_period_us"))
                if q:           # a quota of -1 (no limit) is not digits
                    quotas.append((f"{base}/cpu.cfs_quota_us", q))
                    break
    for rel, (quota, period) in quotas:
        n = max(1, -(-quota // period))         # 1.5 CPUs of quota keep two threads busy part of the time
        if n < usable:
            usable = n
            why.append(f"cgroup CPU quota: /{rel} {quota}/{period} ({quota / period:g} CPUs)")
    return usable, why


def darwin_cpu(sysctl, machine: str) -> dict:
    found = {name for key, name in DARWIN_SYSCTL_FLAGS.items() if str(sysctl(key) or "0") not in ("0", "")}
    x86 = " ".join(str(sysctl(k) or "") for k in ("machdep.cpu.features", "machdep.cpu.leaf7_features")).lower()
    found |= {LINUX_FLAGS[f] for f in x86.replace("avx512vnni", "avx512_vnni").split() if f in LINUX_FLAGS}
    # only this process's architecture's features: an x86-64 Python under Rosetta 2 still reads the
    # chip's hw.optional.arm.* (dotprod, i8mm) but runs translated x86 code that cannot use them
    other = ({f for f in found if f not in ARM_FEATURES} if machine in ARM_MACHINES
             else {f for f in found if f in ARM_FEATURES})
    found -= other
    if machine == "arm64":
        found.add("neon")
    brand = str(sysctl("machdep.cpu.brand_string") or "")
    vendor = "Apple" if brand.startswith("Apple") or machine == "arm64" else str(sysctl("machdep.cpu.vendor") or "")
    cores = int(sysctl("hw.ncpu") or os.cpu_count() or 1)
    rec = _record(vendor, brand, cores, found)
    if other and machine not in ARM_MACHINES:
        rec["note"] = (f"the chip has {', '.join(_features(other))}, which this {machine} process cannot use "
                       "(Rosetta 2 translates x86-64 code): left out")
    return rec


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
