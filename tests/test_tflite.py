"""TFLite: importing Coral's quantized models, the tflite and edgetpu backends.

The Edge TPU itself is faked at its vendor boundary (tests/fake_edgetpu.py);
no Edge TPU path here ran on real hardware.
"""

import json

import numpy as np
import pytest

import edge_runtime as er
from conftest import need_litert, shared

need_litert()


def _import(tmp_path, model, labels="imagenet_labels.txt", **kw):
    from edge_runtime.converters.tflite_import import import_tflite

    coral = shared("coral")
    out = tmp_path / model.replace(".tflite", "")
    import_tflite(coral / model, out, labels=(coral / labels) if labels else None, **kw)
    return out


@pytest.mark.parametrize("model,image,label", [
    ("mobilenet_v2_1.0_224_quant.tflite", "cat.bmp", "Egyptian cat"),
    ("mobilenet_v2_1.0_224_quant.tflite", "parrot.jpg", "macaw"),
    ("mobilenet_v2_1.0_224_quant.tflite", "grace_hopper.bmp", "military uniform"),
    ("tf2_mobilenet_v2_1.0_224_ptq.tflite", "cat.bmp", "Egyptian cat"),
])
def test_coral_models_classify_their_test_images(tmp_path, model, image, label):
    art = _import(tmp_path, model)
    with er.load(art) as rt:
        res = rt.infer(str(shared("coral", image)))
    assert res.device == "tflite:cpu" and res.target == "tflite-int8"
    assert res.prediction == label, res.scores
    top = res.scores[label]
    assert 0.4 < top <= 1 and abs(top * 256 - round(top * 256)) < 1e-6   # the model's own uint8 probability,
    assert sum(res.scores.values()) <= 1 + 1e-6                           # not softmaxed a second time


def test_inat_bird_model_with_its_labels(tmp_path):
    art = _import(tmp_path, "mobilenet_v2_1.0_224_inat_bird_quant.tflite", labels="inat_bird_labels.txt")
    with er.load(art) as rt:
        res = rt.infer(str(shared("coral", "bird.bmp")))
        assert rt.task.labels.index(res.prediction) == 659           # Coral's expected class


def test_import_records_what_the_model_says(tmp_path):
    art = _import(tmp_path, "mobilenet_v2_1.0_224_quant.tflite")
    man = json.loads((art / "manifest.json").read_text())
    v = man["variants"][0]
    assert v["target"] == "tflite-int8" and man["model"]["source"]["imported"]
    inp = v["buckets"][0]["inputs"][0]
    assert inp == {"name": "input", "dtype": "uint8", "shape": [1, 224, 224, 3],
                   "quantization": {"scale": 0.0078125, "zero_point": 128}}
    assert man["preprocess"]["resize"] == "bilinear-half-pixel" and man["preprocess"]["input"] == "pixels"
    assert man["postprocess"]["softmax"] is False                    # the model ends in SOFTMAX
    assert v["parity"]["metric"] == "not_measured" and v["parity"]["value"] is None
    assert set(man["files"]) == {"tflite-int8/model.tflite", "labels.txt"}
    rep = v["edgetpu_report"]                                        # the static report travels with it
    assert rep["fully_mappable"] and rep["tpu_ops"] == 66 and rep["cpu_ops"] == 0 and rep["first_unsupported"] is None


def test_label_offset_and_mismatch(tmp_path):
    coral = shared("coral")
    names = (coral / "imagenet_labels.txt").read_text().splitlines()[1:]   # without the background line
    labels = tmp_path / "no_background.txt"
    labels.write_text("\n".join(names) + "\n")
    from edge_runtime.converters.tflite_import import import_tflite

    with pytest.raises(er.InputError) as ei:
        import_tflite(coral / "mobilenet_v1_0.25_128_quant.tflite", tmp_path / "a", labels=labels)
    assert ei.value.code == "import_labels_mismatch" and "1000 labels" in ei.value.message
    import_tflite(coral / "mobilenet_v1_0.25_128_quant.tflite", tmp_path / "b", labels=labels, label_offset=1)
    with er.load(tmp_path / "b") as rt:
        assert rt.task.labels[0] == "background" and rt.task.labels[286] == "Egyptian cat"


