"""Core ML backend (``coreml``, target ``coreml``): one ``.mlpackage`` per bucket, macOS only.

``coremltools`` is imported when a session loads, never at module import.
Each bucket's package is loaded as ``coremltools.models.MLModel`` with the
requested compute units (device option ``compute_units`` or the device
suffix: ``ALL`` default, ``CPU_AND_NE``, ``CPU_ONLY``, ``CPU_AND_GPU``).
Feeds are cast to the dtypes the model declares (Core ML has no int64: token
ids go in as int32, range-checked), outputs are mapped back to the contract's
names, dtypes and shapes.

The package directory must hold exactly the files the manifest lists for the
bucket (they are sha256-verified by the runtime), with no symlinks.

On Linux the backend says it cannot run (suitability 0, "Core ML runs only on
macOS"). Tests replace the vendor module (``module=``) with a fake whose
``MLModel.predict`` runs a CPU twin, so this code path runs everywhere; on an
Apple Silicon Mac it scores above onnxruntime and openvino.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path, PurePosixPath

import numpy as np

from edge_runtime.errors import ArtifactError, DeviceError

from .base import Suitability, check_feeds

COMPUTE_UNITS = ("ALL", "CPU_AND_NE", "CPU_ONLY", "CPU_AND_GPU")
SCORE_APPLE_SILICON = 30      # above openvino (20) and onnxruntime (12): the Neural Engine
SCORE_INTEL_MAC = 10          # CPU/GPU only: below onnxruntime
_INT32 = np.iinfo(np.int32)


def compute_units(device: str | None, options: dict) -> str:
    """The device suffix (``coreml:cpu_only``) or the ``compute_units`` option; ALL by default."""
    opt = options.get("compute_units")
    device = None if device in (None, "", "auto") else device
    if device and opt and str(opt).upper() != device.upper():
        raise DeviceError(f"device coreml:{device} and compute_units={opt} disagree", code="device_option_invalid")
    cu = str(opt or device or "ALL").upper()
    if cu not in COMPUTE_UNITS:
        raise DeviceError(f"unknown Core ML compute units {cu!r} (one of {', '.join(COMPUTE_UNITS)})",
                          code="device_option_invalid")
    return cu


def check_package(model_path: Path, bucket: dict) -> Path:
    """The package directory of a bucket whose file is ``<package>/Manifest.json``;
    it must contain exactly the manifest's files for the bucket."""
    from edge_runtime.artifact import tree_files

    rel = bucket.get("package")
    if not rel or not bucket["file"].startswith(rel + "/"):
        raise ArtifactError("coreml bucket names no package directory", file=bucket["file"],
                            code="manifest_field_invalid")
    root = Path(model_path)
    for _ in PurePosixPath(bucket["file"]).parts:
        root = root.parent
    listed = {bucket["file"], *bucket.get("extra_files", [])}
    found = set(tree_files(root, rel))
    if found != listed:
        extra, missing = sorted(found - listed), sorted(listed - found)
        raise ArtifactError(f"package {rel} does not hold exactly the manifest's files (unlisted: {extra[:3]}, "
                            f"missing: {missing[:3]})", file=rel, code="artifact_file_unlisted")
    return root / rel


class CoremlSession:
    # a running predict cannot be stopped: the runtime runs it on its pool to keep deadlines
    cancellable = False

    def __init__(self, package: Path, bucket: dict, units: str, module, device: str):
        self._bucket = bucket
        self.compute_units = units
        self.device = device
        self._model = module.models.MLModel(str(package), compute_units=getattr(module.ComputeUnit, units))
        declared = bucket.get("coreml", {})
        self._in = {t["name"]: np.dtype(declared.get("inputs", {}).get(t["name"], t["dtype"]))
                    for t in bucket["inputs"]}
        self._lock = threading.Lock()
        self._closed = False

    def run(self, feeds, cancel=None):
        if self._closed:
            raise RuntimeError("session is closed")
        check_feeds(feeds, self._bucket)
        data = {}
        for name, want in self._in.items():
            arr = feeds[name]
            if want == np.int32 and arr.dtype == np.int64 and arr.size and \
                    (arr.min() < _INT32.min or arr.max() > _INT32.max):
                raise ValueError(f"input {name!r} has values outside int32, which Core ML takes")
            data[name] = np.ascontiguousarray(arr.astype(want, copy=False))
        with self._lock:
            out = self._model.predict(data)
        result = {}
        for t in self._bucket["outputs"]:
            if t["name"] not in out:
                raise ValueError(f"Core ML model returned no {t['name']!r} (has {sorted(out)})")
            arr = np.asarray(out[t["name"]]).astype(t["dtype"], copy=False)
            if list(arr.shape) != list(t["shape"]):
                raise ValueError(f"output {t['name']!r} has shape {list(arr.shape)}, the manifest {t['shape']}")
            result[t["name"]] = arr
        return result

    def info(self) -> dict:
        return {"compute_units": self.compute_units, "inputs_as": {k: str(v) for k, v in self._in.items()}}

    def close(self) -> None:
        self._closed = True
        self._model = None


class CoremlBackend:
    name = "coreml"
    targets = ("coreml",)

    def __init__(self, module=None, name: str = "coreml", pretend: dict | None = None):
        # tests replace the vendor boundary (coremltools: MLModel, ComputeUnit) and, with
        # ``pretend``, the host facts; everything else is the real code path
        self._module = module
        self._pretend = dict(pretend or {})
        self.name = name

    def _coremltools(self):
        if self._module is not None:
            return self._module
        try:
            import coremltools
        except Exception as exc:  # noqa: BLE001
            raise DeviceError(f"coremltools is not importable ({exc}): pip install 'edge-runtime[coreml]'",
                              code="device_unavailable") from None
        return coremltools

    def suitability(self, target: str, hardware: dict, device: str | None = None) -> Suitability:
        if target not in self.targets:
            return Suitability(0, self.name, f"coreml does not run {target!r} variants")
        hw = {**hardware, **self._pretend}
        if hw.get("system") != "Darwin":
            return Suitability(0, self.name, "Core ML runs only on macOS")
        if self._module is None and importlib.util.find_spec("coremltools") is None:
            return Suitability(0, self.name, "coremltools is not installed (pip install 'edge-runtime[coreml]')")
        device = None if device in (None, "", "auto") else device
        if device is not None and device.upper() not in COMPUTE_UNITS:
            return Suitability(0, f"{self.name}:{device}", f"unknown Core ML compute units {device!r} "
                               f"({', '.join(u.lower() for u in COMPUTE_UNITS)})")
        apple = hw.get("apple_silicon")
        if apple is None:
            apple = str(hw.get("machine", "")).lower() == "arm64"
        units = device.lower() if device else "auto"     # ALL or the compute_units option: Core ML places ops
        if apple:
            return Suitability(SCORE_APPLE_SILICON, f"{self.name}:{units}",
                               "Core ML on Apple Silicon (Neural Engine, GPU and CPU)")
        return Suitability(SCORE_INTEL_MAC, f"{self.name}:{units}", "Core ML on an Intel Mac (CPU and GPU, no Neural "
                                                                    "Engine)")

    def load(self, model_path: Path, bucket: dict, device: str | None = None, options: dict | None = None):
        options = dict(options or {})
        units = compute_units(device, options)
        package = check_package(Path(model_path), bucket)
        ct = self._coremltools()
        return CoremlSession(package, bucket, units, ct, f"{self.name}:{units.lower()}")
