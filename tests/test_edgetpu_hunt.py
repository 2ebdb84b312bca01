"""The Coral/Edge TPU path: what ran where, and typed failures at its vendor boundary.

The Edge TPU and libedgetpu are faked at ``load_delegate`` (tests/fake_edgetpu.py); the
compiled models are Coral's and Ultralytics' real ones (../shared/data).
"""

import ctypes
import ctypes.util
import gc
import json
import sys
import weakref

import pytest

import edge_runtime as er
from conftest import need_litert, shared


def _bucket(model):
    """A bucket spec of ``model``'s own I/O names (what check_io compares the interpreter's against)."""
    from edge_runtime.converters.tflite_inspect import inspect_tflite

    sg = inspect_tflite(model)["subgraphs"][0]
    return {"name": "b", "inputs": [{"name": t["name"], "dtype": t["dtype"], "shape": t["shape"]} for t in sg["inputs"]],
            "outputs": [{"name": t["name"], "dtype": t["dtype"], "shape": t["shape"]} for t in sg["outputs"]]}


def _fake(twins, **kw):
    from fake_edgetpu import FakeEdgeTpuModule

    need_litert()
    return FakeEdgeTpuModule({str(k): str(v) for k, v in twins.items()}, **kw)


def _mnv1():
    coral = shared("coral")
    return coral / "mobilenet_v1_0.25_128_quant_edgetpu.tflite", coral / "mobilenet_v1_0.25_128_quant.tflite"


# -- the delegate: one per session, shared by its pooled interpreters -------------------------------

def test_pooled_interpreters_share_one_delegate_the_device_is_opened_once():
    """libedgetpu versions that open an Edge TPU exclusively refuse a second delegate on it while the
    first lives: one delegate per pooled interpreter made the second concurrent call fail with
    ``device_delegate_missing`` ("is libedgetpu installed?") although the first call ran on it."""
    from fake_edgetpu import FakeDelegate

    from edge_runtime.devices.tflite_backend import EdgeTpuBackend

    compiled, plain = _mnv1()
    module = _fake({compiled: plain})
    live: weakref.WeakSet = weakref.WeakSet()
    plain_load = module.load_delegate

    def exclusive(library, options=None):
        if any(d.options == dict(options or {}) for d in live):
            raise ValueError(f"Failed to load delegate from {library}\n")   # the device is held
        d = plain_load(library, options)
        live.add(d)
        return d

    module.load_delegate = exclusive
    sess = EdgeTpuBackend(module=module).load(compiled, _bucket(compiled), "usb", {"max_interpreters": 2})
    try:
        first = sess._pool.acquire()          # two concurrent calls: the pool makes a second interpreter
        second = sess._pool.acquire()
        assert first is not second and sess._pool.size == 2
        assert len(module.loaded) == 1 and isinstance(module.loaded[0], FakeDelegate)
        assert module.loaded[0].options == {"device": "usb"}
        sess._pool.release(first)
        sess._pool.release(second)
        # a second session on the same Edge TPU (another bucket, another runtime) shares it too
        other = EdgeTpuBackend(module=module).load(compiled, _bucket(compiled), "usb")
        other.close()
        assert len(module.loaded) == 1
    finally:
        sess.close()


def test_a_delegate_that_cannot_load_fails_the_load_not_a_later_call():
    """The delegate is loaded when the session opens: a refused device is the load's DeviceError."""
    from edge_runtime.devices.tflite_backend import EdgeTpuBackend

    compiled, plain = _mnv1()
    module = _fake({compiled: plain})
    calls = []

    def load_delegate(library, options=None):
        calls.append(dict(options or {}))
        raise ValueError(f"Failed to load delegate from {library}\n")

    module.load_delegate = load_delegate
    with pytest.raises(er.DeviceError):
        EdgeTpuBackend(module=module).load(compiled, _bucket(compiled), "pci:1")
    assert calls == [{"device": "pci:1"}]


def _loadable_library() -> str:
    name = ctypes.util.find_library("c") or ctypes.util.find_library("m")
    if not name:
        pytest.skip("no loadable C library found to stand in for libedgetpu")
    ctypes.CDLL(name)
    return name


