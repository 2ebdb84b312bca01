"""The coreml target and backend: converts and validates on Linux; runs only through
the faked Core ML boundary here (tests/fake_coreml.py)."""

import dataclasses
import json
import shutil
import struct

import numpy as np
import pytest

import edge_runtime as er
from conftest import ZOO, add_coreml_twins, need_coreml
from edge_runtime.artifact import sha256_file
from edge_runtime.devices.coreml_backend import CoremlBackend

DIGITS = ZOO / "digits-cnn"


def _manifest(path):
    return json.loads((path / "manifest.json").read_text())


def _package(art):
    b = _manifest(art)["variants"][0]["buckets"][0]
    return art / b["package"], b


# -- converter -----------------------------------------------------------------

def test_digits_package_hashed_validated_and_w8a8(coreml_digits_artifact):
    man = _manifest(coreml_digits_artifact)
    (v,) = man["variants"]
    assert v["target"] == "coreml" and v["quantization"]["mode"] == "w8a8" == v["quantization"]["recipe"]
    assert v["quantization"]["weights"] == "int8" and v["quantization"]["activations"].startswith("int8")
    pkg, b = _package(coreml_digits_artifact)
    assert b["file"] == f"{b['package']}/Manifest.json" and pkg.name == "static.mlpackage"
    on_disk = sorted(p.relative_to(coreml_digits_artifact).as_posix() for p in pkg.rglob("*") if p.is_file())
    assert sorted([b["file"], *b["extra_files"]]) == on_disk and len(on_disk) == 3   # every file, nothing else
    for rel in on_disk:
        assert man["files"][rel]["sha256"] == sha256_file(coreml_digits_artifact / rel)
    # the contract's I/O, static shapes
    assert b["inputs"] == [{"name": "image", "dtype": "float32", "shape": [1, 1, 8, 8]}]
    assert b["outputs"] == [{"name": "logits", "dtype": "float32", "shape": [1, 10]}]
    rep = b["spec_validation"]
    assert rep["passed"] and rep["model_type"] == "mlProgram"
    assert rep["int8_weight_tensors"] == 4 and rep["int8_weight_elements"] == 16 * 9 + 32 * 16 * 9 + 64 * 512 + 640
    assert rep["op_counts"]["quantize"] >= 4 and rep["activations"]["quantized_inputs"] == "4/4 conv/linear"
    assert v["quantization"]["source_agreement"]["relative"] < 1e-5
    # Core ML cannot run here: parity measured on the fake-quantized torch model, and labelled so
    par = v["parity"]
    assert par["measured_on"] == "fake-quantized torch model" and par["measured"] == "stand-in"
    assert "only on macOS" in par["not_measured_on_target"]
    assert par["samples"] == 360 and par["value"] >= 0.99 and par["passed"] is True
    assert v["toolchain"]["coremltools"] == "9.0"


def test_w8_digits_via_cli_records_parity_not_measured(tmp_path):
    """w8 cannot be measured off macOS: the convert succeeds, and nothing claims a figure."""
    from click.testing import CliRunner

    from edge_runtime.cli import main

    need_coreml()
    out = tmp_path / "w8"
    res = CliRunner().invoke(main, [
        "convert", str(DIGITS / "model.onnx"), "-o", str(out), "--task", "image-classification", "--target",
        "coreml", "--recipe", "w8", "--calibration", str(DIGITS / "calibration"), "--parity-data",
        str(DIGITS / "held_out"), "--labels", str(DIGITS / "labels.txt"), "--preprocess",
        str(DIGITS / "preprocess.json")])
    assert res.exit_code == 0, res.output
    assert "coreml: buckets static; parity not measured: Core ML prediction runs only on macOS" in res.output
    (v,) = _manifest(out)["variants"]
    assert v["quantization"]["mode"] == "w8" and "linear_quantize_weights" in v["quantization"]["scheme"]
    # weights from their own ranges: no calibration sample shaped the package (it recorded all of them)
    cal = v["quantization"]["calibration"]
    assert cal["samples"] == 0 and cal["used"] is False and "fingerprint" not in cal, cal
    par = v["parity"]
    assert par["value"] is None and par["measured"] is False and par["passed"] is None and par["samples"] == 0
    assert "macOS" in par["not_measured"]
    rep = v["buckets"][0]["spec_validation"]
    assert rep["int8_weight_tensors"] == 4 and "quantize" not in rep["op_counts"]
    shown = CliRunner().invoke(main, ["inspect", str(out)])
    assert shown.exit_code == 0 and "coreml: buckets static" in shown.output and "parity not measured (Core ML prediction runs only on macOS" \
        in shown.output and "None" not in shown.output
    as_json = json.loads(CliRunner().invoke(main, ["inspect", str(out), "--json"]).output)
    assert as_json["variants"][0]["parity"]["value"] is None


