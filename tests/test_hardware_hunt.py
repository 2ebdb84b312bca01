"""Wrong answers hunted in hardware detection, each on a faked input (tests/boards.py trees).

A wrong detection is a wrong choice with exit 0: the int8 class, ``int8_dot`` (selection's
row 7), the CPU counts and the packages ``devices`` and ``doctor`` report are all read from
here, so each case pins what the machine really offers this process.
"""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

from boards import A76, SAPPHIRE_RAPIDS, X86_BASE, arm_cpuinfo, board, site, write, x86_cpuinfo

from edge_runtime import doctor, hardware_cpu, host
from edge_runtime.hardware import detect
from edge_runtime.hardware_cpu import linux_cpu

A55 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
M3 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop"   # no asimddp


def _arm(root: Path, cpuinfo: str) -> dict:
    write(root, "proc/cpuinfo", cpuinfo)
    return detect(root, system="Linux", machine="aarch64", python_path=[], env={})


# -- features a core does not have -------------------------------------------------------------
def test_x86_flags_that_differ_between_cores_count_only_where_every_core_has_them(tmp_path):
    """A hypervisor giving vCPUs different flags: cpu0 lists AVX-512 VNNI, cpu1 does not. A thread
    runs on either, so the process has no VNNI: class x86-avx2, no int8 dot products (before: cpu0's
    flags alone, x86-vnni and ``int8_dot`` true)."""
    info = (x86_cpuinfo(1, "GenuineIntel", "Intel(R) Xeon(R) Processor", SAPPHIRE_RAPIDS)
            + x86_cpuinfo(1, "GenuineIntel", "Intel(R) Xeon(R) Processor", X86_BASE).replace(": 0\n", ": 1\n"))
    cpu = linux_cpu(info, "x86_64")
    assert cpu["features"] == ["avx2"] and cpu["int8_dot"] is False and cpu["cores"] == 2
    assert host.cpu_int8_class({"cpu": cpu, "machine": "x86_64"}) == "x86-avx2"
    assert "avx512_vnni" in cpu["features_not_on_every_core"] and "amx_int8" in cpu["features_not_on_every_core"]
    assert "some processors only" in cpu["note"]


def test_big_little_dotprod_on_the_little_cores_only_is_not_dotprod(tmp_path):
    """Exynos 9810: four Cortex-A55 (dotprod) listed first, four Mongoose M3 (none). Without the
    process's HWCAPs the probe read cpu0's Features: arm-dotprod, a confident wrong class."""
    info = arm_cpuinfo(4, "0xd05", A55) + arm_cpuinfo(4, "0x002", M3, implementer="0x53")
    hw = _arm(tmp_path, info)
    assert "dotprod" not in hw["cpu"]["features"] and hw["cpu"]["int8_dot"] is False
    assert hw["cpu"]["features_not_on_every_core"] == ["dotprod"]
    assert host.cpu_int8_class(hw) == "arm"
    assert hw["cpu"]["model"] == "ARM Cortex-A55 x4 + Samsung part 0x002 x4"


def test_big_little_model_names_every_kind_of_core(tmp_path):
    """RK3588: four Cortex-A55 then four Cortex-A76; the model was cpu0's alone ("ARM Cortex-A55")."""
    hw = _arm(tmp_path, arm_cpuinfo(4, "0xd05", A55) + arm_cpuinfo(4, "0xd0b", A76))
    assert hw["cpu"]["model"] == "ARM Cortex-A55 x4 + ARM Cortex-A76 x4" and hw["cpu"]["cores"] == 8
    assert hw["cpu"]["int8_dot"] and "features_not_on_every_core" not in hw["cpu"]
    # one kind of core keeps its plain name
    assert _arm(tmp_path / "pi", arm_cpuinfo(4, "0xd0b", A76))["cpu"]["model"] == "ARM Cortex-A76"


