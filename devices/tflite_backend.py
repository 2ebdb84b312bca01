"""TFLite backends: ``tflite`` (CPU, XNNPACK) and ``edgetpu`` (Coral, via its delegate).

The interpreter comes from ``ai-edge-litert`` (works with numpy 2) or, where
that is what a board has, ``tflite-runtime`` (numpy<2). Neither is imported
at module import. An interpreter is not thread-safe: each session keeps a
small pool of interpreters, one per concurrent call, created on demand.

A model compiled for the Edge TPU contains the ``edgetpu-custom-op``; it is
recognised from its bytes *before* any interpreter is made, so running one
without an Edge TPU or without ``libedgetpu`` is a ``DeviceError`` that says
so, never "unresolved custom op". The PyPI ``pycoral`` is an unrelated
project and is never used; Google's own ``pycoral`` (a Coral system package)
is used to list Edge TPUs when it is importable.
"""

from __future__ import annotations

import logging
import os
import platform
from pathlib import Path

from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError, DeviceError

from .base import Capabilities, DeviceBackend, DeviceSession, Option, Pool, Suitability, check_io, threads_option
from .edgetpu_delegate import EDGETPU_OP, edgetpu_placement, load_edgetpu_delegate
from .native_stderr import quiet_native_stderr  # noqa: F401 (its public home was here)
log = logging.getLogger("edge_runtime.tflite")
_DELEGATE_LIBS = {"Linux": "libedgetpu.so.1", "Darwin": "libedgetpu.1.dylib", "Windows": "edgetpu.dll"}


def interpreter_module():
    """(module with Interpreter and load_delegate, package name) or (None, reason)."""
    try:
        from ai_edge_litert import interpreter as mod

        return mod, "ai-edge-litert"
    except Exception as first:  # noqa: BLE001 - any import failure means "not this one"
        try:
            from tflite_runtime import interpreter as mod

            return mod, "tflite-runtime"
        except Exception as second:  # noqa: BLE001
            return None, f"no TFLite interpreter (ai-edge-litert: {first}; tflite-runtime: {second})"


def is_edgetpu_model(path: Path) -> bool:
    """True when the file holds an Edge TPU compiled subgraph: one memory-mapped search
    (0.3 ms for MobileNetV2's 3.4 MB, where reading it in 1 MB blocks took 3.7 ms of every load)."""
    import mmap

    with open(path, "rb") as fh:
        try:
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                return mm.find(EDGETPU_OP) >= 0
        except ValueError:          # an empty file cannot be mapped, and holds nothing
            return False


def delegate_library(system: str | None = None) -> str:
    return _DELEGATE_LIBS.get(system or platform.system(), "libedgetpu.so.1")


