"""The CPU probe under user-mode emulation (issue #23), on fake trees.

qemu-user 7.2 (Debian bookworm's) running an arm64 userland on this x86 host
passes the kernel's /proc/cpuinfo through: it names the host's Intel CPU and
its AVX-512/AMX flags, none of which this aarch64 process can use. What is
true for the process is its auxiliary vector: qemu gives it the emulated
CPU's HWCAPs. The probe must say machine aarch64, CPU model unknown, and the
features from the HWCAPs.
"""

import struct

from boards import A76, SAPPHIRE_RAPIDS, arm_cpuinfo, detect_board, write, x86_cpuinfo

from edge_runtime.hardware import detect
from edge_runtime.hardware_cpu import auxv_hwcaps, linux_cpu

HWCAP_ASIMD, HWCAP_ASIMDDP, HWCAP_SVE = 1 << 1, 1 << 20, 1 << 22
HWCAP2_SVE2, HWCAP2_I8MM, HWCAP2_BF16 = 1 << 1, 1 << 13, 1 << 14


def auxv(hwcap: int, hwcap2: int = 0) -> bytes:
    """A 64-bit little-endian auxv: AT_PAGESZ, AT_HWCAP, AT_HWCAP2, AT_NULL."""
    return struct.pack("<8Q", 6, 4096, 16, hwcap, 26, hwcap2, 0, 0)


def qemu_user_tree(root, hwcap2=HWCAP2_I8MM | HWCAP2_BF16 | HWCAP2_SVE2):
    write(root, "proc/cpuinfo", x86_cpuinfo(2, "GenuineIntel", "Intel(R) Xeon(R) Processor", SAPPHIRE_RAPIDS))
    p = root / "proc/self/auxv"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(auxv(HWCAP_ASIMD | HWCAP_ASIMDDP | HWCAP_SVE, hwcap2))
    return {"system": "Linux", "machine": "aarch64", "python_path": [], "env": {}}


def test_qemu_user_aarch64_on_an_x86_kernel_names_no_host_cpu(tmp_path):
    hw = detect(tmp_path, **qemu_user_tree(tmp_path))
    cpu = hw["cpu"]
    assert hw["machine"] == "aarch64"
    assert cpu["model"] == "" and cpu["vendor"] == "" and cpu["emulated"] is True
    assert "Intel" not in str(cpu) and "GenuineIntel" not in str(cpu)
    assert cpu["features"] == ["neon", "dotprod", "i8mm", "sve", "sve2", "bf16"] and cpu["int8_dot"]
    assert not {"avx2", "avx512f", "avx512_vnni", "amx_int8"} & set(cpu["features"])
    assert "qemu-user" in cpu["note"] and "HWCAPs" in cpu["note"]


def test_emulated_without_an_auxv_claims_only_what_aarch64_guarantees(tmp_path):
    write(tmp_path, "proc/cpuinfo", x86_cpuinfo(2, "GenuineIntel", "Intel(R) Xeon(R) Processor", SAPPHIRE_RAPIDS))
    cpu = detect(tmp_path, system="Linux", machine="aarch64", python_path=[], env={})["cpu"]
    assert cpu["model"] == "" and cpu["features"] == ["neon"] and not cpu["int8_dot"]
    assert "nothing readable" in cpu["note"]


def test_on_a_board_the_hwcaps_are_the_process_truth(tmp_path):
    """A Pi 5 (Cortex-A76): the model from cpuinfo; features from the auxv when present."""
    info = arm_cpuinfo(4, "0xd0b", A76)
    cpu = linux_cpu(info, "aarch64", auxv(HWCAP_ASIMD | HWCAP_ASIMDDP))
    assert cpu["model"] == "ARM Cortex-A76" and "emulated" not in cpu
    assert cpu["features"] == ["neon", "dotprod"] and cpu["int8_dot"]
    # a container that masks dotprod (or an older kernel) shows in the HWCAPs, not in the board's cpuinfo
    assert linux_cpu(info, "aarch64", auxv(HWCAP_ASIMD))["features"] == ["neon"]


def test_boards_without_an_auxv_read_cpuinfo_as_before(tmp_path):
    hw = detect_board(tmp_path, "rpi5-coral")
    assert hw["cpu"]["model"] == "ARM Cortex-A76" and hw["cpu"]["int8_dot"] and "emulated" not in hw["cpu"]


def test_an_x86_process_on_an_arm_kernel_is_not_given_the_arm_model(tmp_path):
    """The other direction (an x86-64 userland under FEX or box64 on an ARM board)."""
    write(tmp_path, "proc/cpuinfo", arm_cpuinfo(4, "0xd0b", A76))
    cpu = detect(tmp_path, system="Linux", machine="x86_64", python_path=[], env={})["cpu"]
    assert cpu["model"] == "" and cpu["emulated"] and cpu["features"] == []


def test_auxv_parsing_stops_at_at_null_and_needs_at_hwcap():
    assert auxv_hwcaps(auxv(3, 5)) == (3, 5)
    assert auxv_hwcaps(struct.pack("<4Q", 6, 4096, 0, 0)) is None
    assert auxv_hwcaps(b"") is None and auxv_hwcaps(b"\x01\x02") is None
    assert auxv_hwcaps(struct.pack("<6Q", 0, 0, 16, 7, 0, 0)) is None      # AT_NULL first: nothing after counts
