"""Jetson / NVIDIA GPU path of the onnxruntime backend, with onnxruntime faked at its boundary.

No GPU here: ``fake_onnxruntime`` says the build has TensorRT/CUDA and runs on
the CPU; the hardware record comes from the fake board trees. What is real:
the backend's scoring, provider order, TensorRT options (int8 for QDQ, engine
cache dir), reading back the providers actually used, and the runtime's
fallback reporting and strict mode.
"""

import logging
import subprocess
import sys

import pytest
from boards import detect_board
from conftest import ZOO
from fake_onnxruntime import CPU, CUDA, TRT, FakeOrtModule

import edge_runtime as er
from edge_runtime.artifact import load_artifact
from edge_runtime.devices.onnxruntime_backend import OnnxRuntimeBackend, is_qdq

DIGIT3 = sorted((ZOO / "digits-cnn" / "held_out" / "3").iterdir())[0]


def faked(module: FakeOrtModule) -> OnnxRuntimeBackend:
    """The real backend over the faked module, with a probe that answers for that module's build."""
    return OnnxRuntimeBackend(module=module, probe=lambda hw: {"installed": True,
                                                                "providers": module.get_available_providers()})


def test_jetson_runs_onnx_int8_through_tensorrt_cuda_cpu(fake_ort, digits_artifact, tmp_path):
    ort = fake_ort()
    hw = detect_board(tmp_path, "jetson-orin")
    with er.load(digits_artifact, hardware=hw) as rt:       # auto
        res = rt.infer(DIGIT3)
        info = rt.info()
    assert res.prediction == "3" and res.device == rt.device == "onnxruntime:tensorrt"
    assert info["fallback"] is None and "Jetson AGX Orin" in info["device_reason"]
    sess = ort.sessions[0]
    assert sess.providers_given == [TRT, CUDA, CPU]
    trt, cuda, cpu = sess.provider_options
    cache = tmp_path / "cache" / "tensorrt"
    assert trt["trt_int8_enable"] is True                    # digits onnx-int8 is QDQ
    assert trt["trt_engine_cache_enable"] is True and trt["trt_engine_cache_path"] == str(cache)
    assert trt["trt_timing_cache_path"] == str(cache) and cache.is_dir()
    assert cuda == {"device_id": 0} and cpu == {}
    s = info["sessions"][0]
    assert s["providers"] == [TRT, CUDA, CPU] and s["dropped_providers"] == [] and s["int8"] is True
    assert s["trt_cache_dir"] == str(cache)
    chosen = [c for c in info["candidates"] if c["chosen"]]
    assert [(c["backend"], c["device"]) for c in chosen] == [("onnxruntime", "onnxruntime:tensorrt")]


