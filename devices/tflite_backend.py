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

import contextlib
import logging
import os
import platform
import sys
import tempfile
import threading
from pathlib import Path

from edge_runtime.errors import DeviceError

from .base import Suitability, check_feeds, int_option

EDGETPU_OP = b"edgetpu-custom-op"
log = logging.getLogger("edge_runtime.tflite")
_DELEGATE_LIBS = {"Linux": "libedgetpu.so.1", "Darwin": "libedgetpu.1.dylib", "Windows": "edgetpu.dll"}


def interpreter_module():
    """(module with Interpreter and load_delegate, package name) or (None, reason)."""
    try:
        from ai_edge_litert import interpreter as mod

        return mod, "ai-edge-litert"
    except Exception as first:  # noqa: BLE001 - any import failure means "not this one"
        try:
            from tflite_runtime import interpreter as mod  # type: ignore

            return mod, "tflite-runtime"
        except Exception as second:  # noqa: BLE001
            return None, f"no TFLite interpreter (ai-edge-litert: {first}; tflite-runtime: {second})"


# LiteRT's native code writes this on fd 2 when an interpreter allocates its tensors;
# no environment variable turns it off (TF_CPP_MIN_LOG_LEVEL, TFLITE_LOG_LEVEL do not)
_NATIVE_NOISE = {b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.",
                 b"INFO: Initialized TensorFlow Lite runtime."}
_FD2_LOCK = threading.RLock()     # re-entrant: a nested block redirects into the outer one


@contextlib.contextmanager
def quiet_native_stderr():
    """Drop LiteRT's INFO lines from the process's stderr while the block runs.

    fd 2 is pointed at a temporary file (under a process-wide lock, so two threads
    making interpreters never interleave their redirects) and restored when the block
    ends, exception or not; what was written meanwhile, by the native code or by any
    other thread, is then written to the real stderr, less the known INFO lines (logged
    at DEBUG instead). Native errors therefore still reach stderr, only later. Without a
    usable fd 2 or temporary directory the block runs unredirected."""
    with _FD2_LOCK:
        saved = tmp = None
        try:
            tmp = tempfile.TemporaryFile()
            saved = os.dup(2)
        except OSError:
            if tmp is not None:
                tmp.close()
            tmp = None
        if tmp is None:
            yield
            return
        _flush_stderr()
        try:
            os.dup2(tmp.fileno(), 2)
            try:
                yield
            finally:
                _flush_stderr()
                os.dup2(saved, 2)
        finally:
            os.close(saved)
            try:
                tmp.seek(0)
                captured = tmp.read()
            finally:
                tmp.close()
            _replay(captured)


def _flush_stderr() -> None:
    try:
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed or replaced sys.stderr
        pass


def _replay(captured: bytes) -> None:
    keep = []
    for line in captured.splitlines(keepends=True):
        if line.strip() in _NATIVE_NOISE:
            log.debug("%s", line.strip().decode("utf-8", "replace"))
        else:
            keep.append(line)
    data = b"".join(keep)
    while data:
        try:
            data = data[os.write(2, data):]
        except OSError:
            return


def is_edgetpu_model(path: Path) -> bool:
    """True when the file holds an Edge TPU compiled subgraph (scanned in chunks)."""
    tail = b""
    with open(path, "rb") as fh:
        while True:
            block = fh.read(1 << 20)
            if not block:
                return False
            if EDGETPU_OP in tail + block:
                return True
            tail = block[-len(EDGETPU_OP):]


def delegate_library(system: str | None = None) -> str:
    return _DELEGATE_LIBS.get(system or platform.system(), "libedgetpu.so.1")


def _flag(value) -> bool:
    if isinstance(value, str):
        if value.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
            raise ValueError(f"device option inline={value!r} is not a boolean")
        return value.lower() in ("1", "true", "yes", "on")
    return bool(value)


