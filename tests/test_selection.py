"""Device selection per board: what auto picks and why, forced devices, strict mode, session fallbacks."""

from types import SimpleNamespace

import pytest
from boards import detect_board

import edge_runtime as er
from edge_runtime.devices import registry
from edge_runtime.devices.base import Suitability
from edge_runtime.selection import Choice, choose, same_device, session_fallback

ALL = [{"target": t} for t in ("edgetpu", "tflite-int8", "onnx-int8", "openvino")]
BUILTIN = {"onnxruntime", "openvino", "tflite", "edgetpu", "coreml"}     # shipped; the fake is a test backend


@pytest.fixture(autouse=True)
def only_builtin_backends(monkeypatch):
    """Fixtures elsewhere register faked backends for the whole session (``edgetpu-faked`` claims a
    TPU on any hardware); selection per board is about the built-in backends only."""
    real = registry.known_targets
    monkeypatch.setattr(registry, "known_targets", lambda: {
        t: [n for n in names if n in BUILTIN] for t, names in real().items() if set(names) & BUILTIN})


@pytest.mark.parametrize("name,target,device", [
    ("coral-usb", "edgetpu", "edgetpu:usb"),
    ("coral-pcie", "edgetpu", "edgetpu:pci"),
    ("rpi5-coral", "edgetpu", "edgetpu:usb"),
    ("coral-usb-before-firmware", "openvino", "openvino:cpu"),     # no libedgetpu: a CPU path, not a dead delegate
    ("coral-pcie-without-driver", "openvino", "openvino:cpu"),
    ("jetson-orin", "onnx-int8", "onnxruntime:tensorrt"),
    ("jetson-orin-cpu-onnxruntime", "tflite-int8", "tflite:cpu"),
    ("nvidia-x86", "onnx-int8", "onnxruntime:cuda"),     # onnxruntime-gpu, no libnvinfer: TensorRT would be dropped
    ("apple-silicon", "onnx-int8", "onnxruntime:cpu"),
    ("x86", "openvino", "openvino:cpu"),
    ("x86-vnni", "onnx-int8", "onnxruntime:cpu"),                  # no openvino installed on that board
])
def test_auto_per_board(tmp_path, name, target, device):
    hw = detect_board(tmp_path, name)
    c = choose(ALL, hw)
    assert (c.variant["target"], c.suitability.device) == (target, device), c.candidates
    assert c.fallback is None
    (chosen,) = [r for r in c.candidates if r["chosen"]]
    assert chosen["score"] == max(r["score"] for r in c.candidates) and chosen["device"] == device
    assert all(r["reason"] for r in c.candidates)


def test_reasons_explain_the_losers(tmp_path):
    c = choose(ALL, detect_board(tmp_path, "jetson-orin-cpu-onnxruntime"))
    onnx = next(r for r in c.candidates if r["target"] == "onnx-int8")
    assert "CPU-only" in onnx["reason"] and "Jetson" in onnx["reason"]
    tpu = next(r for r in c.candidates if r["target"] == "edgetpu")
    assert tpu["score"] == 0 and "no Edge TPU" in tpu["reason"]
    c = choose(ALL, detect_board(tmp_path, "coral-usb-before-firmware"))
    tpu = next(r for r in c.candidates if r["target"] == "edgetpu")
    assert 0 < tpu["score"] < 8 and "libedgetpu" in tpu["reason"]


def test_int8_dot_breaks_the_cpu_tie(tmp_path):
    plain = choose([{"target": "onnx-int8"}], detect_board(tmp_path, "x86")).suitability.score
    vnni = choose([{"target": "onnx-int8"}], detect_board(tmp_path, "x86-vnni")).suitability.score
    assert vnni > plain


@pytest.mark.parametrize("name,device,needle", [
    ("x86", "edgetpu", "no Edge TPU found"),
    ("coral-usb", "edgetpu:pci", "no Edge TPU 'pci'"),
    ("jetson-orin-cpu-onnxruntime", "onnxruntime:tensorrt", "not in this onnxruntime build"),
    ("x86", "onnxruntime:cuda", "not in this onnxruntime build"),
])
def test_forced_device_strict_raises_else_falls_back(tmp_path, name, device, needle):
    hw = detect_board(tmp_path, name)
    with pytest.raises(er.DeviceError) as ei:
        choose(ALL, hw, device=device, strict=True)
    assert ei.value.code == "device_unavailable" and needle in ei.value.message
    c = choose(ALL, hw, device=device)
    assert c.fallback.startswith(f"requested {device!r} is unavailable") and needle in c.fallback
    assert c.suitability.ok and c.suitability.device != device
    forced = [r for r in c.candidates if r["forced"]]
    assert forced and not any(r["score"] for r in forced) and not any(r["chosen"] for r in forced)


def test_fallback_may_use_the_same_backends_default_device(tmp_path):
    hw = detect_board(tmp_path, "x86")
    c = choose([{"target": "onnx-int8"}], hw, device="onnxruntime:tensorrt")
    assert c.suitability.device == "onnxruntime:cpu" and "TensorrtExecutionProvider" in c.fallback


@pytest.mark.parametrize("device", ["warp-drive", "openvino:warp"])
def test_unknown_backend_or_sub_device_is_an_error_even_without_strict(tmp_path, device):
    with pytest.raises(er.DeviceError) as ei:
        choose(ALL, detect_board(tmp_path, "x86"), device=device)
    assert ei.value.code == "device_unknown"


def test_nothing_can_run_is_a_device_error(tmp_path):
    with pytest.raises(er.DeviceError) as ei:
        choose([{"target": "edgetpu"}], detect_board(tmp_path, "x86"))
    assert "no device can run this artifact here" in ei.value.message and "no Edge TPU" in ei.value.message


@pytest.mark.parametrize("promised,actual,same", [
    ("onnxruntime:tensorrt", "onnxruntime:tensorrt", True),
    ("edgetpu:usb", "edgetpu:usb:0", True),
    ("openvino:auto", "openvino:gpu", True),
    ("onnxruntime:tensorrt", "onnxruntime:cuda", False),
    ("onnxruntime:cuda", "onnxruntime:cpu", False),
    ("openvino:gpu", "openvino:cpu", False),
])
def test_same_device(promised, actual, same):
    assert same_device(promised, actual) is same


def _choice(device):
    return Choice({"target": "x"}, device.split(":")[0], Suitability("gpu", device, "test", score=50))


def test_session_fallback_from_the_session_or_its_device():
    assert session_fallback(_choice("b:gpu"), [SimpleNamespace(device="b:gpu", fallback=None)]) is None
    why = session_fallback(_choice("b:gpu"), [SimpleNamespace(device="b:cpu", fallback=None)])
    assert "chosen for b:gpu" in why and "runs on b:cpu" in why
    told = SimpleNamespace(device="b:cpu", fallback="the GPU provider did not start")
    assert session_fallback(_choice("b:gpu"), [told, told]) == "the GPU provider did not start"
    with pytest.raises(er.DeviceError) as ei:
        session_fallback(_choice("b:gpu"), [told], strict=True)
    assert ei.value.code == "device_fell_back" and ei.value.details["actual"] == "b:cpu"
