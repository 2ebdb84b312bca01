"""The int8 class is the one the kernels see: CPUID, not /proc/cpuinfo, where the two differ (#17).

Under ``qemu-x86_64 -cpu EPYC-Rome`` (AVX2, no AVX-512, no VNNI: the class of the AMD EPYC
issue #17 was measured on) /proc/cpuinfo is still the host's, while ONNX Runtime, OpenVINO
and numpy dispatch on the emulated CPUID. Unit tests feed ``linux_cpu`` both views; the
emulated tests run the runtime in a child process on that CPU (qemu's TCG runs AVX2 with
its real semantics, the u8*s8 ``vpmaddubsw`` saturation included) and check the detected
class, and that the digits artifact built on this host holds its budget there on both
backends: a faithful AVX2-only CPU on a VNNI box, where ``ONEDNN_MAX_CPU_ISA`` only caps
oneDNN (``test_isa_emulated.py``). qemu-user-static comes with the aarch64 run (the same
Debian package; ``ci/aarch64/host-setup`` installs it where it can).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import need_openvino
from edge_runtime import hardware, hardware_cpu, host

XEON = "vendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu sse2 avx2 avx512f " \
       "avx512_vnni avx_vnni avx512_bf16 amx_tile amx_int8 amx_bf16\nprocessor\t: 0\nprocessor\t: 1\n"
ROME = {"avx2": True, "avx512f": False, "avx512_vnni": False, "avx512_bf16": False}
ROOT = Path(__file__).resolve().parents[1]


def test_cpuid_that_agrees_changes_nothing():
    same = {"avx2": True, "avx512f": True, "avx512_vnni": True, "avx512_bf16": True}
    for cpuid in (same, None):
        cpu = hardware_cpu.linux_cpu(XEON, "x86_64", cpuid=cpuid)
        assert "cpuid_differs" not in cpu and "amx_int8" in cpu["features"] and cpu["int8_dot"]
        assert host.cpu_int8_class({"cpu": cpu, "machine": "x86_64"}) == "x86-amx"


def test_cpuid_that_lacks_a_listed_feature_decides_the_class():
    cpu = hardware_cpu.linux_cpu(XEON, "x86_64", cpuid=ROME)
    assert cpu["features"] == ["avx2"] and cpu["int8_dot"] is False
    assert cpu["cpuid_differs"] == ["avx512_bf16", "avx512_vnni", "avx512f"]
    assert "amx_int8" in cpu["note"] and "unconfirmed" in cpu["note"]      # what CPUID cannot confirm is said
    assert host.cpu_int8_class({"cpu": cpu, "machine": "x86_64"}) == "x86-avx2"


def test_cpuid_is_read_for_the_real_root_only(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "numpy_cpuid", lambda: pytest.fail("a fake root must not read this CPU's CPUID"))
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(XEON)
    hw = hardware.detect(tmp_path, system="Linux", machine="x86_64")
    assert "amx_int8" in hw["cpu"]["features"]
    hw = hardware.detect(tmp_path, system="Linux", machine="x86_64", cpuid=ROME)
    assert hw["cpu"]["features"] == ["avx2"]


def test_numpy_reads_this_process_cpuid():
    if platform.machine() not in hardware_cpu.X86_MACHINES:
        pytest.skip("x86 only")
    got = hardware_cpu.numpy_cpuid()
    assert got is not None and got["avx2"] is True, got       # every x86 CPU this project supports has AVX2
    listed = set(hardware.detect()["cpu"]["features"])
    assert all(got[f] for f in got if f in listed)              # on real hardware the two views agree


# -- on an emulated AVX2-only CPU -------------------------------------------------------------
CHILD = r"""
import json, sys
import edge_runtime as er
from edge_runtime import host
from edge_runtime.hardware import detect
hw = detect()
out = {"cpu": dict(hw["cpu"]), "class": host.cpu_int8_class(hw), "runs": {}}
for dev in ("onnxruntime", "openvino"):
    with er.load(sys.argv[1], device=dev, strict=True, limits={"deadline_ms": 120000}, verify=True) as rt:
        row = rt.info()["verified_here"]          # load(verify=True): a ParityError exits non-zero
        out["runs"][dev] = {k: row[k] for k in ("metric", "value", "budget", "passed", "here")}
        out["runs"][dev]["isa"] = rt.info()["isa"]
print(json.dumps(out, default=str))
"""


def _qemu() -> str:
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        pytest.skip(f"needs a Linux x86-64 host (this is {platform.system()} {platform.machine()})")
    exe = shutil.which("qemu-x86_64-static") or shutil.which("qemu-x86_64")
    if exe is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["bash", str(ROOT / "ci" / "aarch64" / "host-setup")], capture_output=True, timeout=900)
        exe = shutil.which("qemu-x86_64-static")
    if exe is None:
        pytest.skip("no qemu-x86_64 (Debian's qemu-user-static) and no way to install it")
    return exe


@pytest.mark.slow
def test_digits_holds_its_budget_on_an_emulated_avx2_only_cpu(ov_digits_artifact):
    need_openvino()
    qemu = _qemu()
    proc = subprocess.run([qemu, "-cpu", "EPYC-Rome", sys.executable, "-c", CHILD, str(ov_digits_artifact)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rep = json.loads(proc.stdout.strip().splitlines()[-1])
    assert rep["class"] == "x86-avx2" and rep["cpu"]["int8_dot"] is False, rep["cpu"]
    built = json.loads((Path(ov_digits_artifact) / "manifest.json").read_text())["build"]["host_info"]["int8_class"]
    for dev, run in rep["runs"].items():
        assert run["here"] == "x86-avx2", (dev, run)
        assert run["passed"], f"{dev} on AVX2: {run['metric']} {run['value']} under its budget {run['budget']}"
        if built != "x86-avx2":      # built on a VNNI/AMX host: the note says the recorded parity came from there
            assert run["isa"]["same"] is False and run["isa"]["verified_here"], run["isa"]
            assert "verified here: top1_agreement" in run["isa"]["note"], run["isa"]
    print(json.dumps({d: (r["metric"], r["value"]) for d, r in rep["runs"].items()}))