class TfliteSession:
    # LiteRT cannot stop a running invoke. inline=true runs it in the caller's thread and
    # checks the deadline when it returns (a late answer is an InferenceTimeout, never a
    # result); inline=false runs it on the runtime's worker pool, which returns at the
    # deadline while the invoke finishes in the background (~0.5-1 ms more per call on
    # 2 cores). CPU sessions default to inline: a static-shape XNNPACK invoke cannot
    # stall. Edge TPU sessions default to the pool: a USB device can.
    cancellable = False

    def __init__(self, model_path: Path, bucket: dict, options: dict, delegate_factory=None, device="tflite:cpu",
                 module=None, inline_default: bool = False):
        mod, pkg = (module, "injected") if module is not None else interpreter_module()
        if mod is None:
            raise DeviceError(pkg, code="device_unavailable")
        self._mod, self.package = mod, pkg
        self._path = str(model_path)
        self._bucket = bucket
        # options checked before any interpreter is made: a bad value names the option (InputError)
        self._threads = int_option(options, "threads", env="EDGE_RUNTIME_THREADS") or os.cpu_count() or 1
        self._delegate_factory = delegate_factory
        self.device = device
        self._lock = threading.Lock()
        self._free = []
        self._made = 0
        self._limit = int_option(options, "max_interpreters", 2, minimum=1)
        self._cv = threading.Condition(self._lock)
        self.cancellable = self.inline = _flag(options.get("inline", inline_default))
        self._free.append(self._new())
        self._made = 1
        self._closed = False

    def _new(self):
        kw = {"model_path": self._path}
        if self._delegate_factory is not None:
            kw["experimental_delegates"] = [self._delegate_factory()]
        else:
            kw["num_threads"] = self._threads
        with quiet_native_stderr():      # LiteRT's "INFO: Created ... XNNPACK delegate" line
            interp = self._mod.Interpreter(**kw)
            interp.allocate_tensors()
        # a converted model's tensors may be named differently from the manifest's
        # (ONNX) names: the bucket maps them
        rename = {v: k for k, v in (self._bucket.get("tensor_names") or {}).items()}
        ins = {rename.get(d["name"], d["name"]): d["index"] for d in interp.get_input_details()}
        outs = {rename.get(d["name"], d["name"]): d["index"] for d in interp.get_output_details()}
        want_in = {t["name"] for t in self._bucket["inputs"]}
        if set(ins) != want_in:
            raise ValueError(f"model inputs {sorted(ins)} differ from the manifest's {sorted(want_in)}")
        missing = [t["name"] for t in self._bucket["outputs"] if t["name"] not in outs]
        if missing:
            raise ValueError(f"model has no output(s) {missing} (has {sorted(outs)})")
        return interp, ins, outs

    def _acquire(self):
        with self._cv:
            while True:
                if self._free:
                    return self._free.pop()
                if self._made < self._limit:
                    self._made += 1
                    break
                self._cv.wait()
        try:
            return self._new()
        except BaseException:
            with self._cv:
                self._made -= 1
                self._cv.notify()
            raise

    def _release(self, item) -> None:
        with self._cv:
            self._free.append(item)
            self._cv.notify()

    def run(self, feeds, cancel=None):
        if self._closed:
            raise RuntimeError("session is closed")
        check_feeds(feeds, self._bucket)
        item = self._acquire()
        interp, ins, outs = item
        try:
            for name, arr in feeds.items():
                interp.set_tensor(ins[name], arr)
            interp.invoke()
            return {t["name"]: interp.get_tensor(outs[t["name"]]).copy() for t in self._bucket["outputs"]}
        finally:
            self._release(item)

    def info(self) -> dict:
        return {"package": self.package, "threads": None if self._delegate_factory else self._threads,
                "inline": self.inline,
                "interpreters": self._made, "delegate": self.device if self._delegate_factory else None}

    def close(self) -> None:
        self._closed = True
        with self._cv:
            self._free = []


