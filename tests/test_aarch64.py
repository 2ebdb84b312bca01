"""Run inside the arm64 userland by ci/aarch64/run (qemu-user); skipped elsewhere.

The host built the artifacts with its converters (EDGE_AARCH64_ARTIFACTS);
here they are loaded and answered on aarch64 wheels. Timings are emulation.
"""

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(platform.machine() not in ("aarch64", "arm64"), reason="aarch64 only (ci/aarch64/run)")

ARTIFACTS = Path(os.environ.get("EDGE_AARCH64_ARTIFACTS", "/nonexistent"))
HEAVY = {"onnxruntime", "openvino", "torch", "tensorflow", "coremltools", "nncf", "onnx", "ai_edge_litert",
         "tflite_runtime", "tokenizers", "PIL"}
PACKAGES = {"onnxruntime": ("onnxruntime",), "openvino": ("openvino",), "tflite": ("ai_edge_litert", "tflite_runtime")}


def test_import_pulls_in_no_framework_on_aarch64():
    code = ("import sys, time; t=time.perf_counter(); import edge_runtime; dt=time.perf_counter()-t; "
            "import json; print(json.dumps({'s': dt, 'mods': sorted({m.split('.')[0] for m in sys.modules})}))")
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert not HEAVY & set(out["mods"])
    assert out["s"] < 20      # emulated: qemu-user is 10-50x slower than a core; this only guards a hang


def test_the_probe_on_the_arm64_userland_says_what_it_knows():
    from edge_runtime.hardware import detect

    hw = detect()
    cpu = hw["cpu"]
    assert hw["machine"] == "aarch64" and hw["system"] == "Linux"
    assert "neon" in cpu["features"]
    host_words = ("intel", "xeon", "amd", "epyc", "genuineintel", "authenticamd")
    assert not any(w in str(cpu["model"]).lower() or w in str(cpu["vendor"]).lower() for w in host_words), cpu
    assert not {"avx2", "avx512f", "avx512_vnni", "amx_int8"} & set(cpu["features"])
    qemu_cpu = os.environ.get("EDGE_AARCH64_QEMU_CPU", "")
    if qemu_cpu in ("cortex-a76", "neoverse-n1"):
        assert {"neon", "dotprod"} <= set(cpu["features"]) and "i8mm" not in cpu["features"]
    if qemu_cpu in ("cortex-a53", "cortex-a72"):
        assert cpu["features"] == ["neon"] and not cpu["int8_dot"]
    mode = os.environ.get("EDGE_AARCH64_CPUINFO")
    if mode == "raw":           # qemu-user 7.2 passes the x86 host's /proc/cpuinfo through
        assert "GenuineIntel" in Path("/proc/cpuinfo").read_text() or "AuthenticAMD" in Path("/proc/cpuinfo").read_text()
        assert cpu["emulated"] is True and cpu["model"] == "" and cpu["vendor"] == ""
    elif mode == "board":       # ci/aarch64/cpuinfo.py's ARM-shaped cpuinfo, as a board has
        assert "emulated" not in cpu and (qemu_cpu != "cortex-a76" or cpu["model"] == "ARM Cortex-A76")
    assert hw["packages"]["onnxruntime"] == bool(__import__("importlib.util").util.find_spec("onnxruntime"))
    json.dumps(hw)


def _index() -> dict:
    if not (ARTIFACTS / "index.json").is_file():
        pytest.skip("no host-built artifacts (EDGE_AARCH64_ARTIFACTS)")
    return json.loads((ARTIFACTS / "index.json").read_text())


@pytest.mark.parametrize("name", ["digits-onnx-int8", "digits-tflite-int8", "digits-openvino", "coral-mnv2"])
def test_an_artifact_built_on_x86_loads_verified_and_answers_here(name):
    import importlib.util

    import numpy as np

    import edge_runtime as er

    spec = _index().get(name)
    if spec is None:
        pytest.skip(f"{name} was not built on the host")
    if not any(importlib.util.find_spec(m) for m in PACKAGES[spec["device"]]):
        pytest.skip(f"{spec['device']}: no aarch64 wheel installed")
    man = json.loads((ARTIFACTS / name / "manifest.json").read_text())
    with er.load(ARTIFACTS / name, device=spec["device"], strict=True) as rt:
        assert rt.info()["device"].startswith(spec["device"])
        size = (28, 28) if spec["inputs"] == "digits" else (224, 224)
        res = rt.infer(np.full((*size, 3), 128, np.uint8))
    assert res.device.startswith(spec["device"]) and res.prediction is not None
    if "build" in man:          # converted artifacts record their build host (imports do not)
        assert man["build"]["host"] == "x86_64"     # it really came from the x86 host