def test_a_device_the_delegate_refuses_is_named_and_not_blamed_on_a_missing_library():
    """libedgetpu present, the Edge TPU asked for absent or busy (``usb:1`` with one USB Coral): the
    delegate refuses (ValueError). That was ``device_delegate_missing``, "is libedgetpu installed",
    with the device nowhere in the message."""
    from edge_runtime.devices.tflite_backend import EdgeTpuBackend

    lib = _loadable_library()           # stands in for an installed libedgetpu: the file loads
    compiled, plain = _mnv1()
    module = _fake({compiled: plain}, libraries=(lib,))
    plain_load = module.load_delegate

    def only_usb0(library, options=None):
        if (options or {}).get("device") not in (None, "usb", "usb:0"):
            raise ValueError(f"Failed to load delegate from {library}\n")
        return plain_load(library, options)

    module.load_delegate = only_usb0
    backend = EdgeTpuBackend(module=module)
    with pytest.raises(er.DeviceError) as ei:
        backend.load(compiled, _bucket(compiled), "usb:1", {"delegate_library": lib})
    assert ei.value.code == "device_unavailable", ei.value.code
    assert "'usb:1'" in ei.value.message and "is libedgetpu installed" not in ei.value.message
    sess = backend.load(compiled, _bucket(compiled), "usb:0", {"delegate_library": lib})    # the one present
    try:
        assert sess.device == "edgetpu:usb:0" and module.loaded[-1].options == {"device": "usb:0"}
    finally:
        sess.close()
    # a library that is not there at all is still device_delegate_missing, naming it
    with pytest.raises(er.DeviceError) as ei:
        backend.load(compiled, _bucket(compiled), "usb", {"delegate_library": "libedgetpu.so.0"})
    assert ei.value.code == "device_delegate_missing" and "libedgetpu.so.0" in ei.value.message


def test_missing_libedgetpu_leaves_no_stray_traceback_on_stderr():
    """Real LiteRT ``load_delegate`` without libedgetpu: OSError, then its half-made Delegate's
    ``__del__`` raised AttributeError ('_library'), printed as "Exception ignored in ..." whenever the
    error was collected (TOOLCHAINS.md). The DeviceError is typed and nothing else is printed."""
    need_litert()
    try:
        ctypes.CDLL("libedgetpu.so.1")
        pytest.skip("libedgetpu is installed here")
    except OSError:
        pass
    from edge_runtime.devices.tflite_backend import EdgeTpuBackend

    compiled, _ = _mnv1()
    unraisable = []
    old_hook = sys.unraisablehook
    sys.unraisablehook = unraisable.append
    try:
        try:
            EdgeTpuBackend().load(compiled, _bucket(compiled), "usb", {"delegate_library": "libedgetpu.so.1"})
        except er.DeviceError as exc:
            code, message = exc.code, exc.message
        else:
            raise AssertionError("loaded without libedgetpu")
        gc.collect()
    finally:
        sys.unraisablehook = old_hook
    assert code == "device_delegate_missing" and "libedgetpu.so.1" in message
    assert [repr(u.exc_value) for u in unraisable] == []


# -- what runs where ------------------------------------------------------------------------------

def test_the_edgetpu_backend_refuses_a_model_that_is_not_compiled_for_it(tmp_path):
    """An ``edgetpu`` variant whose file holds no edgetpu-custom-op: the delegate claims nothing and
    every op runs on the CPU, while each result said ``edgetpu:usb``."""
    from edge_runtime.devices.tflite_backend import EdgeTpuBackend

    _, plain = _mnv1()
    module = _fake({plain: plain})
    with pytest.raises(er.ArtifactError) as ei:
        EdgeTpuBackend(module=module).load(plain, _bucket(plain), "usb")
    assert ei.value.code == "artifact_invalid" and "not compiled for the Edge TPU" in ei.value.message
    assert module.loaded == []          # refused before any delegate was opened
    # the marker text without the operator (a stand-in compiler's output, a tampered file): the same
    pytest.importorskip("tflite")
    fake = tmp_path / "model.tflite"
    fake.write_bytes(plain.read_bytes() + b"edgetpu-custom-op")
    module = _fake({fake: plain})
    with pytest.raises(er.ArtifactError) as ei:
        EdgeTpuBackend(module=module).load(fake, _bucket(fake), "usb")
    assert ei.value.code == "artifact_invalid" and "no operator of that name" in ei.value.message
    assert module.loaded == []