class TfliteSession(DeviceSession):
    """A small pool of interpreters (one is not thread-safe), one per concurrent call.

    LiteRT cannot stop a running invoke, so no session is cancellable. ``inline=true`` runs
    it in the caller's thread and the runtime checks the deadline when it returns (a late
    answer is an InferenceTimeout, never a result); ``inline=false`` runs it on the
    runtime's worker pool, which returns at the deadline while the invoke finishes in the
    background (~0.5-1 ms more per call on 2 cores). CPU sessions default to inline: a
    static-shape XNNPACK invoke cannot stall. Edge TPU sessions default to the pool: a USB
    device can."""

    def __init__(self, model_path: Path, bucket: dict, options, mod, device="tflite:cpu", delegate_factory=None,
                 placement: dict | None = None):
        super().__init__(bucket, device)
        self.placement = placement
        self._mod, self.package = mod, _package_of(mod)
        self._path = str(model_path)
        self._threads = options.get("threads") or os.cpu_count() or 1
        self._delegate_factory = delegate_factory
        self.inline = bool(options["inline"])
        self.capabilities = Capabilities(inline=self.inline)
        self.xnnpack = delegate_factory is None      # False once XNNPACK refused the model (built-in kernels)
        self._out_names = [t["name"] for t in bucket["outputs"]]
        self._pool = Pool(self._new, options.get("max_interpreters", 2))

    def _new(self):
        kw: dict[str, object] = {"model_path": self._path}
        if self._delegate_factory is not None:
            kw["experimental_delegates"] = [self._delegate_factory()]
        else:
            kw["num_threads"] = self._threads
        with quiet_native_stderr():      # LiteRT's "INFO: Created ... XNNPACK delegate" line
            try:
                interp = self._mod.Interpreter(**kw)
                interp.allocate_tensors()
            except (RuntimeError, ValueError) as exc:
                if self._delegate_factory is not None:     # the Edge TPU's interpreter: typed, here and mid-call
                    raise _edgetpu_interpreter_error(exc, Path(self._path).name) from None
                # XNNPACK takes most int8 graphs but refuses some ops (NanoDet's 5-D channel-shuffle
                # transposes): the built-in kernels run the same model, slower, never differently
                resolver = getattr(self._mod, "OpResolverType", None)
                if self._delegate_factory is not None or resolver is None or "XNNPack" not in str(exc):
                    raise
                kw["experimental_op_resolver_type"] = resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES
                interp = self._mod.Interpreter(**kw)
                interp.allocate_tensors()
                self.xnnpack = False
        # a converted model's tensors may be named differently from the manifest's
        # (ONNX) names: the bucket maps them
        rename = {v: k for k, v in (self._bucket.get("tensor_names") or {}).items()}
        ins = {rename.get(d["name"], d["name"]): d["index"] for d in interp.get_input_details()}
        outs = {rename.get(d["name"], d["name"]): d["index"] for d in interp.get_output_details()}
        check_io(ins, outs, self._bucket)
        return interp, ins, outs

    def _run(self, feeds, cancel):
        item = self._pool.acquire()
        interp, ins, outs = item
        try:
            for name, arr in feeds.items():
                interp.set_tensor(ins[name], arr)
            interp.invoke()
            # get_tensor returns a copy (tensor() would be the view): nothing to copy again
            return {name: interp.get_tensor(outs[name]) for name in self._out_names}
        finally:
            self._pool.release(item)

    def info(self) -> dict:
        return {"package": self.package, "threads": None if self._delegate_factory else self._threads,
                "inline": self.inline, "xnnpack": self.xnnpack,
                "interpreters": self._pool.size, "delegate": self.device if self._delegate_factory else None,
                **({"placement": self.placement} if self._delegate_factory else {})}

    def _release(self) -> None:
        self._pool.close()      # a call waiting for an interpreter gets SessionClosed, never waits on


def _edgetpu_interpreter_error(exc: Exception, name: str) -> DeviceError:
    """LiteRT's refusal of a compiled model with the delegate given, as the operator's DeviceError."""
    text = " ".join(str(exc).split())
    if "runtime version" in text:
        return DeviceError(f"libedgetpu is older than the edgetpu_compiler that built {name} ({text}): update "
                           "libedgetpu (Coral's libedgetpu1-std), or compile with a matching compiler",
                           code=ec.DEVICE_LOAD_FAILED)
    if "unresolved custom op" in text:
        return DeviceError(f"the delegate loaded does not run {EDGETPU_OP.decode()} ({text}): the delegate "
                           "library is not libedgetpu", code=ec.DEVICE_LOAD_FAILED)
    return DeviceError(f"the Edge TPU interpreter refused {name}: {text}", code=ec.DEVICE_LOAD_FAILED)


def _package_of(mod) -> str:
    top = (getattr(mod, "__name__", None) or type(mod).__module__ or "").split(".")[0]
    return {"ai_edge_litert": "ai-edge-litert", "tflite_runtime": "tflite-runtime"}.get(top, top or "unknown")


