"""Core ML: wrong answers with exit 0 and claims about where it ran (the hunt).

Runs on Linux: conversion is real coremltools; execution only through the faked boundary
(tests/fake_coreml.py) or real coremltools without Core ML behind it."""

import json
import platform

import numpy as np
import pytest

import edge_runtime as er
from conftest import need_coreml
from edge_runtime.devices.coreml_backend import CoremlBackend


def _manifest(path):
    return json.loads((path / "manifest.json").read_text())


# -- float16 compute: an activation past 65504 is inf on Core ML, invisible in float32 -------------

def _scaled_matmul(tmp_path, scale=1000.0):
    import onnx
    from onnx import TensorProto, helper

    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 4], (np.eye(4, dtype=np.float32) * scale).ravel())
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    path = tmp_path / "big.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_float16_overflow_is_refused_not_packaged(tmp_path):
    """y = 1000·x with x ≈ 100: 1e5 > 65504. A float16 ML program gives inf for every output, the
    float32 torch model (and the parity stand-in) 1e5: the convert must not pass it."""
    from edge_runtime.converters.base import BuildContext
    from edge_runtime.converters.coreml import CoremlConverter
    from edge_runtime.converters.registry import ConversionFailed

    need_coreml()
    src = _scaled_matmul(tmp_path)
    feeds = [{"x": np.full((1, 4), 100.0, np.float32)} for _ in range(3)]
    ctx = BuildContext(task="tensors", recipe="w8", work=tmp_path)
    with pytest.raises(ConversionFailed, match="reaches 1e\\+05 at .*beyond float16's largest value 65504") as ei:
        CoremlConverter().build_bucket(src, tmp_path / "o.mlpackage", feeds, ctx)
    assert "compute_precision" in str(ei.value) and not (tmp_path / "o.mlpackage").exists()
    # the way out it names: float32 compute converts, and records no float16 range
    ok = CoremlConverter().build_bucket(src, tmp_path / "f32.mlpackage", feeds,
                                        BuildContext(task="tensors", recipe="w8", work=tmp_path,
                                                     overrides={"compute_precision": "float32"}))
    assert ok.quantization["compute_precision"] == "float32" and "float16_range" not in ok.quantization


def test_float16_range_is_recorded(coreml_digits_artifact):
    (v,) = _manifest(coreml_digits_artifact)["variants"]
    r = v["quantization"]["float16_range"]
    assert r["fits"] is True and 0 < r["max_abs"] <= 65504 and r["float16_max"] == 65504
    assert r["samples"] > 0 and r["checked"] == "conv/linear/matmul outputs and model outputs"


def test_float16_range_sees_intermediates_not_only_outputs():
    """An overflow inside the graph that a later op scales back down is still an overflow."""
    import torch

    from edge_runtime.converters.coreml_torch import float16_range

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(4, 4)
            self.down = torch.nn.Linear(4, 1)
            with torch.no_grad():
                self.up.weight.copy_(torch.eye(4) * 1e4)
                self.up.bias.zero_()
                self.down.weight.fill_(1e-4)
                self.down.bias.zero_()

        def forward(self, x):
            return self.down(self.up(x))

    gm = torch.fx.symbolic_trace(M())
    feeds = [{"x": np.full((1, 4), 10.0, np.float32)}]
    r = float16_range(gm, feeds, ["x"])
    assert not r["fits"] and r["max_abs"] == pytest.approx(1e5) and r["at"] == "up"
    with torch.no_grad():
        assert float(gm(torch.from_numpy(feeds[0]["x"])).abs().max()) == pytest.approx(40)   # the output alone fits


# -- where it ran: compute units allow units; Core ML never says which ran -------------------------

MAC = {"system": "Darwin", "machine": "arm64", "cpu": {}, "packages": {"coremltools": True}}


