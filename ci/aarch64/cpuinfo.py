"""Write an ARM-shaped /proc/cpuinfo for the CPU qemu-user emulates (run inside the
arm64 chroot, under the same QEMU_CPU).   python3 cpuinfo.py QEMU_CPU > cpuinfo

Why: qemu-user 7.2 (Debian bookworm) passes the x86 host's /proc/cpuinfo
through. The probe handles that (tests/test_aarch64_probe.py), but
pytorch-cpuinfo, inside onnxruntime and LiteRT's XNNPACK, crashes (SIGSEGV) on an
aarch64 Linux whose sysfs is present and whose cpuinfo has no ARM fields, and
OpenVINO's hwloc needs that sysfs. A board has both, ARM-shaped: this gives the
chroot the same, from the process's real HWCAPs and the emulated CPU's MIDR.
"""

import os
import struct
import sys

HWCAP = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop "
         "sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg").split()
HWCAP2 = ("dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm svef32mm svef64mm svebf16 "
          "i8mm bf16 dgh rng bti mte").split()
# qemu's MIDR for each -cpu (target/arm/cpu64.c): implementer, variant, part, revision
MIDR = {"cortex-a35": ("0x41", "0x0", "0xd04", 1), "cortex-a53": ("0x41", "0x0", "0xd03", 4),
        "cortex-a57": ("0x41", "0x1", "0xd07", 0), "cortex-a72": ("0x41", "0x0", "0xd08", 3),
        "cortex-a76": ("0x41", "0x4", "0xd0b", 1), "neoverse-n1": ("0x41", "0x4", "0xd0c", 1),
        "a64fx": ("0x46", "0x1", "0x001", 0), "max": ("0x00", "0x0", "0x051", 0)}


def main() -> int:
    cpu = sys.argv[1].split(",")[0]
    raw = open("/proc/self/auxv", "rb").read()
    aux = dict(struct.iter_unpack("<QQ", raw[: len(raw) // 16 * 16]))
    hw, hw2 = aux.get(16, 0), aux.get(26, 0)
    feats = [n for i, n in enumerate(HWCAP) if hw >> i & 1] + [n for i, n in enumerate(HWCAP2) if hw2 >> i & 1]
    impl, variant, part, rev = MIDR.get(cpu, MIDR["max"])
    for i in range(os.cpu_count() or 1):
        sys.stdout.write(f"processor\t: {i}\nBogoMIPS\t: 2000.00\nFeatures\t: {' '.join(feats)}\n"
                         f"CPU implementer\t: {impl}\nCPU architecture: 8\nCPU variant\t: {variant}\n"
                         f"CPU part\t: {part}\nCPU revision\t: {rev}\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