def _max_interpreters() -> Option:
    return Option("max_interpreters", int, 2, "interpreters per bucket for concurrent calls", minimum=1)


class _LiteRt(DeviceBackend):
    packages: tuple[str, ...] = ("ai_edge_litert", "tflite_runtime")
    package_label = "a TFLite interpreter (ai-edge-litert or tflite-runtime)"
    install = "pip install 'edge-runtime[tflite]'"

    def import_vendor(self):
        mod, why = interpreter_module()
        if mod is None:
            raise ImportError(why)
        return mod


class TfliteBackend(_LiteRt):
    name = "tflite"
    targets = ("tflite-int8",)
    options = (
        threads_option("all cores"),
        _max_interpreters(),
        Option("inline", bool, True, "run invoke in the caller's thread, the deadline checked when it returns "
                                     "(false: the runtime's worker pool, which returns at the deadline)"),
    )

    def probe(self, hardware: dict) -> dict:
        # tflite-runtime is what a board brings: assumed absent unless the record says so
        pkgs = hardware.get("packages", {})
        return {"installed": pkgs.get("ai_edge_litert", True) or pkgs.get("tflite_runtime", False)}

    def assess(self, target, hardware, sub, forced, facts) -> Suitability:
        arm = str(hardware.get("machine", "")).lower() in ("aarch64", "arm64", "armv7l")
        return Suitability("cpu", f"{self.name}:cpu",
                           "LiteRT with XNNPACK" + (" (the lightest CPU runtime on ARM boards)" if arm else ""))

    def open(self, model_path, bucket, sub, options):
        if is_edgetpu_model(model_path):
            raise DeviceError(f"{model_path.name} is compiled for the Edge TPU (it contains "
                              "edgetpu-custom-op): it runs only on an Edge TPU through libedgetpu; use the "
                              "artifact's tflite-int8 variant on a CPU", code=ec.DEVICE_MODEL_NEEDS_EDGETPU)
        return TfliteSession(model_path, bucket, options, self.vendor())


def list_edge_tpus(hardware: dict) -> list[dict]:
    """Edge TPUs: Google's pycoral when importable, else what the probe found."""
    try:
        from pycoral.utils.edgetpu import list_edge_tpus as coral_list  # Coral system package

        return [dict(d) for d in coral_list()]
    except Exception:  # noqa: BLE001 - absent or not Google's
        return list(hardware.get("edgetpus") or [])


ACCESS_FIX = ("add a udev rule and the group (PCIe: `sudo groupadd apex && sudo adduser $USER apex`; USB: the "
              "Coral udev rules of libedgetpu1-std and `sudo adduser $USER plugdev`), then log in again")


def _denied(tpus: list[dict], sub: str | None) -> list[str]:
    """The Edge TPUs this process may not open (``access: "denied"`` in the hardware record) when the
    device asked for is one of them (``sub`` "usb:1" is the second USB one), or every one is (no ``sub``)."""
    if sub is not None:
        kind, _, index = sub.partition(":")
        same = [d for d in tpus if d.get("type") == kind]
        picked = same[int(index or 0):int(index or 0) + 1]
    else:
        picked = tpus if all(d.get("access") == "denied" for d in tpus) else []
    return [f"{d.get('type')}:{d.get('path')}" for d in picked if d.get("access") == "denied"]


def _tpus_text(tpus: list[dict]) -> str:
    return ", ".join(d.get("type", "?") + ":" + str(d.get("path", "")) for d in tpus)


