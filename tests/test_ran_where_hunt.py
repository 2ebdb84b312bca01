"""What the runtime reports against what ran: each test pins a place where the two differed.

- ONNX Runtime keeping TensorRT but dropping CUDA: the dropped provider is listed and the
  fallback reported (nodes TensorRT does not take run on the CPU, not on the GPU).
- OpenVINO's ``precision=auto`` asked for explicitly is what the option says (what the artifact
  recorded, else f32), never an f32 override with a reason saying nothing was recorded.
- OpenVINO's AUTO device: the precision and thread count that ran are read back from the
  execution device (AUTO itself exposes neither), never "unknown".
"""

import logging

import numpy as np
import pytest
from boards import detect_board
from conftest import ZOO
from fake_onnxruntime import CPU, CUDA, TRT

import edge_runtime as er

DIGIT3 = sorted((ZOO / "digits-cnn" / "held_out" / "3").iterdir())[0]


def test_tensorrt_kept_with_cuda_dropped_is_reported(fake_ort, digits_artifact, tmp_path, caplog):
    """cuDNN missing: ORT keeps TensorRT, drops CUDA, and runs what TensorRT does not take on the CPU.
    Before, ``dropped_providers`` was [] and nothing said a provider was lost."""
    ort = fake_ort(initialises={TRT})
    hw = detect_board(tmp_path, "nvidia-x86")
    with caplog.at_level(logging.WARNING, logger="edge_runtime"):
        with er.load(digits_artifact, hardware=hw, device="onnxruntime:tensorrt") as rt:
            res = rt.infer(DIGIT3)
            info = rt.info()
    assert ort.sessions[0].providers_given == [TRT, CUDA, CPU]
    s = info["sessions"][0]
    assert s["providers"] == [TRT, CPU] and s["dropped_providers"] == [CUDA]
    assert res.device == "onnxruntime:tensorrt" and res.prediction == "3"     # TensorRT still runs the graph
    assert info["fallback"] and CUDA in info["fallback"] and "could not initialise" in info["fallback"]
    assert f"{TRT} → {CPU}" in info["fallback"]
    assert any(CUDA in r.getMessage() for r in caplog.records)                # logged
    assert rt.metrics()["fallbacks"]
    with pytest.raises(er.DeviceError) as ei:                                 # strict: not what was asked for
        er.load(digits_artifact, hardware=hw, device="onnxruntime:tensorrt", strict=True, warmup=False)
    assert ei.value.code == "device_fell_back"


def test_every_provider_kept_is_no_fallback(fake_ort, digits_artifact, tmp_path):
    fake_ort()
    with er.load(digits_artifact, hardware=detect_board(tmp_path, "nvidia-x86"), device="onnxruntime:tensorrt",
                 strict=True, warmup=False) as rt:
        s = rt.info()["sessions"][0]
        assert s["providers"] == [TRT, CUDA, CPU] and s["dropped_providers"] == [] and s["fallback"] is None


def test_openvino_precision_auto_asked_for_keeps_the_recorded_choice():
    """``precision=auto`` (its help: "what the artifact recorded, else f32") overrode a recorded bf16
    with f32, and the session's reason said "no measured choice recorded"."""
    from edge_runtime.devices.openvino_backend import OpenVinoBackend
    from edge_runtime.devices.openvino_core import choose_precision
    from edge_runtime.devices.options import resolve_options
    from edge_runtime.runtime import device_options_for

    backend = OpenVinoBackend()
    variant = {"target": "openvino", "runtime": {"precision": "bf16", "why": "bf16 measured fastest at convert"}}
    for asked in ({"precision": "auto"}, {"precision": "AUTO"}):
        options, provenance, _ = device_options_for(backend, variant, asked)
        assert options == {"precision": "bf16"} and provenance == {"why": "bf16 measured fastest at convert"}
        resolved = resolve_options(backend.options, options, backend.name, provenance)
        assert choose_precision(resolved, provenance.get("why")) == ("bf16", "bf16 measured fastest at convert")
    # nothing recorded: auto is f32, and says so
    options, provenance, _ = device_options_for(backend, {"target": "openvino"}, {"precision": "auto"})
    assert options == {} and choose_precision(resolve_options(backend.options, options, backend.name))[0] == "f32"
    # a precision named by the caller still overrides the recorded one
    options, provenance, _ = device_options_for(backend, variant, {"precision": "f32"})
    assert options == {"precision": "f32"} and provenance == {}