def test_half_pixel_resize_matches_the_reference_formula():
    from edge_runtime.models.image import resize_half_pixel

    x = np.arange(16, dtype=np.float32).reshape(4, 4, 1)
    y = resize_half_pixel(x, 2, 2)[:, :, 0]
    # half-pixel centres: output pixel (0, 0) samples source (0.5, 0.5)
    np.testing.assert_allclose(y, [[2.5, 4.5], [10.5, 12.5]])
    np.testing.assert_allclose(resize_half_pixel(x, 4, 4), x)


# -- the Edge TPU: compiled models, the delegate boundary ---------------------------

def test_an_edgetpu_compiled_model_is_recognised_before_loading(tmp_path):
    from edge_runtime.devices.tflite_backend import TfliteBackend, is_edgetpu_model

    coral = shared("coral")
    assert is_edgetpu_model(coral / "mobilenet_v1_0.25_128_quant_edgetpu.tflite")
    assert not is_edgetpu_model(coral / "mobilenet_v1_0.25_128_quant.tflite")
    art = _import(tmp_path, "mobilenet_v1_0.25_128_quant_edgetpu.tflite")
    assert json.loads((art / "manifest.json").read_text())["variants"][0]["target"] == "edgetpu"
    with pytest.raises(er.DeviceError) as ei:                         # no Edge TPU on this machine
        er.load(art, device="edgetpu", strict=True)
    assert "no Edge TPU found" in ei.value.message and "custom op" not in ei.value.message
    with pytest.raises(er.DeviceError) as ei:                         # and the CPU backend refuses it by name
        TfliteBackend().load(art / "edgetpu" / "model.tflite", {"inputs": [], "outputs": []})
    assert ei.value.code == "device_model_needs_edgetpu" and "edgetpu-custom-op" in ei.value.message


def test_faked_edgetpu_runs_through_the_delegate(edgetpu_faked_artifact):
    with er.load(edgetpu_faked_artifact, device="edgetpu-faked", strict=True) as rt:
        res = rt.infer(str(shared("coral", "cat.bmp")))
        assert res.device == "edgetpu-faked:usb" and res.target == "edgetpu"
        assert not rt.info()["sessions"][0]["inline"]   # a USB device can stall: worker pool, hard deadline
        assert res.prediction in ("Egyptian cat", "tiger cat", "tabby, tabby cat")
        backend = rt.choice.backend_name
    from edge_runtime.devices import registry

    module = registry.get_backend(backend)._module
    d = module.loaded[-1]
    assert d.library == "libedgetpu.so.1" and d.options == {"device": "usb"}


def test_missing_delegate_library_is_a_clear_device_error(edgetpu_faked_artifact):
    with pytest.raises(er.DeviceError) as ei:
        er.load(edgetpu_faked_artifact, device="edgetpu-faked", strict=True,
                device_options={"delegate_library": "libedgetpu.so.0"})
    assert ei.value.code == "device_delegate_missing" and "libedgetpu.so.0" in ei.value.message


def test_delegate_library_per_platform():
    from edge_runtime.devices.tflite_backend import delegate_library

    assert delegate_library("Linux") == "libedgetpu.so.1"
    assert delegate_library("Darwin") == "libedgetpu.1.dylib"
    assert delegate_library("Windows") == "edgetpu.dll"


def test_probe_finds_edgetpus_in_a_fake_tree(tmp_path):
    from edge_runtime.hardware import detect

    usb = tmp_path / "sys" / "bus" / "usb" / "devices"
    for name, vid, pid in (("1-1", "18d1", "9302"), ("1-2", "1a6e", "089a"), ("1-3", "046d", "c52b")):
        (usb / name).mkdir(parents=True)
        (usb / name / "idVendor").write_text(vid + "\n")
        (usb / name / "idProduct").write_text(pid + "\n")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "apex_0").write_text("")
    hw = detect(tmp_path, system="Linux", machine="aarch64")
    assert hw["edgetpus"] == [{"type": "usb", "path": "1-1", "id": "18d1:9302"},
                              {"type": "usb", "path": "1-2", "id": "1a6e:089a"},
                              {"type": "pci", "path": "/dev/apex_0"}]
    from edge_runtime.devices.tflite_backend import EdgeTpuBackend

    suit = EdgeTpuBackend().suitability("edgetpu", hw)
    assert suit.ok and suit.device == "edgetpu:usb" and "Edge TPU present" in suit.reason
    assert not EdgeTpuBackend().suitability("edgetpu", detect(tmp_path / "empty")).ok


# -- broken models ------------------------------------------------------------

