"""ONNX Runtime backend: CPU, and on NVIDIA GPUs (Jetson included) TensorRT → CUDA → CPU.

``onnxruntime`` is imported when a session is loaded, never at module import
and not to assess itself: which providers the installed build has comes from
the probe, by default the hardware record (``hardware["onnxruntime"]``, read
from the wheel's files; onnxruntime is asked only when the record lacks it).
Tests inject the vendor module (``module=``) and a probe that answers for it.

Devices: ``onnxruntime:cpu``, ``onnxruntime:cuda[:N]``,
``onnxruntime:tensorrt[:N]`` (N: the GPU index). TensorRT gets its engine
cache (and timing cache) in ``$EDGE_RUNTIME_CACHE_DIR/tensorrt`` (default
``$XDG_CACHE_HOME/edge-runtime/tensorrt``, else ``~/.cache/edge-runtime/tensorrt``),
switched off by ``cache=false`` or ``EDGE_RUNTIME_TRT_CACHE=0``, and INT8
enabled when the model holds QDQ (Quantize/DequantizeLinear) nodes. ORT
silently drops providers it cannot initialise (no GPU, missing
CUDA/cuDNN/TensorRT libraries): the session reads back ``get_providers()``,
reports what is used as its device and, when that is not what was asked for,
says so in ``session.fallback`` (a reported fallback, or a ``DeviceError``
under ``strict``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from edge_runtime.hardware import has_nvidia_gpu

from .base import (Capabilities, DeviceBackend, DeviceSession, Option, Suitability, cache_dir as _cache_dir,
                   cache_options, check_io, threads_option, writable_dir)

log = logging.getLogger("edge_runtime.onnxruntime")

# device -> provider order (first that is available and initialises wins)
_PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
}
_SHORT = {"CPUExecutionProvider": "cpu", "CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "tensorrt"}
_LONG = {v: k for k, v in _SHORT.items()}
_QDQ_MARK = b"DequantizeLinear"


def cache_dir(options) -> Path | None:
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


def provider_options(providers: list[str], model_path: Path, device_id: int, options) -> tuple[list[dict], dict]:
    """(options per provider, notes for info()): TensorRT int8 for QDQ models and its engine cache."""
    notes: dict = {"int8": None, "trt_cache_dir": None, "cache_error": None}
    out = []
    for name in providers:
        if name == "TensorrtExecutionProvider":
            qdq = is_qdq(model_path)
            int8 = qdq if options.get("int8") is None else bool(options.get("int8"))
            trt: dict[str, object] = {"device_id": device_id, "trt_int8_enable": int8, "trt_fp16_enable": bool(options.get("fp16"))}
            cache = cache_dir(options)
            if cache is not None:
                why = writable_dir(cache)
                if why:
                    notes["cache_error"] = f"TensorRT engine cache off: {why}"
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


class OnnxRuntimeSession(DeviceSession):
    # ORT stops a running call when its RunOptions.terminate is set, so the
    # runtime runs it in the caller's thread and cancels it at the deadline
    capabilities = Capabilities(inline=True, cancellable=True)

    def __init__(self, ort, model_path: Path, bucket: dict, wanted: list[str], providers: list[str],
                 device_id: int, options, name: str = "onnxruntime"):
        super().__init__(bucket, name)
        self._ort = ort
        so = ort.SessionOptions()
        if options.get("threads"):
            so.intra_op_num_threads = options["threads"]
        self.threads = so.intra_op_num_threads or None      # None: onnxruntime's default (its physical cores)
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        opts, self.notes = provider_options(providers, model_path, device_id, options)
        self.provider_options = dict(zip(providers, opts))
        self._sess = ort.InferenceSession(str(model_path), sess_options=so, providers=providers, provider_options=opts)
        self.providers = list(self._sess.get_providers())
        self.requested_providers = wanted
        self.device = f"{name}:" + _SHORT.get(self.providers[0], self.providers[0])
        if device_id and self.providers[0] != "CPUExecutionProvider":
            self.device += f":{device_id}"
        # every provider asked for that ORT did not keep, the ones after the first kept too: TensorRT
        # kept with CUDA dropped runs what TensorRT does not take on the CPU, not on the GPU
        self.dropped_providers = [p for p in wanted if p not in self.providers]
        if self.dropped_providers:
            absent = [p for p in self.dropped_providers if p not in providers]
            failed = [p for p in self.dropped_providers if p in providers]
            parts = ([f"not in this onnxruntime build: {', '.join(absent)}"] if absent else []) + \
                ([f"onnxruntime could not initialise {', '.join(failed)} (no usable GPU, or CUDA/cuDNN/TensorRT "
                  "libraries missing or mismatched)"] if failed else [])
            self.fallback = f"{'; '.join(parts)}; running on {' → '.join(self.providers)}"
        self._outputs = [t["name"] for t in bucket["outputs"]]
        # ORT names a missing output itself when it runs; the inputs are checked here
        check_io((i.name for i in self._sess.get_inputs()), self._outputs, bucket)
        # on the CPU provider alone, call the native run directly: InferenceSession.run adds
        # only checks that FeedCheck already made (input names; numpy arrays, so no OrtValue
        # ownership or graph capture) and a GPU-provider fallback this session cannot take
        native = getattr(self._sess, "_sess", None)
        self._direct = native.run if self.providers == ["CPUExecutionProvider"] and native is not None \
            and hasattr(native, "run") else None

    def _run(self, feeds, cancel):
        opts = None
        if cancel is not None:
            opts = self._ort.RunOptions()
            cancel.on_cancel(lambda: setattr(opts, "terminate", True))
        feeds = feeds if type(feeds) is dict else dict(feeds)
        if self._direct is not None:
            values = self._direct(self._outputs, feeds, opts)
        else:
            values = self._sess.run(self._outputs, feeds, opts)
        return dict(zip(self._outputs, values))

    def info(self) -> dict:
        return {"providers": self.providers, "requested_providers": self.requested_providers, "threads": self.threads,
                "dropped_providers": self.dropped_providers, "provider_options": self.provider_options,
                "fallback": self.fallback, **self.notes}

    def _release(self) -> None:
        self._sess = None
        self._direct = None


def _build_note(hardware: dict) -> str:
    ort = hardware.get("onnxruntime") or {}
    return f"{ort.get('distribution', 'onnxruntime')} {ort.get('version') or ''}".strip()


def _gpu_where(hardware: dict) -> str:
    jetson = hardware.get("jetson")
    if jetson:
        return f"{jetson['model']} (L4T {jetson.get('l4t') or '?'})"
    gpus = (hardware.get("nvidia") or {}).get("gpus") or hardware.get("nvidia_gpus") or []
    return "NVIDIA GPU " + ", ".join(gpus)


class OnnxRuntimeBackend(DeviceBackend):
    name = "onnxruntime"
    targets = ("onnx-int8", "onnx-fp32")
    packages = ("onnxruntime",)
    package_label = "onnxruntime"
    install = "pip install 'edge-runtime[onnxruntime]'"
    devices = ("cpu", "cuda[:N]", "tensorrt[:N]")
    options = (
        threads_option("onnxruntime's, all physical cores"),
        *cache_options("TensorRT engines and timing", "tensorrt", "EDGE_RUNTIME_TRT_CACHE"),
        Option("int8", bool, None, "TensorRT int8 (default: when the model holds QDQ nodes)"),
        Option("fp16", bool, False, "TensorRT fp16"),
    )

    def probe(self, hardware: dict) -> dict:
        """``installed`` and ``providers`` (long names) of the installed build, from the hardware
        record's reading of the wheel; onnxruntime is imported only when the record lacks it."""
        facts = super().probe(hardware)
        build = hardware.get("onnxruntime")
        if build and build.get("providers"):
            facts["providers"] = [_LONG[p] for p in build["providers"] if p in _LONG]
        elif facts["installed"]:
            try:
                import onnxruntime

                facts["providers"] = list(onnxruntime.get_available_providers())
            except Exception:  # noqa: BLE001 - a broken install is "failed to import"
                facts["providers"] = []
        return facts

    def parse_device(self, device):
        return parse_device(device)

    def assess(self, target, hardware, sub, forced, facts) -> Suitability:
        available = facts.get("providers") or []
        if not available:
            return Suitability(None, self.name, "onnxruntime failed to import")
        gpu = has_nvidia_gpu(hardware)
        want, index = sub
        if forced:
            where = f"{self.name}:{want}" + (f":{index}" if index and want != "cpu" else "")
            first = _PROVIDERS[want][0]
            if first not in available:
                return Suitability(None, where, f"{first} is not in this onnxruntime build "
                                   f"({_build_note(hardware)})" + _cpu_only_note(hardware, available))
            if want != "cpu" and not gpu:
                return Suitability(None, where, f"{first} is in this onnxruntime build but no NVIDIA GPU was "
                                                "found (no /dev/nvidia*, not a Jetson)")
            return Suitability(want, where, f"{first} requested" + (f" on {_gpu_where(hardware)}"
                                                                   if gpu and want != "cpu" else ""))
        no_trt = ""
        for dev in ("tensorrt", "cuda"):
            if _PROVIDERS[dev][0] in available and gpu:
                if dev == "tensorrt" and not _tensorrt_found(hardware):
                    # onnxruntime would drop the provider at load: the plan says where it will run
                    no_trt = "; TensorRT's libnvinfer was not found, so not TensorRT (see `edge-infer doctor`)"
                    continue
                order = " → ".join(_SHORT[p] for p in _PROVIDERS[dev])
                return Suitability(dev, f"{self.name}:{dev}",
                                   f"{_gpu_where(hardware)} with {_build_note(hardware)}: providers {order}{no_trt}")
        return Suitability("cpu", f"{self.name}:cpu", "CPUExecutionProvider" + _cpu_only_note(hardware, available))

    def open(self, model_path, bucket, sub, options):
        want, device_id = sub
        ort = self.vendor()
        available = list(ort.get_available_providers())
        wanted = _PROVIDERS[want]
        providers = [p for p in wanted if p in available] or ["CPUExecutionProvider"]
        return OnnxRuntimeSession(ort, model_path, bucket, wanted, providers, device_id, options, self.name)


def _tensorrt_found(hardware: dict) -> bool:
    """Whether TensorRT's libraries are here (``libnvinfer`` in the usual folders or the ``tensorrt``
    pip package); a hardware record that did not look for libraries says nothing against it."""
    libs = hardware.get("libraries")
    if libs is None:
        return True
    return bool(libs.get("libnvinfer") or (hardware.get("packages") or {}).get("tensorrt"))


def _cpu_only_note(hardware: dict, available: list[str]) -> str:
    """The call-out for a GPU this onnxruntime cannot use (CPU-only wheel on a Jetson or a GPU box)."""
    if not has_nvidia_gpu(hardware) or any(_PROVIDERS[d][0] in available for d in ("cuda", "tensorrt")):
        return ""
    return (f"; this is {_gpu_where(hardware)} but the installed onnxruntime ({_build_note(hardware)}) is "
            "CPU-only, so the GPU is unused: see `edge-infer doctor`")
