"""`edge-infer devices` and `edge-infer doctor`: on this machine for real, and on fake board trees."""

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from boards import detect_board
from click.testing import CliRunner

from edge_runtime import hardware
from edge_runtime.cli import main


def cli(*args):
    return subprocess.run([sys.executable, "-m", "edge_runtime", *map(str, args)], capture_output=True, text=True)


def _cpuinfo():
    text = Path("/proc/cpuinfo").read_text()
    lines = text.splitlines()
    flags = set(next(x for x in lines if x.startswith(("flags", "Features"))).split(":", 1)[1].split())
    model = next((x.split(":", 1)[1].strip() for x in lines if x.startswith("model name")), "")
    vendor = next((x.split(":", 1)[1].strip() for x in lines if x.startswith("vendor_id")), "")
    return model, vendor, flags, sum(x.startswith("processor") for x in lines)


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="needs Linux /proc/cpuinfo")
def test_devices_json_on_this_machine_matches_the_os():
    proc = cli("devices", "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    model, vendor, flags, n = _cpuinfo()
    cpu = d["hardware"]["cpu"]
    assert (cpu["model"], cpu["vendor"], cpu["cores"]) == (model, vendor, n)
    for flag in ("avx512_vnni", "avx_vnni", "amx_int8", "avx2", "avx512f"):
        assert (flag in cpu["features"]) == (flag in flags), flag
    assert cpu["int8_dot"] == bool({"avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm"} & flags)
    for name, present in d["hardware"]["packages"].items():
        assert present == (importlib.util.find_spec(name) is not None), name
    ort = d["hardware"]["onnxruntime"]
    assert ort["version"] == importlib.metadata.version(ort["distribution"])
    import onnxruntime

    short = {"CPUExecutionProvider": "cpu", "CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "tensorrt"}
    assert set(ort["providers"]) == {short[p] for p in onnxruntime.get_available_providers() if p in short}
    assert d["backends"]["onnxruntime"]["suitability"]["onnx-int8"]["score"] > 0
    assert (d["backends"]["openvino"]["suitability"]["openvino"]["score"] > 0) == bool(importlib.util.find_spec("openvino"))


def test_devices_human_output_here():
    proc = cli("devices")
    assert proc.returncode == 0, proc.stderr
    model, _, flags, _ = _cpuinfo()
    assert f"cpu: {model}" in proc.stdout
    vnni = bool({"avx512_vnni", "avx_vnni", "amx_int8"} & flags)
    assert f"int8 dot product (VNNI/AMX/dotprod): {'yes' if vnni else 'no'}" in proc.stdout
    assert ("avx512_vnni" in proc.stdout) == ("avx512_vnni" in flags)


@pytest.fixture
def on_board(monkeypatch, tmp_path):
    def use(name):
        hw = detect_board(tmp_path, name)
        monkeypatch.setattr(hardware, "detect", lambda *a, **k: hw)
        return hw

    return use


def run(*args):
    return CliRunner().invoke(main, list(map(str, args)))


def test_devices_artifact_shows_the_choice_and_the_table(make_artifact, on_board):
    on_board("x86")
    art = make_artifact("tensors")
    r = run("devices", "--json", "--artifact", art)
    assert r.exit_code == 0, r.output
    a = json.loads(r.output)["artifact"]
    assert a["chosen"]["device"] == "fake:cpu" and a["fallback"] is None and a["targets"] == ["fake"]
    assert [c["device"] for c in a["candidates"] if c["chosen"]] == ["fake:cpu"]
    r = run("devices", "--json", "--artifact", art, "--device", "fake:gpu")
    a = json.loads(r.output)["artifact"]
    assert "requested 'fake:gpu' is unavailable" in a["fallback"] and a["chosen"]["device"] == "fake:cpu"
    r = run("devices", "--artifact", art, "--device", "fake:gpu", "--require-device")
    assert r.exit_code == 4 and "would fail: [device_unavailable]" in r.output
    r = run("devices", "--artifact", art)
    assert "would run: fake on fake:cpu" in r.output and "* fake" in r.output
    model = art / "fake" / "static.npz"                  # a corrupt artifact would not run anywhere
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    r = run("devices", "--artifact", art)
    assert r.exit_code == 3 and "would run" not in r.output and "artifact_hash_mismatch" in r.output, r.output


def test_devices_on_a_jetson(on_board):
    on_board("jetson-orin-cpu-onnxruntime")
    out = run("devices").output
    assert "jetson: NVIDIA Jetson AGX Orin Developer Kit, L4T 36.3.0 (JetPack 6)" in out
    assert "CPU only: the GPU is unused" in out and "CPU-only" in out


def _doctor(name, on_board):
    on_board(name)
    r = run("doctor", "--json")
    return r.exit_code, json.loads(r.output)


def _fixes(rep):
    return "\n".join(f["fix"] or "" for f in rep["findings"])


@pytest.mark.parametrize("name,needles", [
    ("coral-usb-before-firmware", ["sudo apt-get install libedgetpu1-std",
                                   "deb https://packages.cloud.google.com/apt coral-edgetpu-stable main"]),
    ("coral-pcie-without-driver", ["sudo apt-get install gasket-dkms libedgetpu1-std"]),
    ("jetson-orin-cpu-onnxruntime", ["pip uninstall -y onnxruntime",
                                     "pip install onnxruntime-gpu --index-url https://pypi.jetson-ai-lab.io/jp6/cu126"]),
    ("x86-vnni", ["pip install 'edge-runtime[openvino]'"]),
    ("apple-silicon", ["pip install 'edge-runtime[coreml]'"]),
    ("nvidia-x86", []),
])
def test_doctor_names_the_missing_piece_and_its_install_step(name, needles, on_board):
    code, rep = _doctor(name, on_board)
    for n in needles:
        assert n in _fixes(rep), (n, rep)
    assert rep["ok"] is (not needles) and code == (1 if needles else 0)


@pytest.mark.parametrize("name", ["jetson-orin", "rpi5-coral", "coral-usb", "x86"])
def test_doctor_is_quiet_when_nothing_is_missing(name, on_board):
    code, rep = _doctor(name, on_board)
    assert code == 0 and rep["ok"] and not [f for f in rep["findings"] if f["level"] == "missing"]


def test_doctor_warns_about_usb2_and_explains_unloaded_firmware(on_board):
    _, rep = _doctor("coral-usb", on_board)
    assert any("USB 2" in f["problem"] for f in rep["findings"])
    _, rep = _doctor("coral-usb-before-firmware", on_board)
    assert any(f["level"] == "info" and "firmware not loaded" in f["problem"] for f in rep["findings"])


def test_doctor_prints_and_never_runs(on_board, monkeypatch):
    import os

    def refuse(*a, **k):
        raise AssertionError("doctor must not run anything")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(os, "system", refuse)
    on_board("jetson-orin-cpu-onnxruntime")
    r = run("doctor")
    assert r.exit_code == 1 and "install (not run; copy and run it yourself):" in r.output
    assert "MISSING: NVIDIA Jetson AGX Orin Developer Kit" in r.output


def test_devices_without_an_artifact_places_the_device_asked_for(on_board):
    # `devices --device X` without --artifact ignored X and exited 0, whatever X was
    on_board("x86")
    r = run(*["devices", "--json", "--device", "onnxruntime:cuda"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)["device"]
    assert d["backend"] == "onnxruntime" and not d["runs"]
    assert "not in this onnxruntime build" in d["suitability"]["onnx-int8"]["reason"]
    r = run(*["devices", "--device", "onnxruntime:cuda", "--require-device"])
    assert r.exit_code == 4 and "device onnxruntime:cuda: cannot run here" in r.output, r.output
    r = run(*["devices", "--device", "fake", "--require-device"])
    assert r.exit_code == 0 and "device fake: can run here" in r.output, r.output
    for bad in ("onnxruntime:warp", "warp-drive", ""):
        r = run("devices", "--device", bad)
        assert r.exit_code == 4 and ("unknown" in r.output or "empty" in r.output), (bad, r.output)