def test_real_broken_models_get_typed_errors(tmp_path):
    from edge_runtime.converters.tflite_import import import_tflite

    with pytest.raises(er.ArtifactError) as ei:       # LiteRT refuses its quantization parameters
        import_tflite(shared("tflm", "person_detect.tflite"), tmp_path / "p", task="tensors")
    assert ei.value.code == "import_model_invalid" and "quantized_dimension" in ei.value.message
    # an unknown custom op: imports (the file is fine), then loading says which op
    import_tflite(shared("coral", "invalid_models", "model_invoking_error.tflite"), tmp_path / "c", task="tensors")
    with pytest.raises(er.DeviceError) as ei:
        er.load(tmp_path / "c")
    assert "fake-op-double" in ei.value.message
    with pytest.raises(er.InputError) as ei:          # not an image model: says how to import it
        import_tflite(shared("tflm", "hello_world_int8.tflite"), tmp_path / "h")
    assert "--task tensors" in ei.value.message
    garbage = tmp_path / "garbage.tflite"
    garbage.write_bytes(b"\x00" * 64)
    with pytest.raises(er.ArtifactError):
        import_tflite(garbage, tmp_path / "g", task="tensors")


def test_tensors_import_runs_a_non_image_model(tmp_path):
    from edge_runtime.converters.tflite_import import import_tflite

    import_tflite(shared("tflm", "hello_world_int8.tflite"), tmp_path / "h", task="tensors")
    with er.load(tmp_path / "h") as rt:
        spec = rt.variant["buckets"][0]["inputs"][0]
        x = np.zeros(spec["shape"], dtype=spec["dtype"])
        res = rt.infer({spec["name"]: x})
        assert set(res.outputs) == {o["name"] for o in rt.variant["buckets"][0]["outputs"]}


def test_cli_import_then_infer(tmp_path):
    from test_cli import cli

    coral = shared("coral")
    out = tmp_path / "mnv2"
    proc = cli("import", coral / "mobilenet_v2_1.0_224_quant.tflite", "-o", out, "--labels",
               coral / "imagenet_labels.txt", "--json", check=0)
    assert json.loads(proc.stdout)["target"] == "tflite-int8"
    res = json.loads(cli("infer", out, "--image", coral / "cat.bmp", "--json", check=0).stdout)
    assert res["prediction"] == "Egyptian cat" and res["device"] == "tflite:cpu"
    bad = cli("import", coral / "mobilenet_v2_1.0_224_quant.tflite", "-o", out)
    assert bad.returncode == 2 and "--force" in bad.stderr


# -- the tflite-int8 converter (ONNX -> onnx2tf -> full-integer TFLite) ---------------

@pytest.mark.slow
def test_digits_to_full_int8_tflite(tflite_digits_artifact):
    from edge_runtime.evaluate import evaluate

    from conftest import ZOO

    man = json.loads((tflite_digits_artifact / "manifest.json").read_text())
    v = man["variants"][0]
    b = v["buckets"][0]
    assert v["target"] == "tflite-int8" and {"tensorflow", "onnx2tf"} <= set(v["toolchain"])
    # the same feeds as every other variant: ONNX names and layout, mapped to the TFLite tensors
    assert b["inputs"][0]["name"] == "image" and b["inputs"][0]["shape"] == [1, 1, 8, 8]
    assert b["inputs"][0]["dtype"] == "int8" and b["outputs"][0]["dtype"] == "int8"
    assert b["tensor_names"]["image"] == "serving_default_image:0"
    q = v["quantization"]
    assert q["all_int8"] and "FLOAT" not in json.dumps(q["op_counts"])      # inspected, not assumed
    assert q["edgetpu_report"]["fully_mappable"] and q["edgetpu_report"]["first_unsupported"] is None
    assert v["parity"]["passed"] and v["parity"]["value"] >= 0.99 and v["parity"]["samples"] == 360
    with er.load(tflite_digits_artifact) as rt:
        rep = evaluate(rt, ZOO / "digits-cnn" / "held_out")
    assert rep["device"] == "tflite:cpu" and rep["accuracy"] >= 0.975


# -- the edgetpu target: edgetpu_compiler replaced at its boundary --------------------