def test_openvino_auto_reads_back_precision_and_threads(tiny_ir):
    """OpenVINO's AUTO plugin answers no INFERENCE_PRECISION_HINT of its own: info said "unknown"
    although its execution device's (DEVICE_PROPERTIES) says what ran."""
    from edge_runtime.devices.openvino_backend import OpenVinoBackend

    path, bucket = tiny_ir
    backend = OpenVinoBackend()
    for device, options in (("auto", {"precision": "f32", "threads": 1, "cache": False}),
                            ("cpu", {"precision": "f32", "threads": 1, "cache": False})):
        sess = backend.load(path, bucket, device, options)
        try:
            out = sess.run({"x": np.array([[-1, 0, 1, 2]], np.float32)})
            assert out["y"].tolist() == [[0, 0, 0.5, 1]]
            info = sess.info()
            assert sess.device == "openvino:cpu" and info["execution_devices"] == ["CPU"]
            assert info["precision"] == "float32", (device, info)
            assert info["threads"] == 1, (device, info)
        finally:
            sess.close()


def test_openvino_auto_with_only_a_cpu_is_placed_as_the_cpu():
    """With no GPU/NPU, OpenVINO's AUTO runs on the CPU plugin: it was placed as an accelerator
    (policy row "an OpenVINO GPU, NPU or AUTO device", and the one-thread fit skipped as
    "not a CPU device") while every result said openvino:cpu."""
    pytest.importorskip("openvino")
    from edge_runtime.devices.openvino_backend import OpenVinoBackend
    from edge_runtime.devices.openvino_core import core
    from edge_runtime.hardware import detect_cached
    from edge_runtime.selection import assess

    if {d.split(".")[0] for d in core().available_devices} != {"CPU"}:
        pytest.skip("this machine has an OpenVINO device besides the CPU")
    hw = detect_cached()
    suit = OpenVinoBackend().suitability("openvino", hw, "auto")
    assert suit.ok and suit.tier == "cpu" and suit.device == "openvino:auto" and "CPU" in suit.reason
    assert assess("openvino", "openvino", hw, "auto").score == assess("openvino", "openvino", hw).score
    assert not OpenVinoBackend().suitability("openvino", hw, "gpu").ok


def test_threads_are_read_back_from_the_sessions(digits_artifact, monkeypatch, tiny_ir):
    """The thread count a session runs with is in its info (ONNX Runtime and OpenVINO said nothing:
    $EDGE_RUNTIME_THREADS, or the one-thread fit, were visible nowhere in the sessions)."""
    from edge_runtime.devices.openvino_backend import OpenVinoBackend

    monkeypatch.setenv("EDGE_RUNTIME_THREADS", "1")
    with er.load(digits_artifact, device="onnxruntime", warmup=False) as rt:
        assert rt.info()["sessions"][0]["threads"] == 1
        assert rt.info()["device_options"] == {}            # not the caller's: the environment's
    path, bucket = tiny_ir
    sess = OpenVinoBackend().load(path, bucket, "cpu", {"cache": False})
    try:
        assert sess.info()["threads"] == 1
    finally:
        sess.close()
    monkeypatch.delenv("EDGE_RUNTIME_THREADS")
    with er.load(digits_artifact, device="onnxruntime", warmup=False) as rt:
        assert rt.info()["sessions"][0]["threads"] is None   # onnxruntime's own default


def test_a_result_names_its_own_buckets_device(make_artifact, monkeypatch):
    """One bucket's session on another device (ORT dropping TensorRT for one shape, say): every
    result named the first session's device, so a call that ran on the CPU said the GPU."""
    import fake_backend

    opened = fake_backend.FakeBackend.open

    def open_(self, model_path, bucket, sub, options):
        sess = opened(self, model_path, bucket, sub, options)
        if bucket["name"] == "seq16":
            sess.device = "fake:other"
            sess.fallback = "the seq16 session fell back to fake:other"
        return sess

    monkeypatch.setattr(fake_backend.FakeBackend, "open", open_)
    art = make_artifact("text-classification", buckets=(8, 16))
    with er.load(art, device="fake") as rt:
        assert [s.device for s in rt._sessions] == ["fake:cpu", "fake:other"]
        assert "the seq16 session fell back to fake:other" in rt.info()["fallback"]
        short, long_ = rt.infer("hi"), rt.infer("a much longer text than eight tokens fits in here")
        assert (short.bucket, short.device) == ("seq8", "fake:cpu")
        assert (long_.bucket, long_.device) == ("seq16", "fake:other")
        batch = rt.infer_batch(["hi", "a much longer text than eight tokens fits in here"])
        assert [r.device for r in batch] == ["fake:cpu", "fake:other"]
