"""The ``tensors`` task and ``edge-infer infer --input``: inputs that answered wrongly with exit 0
(or were refused while correct), each pinned here.

- a list fed to a ``bool`` input was cast (2 and 0.5 fed as True);
- a rank-0 (scalar) input raised ``IndexError`` on every call (``input_invalid``);
- a quantized input took a same-width array of the other signedness (uint8 for int8) or a bool
  array as its codes whenever the values happened to fit;
- a float narrowing (float32 1e5 to a float16 input, float64 1e300 to float32) overflowed to
  infinity: fed as inf under ``allow_nonfinite``, otherwise misreported as a NaN/inf input;
- a masked array's masked elements were fed as if given;
- a dict of lists counted 0 bytes against ``max_request_bytes``;
- a single-input model refused its array as a list, so ``{"inputs": [...]}`` (a model whose input
  is named ``inputs``) was refused by ``infer --input F.json``;
- an int32 quantized output past 2**24 was rounded before its zero point was taken off;
- parity paired outputs by position, not by name;
- a calibration ``.npz`` whose arrays hold different sample counts was cut to the first's, and
  every sample re-read every whole array;
- an ``.npz`` holding one array name twice was read as its last copy.

Artifacts are built as ``tests/factories.py`` builds them (the fake backend), and the quantized
path on LiteRT with ``tests/tflite_builder.py``.
"""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest
from click.testing import CliRunner

import edge_runtime as er
from edge_runtime.artifact import ArtifactWriter
from edge_runtime.manifest import FORMAT, FORMAT_VERSION
from edge_runtime.models.results import Outputs, Prepared, TaskOutput
from edge_runtime.models.tensors import Tensors
from factories import _t, _variant


def _art(root, inputs, outputs=None, pre=None, limits=None):
    """A fake-backend tensors artifact with these input specs (outputs: ``y`` float32 [1, 3])."""
    w = ArtifactWriter(root)
    spec = {"name": "static", "inputs": inputs, "outputs": outputs or [_t("y", "float32", [1, 3])]}
    w.write_manifest({"format": FORMAT, "format_version": FORMAT_VERSION, "model": {"name": "t", "version": "1"},
                      "task": "tensors", "files": {}, "preprocess": {"kind": "tensors", **(pre or {})},
                      "postprocess": {}, "limits": dict(limits or {}), "variants": [_variant(w, root, [spec])]})
    return root


def _code(rt, raw):
    with pytest.raises(er.InputError) as ei:
        rt.infer(raw)
    return ei.value.code


def _task(inputs, outputs=None) -> Tensors:
    bucket = {"name": "static", "inputs": inputs, "outputs": outputs or [_t("y", "float32", [1, 3])]}
    return Tensors({"preprocess": {"kind": "tensors"}, "postprocess": {}}, lambda rel: b"", [bucket])


# -- bool inputs ---------------------------------------------------------------------------------

def test_a_list_for_a_bool_input_must_hold_booleans_or_0_and_1(tmp_path):
    with er.load(_art(tmp_path / "a", [_t("m", "bool", [1, 3])]), device="fake", warmup=False) as rt:
        want = rt.infer({"m": np.array([[False, True, True]])}).outputs["y"]
        np.testing.assert_array_equal(rt.infer({"m": [0, 1, 1]}).outputs["y"], want)
        np.testing.assert_array_equal(rt.infer({"m": [False, True, True]}).outputs["y"], want)
        assert _code(rt, {"m": [0, 1, 2]}) == "input_out_of_range"      # 2 was fed as True
        assert _code(rt, {"m": [0, -1, 1]}) == "input_out_of_range"
        assert _code(rt, {"m": [0.0, 0.5, 1.0]}) == "input_wrong_dtype"  # 0.5 was fed as True


# -- rank-0 inputs ---------------------------------------------------------------------------------