_FAKE_COMPILER = r'''#!{python}
"""A stand-in for edgetpu_compiler: mode={mode}."""
import shutil, sys
from pathlib import Path
args = sys.argv[1:]
if args == ["--version"]:
    print("Edge TPU Compiler version 16.0.384591198"); sys.exit(0)
out = Path(args[args.index("-o") + 1]); model = Path(args[-1])
mode = "{mode}"
if mode == "fail":
    print("ERROR: Didn't find op for builtin opcode 'FULLY_CONNECTED'", file=sys.stderr); sys.exit(1)
if mode == "nofile":
    sys.exit(0)
dst = out / (model.stem + "_edgetpu.tflite")
shutil.copyfile(model, dst)
if mode == "ok":
    with open(dst, "ab") as fh:
        fh.write(b"edgetpu-custom-op")        # what a compiled model carries
print("Edge TPU Compiler version 16.0.384591198")
print("Model compiled successfully in 12 ms.")
print("On-chip memory used for caching model parameters: 40.00KiB")
print("Off-chip memory used for streaming uncached model parameters: 0.00B")
print("Number of Edge TPU subgraphs: 1")
print("Number of operations that will run on Edge TPU: 8")
print("Number of operations that will run on CPU: 0")
print("Operator                       Count      Status")
print("CONV_2D                        2          Mapped to Edge TPU")
print("FULLY_CONNECTED                2          Mapped to Edge TPU")
'''


def _fake_compiler(tmp_path, monkeypatch, mode):
    import os
    import sys

    bindir = tmp_path / f"bin-{mode}"
    bindir.mkdir()
    exe = bindir / "edgetpu_compiler"
    exe.write_text(_FAKE_COMPILER.replace("{python}", sys.executable).replace("{mode}", mode))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir) + os.pathsep + os.environ["PATH"])


def _convert_digits(out, targets):
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.zoo import convert_request

    pytest.importorskip("tensorflow")
    pytest.importorskip("onnx2tf")
    return convert(convert_request("digits-cnn", "image-classification", out, targets=targets))


@pytest.mark.slow
def test_edgetpu_target_without_the_compiler_says_so_and_builds_tflite(tmp_path, monkeypatch):
    import shutil

    if shutil.which("edgetpu_compiler"):
        pytest.skip("a real edgetpu_compiler is on PATH")
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.zoo import convert_request
    from edge_runtime.errors import InputError

    pytest.importorskip("tensorflow")
    pytest.importorskip("onnx2tf")
    with pytest.raises(InputError) as err:                                    # refused unless asked to skip
        convert(convert_request("digits-cnn", "image-classification", tmp_path / "r", targets=["edgetpu"]))
    assert err.value.code == "convert_target_unavailable" and "edgetpu_compiler" in err.value.message
    man = convert(convert_request("digits-cnn", "image-classification", tmp_path / "a", targets=["edgetpu"],
                                  allow_skip=True))
    assert [v["target"] for v in man["variants"]] == ["tflite-int8"]       # never labelled edgetpu
    assert man["skipped_targets"][0]["target"] == "edgetpu"
    assert "edgetpu_compiler is not on PATH" in man["skipped_targets"][0]["reason"]
    assert man["variants"][0]["quantization"]["edgetpu_report"]["fully_mappable"]


@pytest.mark.slow
def test_edgetpu_target_with_a_compiler(tmp_path, monkeypatch):
    _fake_compiler(tmp_path, monkeypatch, "ok")
    man = _convert_digits(tmp_path / "b", ["edgetpu"])
    v = man["variants"][0]
    assert v["target"] == "edgetpu" and "skipped_targets" not in man
    c = v["quantization"]["compiler"]
    assert (c["tpu_ops"], c["cpu_ops"], c["subgraphs"], c["on_chip_memory"]) == (8, 0, 1, "40.00KiB")
    assert {"op": "CONV_2D", "count": 2, "status": "Mapped to Edge TPU"} in c["ops"]
    assert v["toolchain"]["edgetpu_compiler"].startswith("Edge TPU Compiler version 16")
    assert "tflite-int8 model given to the compiler" in v["parity"]["measured_on"]
    assert v["parity"]["passed"] and "parity_model" not in v["buckets"][0]
    from edge_runtime.devices.tflite_backend import is_edgetpu_model

    assert is_edgetpu_model(tmp_path / "b" / v["buckets"][0]["file"])


@pytest.mark.slow
@pytest.mark.parametrize("mode,needle", [("fail", "failed (exit 1)"), ("nofile", "wrote no compiled model"),
                                         ("unmarked", "no edgetpu-custom-op")])
def test_a_compiler_that_did_not_finish_ships_nothing(tmp_path, monkeypatch, mode, needle):
    _fake_compiler(tmp_path, monkeypatch, mode)
    with pytest.raises(er.InputError) as ei:
        _convert_digits(tmp_path / "c", ["edgetpu"])
    assert needle in ei.value.message and ei.value.code == "convert_target_failed"
    assert not (tmp_path / "c").exists()


