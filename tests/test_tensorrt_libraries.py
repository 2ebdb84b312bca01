"""device="auto" plans TensorRT only where TensorRT's libraries are: an onnxruntime-gpu wheel on an
NVIDIA box without libnvinfer (pip's onnxruntime-gpu does not bundle it) would drop the provider at
load, so the plan (``edge-infer devices``, ``--artifact``) says CUDA, and why."""

from __future__ import annotations

from boards import board, write
from edge_runtime.hardware import detect
from edge_runtime.selection import choose


def _nvidia_x86(tmp_path, *libs: str) -> dict:
    root, kw = board(tmp_path, "nvidia-x86")
    for rel in libs:
        write(root, rel)
    return detect(root, **kw)


def test_without_libnvinfer_auto_plans_cuda_and_says_why(tmp_path):
    c = choose([{"target": "onnx-int8"}], _nvidia_x86(tmp_path), device="auto")
    assert c.suitability.device == "onnxruntime:cuda", c.suitability.device
    assert "libnvinfer was not found" in c.suitability.reason and "doctor" in c.suitability.reason


def test_with_libnvinfer_auto_plans_tensorrt(tmp_path):
    hw = _nvidia_x86(tmp_path, "usr/lib/x86_64-linux-gnu/libnvinfer.so.10")
    c = choose([{"target": "onnx-int8"}], hw, device="auto")
    assert c.suitability.device == "onnxruntime:tensorrt", c.suitability.device


def test_a_record_that_did_not_look_for_libraries_keeps_tensorrt(tmp_path):
    hw = {k: v for k, v in _nvidia_x86(tmp_path).items() if k != "libraries"}
    assert choose([{"target": "onnx-int8"}], hw, device="auto").suitability.device == "onnxruntime:tensorrt"