def test_default_trt_cache_is_per_user(fake_ort, digits_artifact, tmp_path, monkeypatch):
    ort = fake_ort()
    monkeypatch.delenv("EDGE_RUNTIME_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with er.load(digits_artifact, hardware=detect_board(tmp_path, "jetson-orin"), warmup=False):
        pass
    assert ort.sessions[0].provider_options[0]["trt_engine_cache_path"] == \
        str(tmp_path / "home" / ".cache" / "edge-runtime" / "tensorrt")


def test_unwritable_cache_runs_uncached_and_says_so(fake_ort, digits_artifact, tmp_path):
    ort = fake_ort()
    blocker = tmp_path / "file"
    blocker.write_text("")
    with er.load(digits_artifact, hardware=detect_board(tmp_path, "jetson-orin"), warmup=False,
                 device_options={"cache_dir": str(blocker / "sub")}) as rt:
        s = rt.info()["sessions"][0]
    assert s["trt_cache_dir"] is None and "cache off" in s["cache_error"]
    assert "trt_engine_cache_enable" not in ort.sessions[0].provider_options[0]


def test_int8_only_for_qdq_models(digits_artifact, tmp_path):
    fp32 = ZOO / "digits-cnn" / "model.onnx"
    int8 = next((digits_artifact / "onnx-int8").iterdir())
    assert is_qdq(int8) and not is_qdq(fp32)
    ort = FakeOrtModule()
    backend = faked(ort)
    bucket = load_artifact(digits_artifact, verify=False).variants[0]["buckets"][0]
    sess = backend.load(fp32, bucket, "tensorrt", {"cache": False})
    assert ort.sessions[-1].provider_options[0]["trt_int8_enable"] is False and sess.info()["int8"] is False


def test_dropped_tensorrt_is_a_reported_fallback_and_strict_refuses(fake_ort, digits_artifact, tmp_path, caplog):
    fake_ort(initialises={CUDA})                              # TensorRT libraries "missing": ORT drops it
    hw = detect_board(tmp_path, "jetson-orin")
    with caplog.at_level(logging.WARNING, logger="edge_runtime"):
        for _ in range(2):
            with er.load(digits_artifact, hardware=hw) as rt:
                res = rt.infer(DIGIT3)
                info = rt.info()
    assert res.device == "onnxruntime:cuda" and res.prediction == "3"
    assert TRT in info["fallback"] and "could not initialise" in info["fallback"]
    assert info["sessions"][0]["dropped_providers"] == [TRT]
    assert len([r for r in caplog.records if TRT in r.getMessage()]) == 1      # logged once
    with pytest.raises(er.DeviceError) as ei:
        er.load(digits_artifact, hardware=hw, strict=True)
    assert ei.value.code == "device_fell_back" and "onnxruntime:tensorrt" in ei.value.message
    with pytest.raises(er.DeviceError):
        er.load(digits_artifact, hardware=hw, device="onnxruntime:tensorrt", strict=True)


def test_every_gpu_provider_dropped_runs_on_cpu_and_says_so(fake_ort, digits_artifact, tmp_path):
    fake_ort(initialises=set())
    with er.load(digits_artifact, hardware=detect_board(tmp_path, "nvidia-x86"), device="onnxruntime:cuda") as rt:
        res = rt.infer(DIGIT3)
        assert res.device == "onnxruntime:cpu"
        assert CUDA in rt.info()["fallback"] and rt.info()["sessions"][0]["dropped_providers"] == [CUDA]


def test_gpu_index_reaches_the_provider(fake_ort, digits_artifact, tmp_path):
    ort = fake_ort()
    with er.load(digits_artifact, hardware=detect_board(tmp_path, "nvidia-x86"), device="onnxruntime:cuda:1",
                 strict=True) as rt:
        assert rt.device == "onnxruntime:cuda:1" and rt.infer(DIGIT3).device == "onnxruntime:cuda:1"
    assert ort.sessions[0].provider_options == [{"device_id": 1}, {}]


def test_cpu_only_onnxruntime_on_a_jetson_is_called_out(tmp_path):
    hw = detect_board(tmp_path, "jetson-orin-cpu-onnxruntime")
    backend = OnnxRuntimeBackend()                  # real: the build's providers come from the probe
    s = backend.suitability("onnx-int8", hw)
    assert s.device == "onnxruntime:cpu" and "CPU-only" in s.reason and "Jetson AGX Orin" in s.reason
    forced = backend.suitability("onnx-int8", hw, "tensorrt")
    assert not forced.ok and "not in this onnxruntime build" in forced.reason and "CPU-only" in forced.reason


def test_gpu_build_without_a_gpu_does_not_claim_it(tmp_path):
    hw = detect_board(tmp_path, "x86")                    # no /dev/nvidia*, not a Jetson
    backend = faked(FakeOrtModule())                      # a build with TensorRT and CUDA
    assert backend.suitability("onnx-int8", hw).device == "onnxruntime:cpu"
    s = backend.suitability("onnx-int8", hw, "cuda")
    assert not s.ok and "no NVIDIA GPU" in s.reason
    assert not backend.suitability("onnx-int8", hw, "warp").ok


def test_scoring_does_not_import_onnxruntime():
    code = ("import sys; from edge_runtime.hardware import detect; from edge_runtime.selection import choose; "
            "c = choose([{'target': 'onnx-int8'}], detect()); print(c.suitability.device, "
            "'onnxruntime' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["onnxruntime:cpu", "False"]