def test_part_codes_are_read_per_implementer(tmp_path):
    """Part 0x004 is NVIDIA's Carmel only under NVIDIA's implementer code; Samsung's 0x004 is not."""
    assert _arm(tmp_path / "a", arm_cpuinfo(2, "0x004", A55, implementer="0x53"))["cpu"]["model"] \
        == "Samsung part 0x004"
    assert _arm(tmp_path / "b", arm_cpuinfo(2, "0x004", A55, implementer="0x4e"))["cpu"]["model"] == "NVIDIA Carmel"
    assert _arm(tmp_path / "c", arm_cpuinfo(2, "0xd46", A55))["cpu"]["model"] == "ARM Cortex-A510"


def test_rosetta_x86_process_has_no_arm_dot_products(tmp_path):
    """An x86-64 Python under Rosetta 2 reads the M2's hw.optional.arm.FEAT_DotProd/I8MM, but runs
    translated x86 code: before, ``int8_dot`` was true and the features listed neon/dotprod/i8mm."""
    root, kw = board(tmp_path, "apple-silicon")
    kw = {**kw, "machine": "x86_64", "sysctl": {**kw["sysctl"], "sysctl.proc_translated": 1,
                                                 "hw.optional.avx2_0": 1}}
    hw = detect(root, **kw)
    assert hw["apple"]["rosetta"] is True
    assert hw["cpu"]["features"] == ["avx2"] and hw["cpu"]["int8_dot"] is False
    assert "Rosetta" in hw["cpu"]["note"] and "dotprod" in hw["cpu"]["note"]
    assert host.cpu_int8_class(hw) == "x86-avx2"
    native = detect(root, **{**kw, "machine": "arm64"})            # the arm64 Python keeps them, not AVX2
    assert {"neon", "dotprod", "i8mm"} <= set(native["cpu"]["features"]) and "avx2" not in native["cpu"]["features"]
    assert native["cpu"]["int8_dot"] and "note" not in native["cpu"]


# -- how many CPUs -------------------------------------------------------------------------------
def _host64(root: Path) -> None:
    write(root, "proc/cpuinfo", x86_cpuinfo(64, "AuthenticAMD", "AMD EPYC 9554", SAPPHIRE_RAPIDS))


def _cpu(root: Path) -> dict:
    return detect(root, system="Linux", machine="x86_64", python_path=[], env={}, cpuid={})["cpu"]


def test_container_cpu_quota_v2_is_the_usable_count(tmp_path):
    """`docker run --cpus 2` on a 64-core host: /proc/cpuinfo lists 64; cpu.max allows 2."""
    _host64(tmp_path)
    write(tmp_path, "proc/self/status", "Name:\tpython\nCpus_allowed_list:\t0-63\n")
    write(tmp_path, "proc/self/cgroup", "0::/\n")
    write(tmp_path, "sys/fs/cgroup/cpu.max", "200000 100000\n")
    cpu = _cpu(tmp_path)
    assert cpu["cores"] == 64 and cpu["usable"] == 2
    assert cpu["usable_limited_by"] == ["cgroup CPU quota: /sys/fs/cgroup/cpu.max 200000/100000 (2 CPUs)"]


