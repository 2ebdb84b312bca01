"""ONNX Runtime backend: CPU, and on NVIDIA GPUs (Jetson included) TensorRT → CUDA → CPU.

``onnxruntime`` is imported when a session is loaded, never at module import
and not to score itself: which providers the installed build has comes from
the hardware probe (``hardware["onnxruntime"]``, read from the wheel's files),
unless the record lacks it or the module is injected (tests replace the vendor
boundary by passing ``module=``: ``get_available_providers``,
``InferenceSession``, ``SessionOptions``...).

Devices: ``onnxruntime:cpu``, ``onnxruntime:cuda[:N]``,
``onnxruntime:tensorrt[:N]`` (N: the GPU index). TensorRT gets its engine
cache (and timing cache) in ``$EDGE_RUNTIME_CACHE_DIR/tensorrt`` (default
``$XDG_CACHE_HOME/edge-runtime/tensorrt``, else ``~/.cache/edge-runtime/tensorrt``;
the convention of the OpenVINO backend), switched off by ``cache=False`` or
``EDGE_RUNTIME_TRT_CACHE=0``, and INT8 enabled when the model holds QDQ
(Quantize/DequantizeLinear) nodes. ORT silently drops providers it cannot
initialise (no GPU, missing CUDA/cuDNN/TensorRT libraries): the session reads
back ``get_providers()``, reports what is used as its device and, when that
is not what was asked for, says so in ``session.fallback`` (the runtime turns
it into a reported fallback, or a ``DeviceError`` under ``strict``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from edge_runtime.hardware import has_nvidia_gpu

from .base import cache_dir as _cache_dir, Suitability, check_feeds, int_option

log = logging.getLogger("edge_runtime.onnxruntime")

# device -> provider order (first that is available and initialises wins)
_PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
}
_SHORT = {"CPUExecutionProvider": "cpu", "CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "tensorrt"}
_LONG = {v: k for k, v in _SHORT.items()}
_SCORES = {"tensorrt": 50, "cuda": 45, "cpu": 10}
_QDQ_MARK = b"DequantizeLinear"


def cache_dir(options: dict) -> Path | None:
    """The TensorRT engine cache directory, or None when switched off."""
    return _cache_dir(options, "tensorrt", "EDGE_RUNTIME_TRT_CACHE")


def is_qdq(path: Path) -> bool:
    """True when the ONNX file holds QDQ nodes (scanned in chunks; no onnx import)."""
    tail = b""
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            if _QDQ_MARK in tail + block:
                return True
            tail = block[-len(_QDQ_MARK):]
    return False


def parse_device(device: str | None) -> tuple[str, int]:
    """``"tensorrt:1"`` → ("tensorrt", 1); None → ("cpu", 0)."""
    name, _, index = (device or "cpu").lower().partition(":")
    if name not in _PROVIDERS or (index and not index.isdigit()):
        raise ValueError(f"unknown onnxruntime device {device!r} (cpu, cuda[:N], tensorrt[:N])")
    return name, int(index or 0)


def _writable(path: Path) -> str | None:
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(f"{path} is not writable")
    except OSError as exc:
        return f"TensorRT engine cache off: {exc}"
    return None


def provider_options(providers: list[str], model_path: Path, device_id: int, options: dict) -> tuple[list[dict], dict]:
    """(options per provider, notes for info()): TensorRT int8 for QDQ models and its engine cache."""
    notes: dict = {"int8": None, "trt_cache_dir": None, "cache_error": None}
    out = []
    for name in providers:
        if name == "TensorrtExecutionProvider":
            qdq = is_qdq(model_path)
            int8 = bool(options.get("int8", qdq))
            trt = {"device_id": device_id, "trt_int8_enable": int8, "trt_fp16_enable": bool(options.get("fp16", False))}
            cache = cache_dir(options)
            if cache is not None:
                notes["cache_error"] = _writable(cache)
                if notes["cache_error"]:
                    log.warning("onnxruntime %s", notes["cache_error"])
                    cache = None
            if cache is not None:
                trt.update(trt_engine_cache_enable=True, trt_engine_cache_path=str(cache),
                           trt_timing_cache_enable=True, trt_timing_cache_path=str(cache))
            notes.update(int8=int8, qdq=qdq, trt_cache_dir=None if cache is None else str(cache))
            out.append(trt)
        elif name == "CUDAExecutionProvider":
            out.append({"device_id": device_id})
        else:
            out.append({})
    return out, notes


class OnnxRuntimeSession:
    # ORT stops a running call when its RunOptions.terminate is set, so the
    # runtime runs it in the caller's thread and cancels it at the deadline
    cancellable = True

    def __init__(self, ort, model_path: Path, bucket: dict, wanted: list[str], providers: list[str],
                 device_id: int, options: dict, name: str = "onnxruntime"):
        self._ort = ort
        so = ort.SessionOptions()
        threads = int_option(options, "threads")
        if threads:
            so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        self._bucket = bucket
        opts, self.notes = provider_options(providers, model_path, device_id, options)
        self.provider_options = dict(zip(providers, opts))
        self._sess = ort.InferenceSession(str(model_path), sess_options=so, providers=providers, provider_options=opts)
        self.providers = list(self._sess.get_providers())
        self.requested_providers = wanted
        self.device = f"{name}:" + _SHORT.get(self.providers[0], self.providers[0])
        if device_id and self.providers[0] != "CPUExecutionProvider":
            self.device += f":{device_id}"
        first = self.providers[0]
        self.dropped_providers = wanted[:wanted.index(first)] if first in wanted else \
            [p for p in wanted if p not in self.providers]
        self.fallback = None
        if self.dropped_providers:
            absent = [p for p in self.dropped_providers if p not in providers]
            failed = [p for p in self.dropped_providers if p in providers]
            parts = ([f"not in this onnxruntime build: {', '.join(absent)}"] if absent else []) + \
                ([f"onnxruntime could not initialise {', '.join(failed)} (no usable GPU, or CUDA/cuDNN/TensorRT "
                  "libraries missing or mismatched)"] if failed else [])
            self.fallback = f"{'; '.join(parts)}; running on {self.providers[0]}"
        self._outputs = [t["name"] for t in bucket["outputs"]]
        declared = {i.name for i in self._sess.get_inputs()}
        wanted_inputs = {t["name"] for t in bucket["inputs"]}
        if declared != wanted_inputs:
            raise ValueError(f"model inputs {sorted(declared)} differ from the manifest's {sorted(wanted_inputs)}")

    def run(self, feeds, cancel=None):
        if self._sess is None:
            raise RuntimeError("session is closed")
        check_feeds(feeds, self._bucket)
        opts = None
        if cancel is not None:
            opts = self._ort.RunOptions()
            cancel.on_cancel(lambda: setattr(opts, "terminate", True))
        values = self._sess.run(self._outputs, dict(feeds), opts)
        return dict(zip(self._outputs, values))

    def info(self) -> dict:
        return {"providers": self.providers, "requested_providers": self.requested_providers,
                "dropped_providers": self.dropped_providers, "provider_options": self.provider_options,
                "fallback": self.fallback, **self.notes}

    def close(self) -> None:
        self._sess = None


def _build_note(hardware: dict) -> str:
    ort = hardware.get("onnxruntime") or {}
    return f"{ort.get('distribution', 'onnxruntime')} {ort.get('version') or ''}".strip()


def _gpu_where(hardware: dict) -> str:
    jetson = hardware.get("jetson")
    if jetson:
        return f"{jetson['model']} (L4T {jetson.get('l4t') or '?'})"
    gpus = (hardware.get("nvidia") or {}).get("gpus") or hardware.get("nvidia_gpus") or []
    return "NVIDIA GPU " + ", ".join(gpus)


class OnnxRuntimeBackend:
    targets = ("onnx-int8", "onnx-fp32")

    def __init__(self, module=None, name: str = "onnxruntime"):
        self._module = module
        self.name = name

    def _ort(self):
        if self._module is not None:
            return self._module
        import onnxruntime

        return onnxruntime

    def _available(self, hardware: dict) -> list[str]:
        """Provider names of the installed build; no import when the probe read them from its files."""
        build = hardware.get("onnxruntime")
        if self._module is None and build and build.get("providers"):   # the hardware record describes the machine
            return [_LONG[p] for p in build["providers"] if p in _LONG]
        try:
            return list(self._ort().get_available_providers())
        except Exception:
            return []

    def suitability(self, target: str, hardware: dict, device: str | None = None) -> Suitability:
        if target not in self.targets:
            return Suitability(0, self.name, f"onnxruntime does not run {target!r} variants")
        if self._module is None and not hardware.get("packages", {}).get("onnxruntime", True):
            return Suitability(0, self.name, "onnxruntime is not installed (pip install 'edge-runtime[onnxruntime]')")
        available = self._available(hardware)
        if not available:
            return Suitability(0, self.name, "onnxruntime failed to import")
        gpu = has_nvidia_gpu(hardware)
        if device is not None:
            try:
                want, index = parse_device(device)
            except ValueError as exc:
                return Suitability(0, f"{self.name}:{device}", str(exc))
            where = f"{self.name}:{want}" + (f":{index}" if index and want != "cpu" else "")
            first = _PROVIDERS[want][0]
            if first not in available:
                return Suitability(0, where, f"{first} is not in this onnxruntime build ({_build_note(hardware)})"
                                   + _cpu_only_note(hardware, available))
            if want != "cpu" and not gpu:
                return Suitability(0, where, f"{first} is in this onnxruntime build but no NVIDIA GPU was found "
                                             "(no /dev/nvidia*, not a Jetson)")
            return Suitability(_SCORES[want], where, f"{first} requested" + (f" on {_gpu_where(hardware)}" if gpu and
                                                                            want != "cpu" else ""))
        for dev in ("tensorrt", "cuda"):
            if _PROVIDERS[dev][0] in available and gpu:
                order = " → ".join(_SHORT[p] for p in _PROVIDERS[dev])
                return Suitability(_SCORES[dev], f"{self.name}:{dev}",
                                   f"{_gpu_where(hardware)} with {_build_note(hardware)}: providers {order}")
        score = _SCORES["cpu"] + (2 if target == "onnx-int8" and hardware.get("cpu", {}).get("int8_dot") else 0)
        return Suitability(score, f"{self.name}:cpu", "CPUExecutionProvider" + _cpu_only_note(hardware, available))

    def load(self, model_path: Path, bucket: dict, device: str | None = None, options: dict | None = None):
        options = dict(options or {})
        want, device_id = parse_device(device)
        ort = self._ort()
        available = list(ort.get_available_providers())
        wanted = _PROVIDERS[want]
        providers = [p for p in wanted if p in available] or ["CPUExecutionProvider"]
        # checked before any session is made: a bad value names the option (InputError)
        options["threads"] = int_option(options, "threads", env="EDGE_RUNTIME_THREADS")
        return OnnxRuntimeSession(ort, Path(model_path), bucket, wanted, providers, device_id, options, self.name)


def _cpu_only_note(hardware: dict, available: list[str]) -> str:
    """The call-out for a GPU this onnxruntime cannot use (CPU-only wheel on a Jetson or a GPU box)."""
    if not has_nvidia_gpu(hardware) or any(_PROVIDERS[d][0] in available for d in ("cuda", "tensorrt")):
        return ""
    return (f"; this is {_gpu_where(hardware)} but the installed onnxruntime ({_build_note(hardware)}) is "
            "CPU-only, so the GPU is unused: see `edge-infer doctor`")
