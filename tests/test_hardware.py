"""Hardware detection against fake trees of every board, and on this machine for real."""

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from boards import BOARDS, board, detect_board, write

from edge_runtime.hardware import detect

HEAVY = {"onnxruntime", "openvino", "torch", "tensorflow", "coremltools", "nncf", "onnx", "ai_edge_litert",
         "tflite_runtime", "tensorrt"}


def test_detect_on_this_machine_is_fast_and_imports_no_framework():
    """Cold (a fresh interpreter) and warm, best of a few runs: the box is shared with other test runs."""
    code = ("import sys, time, json; from edge_runtime.hardware import detect; t = time.perf_counter(); "
            "hw = detect(); t1 = time.perf_counter(); "
            "print(json.dumps({'detect_ms': (t1 - t) * 1e3, 'modules': sorted({m.split('.')[0] for m in sys.modules})}))")
    cold = []
    for _ in range(3):
        out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                        check=True).stdout)
        assert not HEAVY & set(out["modules"])
        cold.append(out["detect_ms"])
    assert min(cold) < 50, cold
    warm = []
    for _ in range(5):
        t0 = time.perf_counter()
        detect()
        warm.append((time.perf_counter() - t0) * 1000)
    assert min(warm) < 50 and statistics.median(warm) < 100, warm


def test_detect_matches_proc_cpuinfo_here():
    text = Path("/proc/cpuinfo").read_text()
    flags = set(next(line for line in text.splitlines() if line.startswith(("flags", "Features"))).split(":")[1].split())
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
    cpu = detect()["cpu"]
    assert cpu["model"] == model
    assert ("avx512_vnni" in cpu["features"]) == ("avx512_vnni" in flags)
    assert ("avx2" in cpu["features"]) == ("avx2" in flags)
    assert cpu["int8_dot"] == bool({"avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm"} & flags)


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_board_detects_and_is_json_safe(tmp_path, name):
    hw = detect_board(tmp_path, name)
    assert set(hw) >= {"system", "machine", "cpu", "nvidia_gpus", "edgetpus", "packages", "apple_silicon", "jetson"}
    assert isinstance(hw["apple_silicon"], bool) and hw["cpu"]["cores"] >= 1
    json.dumps(hw)


@pytest.mark.parametrize("name,state,loaded", [("coral-usb-before-firmware", "1a6e:089a", False),
                                               ("coral-usb", "18d1:9302", True)])
def test_coral_usb_before_and_after_firmware(tmp_path, name, state, loaded):
    hw = detect_board(tmp_path, name)
    assert hw["edgetpus"] == [{"type": "usb", "path": "2-1", "id": state}]
    (usb,) = hw["coral"]["usb"]
    assert usb["firmware_loaded"] is loaded and usb["speed_mbps"] == (480 if loaded else 5000)
    assert bool(hw["libraries"]["libedgetpu"]) is loaded   # the board builders install it only after


def test_coral_pcie_and_a_card_without_its_driver(tmp_path):
    hw = detect_board(tmp_path, "coral-pcie")
    assert hw["edgetpus"] == [{"type": "pci", "path": "/dev/apex_0"}]
    assert hw["coral"]["pcie"] == ["/dev/apex_0"] and hw["coral"]["pcie_without_driver"] == []
    hw = detect_board(tmp_path, "coral-pcie-without-driver")
    assert hw["edgetpus"] == [] and hw["coral"]["pcie_without_driver"] == ["0000:03:00.0"]


def test_jetson_orin(tmp_path):
    hw = detect_board(tmp_path, "jetson-orin")
    j = hw["jetson"]
    assert j["model"] == "NVIDIA Jetson AGX Orin Developer Kit" and j["l4t"] == "36.3.0" and j["jetpack"] == "6"
    assert j["soc"] == "tegra234" and j["onnxruntime_gpu"] is True and j["onnxruntime"] == "onnxruntime-gpu 1.19.0"
    assert hw["board"] == {"model": "NVIDIA Jetson AGX Orin Developer Kit", "kind": "jetson"}
    assert hw["nvidia"]["integrated"] is True and hw["nvidia_gpus"] == []
    assert hw["onnxruntime"]["providers"] == ["cpu", "cuda", "tensorrt"] and hw["onnxruntime"]["cuda_version"] == "12.6"
    assert hw["cpu"]["model"] == "ARM Cortex-A78AE" and hw["cpu"]["cores"] == 12
    assert {"neon", "dotprod"} <= set(hw["cpu"]["features"]) and hw["cpu"]["int8_dot"]
    assert hw["libraries"]["libnvinfer"] == "/usr/lib/aarch64-linux-gnu/libnvinfer.so.10"


