"""Which backend packages and vendor libraries are installed, found without importing or loading them.

- Packages: ``find_spec`` on the top-level name (finds the files, runs nothing).
- The ONNX Runtime build: which distribution installed it (``onnxruntime`` vs
  ``onnxruntime-gpu``, from the ``*.dist-info`` folder names next to it and the
  wheel's own ``capi/build_and_package_info.py``, read as text) and which
  execution providers it ships (the ``libonnxruntime_providers_<ep>`` shared
  libraries in ``capi/``; CPU is built in). This is what
  ``onnxruntime.get_available_providers()`` would say, without the ~100 ms import.
- Vendor libraries (``libedgetpu``, TensorRT's ``libnvinfer``, CUDA's
  ``libcudart``): the file names their packages install, looked up in the usual
  library folders, never ``dlopen``.

``python_path`` (a list of folders) replaces ``sys.path`` so tests can point
the probe at a fake site-packages.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
from collections.abc import Mapping
from pathlib import Path

BACKEND_PACKAGES = ("onnxruntime", "openvino", "ai_edge_litert", "tflite_runtime", "coremltools", "tensorrt")

# shared-library provider in onnxruntime/capi -> short provider name
_ORT_PROVIDER_LIBS = {"cuda": "cuda", "tensorrt": "tensorrt", "openvino": "openvino", "dnnl": "dnnl",
                      "rocm": "rocm", "migraphx": "migraphx", "qnn": "qnn", "vitisai": "vitisai"}
# providers built into the main library of some distributions
_NOT_RUNTIMES = {"onnxruntime-genai", "onnxruntime-extensions", "onnxruntime-tools", "onnxruntime-training-cpu"}
_ORT_DIST_PROVIDERS = {"onnxruntime-directml": ["dml"], "onnxruntime-qnn": ["qnn"]}

VENDOR_LIBS = {   # name -> the file names its packages install (checked with stat, no folder listing)
    "libedgetpu": ("libedgetpu.so.1", "libedgetpu.1.dylib"),
    "libnvinfer": ("libnvinfer.so.10", "libnvinfer.so.8", "libnvinfer.so"),
    "libcudart": ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"),
}
LIB_DIRS = ("usr/lib", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib/arm-linux-gnueabihf",
            "usr/lib/aarch64-linux-gnu/tegra", "usr/local/lib", "usr/local/cuda/lib64",
            "usr/local/cuda/targets/aarch64-linux/lib", "lib", "opt/homebrew/lib")


def find_spec(name: str, python_path: list | None):
    try:
        if python_path is None:
            return importlib.util.find_spec(name)
        return importlib.machinery.PathFinder.find_spec(name, [str(p) for p in python_path])
    except (ImportError, ValueError):
        return None


def packages_present(python_path: list | None = None) -> dict[str, bool]:
    return {name: find_spec(name, python_path) is not None for name in BACKEND_PACKAGES}


def _dist_infos(site: Path, prefix: str) -> list[dict]:
    out: list[dict] = []
    try:
        entries = sorted(os.listdir(site))
    except OSError:
        return out
    pattern = re.compile(rf"({prefix}(?:[-_][a-z0-9]+)*)-([^-]+)\.dist-info", re.I)
    low = prefix.lower()
    for entry in entries:
        # a site-packages holds hundreds of entries: a plain prefix test first (1.5 ms of every
        # process start went to regex calls on all of them, 2-core AMD EPYC with AVX-512 VNNI)
        if not entry[:len(low)].lower() == low or not entry.endswith(".dist-info"):
            continue
        m = pattern.fullmatch(entry)
        if m and m.group(1).lower().replace("_", "-") not in _NOT_RUNTIMES:
            out.append({"distribution": m.group(1).lower().replace("_", "-"), "version": m.group(2)})
    return out


def onnxruntime_build(python_path: list | None = None) -> dict | None:
    """The installed onnxruntime's distribution, version and execution providers (None: not installed)."""
    spec = find_spec("onnxruntime", python_path)
    if spec is None or not spec.submodule_search_locations:
        return None
    pkg = Path(list(spec.submodule_search_locations)[0])
    capi = pkg / "capi"
    try:
        libs = os.listdir(capi)
    except OSError:
        libs = []
    providers = ["cpu"]
    for lib in sorted(libs):     # listdir order is the filesystem's (tmpfs differs from ext4)
        m = re.match(r"(?:lib)?onnxruntime_providers_([a-z0-9]+)\.(?:so|dll|dylib)", lib)
        if m and m.group(1) in _ORT_PROVIDER_LIBS:
            providers.append(_ORT_PROVIDER_LIBS[m.group(1)])
    info = {}
    try:
        text = (capi / "build_and_package_info.py").read_text(errors="replace")
        info = dict(re.findall(r"^(\w+)\s*=\s*['\"]([^'\"]*)['\"]", text, re.M))
    except OSError:
        pass
    dists = _dist_infos(pkg.parent, "onnxruntime")
    name = info.get("package_name") or (dists[0]["distribution"] if dists else "onnxruntime")
    version = info.get("__version__") or next((d["version"] for d in dists if d["distribution"] == name), None)
    providers += [p for p in _ORT_DIST_PROVIDERS.get(name, []) if p not in providers]
    return {
        "distribution": name.lower().replace("_", "-"),
        "version": version,
        "cuda_version": info.get("cuda_version") or None,
        "providers": sorted(set(providers), key=providers.index),
        "gpu": any(p in providers for p in ("cuda", "tensorrt")),
        "path": str(pkg),
        # more than one distribution installs the same `onnxruntime` package: the last one wins
        "distributions": [d["distribution"] for d in dists],
    }


def vendor_libraries(root: Path, env: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """First file found for each vendor library in the usual folders and $LD_LIBRARY_PATH (under ``root``)."""
    environ: Mapping[str, str] = os.environ if env is None else env
    dirs = [d.lstrip("/") for d in (environ.get("LD_LIBRARY_PATH") or "").split(":") if d] + list(LIB_DIRS)
    present = [rel for rel in dict.fromkeys(dirs) if os.path.isdir(root / rel)]
    return {name: next((f"/{rel}/{f}" for rel in present for f in files if os.path.exists(root / rel / f)), None)
            for name, files in VENDOR_LIBS.items()}