class EdgeTpuBackend(_LiteRt):
    name = "edgetpu"
    targets = ("edgetpu",)
    packages = ()       # the interpreter is checked at load (`doctor` names it)
    devices = ("usb[:N]", "pci[:N]")
    options = (
        Option("delegate_library", str, None, "the libedgetpu file to load (default: libedgetpu.so.1, "
                                              "libedgetpu.1.dylib or edgetpu.dll by platform)"),
        _max_interpreters(),
        Option("inline", bool, False, "run invoke in the caller's thread (default: the worker pool, so a "
                                      "stalled USB device cannot hold a call past its deadline)"),
    )

    def probe(self, hardware: dict) -> dict:
        """``tpus`` (Google's pycoral, else the hardware record) and ``delegate``: whether
        libedgetpu was found (None: not looked for)."""
        libs = hardware.get("libraries")
        return {"installed": True, "tpus": list_edge_tpus(hardware),
                "delegate": None if libs is None else bool(libs.get("libedgetpu"))}

    def parse_device(self, device):
        if device is None:
            return None
        kind, sep, index = device.partition(":")
        # "usb:" (an empty index) and "usb:01" reached libedgetpu as given: one device under several names
        if kind not in ("usb", "pci") or (sep and not (index.isascii() and index.isdigit())):
            raise ValueError(f"unknown edgetpu device {device!r} (usb[:N], pci[:N])")
        return f"{kind}:{int(index)}" if sep else kind

    def missing(self, facts: dict) -> str | None:
        return None if facts["tpus"] else "no Edge TPU found (no Coral USB device, no /dev/apex_*)"

    def assess(self, target, hardware, sub, forced, facts) -> Suitability:
        tpus = facts["tpus"]
        if sub is not None:
            kind, _, index = sub.partition(":")
            if sum(d.get("type") == kind for d in tpus) <= int(index or 0):
                return Suitability(None, f"{self.name}:{sub}", f"no Edge TPU {sub!r} here (found: {_tpus_text(tpus)})")
        where = f"{self.name}:{sub or tpus[0].get('type', 'usb')}"
        denied = _denied(tpus, sub)
        if denied:
            # libedgetpu says only "failed to open device" at load: say why and how now (`edge-infer doctor`)
            return Suitability("unready", where, f"Edge TPU {', '.join(denied)} found, but this user may not open "
                                                 f"it: {ACCESS_FIX}")
        if facts.get("delegate") is False:
            # still forceable, but the policy ranks a CPU path above a delegate that will likely not load
            return Suitability("unready", where, "Edge TPU present but libedgetpu was not found in the usual "
                                                 "library folders (see `edge-infer doctor`)")
        return Suitability("accelerator", where, f"Edge TPU present ({_tpus_text(tpus)})")

    def open(self, model_path, bucket, sub, options):
        if not is_edgetpu_model(model_path):
            # the delegate claims only edgetpu-custom-op nodes: every op of this model would run on the
            # CPU while the results said edgetpu
            raise ArtifactError(f"{model_path.name} is in an edgetpu variant but is not compiled for the Edge TPU "
                                "(no edgetpu-custom-op): the delegate would run none of it and every op on the "
                                "CPU; compile it with edgetpu_compiler, or import it as a tflite-int8 variant",
                                file=str(model_path), code=ec.ARTIFACT_INVALID)
        placement = edgetpu_placement(model_path)
        if placement is not None and not placement["edgetpu_segments"]:     # the bytes, but no such op
            raise ArtifactError(f"{model_path.name} holds the text edgetpu-custom-op but no operator of that "
                                f"name: all {placement['cpu_ops']} ops would run on the CPU; it is not an Edge "
                                "TPU compiled model", file=str(model_path), code=ec.ARTIFACT_INVALID)
        lib = options.get("delegate_library") or delegate_library()
        mod = self.vendor()
        # one delegate per session, loaded now (a failure is the load's, never a later call's) and shared by
        # the session's pooled interpreters: one per interpreter opened the same Edge TPU again for each, which
        # some libedgetpu versions refuse while the first holds it
        delegate = load_edgetpu_delegate(mod, lib, sub)
        return TfliteSession(model_path, bucket, options, mod, device=f"{self.name}:{sub or 'auto'}",
                             delegate_factory=lambda: delegate, placement=placement)