def test_nested_cgroup_v2_limit_and_a_fractional_quota(tmp_path):
    """A Kubernetes pod (limit 1.5 CPUs on the pod's slice, none on the container's own cgroup)."""
    _host64(tmp_path)
    write(tmp_path, "proc/self/cgroup", "0::/kubepods/pod1/ctr\n")
    write(tmp_path, "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "max 100000\n")
    write(tmp_path, "sys/fs/cgroup/kubepods/pod1/cpu.max", "150000 100000\n")
    cpu = _cpu(tmp_path)
    assert cpu["usable"] == 2 and "1.5 CPUs" in cpu["usable_limited_by"][0]


def test_affinity_and_cgroup_v1_quota(tmp_path):
    """`taskset -c 0-3,8` (5 CPUs) inside a v1 cgroup with a 3-CPU quota: 3; the affinity alone: 5."""
    _host64(tmp_path)
    write(tmp_path, "proc/self/status", "Cpus_allowed_list:\t0-3,8\n")
    cpu = _cpu(tmp_path)
    assert cpu["usable"] == 5 and cpu["usable_limited_by"] == ["affinity: CPUs 0-3,8 (5)"]
    write(tmp_path, "proc/self/cgroup", "4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "300000\n")
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    cpu = _cpu(tmp_path)
    assert cpu["usable"] == 3 and len(cpu["usable_limited_by"]) == 2
    # no limit (-1) and no files: every listed CPU is usable, nothing said
    write(tmp_path, "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n")
    write(tmp_path, "proc/self/status", "Cpus_allowed_list:\t0-63\n")
    cpu = _cpu(tmp_path)
    assert cpu["usable"] == 64 and "usable_limited_by" not in cpu
    assert hardware_cpu.cpu_list_count("0-3,8,10-11\n") == 7 and hardware_cpu.cpu_list_count("garbage") is None


def test_a_large_server_cpuinfo_is_read_whole(tmp_path):
    """768 threads (2 × EPYC 9965) with real-length flags: ~1.2 MB of /proc/cpuinfo. The probe read
    the first MiB only and reported fewer cores."""
    flags = SAPPHIRE_RAPIDS + " " + " ".join(f"flag{i:04d}" for i in range(160))
    info = x86_cpuinfo(768, "AuthenticAMD", "AMD EPYC 9965 192-Core Processor", flags)
    assert len(info) > 1 << 20
    write(tmp_path, "proc/cpuinfo", info)
    cpu = _cpu(tmp_path)
    assert cpu["cores"] == 768 and cpu["usable"] == 768 and cpu["int8_dot"]


# -- packages ------------------------------------------------------------------------------------
def test_a_leftover_folder_is_not_an_installed_package(tmp_path):
    """`pip uninstall onnxruntime openvino` leaves folders holding files pip did not install (a
    __pycache__, a cache); such a folder imports as an empty namespace package. It was reported as
    installed, with an onnxruntime CPU build, and doctor said nothing was missing."""
    sp = Path(site(tmp_path, "ai_edge_litert")[0])
    write(sp, "onnxruntime/capi/__pycache__/build_and_package_info.cpython-311.pyc", "x")
    write(sp, "openvino/cache/model.blob", "x")
    hw = detect(tmp_path, system="Linux", machine="x86_64", python_path=[str(sp)], env={}, cpuid={})
    assert hw["packages"]["onnxruntime"] is False and hw["packages"]["openvino"] is False
    assert hw["packages"]["ai_edge_litert"] is True
    assert hw["onnxruntime"] is None
    report = doctor.diagnose(hw)
    assert not report["ok"]
    assert any("onnxruntime is not installed" in f["problem"] for f in report["findings"])


# -- the int8 class of the device that ran -------------------------------------------------------
def test_int8_class_of_openvino_auto_on_an_indexed_gpu():
    """OpenVINO AUTO reports the device it ran on with its index ("openvino:gpu.0"): that is the
    GPU's int8 class, not the CPU's (before: x86-amx, so the measured-here note compared CPU figures)."""
    hw = {"machine": "x86_64", "cpu": {"features": ["avx2", "avx512f", "avx512_vnni", "amx_int8"]}}
    assert host.int8_class(hw, "openvino:gpu.0") == "gpu"
    assert host.int8_class(hw, "openvino:GPU") == "gpu"
    assert host.int8_class(hw, "openvino:npu.1") == "npu"
    assert host.int8_class(hw, "onnxruntime:cuda:1") == "nvidia-gpu"
    assert host.int8_class(hw, "openvino:cpu") == "x86-amx" and host.int8_class(hw, "coreml:cpu") == "x86-amx"


# -- nothing to read -----------------------------------------------------------------------------
def test_no_proc_cpuinfo_takes_cpuid_and_says_so(tmp_path):
    """A chroot or sandbox without /proc: the flags list was empty, so an AVX-512 VNNI machine read
    as "no AVX2" (selection's row 4, OpenVINO without AVX2) and no int8 dot products, silently."""
    cpuid = {"avx2": True, "avx512f": True, "avx512_vnni": True, "avx512_bf16": False}
    cpu = detect(tmp_path, system="Linux", machine="x86_64", python_path=[], env={}, cpuid=cpuid)["cpu"]
    assert cpu["features"] == ["avx2", "avx512f", "avx512_vnni"] and cpu["int8_dot"] is True
    assert "CPUID" in cpu["note"] and "no CPU flags" in cpu["note"]
    assert host.cpu_int8_class({"cpu": cpu, "machine": "x86_64"}) == "x86-vnni"
    unknown = detect(tmp_path, system="Linux", machine="x86_64", python_path=[], env={}, cpuid={})["cpu"]
    assert unknown["features"] == [] and "CPU features unknown" in unknown["note"]


# -- vendor libraries where the loader finds them ----------------------------------------------
def test_tensorrt_and_cuda_found_where_the_loader_looks(tmp_path):
    """TensorRT from its tarball registered in /etc/ld.so.conf.d, CUDA's runtime in RHEL's /usr/lib64:
    both load, but the probe looked only in Debian's folders, so doctor warned that onnxruntime
    would drop TensorRT (and run on the CPU) and auto planned onnxruntime:cuda."""
    root, kw = board(tmp_path, "nvidia-x86")
    write(root, "etc/ld.so.conf", "include ld.so.conf.d/*.conf\n")
    write(root, "etc/ld.so.conf.d/tensorrt.conf", "# TensorRT 10\n/opt/TensorRT-10.8/lib\n")
    write(root, "opt/TensorRT-10.8/lib/libnvinfer.so.10")
    write(root, "usr/lib64/libcudart.so.12")
    hw = detect(root, **kw)
    assert hw["libraries"]["libnvinfer"] == "/opt/TensorRT-10.8/lib/libnvinfer.so.10"
    assert hw["libraries"]["libcudart"] == "/usr/lib64/libcudart.so.12"
    assert not [f for f in doctor.diagnose(hw)["findings"] if "libnvinfer" in f["problem"] or "libcudart" in
                f["problem"]]


def test_a_package_built_for_another_python_is_not_available(tmp_path):
    """A venv whose Python went from 3.12 to this one, or an aarch64 venv copied here: onnxruntime's
    binding is ``onnxruntime_pybind11_state.cpython-312-aarch64-linux-gnu.so``, which this Python
    cannot load. It was reported installed (and auto chose it); doctor said nothing."""
    sp = Path(site(tmp_path, "openvino", ort=("onnxruntime", "1.32.0", ["cpu"]))[0])
    write(sp, "onnxruntime/capi/onnxruntime_pybind11_state.cpython-312-aarch64-linux-gnu.so")
    write(sp, "openvino/_pyopenvino" + importlib.machinery.EXTENSION_SUFFIXES[0])     # this Python's: fine
    hw = detect(tmp_path, system="Linux", machine="x86_64", python_path=[str(sp)], env={}, cpuid={})
    assert hw["packages"]["onnxruntime"] is False and hw["packages"]["openvino"] is True
    assert "cpython-312-aarch64-linux-gnu" in hw["packages_unusable"]["onnxruntime"]
    assert "cpython-312-aarch64-linux-gnu" in hw["onnxruntime"]["unusable"]
    findings = doctor.diagnose(hw)["findings"]
    assert [f["fix"] for f in findings if f["found"] == "onnxruntime (installed)"] \
        == ["python -m pip install --force-reinstall onnxruntime"]
    assert not any("onnxruntime is not installed" in f["problem"] for f in findings)
    # the same files built for this Python: importable, nothing said
    (sp / "onnxruntime/capi/onnxruntime_pybind11_state.cpython-312-aarch64-linux-gnu.so").rename(
        sp / ("onnxruntime/capi/onnxruntime_pybind11_state" + importlib.machinery.EXTENSION_SUFFIXES[0]))
    hw = detect(tmp_path, system="Linux", machine="x86_64", python_path=[str(sp)], env={}, cpuid={})
    assert hw["packages"]["onnxruntime"] is True and hw["packages_unusable"] == {}
    assert "unusable" not in hw["onnxruntime"]


def test_wsl2_nvidia_gpu_is_a_gpu(tmp_path):
    """WSL 2: no /dev/nvidia0; CUDA runs through /dev/dxg and the Windows driver's libcuda in
    /usr/lib/wsl/lib. No GPU was found, so even a forced onnxruntime:cuda was refused ("no NVIDIA
    GPU was found") and doctor never said onnxruntime-gpu was missing."""
    root, kw = board(tmp_path, "x86")
    write(root, "dev/dxg")
    write(root, "usr/lib/wsl/lib/libcuda.so.1")
    hw = detect(root, **kw)
    assert hw["nvidia_gpus"] == ["dxg"] and hw["nvidia"]["wsl"] is True
    assert any(f["fix"] and "onnxruntime-gpu" in f["fix"] for f in doctor.diagnose(hw)["findings"])
    # /dev/dxg alone (an AMD or Intel GPU's WSL driver mounts no libcuda): no NVIDIA GPU
    (root / "usr/lib/wsl/lib/libcuda.so.1").unlink()
    hw = detect(root, **kw)
    assert hw["nvidia_gpus"] == [] and hw["nvidia"] is None


def test_jetson_onnxruntime_gpu_is_false_when_it_cannot_be_imported(tmp_path):
    """A JetPack 5 venv (Python 3.8 wheels) kept after the upgrade to JetPack 6: the GPU build is
    there but cannot load; ``jetson.onnxruntime_gpu`` said true."""
    root, kw = board(tmp_path, "jetson-orin")
    write(Path(kw["python_path"][0]), "onnxruntime/capi/onnxruntime_pybind11_state.cpython-38-aarch64-linux-gnu.so")
    hw = detect(root, **kw)
    assert hw["onnxruntime"]["gpu"] is True and hw["jetson"]["onnxruntime_gpu"] is False
    assert "onnxruntime" in hw["packages_unusable"]


def test_x86_process_emulated_on_arm_takes_the_emulated_cpuid(tmp_path):
    """An x86-64 userland under FEX on an ARM board: /proc/cpuinfo is the board's, but numpy read the
    emulator's CPUID (AVX2 here); the features were empty ("no AVX2", selection's row 4)."""
    write(tmp_path, "proc/cpuinfo", arm_cpuinfo(4, "0xd0b", A76))
    cpuid = {"avx2": True, "avx512f": False, "avx512_vnni": False, "avx512_bf16": False}
    cpu = detect(tmp_path, system="Linux", machine="x86_64", python_path=[], env={}, cpuid=cpuid)["cpu"]
    assert cpu["model"] == "" and cpu["emulated"] and cpu["features"] == ["avx2"] and not cpu["int8_dot"]
    assert "emulated CPUID" in cpu["note"]


# -- a probe that fails --------------------------------------------------------------------------
def test_a_failing_probe_degrades_to_unknown_with_the_reason(tmp_path):
    """A sysctl lookup that raises (a sandboxed macOS process) crashed detect(), so `devices` and
    `doctor` failed with a traceback; now the CPU is unknown, said, and the rest is still probed."""
    def sysctl(name: str):
        raise OSError(1, "Operation not permitted", name)

    hw = detect(tmp_path, system="Darwin", machine="arm64", sysctl=sysctl, python_path=[], env={})
    assert hw["cpu"]["features"] == [] and hw["cpu"]["int8_dot"] is False and hw["cpu"]["cores"] >= 1
    assert "CPU features unknown" in hw["cpu"]["note"] and "Operation not permitted" in hw["cpu"]["note"]
    assert set(hw["probe_errors"]) == {"cpu", "apple"} and hw["apple"] is None
    assert hw["apple_silicon"] is True and hw["packages"]["onnxruntime"] is False      # the others still ran
    assert host.cpu_int8_class(hw) == "arm"
    warn = [f for f in doctor.diagnose(hw)["findings"] if f["found"] == "hardware detection (cpu)"]
    assert warn and "Operation not permitted" in warn[0]["problem"]
    assert hardware_cpu.cpu_list_count("3-0") is None


def test_fingerprint_tells_a_cpu_limited_container_from_its_host(tmp_path):
    """The tune cache is keyed by the fingerprint: a choice timed on all 64 cores of the host was
    reused in a container limited to 2 CPUs of it (same /proc/cpuinfo, same fingerprint)."""
    _host64(tmp_path)
    whole = detect(tmp_path, system="Linux", machine="x86_64", python_path=[], env={}, cpuid={})
    write(tmp_path, "proc/self/cgroup", "0::/\n")
    write(tmp_path, "sys/fs/cgroup/cpu.max", "200000 100000\n")
    limited = detect(tmp_path, system="Linux", machine="x86_64", python_path=[], env={}, cpuid={})
    assert host.fingerprint(whole) != host.fingerprint(limited)
    assert host.host_record(limited)["usable"] == 2 and host.host_record(limited)["cores"] == 64
    assert "usable" not in host.host_record(whole)
    # an unlimited machine keeps the fingerprint it had before ``usable`` was recorded
    old = {**whole, "cpu": {k: v for k, v in whole["cpu"].items() if k != "usable"}}
    assert host.fingerprint(whole) == host.fingerprint(old)


def test_a_32_bit_arm_or_riscv_process_under_qemu_is_not_given_the_x86_host(tmp_path):
    """qemu-user running an armv7l (or riscv64) userland on a Sapphire Rapids host: only aarch64 was
    checked for a foreign /proc/cpuinfo, so these got the Xeon's model and AVX-512/AMX flags, and
    ``int8_dot`` true."""
    write(tmp_path, "proc/cpuinfo", x86_cpuinfo(2, "GenuineIntel", "Intel(R) Xeon(R) Processor", SAPPHIRE_RAPIDS))
    for machine in ("armv7l", "riscv64"):
        cpu = detect(tmp_path, system="Linux", machine=machine, python_path=[], env={})["cpu"]
        assert cpu["emulated"] is True and cpu["model"] == "" and cpu["vendor"] == "", machine
        assert cpu["features"] == [] and cpu["int8_dot"] is False, machine
    # a native armv7l board keeps its own cpuinfo
    write(tmp_path, "proc/cpuinfo", arm_cpuinfo(4, "0xd08", "half thumb fastmult vfp edsp neon vfpv3 tls vfpv4"))
    cpu = detect(tmp_path, system="Linux", machine="armv7l", python_path=[], env={})["cpu"]
    assert cpu["model"] == "ARM Cortex-A72" and cpu["features"] == ["neon"] and "emulated" not in cpu


def test_doctor_warns_when_only_another_cuda_runtime_is_installed(tmp_path):
    """onnxruntime-gpu built for CUDA 12.6 on a host with CUDA 11's libcudart.so.11.0 only: the CUDA
    provider cannot load (onnx-int8 runs on the CPU), but a libcudart was "found" so doctor was silent."""
    root, kw = board(tmp_path, "nvidia-x86")
    write(root, "usr/lib/x86_64-linux-gnu/libnvinfer.so.10")
    write(root, "usr/local/cuda/lib64/libcudart.so.11.0")
    hw = detect(root, **kw)
    warn = [f for f in doctor.diagnose(hw)["findings"] if "built for CUDA 12.6" in f["problem"]]
    assert warn and "libcudart.so.12" in warn[0]["problem"] and "runs on the CPU" in warn[0]["problem"]
    assert hw["onnxruntime"]["cuda_version"] == "12.6" and hw["cuda_runtimes"] == ["11"]
    write(root, "usr/local/cuda/lib64/libcudart.so.12")            # the right one beside it: nothing said
    hw = detect(root, **kw)
    assert hw["cuda_runtimes"] == ["11", "12"]
    assert not [f for f in doctor.diagnose(hw)["findings"] if "CUDA provider" in f["found"]]


def test_devices_prints_the_usable_cpus_the_uncounted_features_and_failed_probes():
    # `edge-infer devices` printed "64 cores" for a process a quota held to 2, and nothing of the rest
    from edge_runtime.cli_devices import hardware_lines
    from edge_runtime.hardware import detect_cached

    h = detect_cached()
    cpu = {**dict(h["cpu"]), "cores": 64, "usable": 2, "usable_limited_by": "cgroup v2 cpu.max",
           "features_not_on_every_core": ["avx512_vnni"]}
    text = "\n".join(hardware_lines({**{k: h[k] for k in h.keys()}, "cpu": cpu,
                                     "probe_errors": {"cpu": "PermissionError: sysctl"}}))
    assert "cpu usable by this process: 2 of 64 (cgroup v2 cpu.max)" in text
    assert "cpu features on some cores only (not counted): avx512_vnni" in text
    assert "probe failed: cpu: PermissionError: sysctl" in text