def test_a_scalar_input_takes_a_scalar(tmp_path):
    art = _art(tmp_path / "a", [_t("s", "float32", []), _t("x", "float32", [1, 2])])
    with er.load(art, device="fake", warmup=False) as rt:
        x = np.array([[1.0, 2.0]], np.float32)
        want = rt.infer({"s": np.array(2.5, np.float32), "x": x}).outputs["y"]
        for s in (2.5, np.float32(2.5), np.array(2.5), np.array(2.5, np.float32)):
            np.testing.assert_array_equal(rt.infer({"s": s, "x": x}).outputs["y"], want)
        assert _code(rt, {"s": [2.5], "x": x}) == "input_wrong_shape"


# -- quantized inputs -----------------------------------------------------------------------------

ZP = {"int8": -128, "uint8": 128}


def _qspec(dtype):
    return {**_t("q", dtype, [1, 3]), "quantization": {"scale": 0.5, "zero_point": ZP[dtype]}}


@pytest.mark.parametrize("model, given", [("int8", np.uint8), ("uint8", np.int8)])
def test_a_quantized_input_refuses_codes_of_the_other_signedness_whatever_their_values(tmp_path, model, given):
    """A dark uint8 image (every value < 128) was fed to an int8 model as its codes; a brighter one
    was refused: the same mistake answered or not by the data."""
    with er.load(_art(tmp_path / "a", [_qspec(model)]), device="fake", warmup=False) as rt:
        err = pytest.raises(er.InputError, rt.infer, {"q": np.array([[1, 2, 3]], given)}).value
        assert err.code == "input_wrong_dtype" and "quantized" in err.message and f"zero point {ZP[model]}" in err.message
        assert _code(rt, {"q": np.array([[True, False, True]])}) == "input_wrong_dtype"
        # the model's own codes, and plain integers (numpy's int64, a list) in range, are fed as before
        want = rt.infer({"q": np.array([[1, 2, 3]], model)}).outputs["y"]
        np.testing.assert_array_equal(rt.infer({"q": np.array([[1, 2, 3]], np.int64)}).outputs["y"], want)
        np.testing.assert_array_equal(rt.infer({"q": [1, 2, 3]}).outputs["y"], want)


def test_an_int64_array_for_a_uint8_input_is_range_checked_like_a_list(tmp_path):
    """numpy's default integer array (int64) for a uint8 input was refused (int64 -> uint8 is not a
    same-kind cast) while the same values as a list were fed."""
    with er.load(_art(tmp_path / "a", [_t("p", "uint8", [1, 3])]), device="fake", warmup=False) as rt:
        want = rt.infer({"p": np.array([[0, 128, 255]], np.uint8)}).outputs["y"]
        np.testing.assert_array_equal(rt.infer({"p": np.array([[0, 128, 255]])}).outputs["y"], want)
        np.testing.assert_array_equal(rt.infer({"p": [0, 128, 255]}).outputs["y"], want)
        assert _code(rt, {"p": np.array([[0, 256, 1]])}) == "input_out_of_range"
        assert _code(rt, {"p": np.array([[0, -1, 1]], np.int8)}) == "input_out_of_range"


def test_floats_for_a_quantized_input_are_refused_with_how_to_quantize(tmp_path):
    with er.load(_art(tmp_path / "a", [_qspec("int8")]), device="fake", warmup=False) as rt:
        for raw in ({"q": np.array([[0.5, 1.0, 1.5]], np.float32)}, {"q": [0.5, 1.0, 1.5]}):
            err = pytest.raises(er.InputError, rt.infer, raw).value
            assert err.code == "input_wrong_dtype" and "round(x / scale) + zero_point" in err.message
            assert "scale 0.5, zero point -128" in err.message