def test_jetson_with_cpu_only_onnxruntime(tmp_path):
    hw = detect_board(tmp_path, "jetson-orin-cpu-onnxruntime")
    assert hw["jetson"]["onnxruntime_gpu"] is False and hw["jetson"]["onnxruntime"] == "onnxruntime 1.19.0"
    assert hw["onnxruntime"]["providers"] == ["cpu"] and hw["onnxruntime"]["gpu"] is False


def test_jetson_from_nv_tegra_release_alone(tmp_path):
    """A container on a Jetson: /etc/nv_tegra_release but no device tree."""
    write(tmp_path, "etc/nv_tegra_release", "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref\n")
    j = detect(tmp_path, system="Linux", machine="aarch64", python_path=[], env={})["jetson"]
    assert j["l4t"] == "35.4.1" and j["jetpack"] == "5" and "model not in the device tree" in j["model"]
    assert j["onnxruntime"] is None and j["onnxruntime_gpu"] is False


def test_raspberry_pi_5_with_a_coral(tmp_path):
    hw = detect_board(tmp_path, "rpi5-coral")
    assert hw["board"] == {"model": "Raspberry Pi 5 Model B Rev 1.0", "kind": "raspberry-pi"}
    assert hw["jetson"] is None and hw["nvidia"] is None
    assert hw["cpu"]["model"] == "ARM Cortex-A76" and hw["cpu"]["cores"] == 4 and hw["cpu"]["int8_dot"]
    assert hw["edgetpus"] == [{"type": "usb", "path": "4-1", "id": "18d1:9302"}]
    assert hw["packages"]["tflite_runtime"] and not hw["packages"]["ai_edge_litert"]


def test_apple_silicon(tmp_path):
    hw = detect_board(tmp_path, "apple-silicon")
    assert hw["apple_silicon"] is True and hw["apple"] == {"chip": "Apple M2", "rosetta": False}
    assert hw["cpu"]["vendor"] == "Apple" and hw["cpu"]["cores"] == 8
    assert {"neon", "dotprod", "i8mm"} <= set(hw["cpu"]["features"])
    assert not hw["packages"]["coremltools"]
    root, kw = board(tmp_path / "rosetta", "apple-silicon")
    kw["sysctl"] = {**kw["sysctl"], "sysctl.proc_translated": 1}
    hw = detect(root, **{**kw, "machine": "x86_64"})
    assert hw["apple_silicon"] is True and hw["apple"]["rosetta"] is True


def test_not_apple_silicon_elsewhere(tmp_path):
    assert detect_board(tmp_path, "x86")["apple_silicon"] is False
    assert detect(tmp_path, system="Darwin", machine="x86_64", sysctl={}, python_path=[])["apple_silicon"] is False


@pytest.mark.parametrize("name,vnni", [("x86", False), ("x86-vnni", True)])
def test_plain_x86_with_and_without_vnni(tmp_path, name, vnni):
    hw = detect_board(tmp_path, name)
    assert ("avx512_vnni" in hw["cpu"]["features"]) is vnni and hw["cpu"]["int8_dot"] is vnni
    assert ("amx_int8" in hw["cpu"]["features"]) is vnni and "avx2" in hw["cpu"]["features"]
    assert hw["cpu"]["vendor"] == ("GenuineIntel" if vnni else "AuthenticAMD")
    assert hw["board"] is None and hw["jetson"] is None and hw["edgetpus"] == [] and not hw["apple_silicon"]


def test_nvidia_discrete_gpu(tmp_path):
    hw = detect_board(tmp_path, "nvidia-x86")
    assert hw["nvidia_gpus"] == ["nvidia0"]            # not nvidiactl / nvidia-uvm
    assert hw["nvidia"]["driver"] == "550.54.14" and hw["nvidia"]["gpus"] == ["NVIDIA RTX A2000"]


def test_two_onnxruntime_distributions_are_both_reported(tmp_path):
    root, kw = board(tmp_path, "x86")
    write(Path(kw["python_path"][0]), "onnxruntime_gpu-1.19.0.dist-info/METADATA", "Name: onnxruntime-gpu\n")
    hw = detect(root, **kw)
    assert hw["onnxruntime"]["distributions"] == ["onnxruntime", "onnxruntime-gpu"]


def test_empty_root_finds_nothing(tmp_path):
    hw = detect(tmp_path, system="Linux", machine="x86_64", python_path=[], env={})
    assert hw["edgetpus"] == [] and hw["nvidia_gpus"] == [] and hw["jetson"] is None and hw["board"] is None
    assert not any(hw["packages"].values()) and hw["onnxruntime"] is None