def test_a_partially_compiled_model_says_which_ops_run_on_the_cpu():
    """YOLOv8n compiled: one edgetpu-custom-op and a 24-op CPU tail. The session's info said only
    ``delegate: edgetpu:usb``; it now says how many ops (and which) run on the CPU."""
    pytest.importorskip("tflite")
    from edge_runtime.devices.tflite_backend import EdgeTpuBackend

    det = shared("detection", "yolov8n_tflite")
    compiled, plain = det / "yolov8n_full_integer_quant_edgetpu.tflite", det / "yolov8n_full_integer_quant.tflite"
    mnv1, mnv1_plain = _mnv1()
    module = _fake({compiled: plain, mnv1: mnv1_plain})
    backend = EdgeTpuBackend(module=module)
    sess = backend.load(compiled, _bucket(compiled), "usb")
    try:
        p = sess.info()["placement"]
        assert p["edgetpu_segments"] == 1 and p["cpu_ops"] == 24 and not p["fully_on_edgetpu"]
        assert p["cpu_op_types"]["TRANSPOSE"] == 3 and p["cpu_op_types"]["CONV_2D"] == 1
    finally:
        sess.close()
    sess = backend.load(mnv1, _bucket(mnv1), "usb")
    try:
        assert sess.info()["placement"] == {"edgetpu_segments": 1, "cpu_ops": 0, "cpu_op_types": {},
                                            "fully_on_edgetpu": True}
    finally:
        sess.close()


# -- edge-infer check ------------------------------------------------------------------------------

def test_check_tflite_int8_refuses_a_model_only_an_edge_tpu_can_run():
    """``check --target tflite-int8`` on an Edge TPU compiled model said "all-int8: yes", exit 0: the
    tflite backend refuses that file (``device_model_needs_edgetpu``)."""
    from test_cli import cli

    pytest.importorskip("tflite")
    compiled, plain = _mnv1()
    proc = cli("check", "--target", "tflite-int8", compiled)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "compiled for the Edge TPU" in proc.stdout
    data = json.loads(cli("check", "--target", "tflite-int8", compiled, "--json", check=1).stdout)
    assert data["ok"] is False and "libedgetpu" in data["blockers"][0]
    assert cli("check", "--target", "tflite-int8", plain).returncode == 0      # the uncompiled twin runs


def test_check_tflite_int8_knows_litert_s_own_custom_ops():
    from edge_runtime.cli_check import cpu_blockers

    assert cpu_blockers({"custom_ops": ["TFLite_Detection_PostProcess"], "flex_ops": []}) == []
    b = cpu_blockers({"custom_ops": ["fake-op-double"], "flex_ops": ["FlexErf"]})
    assert "fake-op-double" in b[0] and "FlexErf" in b[1]


# -- the edgetpu converter: the manifest's split is the compiled model's ----------------------------

_COMPILER = r'''#!{python}
import shutil, sys
from pathlib import Path
args = sys.argv[1:]
if args == ["--version"]:
    print("Edge TPU Compiler version 16.0.384591198"); sys.exit(0)
out = Path(args[args.index("-o") + 1]); model = Path(args[-1])
shutil.copyfile({compiled!r}, out / (model.stem + "_edgetpu.tflite"))
print("Edge TPU Compiler version 16.0.384591198")
print("Model compiled successfully in 1159 ms.")
print("Number of Edge TPU subgraphs: 1")
print("Number of operations that will run on Edge TPU: 230")
print("Number of operations that will run on CPU: 24")
'''


def test_edgetpu_convert_records_the_compiled_split_not_the_static_estimate(tmp_path, monkeypatch):
    """The static estimate of the int8 model given to the compiler (YOLOv8n: "fully mappable") was
    the variant's ``edgetpu_report`` even when the compiler left 24 ops on the CPU."""
    pytest.importorskip("tflite")
    from edge_runtime.converters import edgetpu as mod
    from edge_runtime.converters import onnx_io
    from edge_runtime.converters.base import BucketBuild, BuildContext
    from edge_runtime.converters.edgetpu_report import edgetpu_report
    from edge_runtime.converters.tflite_inspect import inspect_tflite

    det = shared("detection", "yolov8n_tflite")
    compiled, plain = det / "yolov8n_full_integer_quant_edgetpu.tflite", det / "yolov8n_full_integer_quant.tflite"
    exe = tmp_path / "edgetpu_compiler"
    exe.write_text(_COMPILER.replace("{python}", sys.executable).replace("{compiled!r}", repr(str(compiled))))
    exe.chmod(0o755)
    estimate = edgetpu_report(inspect_tflite(plain))
    assert estimate["fully_mappable"]          # what the static rules say of the uncompiled model

    def build_int8(self, fp32_path, out_path, feeds, ctx):
        out_path.write_bytes(plain.read_bytes())
        return BucketBuild({"scheme": "tflite-full-integer", "edgetpu_report": {
            k: estimate[k] for k in ("fully_mappable", "tpu_ops", "cpu_ops", "verdict")}})

    monkeypatch.setattr(mod.TfliteInt8Converter, "build_bucket", build_int8)
    monkeypatch.setattr(onnx_io, "io_specs", lambda path: ([], []))
    monkeypatch.setattr(mod, "describe", lambda path, ins, outs: ([], [], {}))
    out = tmp_path / "model_edgetpu.tflite"
    built = mod.EdgeTpuConverter(compiler=str(exe)).build_bucket(
        tmp_path / "src.onnx", out, [], BuildContext(task="object-detection", work=tmp_path / "work"))
    q = built.quantization
    assert q["compiler"]["cpu_ops"] == 24
    rep = q["edgetpu_report"]
    assert rep["fully_mappable"] is False and rep["cpu_ops"] == 24 and rep["tpu_ops"] == 1
    assert rep["edgetpu_compiled"] and rep["cpu_op_types"]["RESHAPE"] == 5
    assert q["edgetpu_estimate"]["fully_mappable"] is True      # the estimate kept, under its own name


