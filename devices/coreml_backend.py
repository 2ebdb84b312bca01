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

On Linux the backend says it cannot run ("Core ML runs only on macOS"). Tests
replace the vendor module (``module=``) with a fake whose ``MLModel.predict``
runs a CPU twin, and the probe with one that answers "a Mac", so this code path
runs everywhere. On Apple Silicon its tier is ``accelerator`` (the compute
units allow the Neural Engine or the GPU), which the policy ranks above every
CPU path; ``cpu_only`` there, and everything on an Intel Mac, is ``cpu``.

Where it ran: Core ML places each op on a unit the compute units allow and does
not report which; an op the Neural Engine does not take runs on the GPU or CPU
without notice. A session therefore names the compute units (its device,
``coreml:cpu_and_ne``) and what they allow (``info()["allowed_units"]``), and
says the placement is not reported (``info()["placement"]``); nothing here
claims the Neural Engine ran.

``coremltools.models.MLModel`` does not raise where Core ML cannot load the
package (not macOS, a specification newer than this macOS runs, a compile
error): the session refuses it at load (``device_unavailable``) instead of a
bare ``Exception`` from every ``predict``. Where Core ML's loader raised for the
units asked (not ``CPU_ONLY``) and the package loads with ``CPU_ONLY``, the
session runs there, named ``coreml:cpu_only``, and says why (``fallback``: the
runtime reports it; strict refuses it, ``device_fell_back``).

The package's inputs are checked at load against the tensors the task feeds (a
``ct.ImageType`` input is refused, ``input_contract_mismatch``); an output is
cast to the manifest's dtype only where that keeps its values.

The ``compute_units`` option is not seen by ``assess`` (the device string only):
``device_for`` names the sub-device the options make, and the runtime places
the loaded choice for that sub-device (``selection.for_options``), so its tier,
reason and device are those of the units that run.
"""

from __future__ import annotations

import threading
from pathlib import Path, PurePosixPath

import numpy as np

from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError, DeviceError, InputError

from .base import Capabilities, DeviceBackend, DeviceSession, Option, Suitability

COMPUTE_UNITS = ("ALL", "CPU_AND_NE", "CPU_ONLY", "CPU_AND_GPU")
_INT32 = np.iinfo(np.int32)
# what each compute-units setting lets Core ML use; Core ML places every op itself and does not
# report where an op ran, so a session names what was allowed, never "the Neural Engine ran"
ALLOWED = {"ALL": "Neural Engine, GPU or CPU", "CPU_AND_NE": "Neural Engine or CPU",
           "CPU_ONLY": "CPU only", "CPU_AND_GPU": "GPU or CPU (no Neural Engine)"}
PLACEMENT = ("not reported: Core ML places each op on a unit the compute units allow and does not say "
             "which ran; an op the Neural Engine does not take runs on the GPU or CPU without notice")


def compute_units(device: str | None, options) -> str:
    """The device suffix (``coreml:cpu_only``) or the ``compute_units`` option; ALL by default.
    Both given and different: the caller's error (``InputError``)."""
    opt = options.get("compute_units")
    device = None if device in (None, "", "auto") else device
    if device and opt and str(opt).upper() != device.upper():
        raise InputError(f"device coreml:{device} and compute_units={opt} disagree", code=ec.DEVICE_OPTION_INVALID,
                         option="compute_units")
    cu = str(opt or device or "ALL").upper()
    if cu not in COMPUTE_UNITS:
        raise InputError(f"unknown Core ML compute units {cu!r} (one of {', '.join(COMPUTE_UNITS)})",
                         code=ec.DEVICE_OPTION_INVALID, option="compute_units")
    return cu


def check_package(model_path: Path, bucket: dict) -> Path:
    """The package directory of a bucket whose file is ``<package>/Manifest.json``;
    it must contain exactly the manifest's files for the bucket."""
    from edge_runtime.artifact import tree_files

    rel = bucket.get("package")
    if not rel or not bucket["file"].startswith(rel + "/"):
        raise ArtifactError("coreml bucket names no package directory", file=bucket["file"],
                            code=ec.MANIFEST_FIELD_INVALID)
    root = Path(model_path)
    for _ in PurePosixPath(bucket["file"]).parts:
        root = root.parent
    listed = {bucket["file"], *bucket.get("extra_files", [])}
    found = set(tree_files(root, rel))
    if found != listed:
        extra, missing = sorted(found - listed), sorted(listed - found)
        raise ArtifactError(f"package {rel} does not hold exactly the manifest's files (unlisted: {extra[:3]}, "
                            f"missing: {missing[:3]})", file=rel, code=ec.ARTIFACT_FILE_UNLISTED)
    return root / rel


