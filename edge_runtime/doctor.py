"""``edge-infer doctor``: for the hardware found, what is missing and the exact step to install it.

Each check is a small function of the hardware record (``hardware.detect()``)
returning findings; ``CHECKS`` lists them. A finding says what was found,
what is missing or wrong and the install step, which is *printed, never run*:
the project never installs anything at run time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

CORAL_APT = (
    'echo "deb https://packages.cloud.google.com/apt coral-edgetpu-stable main" | '
    "sudo tee /etc/apt/sources.list.d/coral-edgetpu.list\n"
    "curl https://packages.cloud.google.com/apt/doc/apt-key.gpg | sudo apt-key add -\n"
    "sudo apt-get update"
)
CORAL_DOCS = "https://coral.ai/docs/accelerator/get-started/"
CORAL_PCIE_DOCS = "https://coral.ai/docs/m2/get-started/"
CORAL_MAC = ("curl -LO https://github.com/google-coral/libedgetpu/releases/download/release-grouper/"
             "edgetpu_runtime_20221024.zip && unzip edgetpu_runtime_20221024.zip && "
             "cd edgetpu_runtime && sudo bash install.sh")
# JetPack line -> where NVIDIA publishes onnxruntime-gpu wheels built for it (PyPI's are x86-64/SBSA only)
JETSON_ORT = {
    "6": "pip install onnxruntime-gpu --index-url https://pypi.jetson-ai-lab.io/jp6/cu126",
    "5": "pip install <the onnxruntime_gpu-*-cp38-*-linux_aarch64.whl for JetPack 5 from "
         "https://elinux.org/Jetson_Zoo#ONNX_Runtime>",
}
JETSON_ORT_DOCS = "https://elinux.org/Jetson_Zoo#ONNX_Runtime"


@dataclass
class Finding:
    level: str          # "missing" (an accelerator here goes unused), "warning", "info"
    found: str          # what hardware/software this is about
    problem: str
    fix: str | None = None      # the exact command(s), printed, never run
    docs: str | None = None


def _coral_runtime(hw: dict) -> list[Finding]:
    tpus = hw.get("edgetpus") or []
    if not tpus or (hw.get("libraries") or {}).get("libedgetpu"):
        return []
    what = ", ".join(f"Coral {t['type']} {t.get('id', t['path'])}" for t in tpus)
    if hw.get("system") == "Darwin":
        return [Finding("missing", what, "the Edge TPU runtime (libedgetpu.1.dylib) is not installed", CORAL_MAC,
                        CORAL_DOCS)]
    pkg = "gasket-dkms libedgetpu1-std" if any(t["type"] == "pci" for t in tpus) else "libedgetpu1-std"
    return [Finding("missing", what, "the Edge TPU runtime libedgetpu (libedgetpu.so.1) is not installed: the "
                    "edgetpu backend cannot load its delegate", f"{CORAL_APT}\nsudo apt-get install {pkg}", CORAL_DOCS)]


def _coral_pcie_driver(hw: dict) -> list[Finding]:
    orphans = (hw.get("coral") or {}).get("pcie_without_driver") or []
    if not orphans:
        return []
    fix = (f"{CORAL_APT}\nsudo apt-get install gasket-dkms libedgetpu1-std\n"
           "sudo sh -c \"echo 'SUBSYSTEM==\\\"apex\\\", MODE=\\\"0660\\\", GROUP=\\\"apex\\\"' >> "
           "/etc/udev/rules.d/65-apex.rules\"\nsudo groupadd apex && sudo adduser $USER apex\nsudo reboot")
    return [Finding("missing", f"Coral PCIe/M.2 card at {', '.join(orphans)}",
                    "no /dev/apex_N: the gasket/apex kernel driver is not loaded", fix, CORAL_PCIE_DOCS)]


def _coral_access(hw: dict) -> list[Finding]:
    out = []
    for t in hw.get("edgetpus") or []:
        if t.get("access") != "denied":
            continue
        if t["type"] == "pci":
            fix = ("sudo sh -c \"echo 'SUBSYSTEM==\\\"apex\\\", MODE=\\\"0660\\\", GROUP=\\\"apex\\\"' >> "
                   "/etc/udev/rules.d/65-apex.rules\"\nsudo groupadd apex; sudo adduser $USER apex\n"
                   "(log out and in again, or reboot)")
            where, docs = f"Coral PCIe/M.2 {t['path']}", CORAL_PCIE_DOCS
        else:
            fix = (f"{CORAL_APT}\nsudo apt-get install libedgetpu1-std   # installs the Coral udev rules\n"
                   "sudo adduser $USER plugdev\n(unplug and replug the accelerator, log out and in again)")
            where, docs = f"Coral USB {t.get('id')} at {t['path']}", CORAL_DOCS
        out.append(Finding("missing", where, "this user may not open the device file (permission denied): the "
                           "edgetpu backend cannot load its delegate", fix, docs))
    return out


def _coral_interpreter(hw: dict) -> list[Finding]:
    pk = hw.get("packages") or {}
    if not hw.get("edgetpus") or pk.get("ai_edge_litert") or pk.get("tflite_runtime"):
        return []
    return [Finding("missing", "Coral Edge TPU", "no TFLite interpreter (ai-edge-litert or tflite-runtime) to drive "
                    "the Edge TPU delegate", "pip install 'edge-runtime[tflite]'")]


def _coral_usb_link(hw: dict) -> list[Finding]:
    out = []
    for d in (hw.get("coral") or {}).get("usb") or []:
        if d.get("speed_mbps") is not None and d["speed_mbps"] < 5000:
            out.append(Finding("warning", f"Coral USB {d['id']} at {d['path']}",
                               f"on a {d['speed_mbps']} Mb/s (USB 2) link: inference is several times slower "
                               "than on a USB 3 port", "plug the accelerator into a USB 3 (blue) port"))
        if not d.get("firmware_loaded"):
            out.append(Finding("info", f"Coral USB {d['id']} at {d['path']}",
                               "firmware not loaded yet: libedgetpu loads it on first use and the device "
                               "re-enumerates as 18d1:9302; this is normal before the first inference"))
    return out


def _jetson_onnxruntime(hw: dict) -> list[Finding]:
    j = hw.get("jetson")
    if not j:
        return []
    ort = hw.get("onnxruntime")
    where = f"{j['model']} (L4T {j.get('l4t') or '?'}, JetPack {j.get('jetpack') or '?'})"
    fix = JETSON_ORT.get(j.get("jetpack") or "", f"install the onnxruntime-gpu wheel for your JetPack from "
                                                 f"{JETSON_ORT_DOCS}")
    if ort is None:
        return [Finding("missing", where, "onnxruntime is not installed: onnx-int8 variants cannot use the GPU",
                        fix, JETSON_ORT_DOCS)]
    if not ort["gpu"]:
        return [Finding("missing", where, f"the installed onnxruntime ({ort['distribution']} {ort['version']}) is "
                        "CPU-only: onnx-int8 runs on the CPU and the GPU is unused (PyPI's onnxruntime-gpu wheels "
                        "do not run on Jetson either)", f"pip uninstall -y {ort['distribution']}\n{fix}",
                        JETSON_ORT_DOCS)]
    return []


def _nvidia_onnxruntime(hw: dict) -> list[Finding]:
    if hw.get("jetson") or not hw.get("nvidia_gpus"):
        return []
    ort = hw.get("onnxruntime")
    gpus = ", ".join((hw.get("nvidia") or {}).get("gpus") or hw["nvidia_gpus"])
    if ort is None or not ort["gpu"]:
        un = f"pip uninstall -y {ort['distribution']}\n" if ort else ""
        return [Finding("missing", f"NVIDIA GPU {gpus}", "no onnxruntime with the CUDA/TensorRT providers: "
                        "onnx-int8 runs on the CPU", f"{un}pip install onnxruntime-gpu",
                        "https://onnxruntime.ai/docs/execution-providers/CUDA-ExecutionProvider.html")]
    return []


def _tensorrt_libraries(hw: dict) -> list[Finding]:
    ort = hw.get("onnxruntime") or {}
    if "tensorrt" not in (ort.get("providers") or []) or not (hw.get("jetson") or hw.get("nvidia_gpus")):
        return []
    if (hw.get("libraries") or {}).get("libnvinfer") or (hw.get("packages") or {}).get("tensorrt"):
        return []
    fix = "sudo apt-get install nvidia-jetpack" if hw.get("jetson") else "pip install tensorrt"
    # where it falls back to: CUDA only when its runtime was found too, else nothing here says so
    cuda = (hw.get("libraries") or {}).get("libcudart") and "cuda" in (ort.get("providers") or [])
    then = ("run on CUDA (reported as a fallback)" if cuda else
            "fall back to CUDA, whose runtime libcudart was not found in the usual library folders either: "
            "unless your environment provides it (the nvidia-cuda-runtime pip package, LD_LIBRARY_PATH), "
            "it runs on the CPU")
    return [Finding("warning", f"{ort['distribution']} {ort.get('version')} (TensorRT provider)",
                    f"TensorRT's libnvinfer was not found: onnxruntime will drop the TensorRT provider and {then}",
                    fix,
                    "https://onnxruntime.ai/docs/execution-providers/TensorRT-ExecutionProvider.html")]


def _cuda_runtime(hw: dict) -> list[Finding]:
    """A discrete NVIDIA GPU, an onnxruntime with the CUDA provider, no CUDA runtime found: the
    provider fails to load and onnx-int8 runs on the CPU (the TensorRT finding says so already
    where it applies)."""
    ort = hw.get("onnxruntime") or {}
    if hw.get("jetson") or not hw.get("nvidia_gpus") or "cuda" not in (ort.get("providers") or []):
        return []
    want, have = str(ort.get("cuda_version") or "").split(".")[0], hw.get("cuda_runtimes") or []
    if want.isdigit() and have and want not in have:
        return [Finding("warning", f"{ort.get('distribution')} {ort.get('version')} (CUDA provider)",
                        f"it was built for CUDA {ort.get('cuda_version')}, but the library folders hold CUDA's "
                        f"runtime for CUDA {', '.join(have)} only (libcudart.so.{have[-1]}...): unless your "
                        f"environment provides libcudart.so.{want} (the nvidia-cuda-runtime-cu{want} pip package, "
                        "LD_LIBRARY_PATH), onnxruntime cannot load its CUDA provider (nor TensorRT's) and onnx-int8 "
                        "runs on the CPU", f"install CUDA {want} and the cuDNN its onnxruntime-gpu release needs, "
                        "or the onnxruntime-gpu release built for the CUDA installed",
                        "https://onnxruntime.ai/docs/execution-providers/CUDA-ExecutionProvider.html#requirements")]
    if (hw.get("libraries") or {}).get("libcudart") or _tensorrt_libraries(hw):
        return []
    return [Finding("warning", f"{ort.get('distribution')} {ort.get('version')} (CUDA provider)",
                    "CUDA's runtime libcudart was not found in the usual library folders: unless your environment "
                    "provides it (the nvidia-cuda-runtime pip package, LD_LIBRARY_PATH), onnxruntime cannot load "
                    "its CUDA provider and onnx-int8 runs on the CPU (install the CUDA and cuDNN versions its "
                    "onnxruntime-gpu release was built for)", None,
                    "https://onnxruntime.ai/docs/execution-providers/CUDA-ExecutionProvider.html#requirements")]


def _onnxruntime_conflict(hw: dict) -> list[Finding]:
    dists = (hw.get("onnxruntime") or {}).get("distributions") or []
    if len(dists) < 2:
        return []
    return [Finding("warning", "onnxruntime", f"{len(dists)} distributions install the same `onnxruntime` package "
                    f"({', '.join(dists)}): whichever was installed last is the one that runs",
                    f"pip uninstall -y {' '.join(dists)}\npip install <the one you want>")]


def _intel_openvino(hw: dict) -> list[Finding]:
    cpu = hw.get("cpu") or {}
    if cpu.get("vendor") != "GenuineIntel" or (hw.get("packages") or {}).get("openvino"):
        return []
    return [Finding("missing", f"Intel CPU {cpu.get('model') or ''}".strip(), "openvino is not installed: "
                    "openvino variants (the fastest int8 path on Intel CPUs) cannot run",
                    "pip install 'edge-runtime[openvino]'")]


def _mac_coreml(hw: dict) -> list[Finding]:
    if not hw.get("apple_silicon") or (hw.get("packages") or {}).get("coremltools"):
        return []
    chip = (hw.get("apple") or {}).get("chip") or "Apple Silicon"
    return [Finding("missing", chip, "coremltools is not installed: coreml variants (Neural Engine/GPU) cannot run",
                    "pip install 'edge-runtime[coreml]'")]


def _rosetta(hw: dict) -> list[Finding]:
    if not (hw.get("apple") or {}).get("rosetta"):
        return []
    return [Finding("warning", "Apple Silicon", "this Python is x86-64 running under Rosetta 2: native arm64 "
                    "wheels and the NEON/dotprod CPU paths are not used", "install an arm64 Python (e.g. "
                    "`brew install python@3.11` under /opt/homebrew) and recreate the virtual environment")]


def _arm_tflite(hw: dict) -> list[Finding]:
    board = hw.get("board") or {}
    pk = hw.get("packages") or {}
    if board.get("kind") != "raspberry-pi" or pk.get("ai_edge_litert") or pk.get("tflite_runtime"):
        return []
    return [Finding("missing", board["model"], "no TFLite interpreter: tflite-int8 variants (the lightest CPU "
                    "runtime on ARM boards) cannot run", "pip install 'edge-runtime[tflite]'")]


# import name -> the distribution that installs it
_DISTRIBUTIONS = {"ai_edge_litert": "ai-edge-litert", "tflite_runtime": "tflite-runtime"}


def _unusable_packages(hw: dict) -> list[Finding]:
    """Installed but not importable by this Python (built for another Python or CPU): each backend
    that needs it cannot run, and "pip install" alone says it is already satisfied."""
    out = []
    for name, why in sorted((hw.get("packages_unusable") or {}).items()):
        ort = hw.get("onnxruntime") or {}
        dist = ort.get("distribution") if name == "onnxruntime" and ort.get("distribution") else \
            _DISTRIBUTIONS.get(name, name)
        out.append(Finding("missing", f"{name} (installed)", f"{name} cannot be imported by this Python: {why}",
                           f"python -m pip install --force-reinstall {dist}"))
    return out


def _probe_errors(hw: dict) -> list[Finding]:
    """A detection that failed: what it would have found is unknown, and said, not guessed."""
    return [Finding("warning", f"hardware detection ({key})", f"the probe failed ({why}): what it finds is "
                    "unknown here, and no finding above relies on it") for key, why in
            sorted((hw.get("probe_errors") or {}).items())]


def _any_backend(hw: dict) -> list[Finding]:
    if (hw.get("packages") or {}).get("onnxruntime") or "onnxruntime" in (hw.get("packages_unusable") or {}) \
            or "packages" in (hw.get("probe_errors") or {}):
        return []
    return [Finding("missing", "this machine", "onnxruntime is not installed: onnx-int8 variants cannot run",
                    "pip install 'edge-runtime[onnxruntime]'")]


CHECKS = (_coral_runtime, _coral_pcie_driver, _coral_access, _coral_interpreter, _coral_usb_link,
          _jetson_onnxruntime, _nvidia_onnxruntime, _tensorrt_libraries, _cuda_runtime, _onnxruntime_conflict,
          _intel_openvino, _mac_coreml, _rosetta, _arm_tflite, _unusable_packages, _any_backend, _probe_errors)


def diagnose(hardware: dict) -> dict:
    findings = [asdict(f) for check in CHECKS for f in check(hardware)]
    return {"ok": not any(f["level"] == "missing" for f in findings), "findings": findings}