class TfliteBackend:
    name = "tflite"
    targets = ("tflite-int8",)

    def suitability(self, target: str, hardware: dict, device: str | None = None) -> Suitability:
        if target not in self.targets:
            return Suitability(0, self.name, f"tflite does not run {target!r} variants")
        pkgs = hardware.get("packages", {})
        if not (pkgs.get("ai_edge_litert", True) or pkgs.get("tflite_runtime", False)):
            return Suitability(0, self.name, "no TFLite interpreter installed (pip install 'edge-runtime[tflite]')")
        if device not in (None, "cpu"):
            return Suitability(0, f"{self.name}:{device}", f"unknown tflite device {device!r} (cpu)")
        arm = str(hardware.get("machine", "")).lower() in ("aarch64", "arm64", "armv7l")
        return Suitability(14 if arm else 8, f"{self.name}:cpu",
                           "LiteRT with XNNPACK" + (" (the lightest CPU runtime on ARM boards)" if arm else ""))

    def load(self, model_path: Path, bucket: dict, device: str | None = None, options: dict | None = None):
        if is_edgetpu_model(Path(model_path)):
            raise DeviceError(f"{Path(model_path).name} is compiled for the Edge TPU (it contains "
                              "edgetpu-custom-op): it runs only on an Edge TPU through libedgetpu; use the "
                              "artifact's tflite-int8 variant on a CPU", code="device_model_needs_edgetpu")
        return TfliteSession(Path(model_path), bucket, dict(options or {}), inline_default=True)


def list_edge_tpus(hardware: dict) -> list[dict]:
    """Edge TPUs: Google's pycoral when importable, else what the probe found."""
    try:
        from pycoral.utils.edgetpu import list_edge_tpus as coral_list  # type: ignore  # Coral system package

        return [dict(d) for d in coral_list()]
    except Exception:  # noqa: BLE001 - absent or not Google's
        return list(hardware.get("edgetpus") or [])


class EdgeTpuBackend:
    name = "edgetpu"
    targets = ("edgetpu",)

    def __init__(self, module=None, list_tpus=None, name: str = "edgetpu"):
        # tests replace the vendor boundary here: the interpreter module (Interpreter,
        # load_delegate) and the Edge TPU listing; everything else is the real code path
        self._module = module
        self._list_tpus = list_tpus or list_edge_tpus
        self.name = name

    def _interpreter(self):
        if self._module is not None:
            return self._module
        mod, why = interpreter_module()
        if mod is None:
            raise DeviceError(why, code="device_unavailable")
        return mod

    def suitability(self, target: str, hardware: dict, device: str | None = None) -> Suitability:
        if target not in self.targets:
            return Suitability(0, self.name, f"edgetpu does not run {target!r} variants")
        tpus = self._list_tpus(hardware)
        if not tpus:
            return Suitability(0, self.name, "no Edge TPU found (no Coral USB device, no /dev/apex_*)")
        kind, _, index = (device or "").partition(":")
        if device is not None and (kind not in ("usb", "pci") or (index and not index.isdigit())):
            return Suitability(0, f"{self.name}:{device}", f"unknown edgetpu device {device!r} (usb[:N], pci[:N])")
        if device is not None and sum(d.get("type") == kind for d in tpus) <= int(index or 0):
            return Suitability(0, f"{self.name}:{device}", f"no Edge TPU {device!r} here (found: "
                               f"{', '.join(d.get('type', '?') + ':' + str(d.get('path', '')) for d in tpus)})")
        where = f"{self.name}:{device or tpus[0].get('type', 'usb')}"
        libs = hardware.get("libraries")
        if self._module is None and libs is not None and not libs.get("libedgetpu"):
            # still forceable, but auto prefers a CPU path over a delegate that will likely not load
            return Suitability(5, where, "Edge TPU present but libedgetpu was not found in the usual library "
                                         "folders (see `edge-infer doctor`)")
        return Suitability(60, where,
                           f"Edge TPU present ({', '.join(d.get('type', '?') + ':' + str(d.get('path', '')) for d in tpus)})")

    def load(self, model_path: Path, bucket: dict, device: str | None = None, options: dict | None = None):
        options = dict(options or {})
        lib = options.get("delegate_library") or delegate_library()
        mod = self._interpreter()
        delegate_opts = {"device": device} if device else {}

        def factory():
            try:
                return mod.load_delegate(lib, delegate_opts)
            except (ValueError, OSError, RuntimeError) as exc:
                raise DeviceError(f"cannot load the Edge TPU delegate {lib} ({exc}): is libedgetpu installed "
                                  "and the device plugged in?", code="device_delegate_missing") from None

        return TfliteSession(Path(model_path), bucket, options, delegate_factory=factory,
                             device=f"{self.name}:{device or 'auto'}", module=mod)