class CoremlSession(DeviceSession):
    # a running predict cannot be stopped: the runtime runs it on its pool to keep deadlines
    capabilities = Capabilities()

    def __init__(self, package: Path, bucket: dict, units: str, module, device: str):
        super().__init__(bucket, device)
        self.compute_units = units
        self._model = _load(module, package, units)
        unusable = _not_loaded(self._model)
        if unusable and units != "CPU_ONLY" and getattr(self._model, "_framework_error", None) is not None:
            # Core ML refused the package with these compute units (its loader raised: the unit cannot
            # compile it here); the CPU takes every op. Said as a fallback: the runtime reports it, and
            # refuses it under strict (device_fell_back), never a session named for units it lacks
            retry = _load(module, package, "CPU_ONLY")
            if _not_loaded(retry) is None:
                self.fallback = (f"Core ML could not load {package.name} with compute units {units} "
                                 f"({unusable}); it runs with CPU_ONLY")
                self._model, self.compute_units, unusable = retry, "CPU_ONLY", None
                self.device = f"{device.rpartition(':')[0]}:cpu_only"
        if unusable:
            self._model = None
            raise DeviceError(f"Core ML cannot run {package.name} here: {unusable}", code=ec.DEVICE_UNAVAILABLE)
        declared = bucket.get("coreml", {})
        self._in = {t["name"]: np.dtype(declared.get("inputs", {}).get(t["name"], t["dtype"]))
                    for t in bucket["inputs"]}
        # contract name -> the package's feature name, where Core ML needed another (an identifier)
        self._names = dict(bucket.get("tensor_names") or {})
        try:
            check_inputs(self._model, bucket, self._names, bucket.get("package") or package.name)
        except BaseException:
            self._model = None
            raise
        self._lock = threading.Lock()

    def _run(self, feeds, cancel):
        data = {}
        for name, want in self._in.items():
            arr = feeds[name]
            if want == np.int32 and arr.dtype == np.int64 and arr.size and \
                    (arr.min() < _INT32.min or arr.max() > _INT32.max):
                raise ValueError(f"input {name!r} has values outside int32, which Core ML takes")
            data[self._names.get(name, name)] = np.ascontiguousarray(arr.astype(want, copy=False))
        with self._lock:
            out = self._model.predict(data)
        result = {}
        for t in self._bucket["outputs"]:
            key = self._names.get(t["name"], t["name"])
            if key not in out:
                raise ValueError(f"Core ML model returned no {key!r} (has {sorted(out)})")
            arr = _as_manifest(np.asarray(out[key]), np.dtype(t["dtype"]), t["name"])
            if list(arr.shape) != list(t["shape"]):
                raise ValueError(f"output {t['name']!r} has shape {list(arr.shape)}, the manifest {t['shape']}")
            result[t["name"]] = arr
        return result

    def info(self) -> dict:
        return {"compute_units": self.compute_units, "allowed_units": ALLOWED[self.compute_units],
                "placement": PLACEMENT, "inputs_as": {k: str(v) for k, v in self._in.items()}}

    def _release(self) -> None:
        self._model = None


def _as_manifest(arr: np.ndarray, want: np.dtype, name: str) -> np.ndarray:
    """``arr`` as the manifest's dtype where that keeps its values: a wider type, float to float, an
    integer in range. Floats where the manifest says integers (or integers where it says floats) are
    another model's outputs: a cast would truncate them into plausible codes (``ValueError``)."""
    if arr.dtype == want or arr.dtype.kind == want.kind == "f":
        return arr.astype(want, copy=False)
    if arr.dtype.kind in "iu" and want.kind in "iu":
        if np.can_cast(arr.dtype, want, "safe"):
            return arr.astype(want)
        info = np.iinfo(want)
        if not arr.size or (int(arr.min()) >= info.min and int(arr.max()) <= info.max):
            return arr.astype(want)
        raise ValueError(f"output {name!r} has values outside {want}, the manifest's dtype")
    raise ValueError(f"output {name!r} is {arr.dtype} from Core ML, the manifest's is {want}: a cast would "
                     "change what its values mean")


def _load(module, package: Path, units: str):
    return module.models.MLModel(str(package), compute_units=getattr(module.ComputeUnit, units))


def check_inputs(model, bucket: dict, names: dict, package: str) -> None:
    """The package's inputs must be the tensors the task feeds: a multi-array under each contract
    name (or its ``tensor_names`` identifier), of the manifest's shape. An image-typed input
    (``ct.ImageType``) applies its own scale, bias and colour layout to what it is given, and a
    tensor the task already normalised is not an image: refused (``ArtifactError``), never run."""
    try:
        spec = model.get_spec()
        got = {f.name: f for f in spec.description.input}
    except Exception as exc:
        raise ArtifactError(f"the package's inputs cannot be read ({type(exc).__name__}: {str(exc)[:200]})",
                            file=package, code=ec.INPUT_CONTRACT_MISMATCH) from None
    want = {names.get(t["name"], t["name"]): t for t in bucket["inputs"]}
    if set(got) != set(want):
        raise ArtifactError(f"package inputs {sorted(got)} are not the manifest's {sorted(want)}", file=package,
                            code=ec.INPUT_CONTRACT_MISMATCH)
    for key, t in want.items():
        kind = got[key].type.WhichOneof("Type")
        if kind != "multiArrayType":
            raise ArtifactError(f"package input {key!r} is a Core ML {kind or 'untyped feature'}, not a multi-array: "
                                f"the task feeds it a {t['dtype']} tensor {t['shape']} (a Core ML image input "
                                "rescales and reorders what it is given)", file=package,
                                code=ec.INPUT_CONTRACT_MISMATCH)
        arr = got[key].type.multiArrayType
        shape = [int(d) for d in arr.shape]
        if arr.WhichOneof("ShapeFlexibility") is None and shape and shape != [int(d) for d in t["shape"]]:
            raise ArtifactError(f"package input {key!r} has shape {shape}, the manifest {t['shape']}", file=package,
                                code=ec.INPUT_CONTRACT_MISMATCH)