def test_quantized_litert_model_refuses_uint8_codes_for_its_int8_input(tmp_path):
    """The same on a real quantized TFLite model (int8 x [1, 2, 2, 3] -RESHAPE-> int8 y [1, 12],
    scale 0.5, zero point 1): uint8 codes under 128 were fed and answered."""
    pytest.importorskip("tflite")
    pytest.importorskip("ai_edge_litert.interpreter")
    from tflite.BuiltinOperator import BuiltinOperator as B

    from edge_runtime.converters.import_common import import_model
    from tflite_builder import I8, I32, build_model

    q = ([0.5], [1], 0)
    model = tmp_path / "m.tflite"
    model.write_bytes(build_model([("x", I8, [1, 2, 2, 3], None, 0, q), ("new_shape", I32, [2], None, 1),
                                   ("y", I8, [1, 12], None, 0, q)], [(B.RESHAPE, None, [0, 1], [2])], [0], [2],
                                  [b"", np.array([1, 12], dtype=np.int32).tobytes()]))
    import_model(model, tmp_path / "art", task="tensors")
    with er.load(tmp_path / "art", warmup=False) as rt:
        codes = np.arange(12, dtype=np.int8).reshape(1, 2, 2, 3)
        res = rt.infer({"x": codes})
        np.testing.assert_array_equal(res.outputs["y"], (codes.reshape(1, 12).astype(np.float32) - 1) * 0.5)
        assert _code(rt, {"x": codes.astype(np.uint8)}) == "input_wrong_dtype"


# -- float narrowing ----------------------------------------------------------------------------

def test_a_float16_input_refuses_values_past_its_range_even_when_nonfinite_is_allowed(tmp_path):
    art = _art(tmp_path / "a", [_t("x", "float16", [1, 3])], pre={"allow_nonfinite": True})
    with er.load(art, device="fake", warmup=False) as rt:
        for raw in (np.array([[1e5, 1.0, 2.0]], np.float32), [1e5, 1.0, 2.0], np.array([[70000, 1, 2]], np.int32)):
            err = pytest.raises(er.InputError, rt.infer, {"x": raw}).value      # was fed as float16 inf
            assert err.code == "input_out_of_range" and "float16" in err.message, raw
        # infinity given is infinity allowed; 65504 (float16's max) is a value
        assert rt.infer({"x": np.array([[np.inf, 65504.0, 1.0]], np.float32)}).outputs["y"].shape == (1, 3)


def test_a_float64_past_float32_is_out_of_range_not_a_nan_input(tmp_path):
    with er.load(_art(tmp_path / "a", [_t("x", "float32", [1, 3])]), device="fake", warmup=False) as rt:
        assert _code(rt, {"x": np.array([[1e300, 1.0, 2.0]])}) == "input_out_of_range"
        assert _code(rt, {"x": [1e300, 1.0, 2.0]}) == "input_out_of_range"
        assert _code(rt, {"x": np.array([[np.nan, 1.0, 2.0]])}) == "input_nonfinite"


# -- masked arrays --------------------------------------------------------------------------------

def test_a_masked_array_with_masked_elements_is_refused(tmp_path):
    with er.load(_art(tmp_path / "a", [_t("x", "float32", [1, 3])]), device="fake", warmup=False) as rt:
        hidden = np.ma.masked_array(np.array([[1.0, 99.0, 3.0]], np.float32), mask=[[False, True, False]])
        err = pytest.raises(er.InputError, rt.infer, {"x": hidden}).value    # 99 was fed, unseen
        assert err.code == "input_wrong_type" and "masked" in err.message
        plain = np.array([[1.0, 2.0, 3.0]], np.float32)
        np.testing.assert_array_equal(rt.infer({"x": np.ma.masked_array(plain)}).outputs["y"],
                                      rt.infer({"x": plain}).outputs["y"])


# -- the request limit ----------------------------------------------------------------------------

