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
            "usr/local/cuda/targets/aarch64-linux/lib", "usr/local/cuda/targets/x86_64-linux/lib",
            "usr/local/cuda/targets/sbsa-linux/lib", "lib", "usr/lib64", "lib64", "opt/homebrew/lib")


def find_spec(name: str, python_path: list | None):
    """The spec of an installed package or module, or None. A bare folder of that name (no
    ``__init__.py``: what ``pip uninstall`` leaves when files it did not install remain, or a
    folder named ``openvino/`` in the working directory) is only an implicit namespace package:
    ``import`` succeeds and the backend has nothing to call, so it is not an installed package."""
    try:
        if python_path is None:
            spec = importlib.util.find_spec(name)
        else:
            spec = importlib.machinery.PathFinder.find_spec(name, [str(p) for p in python_path])
    except (ImportError, ValueError):
        return None
    if spec is not None and spec.origin in (None, "namespace") and spec.submodule_search_locations is not None:
        return None
    return spec


# a CPython extension's tag: ``.cpython-311-x86_64-linux-gnu.so``, ``.cpython-312-darwin.so``, ``.cp311-win_amd64.pyd``
_EXT_TAG = re.compile(r"(\.(?:cpython|cp)-?\d+[a-z]*(?:-[\w-]+)?\.(?:so|pyd))$")


def unusable(spec) -> str | None:
    """Why an installed package cannot be imported by this interpreter, read from its file names
    (nothing is loaded): its compiled extensions are all built for another Python or another
    CPU (a venv whose Python was upgraded in place, an x86-64 venv copied to an ARM board).
    None when it looks importable, or has no tagged extension to judge by."""
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        return None
    tags: list[str] = []
    for folder in (Path(locations[0]), Path(locations[0]) / "capi"):    # onnxruntime keeps its binding in capi/
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        tags += [m.group(1) for n in names if (m := _EXT_TAG.search(n))]
    if not tags or any(t in importlib.machinery.EXTENSION_SUFFIXES for t in tags):
        return None
    return (f"its compiled extensions are built for {', '.join(sorted(set(tags)))}; this Python loads "
            f"{importlib.machinery.EXTENSION_SUFFIXES[0]}: import fails (reinstall it in this environment)")


def packages_unusable(python_path: list | None = None) -> dict[str, str]:
    """Installed backend packages this interpreter cannot import, with the reason."""
    out = {}
    for name in BACKEND_PACKAGES:
        why = unusable(find_spec(name, python_path))
        if why:
            out[name] = why
    return out


def packages_present(python_path: list | None = None) -> dict[str, bool]:
    """Backend packages installed and importable by this interpreter (``packages_unusable`` says why not)."""
    present = {}
    for name in BACKEND_PACKAGES:
        spec = find_spec(name, python_path)
        present[name] = spec is not None and unusable(spec) is None
    return present


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
    broken = unusable(spec)
    return {
        **({"unusable": broken} if broken else {}),
        "distribution": name.lower().replace("_", "-"),
        "version": version,
        "cuda_version": info.get("cuda_version") or None,
        "providers": sorted(set(providers), key=providers.index),
        "gpu": any(p in providers for p in ("cuda", "tensorrt")),
        "path": str(pkg),
        # more than one distribution installs the same `onnxruntime` package: the last one wins
        "distributions": [d["distribution"] for d in dists],
    }


def ld_so_conf(root: Path, rel: str = "etc/ld.so.conf", depth: int = 0) -> list[str]:
    """The folders the dynamic loader searches by ``/etc/ld.so.conf`` and the files it includes
    (``ld.so.conf.d/*.conf``: TensorRT's and CUDA's packages add theirs there), under ``root``."""
    import glob

    try:
        text = (root / rel).read_text(errors="replace")
    except OSError:
        return []
    dirs: list[str] = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("hwcap"):
            continue
        if line.startswith("include") and line[7:8].isspace():
            for pattern in line[8:].split():
                # a relative include is relative to the including file's folder
                pattern = pattern.lstrip("/") if pattern.startswith("/") else os.path.join(os.path.dirname(rel),
                                                                                            pattern)
                for path in sorted(glob.glob(os.path.join(glob.escape(str(root)), pattern))):
                    if depth < 4:
                        dirs += ld_so_conf(root, os.path.relpath(path, root), depth + 1)
        else:
            dirs.append(line.lstrip("/"))
    return dirs


def vendor_libraries(root: Path, env: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """First file found for each vendor library in $LD_LIBRARY_PATH, the loader's ``ld.so.conf``
    folders and the usual folders (under ``root``)."""
    present = _library_dirs(root, env)
    return {name: next((f"/{rel}/{f}" for rel in present for f in files if os.path.exists(root / rel / f)), None)
            for name, files in VENDOR_LIBS.items()}


def _library_dirs(root: Path, env: Mapping[str, str] | None) -> list[str]:
    environ: Mapping[str, str] = os.environ if env is None else env
    dirs = ([d.lstrip("/") for d in (environ.get("LD_LIBRARY_PATH") or "").split(":") if d]
            + ld_so_conf(root) + list(LIB_DIRS))
    return [rel for rel in dict.fromkeys(dirs) if os.path.isdir(root / rel)]


def cuda_runtimes(root: Path, env: Mapping[str, str] | None = None) -> list[str]:
    """The CUDA major versions whose runtime (``libcudart.so.N``) the library folders hold: an
    onnxruntime-gpu built for CUDA 12 cannot load its provider with only ``libcudart.so.11.0``."""
    majors = {m.group(1) for rel in _library_dirs(root, env)
              for f in VENDOR_LIBS["libcudart"] if (m := re.fullmatch(r"libcudart\.so\.(\d+)(?:\.\d+)*", f))
              and os.path.exists(root / rel / f)}
    return sorted(majors, key=int)