def test_compiler_log_parsing():
    from edge_runtime.converters.edgetpu import parse_log

    log = ("Edge TPU Compiler version 16.0.384591198\nNumber of Edge TPU subgraphs: 1\n"
           "Number of operations that will run on Edge TPU: 64\nNumber of operations that will run on CPU: 2\n"
           "Operator                       Count      Status\n"
           "SOFTMAX                        1          Mapped to Edge TPU\n"
           "ARG_MAX                        1          Operation not supported\n")
    r = parse_log(log)
    assert (r["tpu_ops"], r["cpu_ops"], r["subgraphs"], r["compiler_version"]) == (64, 2, 1, "16.0.384591198")
    assert r["ops"][1] == {"op": "ARG_MAX", "count": 1, "status": "Operation not supported"}


def test_inline_mode_checks_the_deadline_after_invoke(coral_artifact, monkeypatch):
    import time

    from edge_runtime.devices.tflite_backend import TfliteSession

    img = str(shared("coral", "cat.bmp"))
    with er.load(coral_artifact, device="tflite") as rt:   # the CPU default
        caps = rt._sessions[0].capabilities
        assert rt.info()["sessions"][0]["inline"] and caps.inline and not caps.cancellable   # LiteRT cannot cancel
        assert rt.infer(img).prediction
        real_run = TfliteSession.run

        def slow_run(self, feeds, cancel=None):        # an invoke that takes 200 ms
            out = real_run(self, feeds, cancel)
            time.sleep(0.2)
            return out

        monkeypatch.setattr(TfliteSession, "run", slow_run)
        with pytest.raises(er.InferenceTimeout) as ei:
            rt.infer(img, deadline_ms=50)
        assert "answered after the 50 ms deadline" in ei.value.message
        monkeypatch.setattr(TfliteSession, "run", real_run)
        assert rt.infer(img).prediction                 # keeps serving
    with er.load(coral_artifact, device="tflite", device_options={"inline": "false"}) as rt:
        caps = rt._sessions[0].capabilities
        assert not rt.info()["sessions"][0]["inline"] and not caps.inline and not caps.cancellable
        monkeypatch.setattr(TfliteSession, "run", slow_run)
        t0 = time.perf_counter()
        with pytest.raises(er.InferenceTimeout):       # the pooled mode returns at the deadline
            rt.infer(img, deadline_ms=50)
        assert time.perf_counter() - t0 < 0.18
        monkeypatch.setattr(TfliteSession, "run", real_run)
    with pytest.raises(er.InputError) as ei:          # a bad value of a declared option: the caller's error
        er.load(coral_artifact, device="tflite", device_options={"inline": "sometimes"})
    assert ei.value.code == "device_option_invalid" and "inline" in ei.value.message


@pytest.mark.slow
def test_minilm_to_tflite_reaches_the_budget_or_fails_typed(tmp_path):
    """A transformer through onnx2tf: either a parity-gated artifact with its Edge TPU
    report, or a typed failure naming the tool and its reason, and nothing written."""
    from conftest import CACHE, _need_minilm

    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.zoo import convert_request

    _need_minilm()
    pytest.importorskip("onnx2tf")
    out = tmp_path / "ml"
    try:
        man = convert(convert_request("minilm", "text-embedding", out, cache=CACHE, targets=["tflite-int8"],
                                      buckets=[64], max_calibration=60,
                                      # TF 2.21's int8 DIV fails at run time: keep it float
                                      recipe_overrides={"float_ops": ["DIV"]}))
    except er.ParityError as exc:
        # today: naive post-training int8 through TFLite wrecks the embedding (cosine ~0.3;
        # onnx2tf's float model matches ONNX at cosine 1.0): convert fails with the figure
        par = exc.details["variants"][0]["parity"]
        assert par["value"] is not None and par["value"] < par["budget"]
        assert not out.exists()
        return
    except er.InputError as exc:
        # today: TF 2.21 builds an int8 DIV that fails at run time (TOOLCHAINS); the message
        # carries the static Edge TPU report of what was built (CAST first: all on the CPU)
        assert exc.code == "convert_target_failed"
        assert any(k in exc.message for k in ("onnx2tf", "TFLite", "fails when run for parity"))
        assert not out.exists()
        return
    v = man["variants"][0]
    assert v["parity"]["passed"] and "edgetpu_report" in v["quantization"]