def test_cpu_only_is_not_an_accelerator_and_no_neural_engine_is_claimed():
    from edge_runtime.selection import place

    backend = CoremlBackend()

    def scored(hw, device=None):
        return place(backend.family, backend.suitability("coreml", hw, device), hw, "coreml")

    cpu_only = scored(MAC, "cpu_only")
    assert cpu_only.tier == "cpu" and "Neural Engine" not in cpu_only.reason and "CPU only" in cpu_only.reason
    assert cpu_only.score < scored(MAC).score
    gpu = scored(MAC, "cpu_and_gpu")
    assert "no Neural Engine" in gpu.reason
    intel_ne = scored({**MAC, "machine": "x86_64", "apple_silicon": False}, "cpu_and_ne")
    assert intel_ne.tier == "cpu" and "CPU only (no Neural Engine)" in intel_ne.reason
    assert intel_ne.reason.count("Neural Engine") == 1, intel_ne.reason     # it said so twice before 2026-12-07
    for units in ("auto", "all", "cpu_and_ne"):
        r = scored(MAC, None if units == "auto" else units).reason
        assert "does not report which unit ran" in r, r


def test_session_says_placement_is_not_reported(coreml_faked_digits_artifact, coreml_fake):
    with er.load(coreml_faked_digits_artifact, device="coreml-faked:cpu_and_ne", strict=True) as rt:
        (s,) = rt.info()["sessions"]
        assert s["compute_units"] == "CPU_AND_NE" and s["allowed_units"] == "Neural Engine or CPU"
        assert s["placement"].startswith("not reported")


# -- real coremltools without Core ML behind it: device unavailable at load, not a late crash ------

@pytest.mark.skipif(platform.system() == "Darwin", reason="on macOS coremltools has Core ML behind it")
def test_real_coremltools_off_macos_is_device_unavailable_at_load(coreml_digits_artifact):
    """coremltools' MLModel loads on Linux with no Core ML behind it (a warning at most) and every
    predict raises a bare Exception: the load must say the device is unavailable."""
    import coremltools

    from edge_runtime.devices import registry

    need_coreml()
    mac = lambda hw: {"installed": True, "macos": True, "apple_silicon": True}  # noqa: E731
    registry.register("coreml-realct", lambda: CoremlBackend(module=coremltools, probe=mac, name="coreml-realct"))
    with pytest.raises(er.DeviceError, match="Core ML runs only on macOS \\(this host: Linux\\)") as ei:
        er.load(coreml_digits_artifact, device="coreml-realct", strict=True)
    assert ei.value.code == "device_unavailable"


# -- feature names coremltools renames by itself: mapped, and mapped back -------------------------

