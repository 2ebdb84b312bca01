"""Fake filesystem trees of the boards the runtime targets, for ``hardware.detect(root, ...)``.

Each builder writes what the real board exposes (``/proc/cpuinfo``, the
device tree, ``/etc/nv_tegra_release``, sysfs USB/PCI entries, ``/dev`` nodes,
vendor libraries) plus a fake ``site-packages`` holding the Python packages
that board is given, and returns the keyword arguments for ``detect``.
``board(tmp_path, name)`` → (root, kwargs); ``detect_board(tmp_path, name)`` → the hardware dict.
"""

from __future__ import annotations

from pathlib import Path

from edge_runtime.hardware import detect

A78AE = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp uscat " \
        "ilrcpc flagm paca pacg"
A76 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
X86_BASE = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr sse sse2 ht syscall nx lm avx f16c fma avx2 bmi1 bmi2"
SAPPHIRE_RAPIDS = X86_BASE + " avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16 avx_vnni amx_bf16 amx_tile amx_int8"
ORIN_RELEASE = "# R36 (release), REVISION: 3.0, GCID: 36923193, BOARD: generic, EABI: aarch64, DATE: Fri Jul 19 23:24:25 UTC 2024\n"


def write(root: Path, rel: str, text: str = "") -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def arm_cpuinfo(cores: int, part: str, features: str, implementer: str = "0x41") -> str:
    return "".join(f"processor\t: {i}\nBogoMIPS\t: 62.50\nFeatures\t: {features}\nCPU implementer\t: {implementer}\n"
                   f"CPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: {part}\nCPU revision\t: 1\n\n"
                   for i in range(cores))


def x86_cpuinfo(cores: int, vendor: str, model: str, flags: str) -> str:
    return "".join(f"processor\t: {i}\nvendor_id\t: {vendor}\ncpu family\t: 6\nmodel name\t: {model}\n"
                   f"flags\t\t: {flags}\n\n" for i in range(cores))


def site(root: Path, *modules: str, ort: tuple | None = None) -> list[str]:
    """A fake site-packages: empty packages for ``modules``; ``ort`` = (distribution, version, providers)."""
    sp = root / "site-packages"
    sp.mkdir(parents=True, exist_ok=True)
    for m in modules:
        write(sp, f"{m}/__init__.py")
    if ort is not None:
        dist, version, providers = ort
        write(sp, "onnxruntime/__init__.py")
        write(sp, "onnxruntime/capi/build_and_package_info.py",
              f"package_name = '{dist}'\n__version__ = '{version}'\n"
              + ("cuda_version = '12.6'\n" if "cuda" in providers else ""))
        write(sp, "onnxruntime/capi/libonnxruntime_providers_shared.so")
        for p in providers:
            if p != "cpu":
                write(sp, f"onnxruntime/capi/libonnxruntime_providers_{p}.so")
        write(sp, f"{dist.replace('-', '_')}-{version}.dist-info/METADATA", f"Name: {dist}\nVersion: {version}\n")
    return [str(sp)]


def usb(root: Path, port: str, vid: str, pid: str, speed: str = "5000") -> None:
    base = f"sys/bus/usb/devices/{port}"
    write(root, f"{base}/idVendor", vid + "\n")
    write(root, f"{base}/idProduct", pid + "\n")
    write(root, f"{base}/speed", speed + "\n")


def _linux(system="Linux", machine="x86_64", **kw) -> dict:
    return {"system": system, "machine": machine, "env": {}, **kw}


def x86_host(root: Path, *, vnni: bool = False, modules=("openvino", "ai_edge_litert"), ort=("onnxruntime", "1.32.0", ["cpu"])):
    if vnni:
        write(root, "proc/cpuinfo", x86_cpuinfo(8, "GenuineIntel", "Intel(R) Xeon(R) Platinum 8480+", SAPPHIRE_RAPIDS))
    else:
        write(root, "proc/cpuinfo", x86_cpuinfo(2, "AuthenticAMD", "AMD EPYC 7B13", X86_BASE))
    (root / "dev").mkdir(parents=True, exist_ok=True)
    (root / "sys/bus/usb/devices").mkdir(parents=True, exist_ok=True)
    return _linux(python_path=site(root, *modules, ort=ort))


def coral_usb_before_firmware(root: Path):
    kw = x86_host(root)
    usb(root, "2-1", "1a6e", "089a")
    return kw        # and no libedgetpu installed


def coral_usb(root: Path):
    kw = x86_host(root)
    usb(root, "2-1", "18d1", "9302", speed="480")
    write(root, "usr/lib/x86_64-linux-gnu/libedgetpu.so.1")
    return kw


