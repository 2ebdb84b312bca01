"""The raw backends ``edge-infer bench`` compares against: the vendor API
called directly on the artifact's own model file, configured as our backend
configures it by default (same threads, same hints).

A raw runner has ``run(feeds) -> outputs`` and ``run_async(list of feeds)``
(the vendor's own throughput path where it has one). Only backends with an
entry here get raw figures; the rest are reported as "no raw runner".
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any


_ORT_SHORT = {"CPUExecutionProvider": "cpu", "CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "tensorrt"}


class OrtRaw:
    def __init__(self, path: str, options: dict):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.inter_op_num_threads = 1
        if options.get("threads"):
            so.intra_op_num_threads = int(options["threads"])
        # the providers ours runs on (CUDA, TensorRT...), with their options: the CPU only where ours is on it
        providers = list(options.get("providers") or ["CPUExecutionProvider"])
        popts = options.get("provider_options") or {}
        self.sess = ort.InferenceSession(path, sess_options=so, providers=providers,
                                         provider_options=[dict(popts.get(p) or {}) for p in providers])
        self.outputs = [o.name for o in self.sess.get_outputs()]
        ran = list(self.sess.get_providers())
        self.device = "onnxruntime:" + _ORT_SHORT.get(ran[0], ran[0]) if ran else "onnxruntime:unknown"

    def run(self, feeds):
        return self.sess.run(self.outputs, feeds)

    def run_async(self, feeds_list, concurrency: int = 2):
        with ThreadPoolExecutor(concurrency) as pool:       # InferenceSession.run is thread-safe
            return list(pool.map(self.run, feeds_list))


class OvRaw:
    def __init__(self, path: str, options: dict):
        import openvino as ov

        self.core = ov.Core()
        precision = str(options.get("precision") or "f32")
        precision = "f32" if precision == "auto" else precision      # our backend's "auto" without a record
        # the thread count ours runs with (the caller's, or threads_fit's one): all cores otherwise
        self._config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": precision}
        if options.get("threads"):
            self._config["INFERENCE_NUM_THREADS"] = int(options["threads"])
        self._device = str(options.get("ov_device") or "CPU")      # where ours compiles: GPU/NPU, not always CPU
        self.latency = self.core.compile_model(path, self._device, {**self._config, "PERFORMANCE_HINT": "LATENCY"})
        self.device = "openvino:" + self._device.lower()
        self.request = self.latency.create_infer_request()
        self._path, self._precision = path, precision
        self._tp: Any = None      # openvino.AsyncInferQueue, made on the first run_async

    def run(self, feeds):
        return self.request.infer(feeds)

    def run_async(self, feeds_list, concurrency: int = 2):
        import openvino as ov

        if self._tp is None:
            compiled = self.core.compile_model(self._path, self._device,
                                               {**self._config, "PERFORMANCE_HINT": "THROUGHPUT"})
            self._tp = ov.AsyncInferQueue(compiled)
        out = [None] * len(feeds_list)

        def done(req, i):
            out[i] = req.get_output_tensor(0).data.copy()

        self._tp.set_callback(done)
        for i, feeds in enumerate(feeds_list):
            self._tp.start_async(feeds, userdata=i, share_inputs=True)
        self._tp.wait_all()
        return out


class TfliteRaw:
    def __init__(self, path: str, options: dict):
        from ai_edge_litert.interpreter import Interpreter

        threads = int(options.get("threads") or os.environ.get("EDGE_RUNTIME_THREADS") or os.cpu_count() or 1)
        from edge_runtime.devices.native_stderr import quiet_native_stderr

        with quiet_native_stderr():      # LiteRT's "Created ... XNNPACK delegate" INFO line
            self.interp = Interpreter(model_path=path, num_threads=threads)
            self.interp.allocate_tensors()
        self.ins = {d["name"]: d["index"] for d in self.interp.get_input_details()}
        self.outs = [d["index"] for d in self.interp.get_output_details()]
        self.rename: dict[str, str] = {}
        self.device = "tflite:cpu"

    def run(self, feeds):
        for name, arr in feeds.items():
            self.interp.set_tensor(self.ins[self.rename.get(name, name)], arr)
        self.interp.invoke()
        return [self.interp.get_tensor(i).copy() for i in self.outs]

    def run_async(self, feeds_list, concurrency: int = 2):
        return [self.run(f) for f in feeds_list]      # an interpreter is single-threaded: no async path


def peak_rss_kb(status: str = "/proc/self/status", platform: str | None = None) -> int:
    """This process's peak resident set in KiB: Linux's ``VmHWM`` (it belongs to this process image;
    ``ru_maxrss`` keeps the forking parent's peak across exec), else ``ru_maxrss``, which macOS counts
    in bytes and the other systems in KiB."""
    import resource
    import sys

    try:
        with open(status) as f:
            hwm = [line for line in f if line.startswith("VmHWM:")]
    except OSError:
        hwm = []
    if hwm:
        return int(hwm[0].split()[1])
    rss = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return rss // 1024 if (platform or sys.platform) == "darwin" else rss


RAW = {"onnxruntime": OrtRaw, "openvino": OvRaw, "tflite": TfliteRaw}


def raw_runner(backend: str, path: str, bucket: dict, options: dict):
    cls = RAW.get(backend)
    if cls is None:
        return None
    runner = cls(path, options)
    if isinstance(runner, TfliteRaw):
        runner.rename = dict(bucket.get("tensor_names") or {})
    return runner