def _float_package(tmp_path):
    """The digits model converted with float weights (no quantization)."""
    import torch

    from edge_runtime.converters.coreml import CoremlConverter
    from edge_runtime.converters.coreml_onnx2torch import translate

    need_coreml()
    module, _, _ = translate(DIGITS / "model.onnx")
    ml = CoremlConverter()._convert(module, (torch.zeros(1, 1, 8, 8),), *_digits_io(), {})
    out = tmp_path / "float.mlpackage"
    ml.save(str(out))
    return out


def _digits_io():
    return ([{"name": "image", "dtype": "float32", "shape": [1, 1, 8, 8]}],
            [{"name": "logits", "dtype": "float32", "shape": [1, 10]}])


def test_validation_rejects_float_weights(tmp_path):
    from edge_runtime.converters.coreml_spec import SpecInvalid, validate
    from edge_runtime.converters.registry import ConversionFailed

    pkg = _float_package(tmp_path)
    with pytest.raises(SpecInvalid, match="weight operand\\(s\\) are not int8") as ei:
        validate(pkg, *_digits_io(), "w8")
    assert isinstance(ei.value, ConversionFailed) and "no int8 weights at all" in str(ei.value)


def test_validation_rejects_tampered_blob_wrong_io_and_missing_activations(coreml_digits_artifact, tmp_path):
    from edge_runtime.converters.coreml_spec import SpecInvalid, validate

    src, _ = _package(coreml_digits_artifact)
    pkg = tmp_path / "p.mlpackage"
    shutil.copytree(src, pkg)
    ins, outs = _digits_io()
    assert validate(pkg, ins, outs, "w8a8")["passed"]
    with pytest.raises(SpecInvalid, match="inputs \\['image'\\] differ from the contract's \\['pixels'\\]"):
        validate(pkg, [dict(ins[0], name="pixels")], outs, "w8a8")
    with pytest.raises(SpecInvalid, match="has shape \\[1, 1, 8, 8\\].*the contract \\[1, 1, 16, 16\\]"):
        validate(pkg, [dict(ins[0], shape=[1, 1, 16, 16])], outs, "w8a8")
    with pytest.raises(SpecInvalid, match="mode w8 but the program quantizes activations"):
        validate(pkg, ins, outs, "w8")
    # the program says int8, the weight file's blob header is rewritten to say float16
    blob = pkg / "Data" / "com.apple.CoreML" / "weights" / "weight.bin"
    data = bytearray(blob.read_bytes())
    offset = 64
    while offset < len(data):
        sentinel, dtype, size, start = struct.unpack_from("<IIQQ", data, offset)
        assert sentinel == 0xDEADBEEF
        if dtype == 4 and size > 1000:      # an int8 weight tensor
            struct.pack_into("<I", data, offset + 4, 1)
            break
        offset = (start + size + 63) // 64 * 64
    blob.write_bytes(bytes(data))
    with pytest.raises(SpecInvalid, match="data is int8 in the program, float16 in the weight file"):
        validate(pkg, ins, outs, "w8a8")


def test_unsupported_onnx_op_fails_clearly(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from edge_runtime.converters.base import BuildContext
    from edge_runtime.converters.coreml import CoremlConverter
    from edge_runtime.converters.registry import ConversionFailed

    need_coreml()
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], np.eye(4, dtype=np.float32).ravel())
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                               helper.make_node("Erf", ["h"], ["y"], name="the_erf")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    path = tmp_path / "erf.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(ConversionFailed, match="ONNX op Erf \\(node 'the_erf'\\) is not supported") as ei:
        CoremlConverter().build_bucket(path, tmp_path / "out.mlpackage", [{"x": np.ones((1, 4), np.float32)}],
                                       BuildContext(task="tensors", recipe="w8", work=tmp_path))
    assert "torch_source" in str(ei.value) and not (tmp_path / "out.mlpackage").exists()
    with pytest.raises(ValueError, match="unknown coreml mode 'w4'"):
        CoremlConverter().build_bucket(path, tmp_path / "o2.mlpackage", [],
                                       BuildContext(task="tensors", recipe="w4", work=tmp_path))


