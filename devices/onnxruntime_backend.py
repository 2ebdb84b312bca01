"""ONNX Runtime backend: CPU provider, plus CUDA/TensorRT when present.

``onnxruntime`` is imported when a session is loaded (or availability is
asked), never at module import. The providers actually in use (ORT silently
drops ones it cannot initialise) are what the session reports as its device.
"""

from __future__ import annotations

import os
from pathlib import Path


from .base import Suitability, check_feeds

# device suffix -> provider order (first that is available and initialises wins)
_PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
}
_SHORT = {"CPUExecutionProvider": "cpu", "CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "tensorrt"}


def _ort():
    import onnxruntime

    return onnxruntime


class OnnxRuntimeSession:
    # ORT stops a running call when its RunOptions.terminate is set, so the
    # runtime runs it in the caller's thread and cancels it at the deadline
    cancellable = True

    def __init__(self, model_path: Path, bucket: dict, providers: list[str], options: dict):
        ort = _ort()
        so = ort.SessionOptions()
        threads = options.get("threads")
        if threads:
            so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        self._bucket = bucket
        self._sess = ort.InferenceSession(str(model_path), sess_options=so, providers=providers)
        self.providers = list(self._sess.get_providers())
        self.requested_providers = providers
        self.device = "onnxruntime:" + _SHORT.get(self.providers[0], self.providers[0])
        self._outputs = [t["name"] for t in bucket["outputs"]]
        declared = {i.name for i in self._sess.get_inputs()}
        wanted = {t["name"] for t in bucket["inputs"]}
        if declared != wanted:
            raise ValueError(f"model inputs {sorted(declared)} differ from the manifest's {sorted(wanted)}")

    def run(self, feeds, cancel=None):
        if self._sess is None:
            raise RuntimeError("session is closed")
        check_feeds(feeds, self._bucket)
        opts = None
        if cancel is not None:
            opts = _ort().RunOptions()
            cancel.on_cancel(lambda: setattr(opts, "terminate", True))
        values = self._sess.run(self._outputs, dict(feeds), opts)
        return dict(zip(self._outputs, values))

    def info(self) -> dict:
        return {"providers": self.providers, "requested_providers": self.requested_providers}

    def close(self) -> None:
        self._sess = None


class OnnxRuntimeBackend:
    name = "onnxruntime"
    targets = ("onnx-int8", "onnx-fp32")

    def _available(self) -> list[str]:
        try:
            return list(_ort().get_available_providers())
        except Exception:
            return []

    def suitability(self, target: str, hardware: dict, device: str | None = None) -> Suitability:
        if target not in self.targets:
            return Suitability(0, self.name, f"onnxruntime does not run {target!r} variants")
        if not hardware.get("packages", {}).get("onnxruntime", True):
            return Suitability(0, self.name, "onnxruntime is not installed (pip install 'edge-runtime[onnxruntime]')")
        available = self._available()
        if not available:
            return Suitability(0, self.name, "onnxruntime failed to import")
        want = (device or "").lower() or None
        if want is not None:
            if want not in _PROVIDERS:
                return Suitability(0, f"{self.name}:{want}", f"unknown onnxruntime device {want!r} (cpu, cuda, tensorrt)")
            if _PROVIDERS[want][0] not in available:
                return Suitability(0, f"{self.name}:{want}", f"{_PROVIDERS[want][0]} is not in this onnxruntime build")
            return Suitability(50 if want != "cpu" else 10, f"{self.name}:{want}", f"{_PROVIDERS[want][0]} requested")
        for dev in ("tensorrt", "cuda"):
            if _PROVIDERS[dev][0] in available and hardware.get("nvidia_gpus"):
                return Suitability(50, f"{self.name}:{dev}", f"{_PROVIDERS[dev][0]} available with an NVIDIA GPU")
        score = 10 + (2 if target == "onnx-int8" and hardware.get("cpu", {}).get("int8_dot") else 0)
        return Suitability(score, f"{self.name}:cpu", "CPUExecutionProvider")

    def load(self, model_path: Path, bucket: dict, device: str | None = None, options: dict | None = None):
        options = dict(options or {})
        want = (device or "cpu").lower()
        if want not in _PROVIDERS:
            raise ValueError(f"unknown onnxruntime device {want!r} (cpu, cuda, tensorrt)")
        providers = [p for p in _PROVIDERS[want] if p in self._available()] or ["CPUExecutionProvider"]
        if "threads" not in options and os.environ.get("EDGE_RUNTIME_THREADS"):
            options["threads"] = int(os.environ["EDGE_RUNTIME_THREADS"])
        return OnnxRuntimeSession(Path(model_path), bucket, providers, options)