def coral_pcie(root: Path):
    kw = x86_host(root)
    write(root, "dev/apex_0")
    write(root, "sys/bus/pci/devices/0000:03:00.0/vendor", "0x1ac1\n")
    write(root, "sys/bus/pci/devices/0000:03:00.0/device", "0x089a\n")
    write(root, "usr/lib/x86_64-linux-gnu/libedgetpu.so.1")
    return kw


def coral_pcie_without_driver(root: Path):
    kw = x86_host(root)
    write(root, "sys/bus/pci/devices/0000:03:00.0/vendor", "0x1ac1\n")
    write(root, "sys/bus/pci/devices/0000:03:00.0/device", "0x089a\n")
    return kw


def _orin(root: Path, ort):
    write(root, "proc/cpuinfo", arm_cpuinfo(12, "0xd42", A78AE))
    write(root, "proc/device-tree/model", "NVIDIA Jetson AGX Orin Developer Kit\0")
    write(root, "proc/device-tree/compatible", "nvidia,p3737-0000+p3701-0005\0nvidia,p3701-0005\0nvidia,tegra234\0")
    write(root, "etc/nv_tegra_release", ORIN_RELEASE)
    write(root, "dev/nvhost-ctrl-gpu")
    write(root, "usr/lib/aarch64-linux-gnu/libnvinfer.so.10")
    write(root, "usr/local/cuda/lib64/libcudart.so.12")
    return _linux(machine="aarch64", python_path=site(root, "ai_edge_litert", ort=ort))


def jetson_orin(root: Path):
    return _orin(root, ("onnxruntime-gpu", "1.19.0", ["cpu", "cuda", "tensorrt"]))


def jetson_orin_cpu_onnxruntime(root: Path):
    return _orin(root, ("onnxruntime", "1.19.0", ["cpu"]))


def rpi5_coral(root: Path):
    write(root, "proc/cpuinfo", arm_cpuinfo(4, "0xd0b", A76) + "Revision\t: d04170\nModel\t\t: Raspberry Pi 5 Model B Rev 1.0\n")
    write(root, "proc/device-tree/model", "Raspberry Pi 5 Model B Rev 1.0\0")
    usb(root, "4-1", "18d1", "9302")
    write(root, "usr/lib/aarch64-linux-gnu/libedgetpu.so.1")
    return _linux(machine="aarch64", python_path=site(root, "tflite_runtime", ort=("onnxruntime", "1.19.0", ["cpu"])))


def apple_silicon(root: Path, *, coremltools: bool = False):
    root.mkdir(parents=True, exist_ok=True)
    sysctl = {"machdep.cpu.brand_string": "Apple M2", "hw.ncpu": 8, "hw.optional.neon": 1,
              "hw.optional.arm.FEAT_DotProd": 1, "hw.optional.arm.FEAT_I8MM": 1, "hw.optional.arm.FEAT_BF16": 1,
              "sysctl.proc_translated": 0}
    mods = ("coremltools",) if coremltools else ()
    return {"system": "Darwin", "machine": "arm64", "sysctl": sysctl, "env": {},
            "python_path": site(root, *mods, ort=("onnxruntime", "1.19.0", ["cpu"]))}


def nvidia_x86(root: Path):
    kw = x86_host(root, modules=("openvino",), ort=("onnxruntime-gpu", "1.19.0", ["cpu", "cuda", "tensorrt"]))
    for n in ("nvidia0", "nvidiactl", "nvidia-uvm"):
        write(root, f"dev/{n}")
    write(root, "proc/driver/nvidia/version",
          "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n")
    write(root, "proc/driver/nvidia/gpus/0000:01:00.0/information", "Model: \t\t NVIDIA RTX A2000\nIRQ: 130\n")
    return kw


BOARDS = {
    "coral-usb-before-firmware": coral_usb_before_firmware,
    "coral-usb": coral_usb,
    "coral-pcie": coral_pcie,
    "coral-pcie-without-driver": coral_pcie_without_driver,
    "jetson-orin": jetson_orin,
    "jetson-orin-cpu-onnxruntime": jetson_orin_cpu_onnxruntime,
    "rpi5-coral": rpi5_coral,
    "apple-silicon": apple_silicon,
    "x86": lambda root: x86_host(root),
    "x86-vnni": lambda root: x86_host(root, vnni=True, modules=("ai_edge_litert",)),
    "nvidia-x86": nvidia_x86,
}


def board(tmp_path: Path, name: str) -> tuple[Path, dict]:
    root = Path(tmp_path) / name
    return root, BOARDS[name](root)


def detect_board(tmp_path: Path, name: str) -> dict:
    root, kw = board(tmp_path, name)
    return detect(root, **kw)