def test_mismatched_torch_source_is_refused(tmp_path):
    import torch

    from edge_runtime.converters.base import BuildContext
    from edge_runtime.converters.coreml import CoremlConverter
    from edge_runtime.converters.coreml_onnx2torch import translate
    from edge_runtime.converters.registry import ConversionFailed

    need_coreml()
    module, _, _ = translate(DIGITS / "model.onnx")
    with torch.no_grad():
        module.m8_gemm.bias += 1.0              # a different model than the ONNX source
        traced = torch.jit.trace(module, torch.zeros(1, 1, 8, 8))
    traced.save(str(tmp_path / "other.pt"))
    feeds = [{"image": np.random.default_rng(0).random((1, 1, 8, 8), dtype=np.float32)}]
    with pytest.raises(ConversionFailed, match="disagrees with the ONNX source"):
        CoremlConverter().build_bucket(DIGITS / "model.onnx", tmp_path / "o.mlpackage", feeds,
                                       BuildContext(task="image-classification", recipe=None, work=tmp_path,
                                                    torch_source=tmp_path / "other.pt"))


def _digits_program(tmp_path, name="digits.bin"):
    """digits-cnn as a torch.export program saved under a suffix that says nothing."""
    import torch

    from edge_runtime.converters.coreml_onnx2torch import translate

    need_coreml()
    module, _, _ = translate(DIGITS / "model.onnx")
    torch.export.save(torch.export.export(module.eval(), (torch.zeros(1, 1, 8, 8),)), str(tmp_path / name))
    return tmp_path / name