def test_reserved_and_non_identifier_names_map_back(tmp_path):
    """``tensor`` and ``state`` are identifiers, but MIL reserves them: coremltools renamed them to
    ``tensor_workaround``/``state_workaround`` and the convert failed; ``2 x`` is no identifier.
    All three get Core ML names of ours, recorded, and the session maps feeds and outputs back."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from edge_runtime.converters.base import BuildContext
    from edge_runtime.converters.coreml import CoremlConverter
    from edge_runtime.devices.coreml_backend import CoremlSession
    from fake_coreml import FakeCoremltools

    need_coreml()
    rng = np.random.default_rng(1)
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3], rng.standard_normal((4, 3)).astype(np.float32).ravel())
    graph = helper.make_graph([helper.make_node("MatMul", ["tensor", "w"], ["h"], name="mm"),
                               helper.make_node("Add", ["h", "2 x"], ["state"], name="add")], "g",
                              [helper.make_tensor_value_info("tensor", TensorProto.FLOAT, [1, 4]),
                               helper.make_tensor_value_info("2 x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("state", TensorProto.FLOAT, [1, 3])], [w])
    src = tmp_path / "names.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    feeds = [{"tensor": rng.standard_normal((1, 4)).astype(np.float32),
              "2 x": rng.standard_normal((1, 3)).astype(np.float32)} for _ in range(4)]
    pkg = tmp_path / "n.mlpackage"
    built = CoremlConverter().build_bucket(src, pkg, feeds, BuildContext(task="tensors", recipe="w8", work=tmp_path))
    names = built.fields["tensor_names"]
    assert names == {"tensor": "t_tensor", "2 x": "t_2_x", "state": "t_state"}
    assert built.fields["coreml"]["inputs"] == {"tensor": "float32", "2 x": "float32"}
    bucket = {"inputs": built.inputs, "outputs": built.outputs, **built.fields}
    fake = FakeCoremltools({str(pkg): str(src)})
    sess = CoremlSession(pkg, bucket, "ALL", fake, "coreml-faked:all")
    assert set(fake.loaded[-1].inputs) == {"t_tensor", "t_2_x"} and fake.loaded[-1].outputs == ["t_state"]
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    got = sess.run(feeds[0])
    assert list(got) == ["state"]
    np.testing.assert_allclose(got["state"], ref.run(["state"], feeds[0])[0], rtol=1e-6)


def test_parity_precision_is_recorded_not_assumed(coreml_digits_artifact):
    """The w8a8 parity figure comes from a float32 stand-in; the package computes in float16."""
    (v,) = _manifest(coreml_digits_artifact)["variants"]
    q = v["quantization"]
    assert q["compute_precision"] == "float16" and v["parity"]["measured_on"] == "fake-quantized torch model"
    assert q["parity_precision"].startswith("float32: the fake-quantized torch stand-in computes in float32")
    assert "float16 rounding is not in the parity figure" in q["parity_precision"]


# -- recipe auto: the next trial is not measured on the previous trial's stand-ins ---------------

def test_w8_trial_after_w8a8_gets_no_stale_stand_in(tmp_path):
    """``recipe auto`` builds w8a8, then (under budget) w8 into the same package with the same
    converter: the w8 variant was 'measured on the fake-quantized torch model' of the w8a8 trial
    (its figure, so refused again) instead of 'not measured'."""
    from test_coreml import _digits_feeds, _static_digits

    from edge_runtime.converters.base import BuildContext
    from edge_runtime.converters.coreml import CoremlConverter

    need_coreml()
    conv, fp32 = CoremlConverter(), _static_digits(tmp_path)
    root = tmp_path / "art"
    pkg = root / "coreml" / "static.mlpackage"
    pkg.parent.mkdir(parents=True)
    ctx = BuildContext(task="image-classification", work=tmp_path)

    def bucket(build):
        return {"name": "static", "package": "coreml/static.mlpackage", "file": "coreml/static.mlpackage/"
                "Manifest.json", "inputs": build.inputs, "outputs": build.outputs}

    a8 = conv.build_bucket(fp32, pkg, _digits_feeds(), ctx)                       # default: w8a8
    assert a8.quantization["mode"] == "w8a8"
    stand_in = conv.parity_stand_in([bucket(a8)])
    assert stand_in is not None and stand_in.label == "fake-quantized torch model"
    w8 = conv.build_bucket(fp32, pkg, _digits_feeds(), BuildContext(task="image-classification", work=tmp_path,
                                                                   recipe="w8"))
    assert w8.quantization["mode"] == "w8"
    assert conv.parity_stand_in([bucket(w8)]) is None


# -- w8a8, ONNX route: the parity stand-in is compared with what is converted -----------------------

def test_stand_in_vs_finalized_is_measured_on_the_onnx_route(coreml_digits_artifact):
    (v,) = _manifest(coreml_digits_artifact)["variants"]
    q = v["quantization"]
    assert q["source"].startswith("ONNX → torch") and "w8a8_recipe" not in q
    r = q["fake_quant_vs_finalized"]
    assert r["samples"] == 4 and r["relative"] < 0.05      # one quantization step of rounding (0.008 here)


def test_stand_in_that_is_not_the_converted_model_is_refused(tmp_path, monkeypatch):
    """The parity figure is measured on the fake-quantized model and claimed for the package
    converted from the finalized one: where they differ, the convert must not pass it."""
    import torch

    from test_coreml import _digits_feeds, _static_digits

    from edge_runtime.converters import coreml_torch
    from edge_runtime.converters.base import BuildContext
    from edge_runtime.converters.coreml import CoremlConverter
    from edge_runtime.converters.registry import ConversionFailed

    need_coreml()
    real = coreml_torch.calibrate_w8a8

    class Shifted(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x) + 5.0

    def drifting(*args, **kwargs):
        prepared, finalized = real(*args, **kwargs)
        return prepared, Shifted(finalized)

    monkeypatch.setattr(coreml_torch, "calibrate_w8a8", drifting)
    conv = CoremlConverter()
    with pytest.raises(ConversionFailed, match="the fake-quantized model \\(the parity stand-in\\) and the "
                                               "finalized model \\(what is converted\\) disagree"):
        conv.build_bucket(_static_digits(tmp_path), tmp_path / "o.mlpackage", _digits_feeds(),
                          BuildContext(task="image-classification", work=tmp_path))
    assert conv.parity_stand_in([{"package": "o.mlpackage", "inputs": [], "outputs": []}]) is None