def test_compiler_log_keeps_the_custom_ops_it_left_on_the_cpu():
    """The per-op table matched only UPPER_CASE names: ``TFLite_Detection_PostProcess`` left on the CPU
    (SSD's post-processing) was dropped from the manifest's ``compiler.ops``, which then listed only
    mapped ops while ``cpu_ops`` said 1."""
    from edge_runtime.converters.edgetpu import parse_log

    log = ("Edge TPU Compiler version 16.0.384591198\nModel compiled successfully in 1159 ms.\n"
           "Number of operations that will run on Edge TPU: 63\nNumber of operations that will run on CPU: 1\n\n"
           "Operator                       Count      Status\n\n"
           "CONV_2D                        55         Mapped to Edge TPU\n"
           "TFLite_Detection_PostProcess   1          Operation is working on an unsupported data type\n")
    r = parse_log(log)
    assert (r["tpu_ops"], r["cpu_ops"]) == (63, 1)
    assert r["ops"] == [{"op": "CONV_2D", "count": 55, "status": "Mapped to Edge TPU"},
                        {"op": "TFLite_Detection_PostProcess", "count": 1,
                         "status": "Operation is working on an unsupported data type"}]


def test_edgetpu_device_strings_are_refused_or_spelled_one_way():
    """``edgetpu:usb:`` (an empty index) was accepted and handed to libedgetpu as ``usb:``; ``usb:01``
    and ``usb:1`` were two names (two delegates) for one device."""
    from edge_runtime.devices.tflite_backend import EdgeTpuBackend

    b = EdgeTpuBackend()
    assert b.parse_device("usb:01") == "usb:1" and b.parse_device("pci") == "pci" and b.parse_device(None) is None
    for bad in ("usb:", "usb:-1", "usb:x", "tpu:0", "pci:\u00b2"):
        with pytest.raises(ValueError):
            b.parse_device(bad)


@pytest.mark.parametrize("native,needle", [
    ("Failed to prepare for TPU. Failed precondition: Package requires runtime version (14), which is newer "
     "than this runtime version (13).", "libedgetpu is older than the edgetpu_compiler"),
    ("Encountered unresolved custom op: edgetpu-custom-op.", "is not libedgetpu"),
])
def test_the_interpreter_refusing_a_compiled_model_is_a_typed_device_error(native, needle):
    """libedgetpu older than the compiler, or a delegate library that is not libedgetpu: the backend
    raised LiteRT's bare RuntimeError (a pooled interpreter made mid-call raised it from the call)."""
    from fake_edgetpu import FakeDelegate

    from edge_runtime.devices.tflite_backend import EdgeTpuBackend

    compiled, plain = _mnv1()
    module = _fake({compiled: plain})
    make = module.Interpreter

    def interpreter(model_path, experimental_delegates=None, num_threads=None):
        if experimental_delegates and any(isinstance(d, FakeDelegate) for d in experimental_delegates):
            raise RuntimeError(native)
        return make(model_path, experimental_delegates, num_threads)

    module.Interpreter = interpreter
    with pytest.raises(er.DeviceError) as ei:
        EdgeTpuBackend(module=module).load(compiled, _bucket(compiled), "usb")
    assert ei.value.code == "device_load_failed" and needle in ei.value.message