def test_lists_count_against_the_request_limit_as_the_arrays_they_become(tmp_path):
    art = _art(tmp_path / "a", [_t("x", "float32", [1, 4]), _t("k", "int32", [1, 2])])
    with er.load(art, device="fake", warmup=False) as rt:
        lim = {"max_request_bytes": 16}         # x alone is 16 bytes as float32, k 8 as int32
        as_arrays = {"x": np.ones((1, 4), np.float32), "k": np.ones((1, 2), np.int32)}
        as_lists = {"x": [[1.0, 1.0, 1.0, 1.0]], "k": [1, 1]}
        assert rt.task.request_bytes(as_lists) == rt.task.request_bytes(as_arrays) == 24
        for raw in (as_arrays, as_lists):
            with pytest.raises(er.InputError) as ei:
                rt.infer(raw, limits=lim)
            assert ei.value.code == "input_too_large"
            with pytest.raises(er.InputError) as ei:
                rt.infer_batch([raw], limits=lim)
            assert ei.value.code == "input_too_large"
        assert rt.infer(as_lists, limits={"max_request_bytes": 24}).outputs["y"].shape == (1, 3)


# -- a single-input model named "inputs" -----------------------------------------------------------

def test_a_single_input_model_takes_a_list_and_infer_input_json_for_an_input_named_inputs(tmp_path):
    from edge_runtime.cli import main

    art = _art(tmp_path / "a", [_t("inputs", "float32", [1, 4])])
    with er.load(art, device="fake", warmup=False) as rt:
        want = rt.infer(np.array([[1, 2, 3, 4]], np.float32)).outputs["y"]
        np.testing.assert_array_equal(rt.infer([1.0, 2.0, 3.0, 4.0]).outputs["y"], want)
    doc = tmp_path / "in.json"
    doc.write_text(json.dumps({"inputs": [[1, 2, 3, 4]]}))
    res = CliRunner().invoke(main, ["infer", str(art), "--input", str(doc), "--device", "fake", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    np.testing.assert_allclose(out["outputs"]["y"]["data"], want.tolist(), rtol=1e-6)


# -- dequantization ---------------------------------------------------------------------------------

def test_int32_quantized_outputs_dequantize_exactly_past_2_24():
    zp = 2 ** 24
    task = _task([_t("x", "float32", [1, 3])],
                 [{**_t("acc", "int32", [1, 3]), "quantization": {"scale": 0.25, "zero_point": zp}},
                  {**_t("c", "int8", [1, 2]), "quantization": {"scale": 0.5, "zero_point": -3}}])
    acc = np.array([[zp + 1, zp - 3, zp + 1001]], np.int32)
    c = np.array([[-3, 5]], np.int8)
    out = task.finish({"acc": acc, "c": c}, Prepared(bucket=0, feeds={}))
    np.testing.assert_array_equal(out.outputs["acc"], np.array([[0.25, -0.75, 250.25]], np.float32))  # was [0, -1, 250]
    assert out.outputs["acc"].dtype == np.float32
    np.testing.assert_array_equal(out.outputs["c"], np.array([[0.0, 4.0]], np.float32))
    assert out.raw_outputs["acc"] is acc and out.raw_outputs["c"] is c


# -- parity ---------------------------------------------------------------------------------------

def test_parity_pairs_outputs_by_name_not_by_position():
    a, b = np.array([1.0, 0.0, 2.0], np.float32), np.array([0.0, 5.0], np.float32)
    ref = [TaskOutput(outputs=Outputs({"scores": a, "boxes": b}))]
    cand = [TaskOutput(outputs=Outputs({"boxes": b.copy(), "scores": a.copy()}))]   # another variant's order
    figures = Tensors.compare(ref, cand)
    assert figures["value"] == pytest.approx(1.0) and figures["norm_ratio"] == pytest.approx(1.0)


# -- calibration samples ----------------------------------------------------------------------------

def test_calibration_arrays_of_different_sample_counts_are_refused(tmp_path):
    p = tmp_path / "cal.npz"
    np.savez(p, x=np.zeros((100, 4), np.float32), k=np.zeros((120, 2), np.int32))
    with pytest.raises(er.InputError) as ei:            # the 20 last k samples were dropped
        Tensors.load_samples(p)
    assert ei.value.code == "convert_calibration_invalid" and "x: 100" in ei.value.message
    np.savez(p, x=np.arange(12, dtype=np.float32).reshape(3, 4), k=np.ones((3, 2), np.int32))
    samples = Tensors.load_samples(p)
    assert len(samples) == 3 and samples[2]["x"].tolist() == [8, 9, 10, 11] and samples[1]["k"].shape == (2,)


def test_calibration_arrays_are_read_once_not_once_per_sample(tmp_path, monkeypatch):
    from numpy.lib import npyio

    p = tmp_path / "cal.npz"
    np.savez_compressed(p, x=np.zeros((50, 4), np.float32), k=np.zeros((50, 2), np.int32))
    reads = []
    orig = npyio.NpzFile.__getitem__
    monkeypatch.setattr(npyio.NpzFile, "__getitem__", lambda self, key: reads.append(key) or orig(self, key))
    assert len(Tensors.load_samples(p)) == 50
    assert sorted(reads) == ["k", "x"]          # was 2 per sample: each one decompressing the whole array


# -- .npz files ---------------------------------------------------------------------------------------

def test_an_npz_holding_one_name_twice_is_refused(tmp_path):
    from edge_runtime.cli_inputs import _read_arrays
    from edge_runtime.limits import DEFAULT_LIMITS

    def member(arr):
        buf = io.BytesIO()
        np.save(buf, arr)
        return buf.getvalue()

    p = tmp_path / "twice.npz"
    with pytest.warns(UserWarning, match="Duplicate name"):
        with zipfile.ZipFile(p, "w") as zf:
            zf.writestr("x.npy", member(np.array([[1, 2, 3, 4]], np.float32)))
            zf.writestr("x.npy", member(np.array([[9, 9, 9, 9]], np.float32)))
    with pytest.raises(er.InputError) as ei:            # the second copy was read, the first ignored
        _read_arrays(str(p), DEFAULT_LIMITS, ["x"])
    assert ei.value.code == "input_bad_file" and "twice" in ei.value.message
    ok = tmp_path / "ok.npz"
    np.savez(ok, x=np.array([[1, 2, 3, 4]], np.float32))
    assert _read_arrays(str(ok), DEFAULT_LIMITS, ["x"])["x"].tolist() == [[1, 2, 3, 4]]


# -- JSON inputs ----------------------------------------------------------------------------------

def test_an_input_json_naming_a_key_twice_is_refused(tmp_path):
    from edge_runtime.cli_inputs import _read_json_input

    p = tmp_path / "in.json"
    p.write_text('{"x": [[1, 2, 3, 4]], "k": [[1, 2]], "x": [[9, 9, 9, 9]]}')    # json kept the last x
    with pytest.raises(er.InputError) as ei:
        _read_json_input(str(p))
    assert ei.value.code == "input_bad_json" and "'x'" in ei.value.message and "twice" in ei.value.message
    p.write_text('{"inputs": {"x": [[1, 2, 3, 4]], "k": [[1, 2]]}}')
    assert _read_json_input(str(p)) == {"x": [[1, 2, 3, 4]], "k": [[1, 2]]}
    p.write_text('[{"text": "a"}, {"text": "b"}]')      # the same key in two objects is two values
    assert _read_json_input(str(p)) == [{"text": "a"}, {"text": "b"}]


# -- the manifest's quantization --------------------------------------------------------------------

@pytest.mark.parametrize("q, why", [
    ({"scale": 0.0, "zero_point": 0}, "scale"),          # every output 0
    ({"scale": -0.5, "zero_point": 0}, "scale"),         # every output negated
    ({"scale": "0.5", "zero_point": 0}, "scale"),
    ({"scale": 0.5, "zero_point": 0.5}, "zero_point"),
    ({"scale": 0.5, "zero_point": 300}, "outside int8"),
    ({"scale": 0.5}, "zero_point"),
])
def test_an_output_quantization_that_cannot_dequantize_is_refused_at_load(tmp_path, q, why):
    art = _art(tmp_path / "a", [_t("x", "float32", [1, 3])], outputs=[{**_t("y", "int8", [1, 3]), "quantization": q}])
    with pytest.raises(er.ArtifactError) as ei:
        er.load(art, device="fake", warmup=False)
    assert ei.value.code == "manifest_field_invalid" and why in ei.value.message and "'y'" in ei.value.message


def test_a_quantized_int8_output_is_dequantized_with_its_own_scale_and_zero_point(tmp_path):
    q = {"scale": 0.25, "zero_point": -3}
    art = _art(tmp_path / "a", [_t("x", "float32", [1, 3])], outputs=[{**_t("y", "int8", [1, 3]), "quantization": q}])
    with er.load(art, device="fake", warmup=False) as rt:
        res = rt.infer({"x": np.array([[1.0, -2.0, 3.0]], np.float32)})
        raw = res.raw_outputs["y"]
        assert raw.dtype == np.int8 and res.outputs["y"].dtype == np.float32
        np.testing.assert_array_equal(res.outputs["y"], (raw.astype(np.float32) + 3) * 0.25)
        d = res.to_dict()
        assert d["raw_outputs"]["y"]["dtype"] == "int8" and d["outputs"]["y"]["dtype"] == "float32"


# -- a converted artifact's quantized inputs take real values ----------------------------------------

def _manifest_task(model: dict | None) -> Tensors:
    q = {"scale": 0.25, "zero_point": -3}
    man = {"preprocess": {"kind": "tensors"}, "postprocess": {}}
    if model is not None:
        man["model"] = model
    bucket = {"name": "static", "inputs": [{**_t("x", "int8", [1, 4]), "quantization": dict(q)}],
              "outputs": [_t("y", "float32", [1, 3])]}
    return Tensors(man, lambda rel: b"", [bucket])


def test_a_converted_artifacts_quantized_input_quantizes_real_values():
    """tflite-int8 and edgetpu variants have int8 inputs; the artifact's contract is its float source's
    (its onnx-int8/openvino variants take floats). Floats were refused, so `convert --task tensors
    --target tflite-int8` failed at parity for every model, and integers were fed as codes."""
    from edge_runtime.limits import DEFAULT_LIMITS

    for model in (None, {"name": "m", "version": "1", "source": {"file": "m.onnx", "sha256": "0" * 64}}):
        task = _manifest_task(model)
        feeds = task.prepare({"x": np.array([[0.5, -1.0, 100.0, -0.125]], np.float32)}, DEFAULT_LIMITS).feeds
        # round(x / 0.25) - 3, saturated to int8 (400 - 3 -> 127); -0.5 rounds half to even (-0 - 3)
        assert feeds["x"].dtype == np.int8 and feeds["x"].tolist() == [[-1, -7, 127, -3]]
        assert task.prepare({"x": [1, 2, 3, 4]}, DEFAULT_LIMITS).feeds["x"].tolist() == [[1, 5, 9, 13]]  # values, not codes
        assert task.prepare({"x": np.array([[1, 2, 3, 4]])}, DEFAULT_LIMITS).feeds["x"].tolist() == [[1, 5, 9, 13]]
        # an array in the input's own dtype holds its codes (a served client follows the variant's INT8 metadata)
        codes = np.array([[1, 2, 3, 4]], np.int8)
        assert task.prepare({"x": codes}, DEFAULT_LIMITS).feeds["x"].tolist() == [[1, 2, 3, 4]]
        with pytest.raises(er.InputError) as ei:
            task.prepare({"x": [0.0, float("nan"), 1.0, 2.0]}, DEFAULT_LIMITS)
        assert ei.value.code == "input_nonfinite" and task.real_inputs
    # an imported model (and a manifest with no source record) takes its own codes, as before
    for model in ({"name": "m", "version": "1", "source": {"file": "m.tflite", "imported": True}},
                  {"name": "m", "version": "1"}):
        task = _manifest_task(model)
        assert task.prepare({"x": [1, 2, 3, 4]}, DEFAULT_LIMITS).feeds["x"].tolist() == [[1, 2, 3, 4]]
        with pytest.raises(er.InputError) as ei:
            task.prepare({"x": [0.5, 1.0, 1.5, 2.0]}, DEFAULT_LIMITS)
        assert ei.value.code == "input_wrong_dtype" and not task.real_inputs


def test_parity_counts_two_all_zero_outputs_as_agreeing():
    """A ReLU output is all zeros for some inputs: the cosine of two zero vectors was read as 0, so
    identical answers failed the budget (a tiny tensors model's tflite-int8 parity 0.87, min 0.0)."""
    z = np.zeros(3, np.float32)
    one = np.array([1.0, 2.0, 0.0], np.float32)
    ref = [TaskOutput(outputs=Outputs({"y": z})), TaskOutput(outputs=Outputs({"y": one}))]
    same = [TaskOutput(outputs=Outputs({"y": z.copy()})), TaskOutput(outputs=Outputs({"y": one.copy()}))]
    figures = Tensors.compare(ref, same)
    assert figures["value"] == pytest.approx(1.0) and figures["min"] == pytest.approx(1.0)
    off = [TaskOutput(outputs=Outputs({"y": one.copy()})), TaskOutput(outputs=Outputs({"y": one.copy()}))]
    assert Tensors.compare(ref, off)["min"] == 0.0          # zero against non-zero still disagrees


@pytest.mark.slow
def test_convert_tensors_to_tflite_int8_takes_the_float_feeds(tmp_path):
    pytest.importorskip("tensorflow")
    pytest.importorskip("onnx2tf")
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from edge_runtime.cli import main

    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
                              [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "cal.npz", x=rng.standard_normal((64, 1, 4)).astype(np.float32))
    np.savez(tmp_path / "par.npz", x=rng.standard_normal((32, 1, 4)).astype(np.float32))
    out = tmp_path / "art"
    res = CliRunner().invoke(main, ["convert", str(tmp_path / "m.onnx"), "-o", str(out), "--task", "tensors",
                                    "--target", "tflite-int8", "--calibration", str(tmp_path / "cal.npz"),
                                    "--parity-data", str(tmp_path / "par.npz"), "--json"])
    assert res.exit_code == 0, res.output           # was exit 2: input 'x' has dtype float32, model wants int8
    x = np.array([[0.5, -1.0, 2.0, 0.25]], np.float32)
    want = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"x": x})[0]
    with er.load(out, warmup=False) as rt:
        assert rt.variant.target == "tflite-int8" and rt.variant["buckets"][0]["inputs"][0]["dtype"] == "int8"
        got = rt.infer({"x": x}).outputs["y"]
    np.testing.assert_allclose(got, want, atol=0.1)


def test_serve_declares_a_converted_quantized_input_as_the_real_values_it_takes():
    # the metadata said INT8 (the codes) for an input the converted artifact takes as float32 values
    from types import SimpleNamespace

    from edge_runtime.serve_model import served_input_specs

    q = {"name": "x", "dtype": "int8", "shape": [1, 4], "quantization": {"scale": 0.1, "zero_point": 0}}
    plain = {"name": "y", "dtype": "float32", "shape": [1, 2]}
    variant = SimpleNamespace(buckets=[{"inputs": [q, plain]}])
    converted = served_input_specs(SimpleNamespace(variant=variant, task=SimpleNamespace(real_inputs=True)))
    assert [s["dtype"] for s in converted] == ["float32", "float32"] and q["dtype"] == "int8"
    imported = served_input_specs(SimpleNamespace(variant=variant, task=SimpleNamespace(real_inputs=False)))
    assert [s["dtype"] for s in imported] == ["int8", "float32"]