def _static_digits(tmp_path):
    """The fp32 bucket the pipeline hands the converter: batch fixed to 1."""
    import onnx

    model = onnx.load(DIGITS / "model.onnx")
    for vi in (*model.graph.input, *model.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_value = 1
    onnx.save(model, tmp_path / "static.onnx")
    return tmp_path / "static.onnx"


def _digits_feeds(n=16):
    rng = np.random.default_rng(0)
    return [{"image": rng.random((1, 1, 8, 8), dtype=np.float32)} for _ in range(n)]


def test_torch_export_program_source_w8_and_default_w8a8(tmp_path):
    """A .pt2 (found by its archive, not its suffix) converts through ct.convert(ExportedProgram);
    its default is w8a8 (lifted conv/linear, calibrated) and both packages validate."""
    from edge_runtime.converters.base import BuildContext
    from edge_runtime.converters.coreml import CoremlConverter
    from edge_runtime.converters.coreml_export import source_kind

    src = _digits_program(tmp_path)
    assert source_kind(src) == "export"
    ctx = BuildContext(task="image-classification", work=tmp_path, torch_source=src)
    conv, fp32 = CoremlConverter(), _static_digits(tmp_path)
    w8 = conv.build_bucket(fp32, tmp_path / "w8.mlpackage", _digits_feeds(), dataclasses.replace(ctx, recipe="w8"))
    q = w8.quantization
    assert q["mode"] == "w8" and q["source"] == "torch.export program digits.bin"
    assert q["source_agreement"]["relative"] < 1e-5 and "w8a8_recipe" not in q
    rep = w8.fields["spec_validation"]
    assert rep["int8_weight_tensors"] == 4 and "quantize" not in rep["op_counts"]
    assert w8.fields["coreml"]["inputs"] == {"image": "float32"} and w8.entry == "Manifest.json"
    assert not conv._stand_ins                                 # w8: nothing to measure parity on here
    dflt = conv.build_bucket(fp32, tmp_path / "d.mlpackage", _digits_feeds(), ctx)
    q = dflt.quantization
    assert q["mode"] == "w8a8" and q["w8a8_recipe"]["smoothquant"]["groups"] == 0   # no LayerNorm/GELU
    rep = dflt.fields["spec_validation"]
    assert rep["activations"]["quantized_inputs"] == "4/4 conv/linear" and rep["int8_weight_tensors"] == 4
    assert len(conv._stand_ins) == 1


def test_torch_source_that_is_neither_fails_typed(tmp_path):
    import torch

    from edge_runtime.converters.base import BuildContext
    from edge_runtime.converters.coreml import CoremlConverter
    from edge_runtime.converters.registry import ConversionFailed

    need_coreml()
    (tmp_path / "notes.pt2").write_text("not a model")
    torch.save({"w": torch.zeros(2)}, tmp_path / "state.pt2")
    ctx = BuildContext(task="image-classification", work=tmp_path, recipe=None)
    for name, why in (("notes.pt2", "not a zip archive"), ("state.pt2", "a torch.save pickle")):
        with pytest.raises(ConversionFailed, match=f"torch source {name} is neither TorchScript nor a "
                                                   f"torch.export program \\(.pt2\\): {why}"):
            CoremlConverter().build_bucket(DIGITS / "model.onnx", tmp_path / "o.mlpackage", _digits_feeds(1),
                                           dataclasses.replace(ctx, torch_source=tmp_path / name))
    assert not (tmp_path / "o.mlpackage").exists()


# -- backend -----------------------------------------------------------------

def test_linux_unavailable_with_reason(coreml_digits_artifact):
    backend = CoremlBackend()
    s = backend.suitability("coreml", {"system": "Linux", "machine": "x86_64"})
    assert s.score == 0 and s.reason == "Core ML runs only on macOS"
    import platform

    if platform.system() != "Darwin":
        with pytest.raises(er.DeviceError, match="Core ML runs only on macOS"):
            er.load(coreml_digits_artifact, device="coreml", strict=True)   # auto may pick a test-registered faked backend


def test_preferred_on_apple_silicon():
    from edge_runtime.selection import assess, place

    backend = CoremlBackend()           # the default probe reads the record: no coremltools needed to assess
    mac = {"system": "Darwin", "machine": "arm64", "cpu": {}, "packages": {"coremltools": True}}

    def scored(hw, device=None):
        return place(backend.family, backend.suitability("coreml", hw, device), hw, "coreml")

    cm = scored(mac)
    assert cm.device == "coreml:auto" and "Apple Silicon" in cm.reason and cm.tier == "accelerator"
    others = [assess("onnxruntime", "onnx-int8", mac), assess("openvino", "openvino", mac)]
    assert all(cm.score > o.score for o in others)
    assert scored({**mac, "apple_silicon": True}).score == cm.score
    intel = scored({**mac, "machine": "x86_64", "apple_silicon": False})
    assert 0 < intel.score < cm.score and "Intel Mac" in intel.reason
    assert scored(mac, "cpu_only").device == "coreml:cpu_only"
    assert scored(mac, "gpu_only").score == 0
    assert "not installed" in scored({**mac, "packages": {"coremltools": False}}).reason


def test_compute_units_reach_the_model(coreml_faked_digits_artifact, coreml_fake):
    from fake_coreml import ComputeUnit

    with er.load(coreml_faked_digits_artifact, device="coreml-faked", strict=True,
                 device_options={"compute_units": "CPU_AND_NE"}) as rt:
        assert rt.device == "coreml-faked:cpu_and_ne"
        assert coreml_fake.loaded[-1].compute_units is ComputeUnit.CPU_AND_NE
        assert rt.info()["sessions"][0]["compute_units"] == "CPU_AND_NE"
    with er.load(coreml_faked_digits_artifact, device="coreml-faked:cpu_only", strict=True) as rt:
        assert rt.device == "coreml-faked:cpu_only" and coreml_fake.loaded[-1].compute_units is ComputeUnit.CPU_ONLY
    # the caller's option values are the caller's errors (exit 2), named with what is valid
    with pytest.raises(er.InputError, match="disagree") as ei:
        er.load(coreml_faked_digits_artifact, device="coreml-faked:cpu_only", device_options={"compute_units": "ALL"})
    assert ei.value.code == "device_option_invalid"
    with pytest.raises(er.InputError, match="compute_units must be one of ALL, CPU_AND_NE, CPU_ONLY, CPU_AND_GPU, "
                                            "got 'gpu_only'") as ei:
        er.load(coreml_faked_digits_artifact, device="coreml-faked", strict=True,
                device_options={"compute_units": "gpu_only"})
    assert ei.value.code == "device_option_invalid"


def test_faked_predictions_are_the_twins(coreml_faked_digits_artifact, coreml_fake):
    """The backend feeds the spec's inputs and maps outputs back: results equal the fp32 twin's."""
    import onnxruntime as ort

    ref = ort.InferenceSession(str(DIGITS / "model.onnx"), providers=["CPUExecutionProvider"])
    with er.load(coreml_faked_digits_artifact, device="coreml-faked", strict=True) as rt:
        img = np.tile(np.arange(8, dtype=np.uint8) * 30, (8, 1))
        prepared = rt.task.prepare(img, rt.limits)
        logits = ref.run(None, prepared.feeds)[0]
        res = rt.infer(img)
        assert res.prediction == rt.task.labels[int(logits.argmax())]
        assert coreml_fake.loaded[-1].calls > 0


def test_package_with_unlisted_file_or_symlink_is_refused(coreml_digits_artifact, coreml_fake, tmp_path):
    for i, tamper in enumerate(("extra", "symlink")):
        art = tmp_path / f"a{i}"
        shutil.copytree(coreml_digits_artifact, art)
        pkg, _ = _package(art)
        add_coreml_twins(coreml_fake, art, DIGITS / "model.onnx")
        if tamper == "extra":
            (pkg / "Data" / "extra.bin").write_bytes(b"x")
        else:
            (pkg / "Data" / "link").symlink_to(pkg / "Manifest.json")
        with pytest.raises(er.ArtifactError) as ei:
            er.load(art, device="coreml-faked", strict=True)
        assert ei.value.code == ("artifact_file_unlisted" if tamper == "extra" else "artifact_path_escapes")


# -- MiniLM (slow: exports and converts the real model) -------------------------

@pytest.mark.slow
@pytest.mark.parametrize("task", ["text-embedding", "text-classification"])
def test_minilm_coreml_variants(task, request):
    """The zoo converts MiniLM from its torch.export program: w8a8 by default, FFN2 inputs float."""
    art = request.getfixturevalue("coreml_minilm_embedding_artifact" if task == "text-embedding"
                                  else "coreml_minilm_classifier_artifact")
    (v,) = _manifest(art)["variants"]
    q = v["quantization"]
    name = "embedding.pt2" if task == "text-embedding" else "classifier.pt2"
    assert q["mode"] == "w8a8" and q["source"] == f"torch.export program {name}"
    assert q["source_agreement"]["relative"] < 1e-3
    rec = q["w8a8_recipe"]
    assert rec["smoothquant"] == {"alpha": 0.8, "groups": 12}          # Q/K/V and FFN1 of 6 layers
    assert rec["quantization_scheme"] == "affine"       # the classifier's margin: 0.9943 vs 0.9920 symmetric
    floats = rec["float_input_layers"]["layers"]
    assert len(floats) == 6 and all(f.endswith("output.dense.linear") and ".attention." not in f for f in floats)
    assert rec["fake_quant_vs_finalized"]["relative"] < 0.1
    seqs = (64, 128) if task == "text-embedding" else (64,)         # the test classifier has one bucket
    assert [b["name"] for b in v["buckets"]] == [f"seq{n}" for n in seqs]
    out = "last_hidden_state" if task == "text-embedding" else "logits"
    linears = 36 if task == "text-embedding" else 37                    # + the classifier's label-matrix head
    for b, seq in zip(v["buckets"], seqs):
        assert [t["name"] for t in b["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
        assert all(t["dtype"] == "int64" and t["shape"] == [1, seq] for t in b["inputs"])   # the ONNX contract
        assert b["coreml"]["inputs"] == {n: "int32" for n in ("input_ids", "attention_mask", "token_type_ids")}
        assert b["outputs"][0]["name"] == out
        rep = b["spec_validation"]
        # every linear's weights + 3 embedding tables int8 (tables weight-only)
        assert rep["passed"] and rep["int8_weight_tensors"] == linears + 3
        assert rep["int8_weight_elements"] > 22_000_000 and rep["float_constant_elements"] < 100_000
        assert rep["activations"]["quantized_inputs"] == f"{linears - 6}/{linears} conv/linear"
        assert rep["activations"]["float_inputs_by_recipe"] == 6 and rep["op_counts"]["quantize"] >= 18
        assert b["package_bytes"] < 30_000_000
    par = v["parity"]      # Core ML cannot run here: measured on the fake-quantized model, labelled so
    assert par["measured_on"] == "fake-quantized torch model" and par["measured"] == "stand-in"
    assert "only on macOS" in par["not_measured_on_target"] and par["passed"] is True
    assert par["value"] >= 0.99 and par["samples"] == (129 if task == "text-embedding" else 872)


@pytest.mark.slow
def test_minilm_embedding_through_faked_boundary(coreml_minilm_embedding_artifact, coreml_fake, minilm_sources):
    add_coreml_twins(coreml_fake, coreml_minilm_embedding_artifact, minilm_sources / "embedding.onnx")
    with er.load(coreml_minilm_embedding_artifact, device="coreml-faked", strict=True) as rt:
        a = rt.infer("Stock market crashes!")
        b = rt.infer("Shares plunged on Wall Street after the report. " * 10)
        assert a.bucket == "seq64" and b.bucket == "seq128"
        assert coreml_fake.loaded[-1].inputs["input_ids"] == ([1, 128], np.int32)   # what Core ML is fed
        assert abs(np.linalg.norm(a.embedding) - 1) < 1e-4 and float(a.embedding @ b.embedding) > 0.3


@pytest.mark.slow
def test_minilm_torchscript_source_w8_and_no_w8a8(tmp_path_factory, minilm_sources):
    """From the TorchScript twin: w8 converts (parity not measurable here); w8a8 fails typed."""
    from conftest import _convert_minilm

    need_coreml()
    ts = minilm_sources / "embedding.pt"
    art = _convert_minilm(tmp_path_factory, "text-embedding", targets=("coreml",), torch_source=ts,
                          buckets=[64])
    (v,) = _manifest(art)["variants"]
    assert v["quantization"]["mode"] == "w8" and v["quantization"]["source"] == "TorchScript embedding.pt"
    rep = v["buckets"][0]["spec_validation"]
    assert rep["int8_weight_tensors"] == 39 and "quantize" not in rep["op_counts"]
    assert v["parity"]["value"] is None and v["parity"]["measured"] is False
    with pytest.raises(er.InputError, match="w8a8 needs an FX-traceable torch module") as ei:
        _convert_minilm(tmp_path_factory, "text-embedding", targets=("coreml",), recipe="w8a8", torch_source=ts)
    assert ei.value.code == "convert_target_failed"


def test_contract_names_core_ml_cannot_take_map_to_identifiers():
    """ML Program features must be identifiers: NanoDet's ``input.1`` and ``792`` get a name
    Core ML takes (recorded in the bucket's tensor_names and the package metadata); identifiers
    stay as they are; two names never collide."""
    from edge_runtime.converters.coreml import core_names

    m = core_names(["input.1", "792", "input_ids", "t_792", "a-b", "a.b"])
    assert m["input_ids"] == "input_ids" and m["t_792"] == "t_792"
    assert m["input.1"] == "t_input_1" and m["792"] == "t_792_"
    assert len(set(m.values())) == len(m)
    import re

    assert all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v) for v in m.values())


def test_a_model_whose_names_core_ml_cannot_take_converts_and_runs_under_its_own_names(tmp_path):
    import onnx
    from fake_coreml import FakeCoremltools
    from onnx import TensorProto, helper

    from edge_runtime.converters.base import BuildContext
    from edge_runtime.converters.coreml import CoremlConverter
    from edge_runtime.devices.coreml_backend import CoremlSession

    need_coreml()
    rng = np.random.default_rng(0)
    wv = rng.standard_normal((3, 4)).astype(np.float32)
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 4], wv.ravel())
    graph = helper.make_graph([helper.make_node("Gemm", ["input.1", "w"], ["792"], transB=1)], "g",
                              [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("792", TensorProto.FLOAT, [1, 3])], [w])
    path = tmp_path / "odd_names.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    feeds = [{"input.1": rng.standard_normal((1, 4)).astype(np.float32)} for _ in range(4)]
    built = CoremlConverter().build_bucket(path, tmp_path / "m.mlpackage", feeds,
                                           BuildContext(task="tensors", recipe="w8", work=tmp_path))
    assert built.fields["tensor_names"] == {"input.1": "t_input_1", "792": "t_792"}
    assert set(built.fields["coreml"]["inputs"]) == {"input.1"}          # keyed by the contract's names
    bucket = {"inputs": built.inputs, "outputs": built.outputs, **built.fields}
    fake = FakeCoremltools({str((tmp_path / "m.mlpackage").resolve()): str(path)})
    sess = CoremlSession((tmp_path / "m.mlpackage").resolve(), bucket, "ALL", fake, "coreml-faked")
    out = sess.run(feeds[0])
    want = feeds[0]["input.1"] @ wv.T
    assert list(out) == ["792"] and np.allclose(out["792"], want, atol=1e-5)