def _not_loaded(model) -> str | None:
    """Why coremltools built the model without Core ML behind it, or None. ``MLModel`` does not
    raise where Core ML cannot load a package (not macOS, no CoreML.framework, a specification
    newer than this macOS runs, a compile error: only a warning, if that): its ``__proxy__`` is
    None and every ``predict`` raises a bare ``Exception`` later."""
    if getattr(model, "__proxy__", True) is not None:
        return None
    framework = getattr(model, "_framework_error", None)
    if framework is not None:
        return f"Core ML did not load the model ({type(framework).__name__}: {str(framework)[:200]})"
    import platform

    if platform.system() != "Darwin":
        return f"Core ML runs only on macOS (this host: {platform.system()}); coremltools here reads the spec only"
    return ("Core ML did not load the model (CoreML.framework unavailable, or the package's specification is "
            "newer than this macOS runs)")


class CoremlBackend(DeviceBackend):
    name = "coreml"
    targets = ("coreml",)
    packages = ("coremltools",)
    package_label = "coremltools"
    install = "pip install 'edge-runtime[coreml]'"
    devices = ("auto", *(u.lower() for u in COMPUTE_UNITS))
    options = (Option("compute_units", str, None, "where Core ML may place ops (default ALL; the same as "
                                                  "--device coreml:<units>)", choices=COMPUTE_UNITS),)

    def probe(self, hardware: dict) -> dict:
        """``macos``, ``apple_silicon`` (also under Rosetta) and ``installed`` (coremltools), from the record."""
        apple = hardware.get("apple_silicon")
        if apple is None:
            apple = str(hardware.get("machine", "")).lower() == "arm64"
        return {**super().probe(hardware), "macos": hardware.get("system") == "Darwin", "apple_silicon": bool(apple)}

    def missing(self, facts: dict) -> str | None:
        return "Core ML runs only on macOS" if not facts["macos"] else super().missing(facts)

    def parse_device(self, device):
        if device in (None, "", "auto"):
            return None
        if device.upper() not in COMPUTE_UNITS:
            raise ValueError(f"unknown Core ML compute units {device!r} "
                             f"({', '.join(u.lower() for u in COMPUTE_UNITS)})")
        return device.lower()

    def assess(self, target, hardware, sub, forced, facts) -> Suitability:
        units = sub or "auto"     # ALL or the compute_units option: Core ML places ops
        asked = (sub or "all").upper()
        device = f"{self.name}:{units}"
        # assessed from the device string only: a loaded runtime re-assesses device_for(sub, options);
        # without options (edge-infer devices, choose) the reason says the option may set other units
        unless = "" if sub else "; unless the compute_units option sets other units: the session's device names them"
        if facts["apple_silicon"]:
            if asked == "CPU_ONLY":
                return Suitability("cpu", device, "Core ML on Apple Silicon, CPU only (compute units CPU_ONLY)")
            return Suitability("accelerator", device, f"Core ML on Apple Silicon: {ALLOWED[asked]} (compute units "
                               f"{asked}; Core ML places each op and does not report which unit ran it{unless})")
        units_here = {"CPU_AND_NE": "CPU only (no Neural Engine)", "CPU_ONLY": "CPU only"}.get(asked, "CPU and GPU")
        no_ne = "" if "Neural Engine" in units_here else ", no Neural Engine"     # said once, not twice
        return Suitability("cpu", device, f"Core ML on an Intel Mac: {units_here}{no_ne} "
                                          f"(compute units {asked}{unless})")

    def device_for(self, sub, options) -> str | None:
        """The sub-device ``options`` make of ``sub`` (``compute_units=CPU_ONLY`` → ``cpu_only``; None:
        the default ALL). ``suitability`` sees the device string only: the runtime must assess this
        sub-device, not ``sub``, for its tier and reason to be the compute units that run."""
        units = compute_units(sub, options)
        return None if units == "ALL" and sub in (None, "", "auto") else units.lower()

    def open(self, model_path, bucket, sub, options):
        units = compute_units(sub, options)
        package = check_package(model_path, bucket)
        ct = self.vendor()
        return CoremlSession(package, bucket, units, ct, f"{self.name}:{units.lower()}")
