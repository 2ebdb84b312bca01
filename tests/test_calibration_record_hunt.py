"""A variant's ``quantization.calibration`` says what was calibrated on, never only what was given
(the 2026-12-07 calibration record hunt): NNCF's ``subset_size`` calibrates on the first N feeds and
the record counted them all; a bucket whose task refused a sample dropped it without a word; a float
variant (onnx-fp32) and a data-free weight compression (openvino weights-int8) recorded the
convert's calibration samples as if they had been calibrated on."""

from __future__ import annotations

import json

import pytest

from edge_runtime import error_codes as ec
from edge_runtime.converters.zoo import ZOO
from factories import convert_digits
from edge_runtime.errors import InputError

DIGITS = ZOO / "digits-cnn"


def _convert(out, monkeypatch=None, **kw):
    """The digits convert (no probe set) with ``kw``; the manifest, the progress lines and (with
    ``monkeypatch``) the calibration samples split_samples returned."""
    man, lines, samples = convert_digits(out, monkeypatch, **kw)
    return man, lines, (samples.calib if samples is not None else None)


def _variant(man, target):
    return next(v for v in man["variants"] if v["target"] == target)


# -- 1. openvino: subset_size --------------------------------------------------------------------

def test_openvino_subset_size_records_the_samples_nncf_calibrated_on(tmp_path, monkeypatch):
    pytest.importorskip("nncf")
    from edge_runtime.converters.request import fingerprint

    # before: NNCF ran its statistics over the first 40 feeds and the record said 200, with the
    # fingerprint of all 200
    man, lines, calib = _convert(tmp_path / "a", monkeypatch, targets=["openvino"],
                                 recipe_overrides={"subset_size": 40}, allow_few_samples=True)
    q = _variant(man, "openvino")["quantization"]
    cal = q["calibration"]
    assert len(calib) == 200
    assert cal["samples"] == 40 == q["calibration_samples"] and q["nncf"]["subset_size"] == 40
    assert cal["fingerprint"] == fingerprint(calib[:40]) != fingerprint(calib)
    assert cal["given"] == 200 and "first 40 of the 200" in cal["not_used"]
    assert cal["warning"].startswith("only 40 calibration samples used")
    assert any("calibration: bucket static: the toolchain calibrated on the first 40 of the 200" in x
               for x in lines), lines


def test_openvino_default_records_all_samples_when_under_300(tmp_path, monkeypatch):
    pytest.importorskip("nncf")
    from edge_runtime.converters.request import fingerprint

    man, _, calib = _convert(tmp_path / "a", monkeypatch, targets=["openvino"])
    q = _variant(man, "openvino")["quantization"]
    cal = q["calibration"]
    # the subset NNCF ran over is in its record now (300, its default: every one of the 200)
    assert q["nncf"]["subset_size"] == 300 and q["calibration_samples"] == 200
    assert q["nncf"]["overflow_fix"] == "first_layer_only"          # NNCF's default, recorded as run
    assert cal["samples"] == 200 and cal["fingerprint"] == fingerprint(calib)
    assert "given" not in cal and "not_used" not in cal


def test_openvino_subset_under_the_minimum_is_refused_like_too_few_samples(tmp_path):
    pytest.importorskip("nncf")
    with pytest.raises(InputError) as exc:
        _convert(tmp_path / "a", targets=["openvino"], recipe_overrides={"subset_size": 5})
    assert exc.value.code == ec.CONVERT_TOO_FEW_SAMPLES and "calibrated on 5" in exc.value.message


@pytest.mark.parametrize("bad", [0, 2.5, "50", True])
def test_openvino_a_subset_size_that_is_no_count_is_a_typed_recipe_error(tmp_path, bad):
    # before: 0 reached NNCF (an untyped nncf.ValidationError, a crash), 2.5 calibrated on 2
    pytest.importorskip("nncf")
    with pytest.raises(InputError) as exc:
        _convert(tmp_path / "a", targets=["openvino"], recipe_overrides={"subset_size": bad})
    assert exc.value.code == ec.CONVERT_RECIPE_INVALID and "subset_size" in exc.value.message


@pytest.mark.parametrize("override, needle", [({"preset": "bogus"}, "preset"),                  # a KeyError crash
                                              ({"model_type": "transfomer"}, "model_type"),     # ran as "none"
                                              ({"fast_bias_correction": "false"}, "fast_bias"),  # ran as True
                                              ({"ignored_scope": 5}, "ignored_scope")])          # a TypeError crash
def test_openvino_an_override_value_it_would_not_run_as_recorded_is_a_typed_recipe_error(tmp_path, override, needle):
    pytest.importorskip("nncf")
    with pytest.raises(InputError) as exc:
        _convert(tmp_path / "a", targets=["openvino"], recipe_overrides=override)
    assert exc.value.code == ec.CONVERT_RECIPE_INVALID and needle in exc.value.message


def test_openvino_weights_int8_records_no_calibration(tmp_path):
    # nncf.compress_weights is data-free: the record named 200 calibration samples it never ran
    pytest.importorskip("nncf")
    man, _, _ = _convert(tmp_path / "a", targets=["openvino"], recipe="weights-int8")
    q = _variant(man, "openvino")["quantization"]
    assert q["scheme"] == "nncf-weight-compression"
    cal = q["calibration"]
    assert cal["samples"] == 0 and cal["used"] is False and "fingerprint" not in cal
    assert "none of the 200 calibration samples" in cal["not_used"]


# -- 2. a bucket's task that refuses a sample -----------------------------------------------------

def _tiny_text_model(path):
    import numpy as np
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    from factories import WORDS

    vocab = 4 + len(WORDS)
    nodes = [h.make_node("Gather", ["emb", "input_ids"], ["e"]),
             h.make_node("Cast", ["attention_mask"], ["mf"], to=T.FLOAT),
             h.make_node("Unsqueeze", ["mf", "ax"], ["m3"]),
             h.make_node("Mul", ["e", "m3"], ["em"]),
             h.make_node("ReduceSum", ["em", "one"], ["pooled"], keepdims=0),
             h.make_node("MatMul", ["pooled", "W"], ["logits"])]
    rng = np.random.default_rng(0)
    graph = h.make_graph(
        nodes, "tiny-text",
        [h.make_tensor_value_info("input_ids", T.INT64, ["b", "s"]),
         h.make_tensor_value_info("attention_mask", T.INT64, ["b", "s"])],
        [h.make_tensor_value_info("logits", T.FLOAT, ["b", 2])],
        [nh.from_array(rng.normal(size=(vocab, 8)).astype(np.float32), "emb"),
         nh.from_array(rng.normal(size=(8, 2)).astype(np.float32), "W"),
         nh.from_array(np.array([2], np.int64), "ax"), nh.from_array(np.array([1], np.int64), "one")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_samples_a_bucket_cannot_take_are_counted_said_and_warned(tmp_path, monkeypatch):
    # A task whose one-bucket contract refuses a sample the whole task took (a plug-in sequence task
    # that refuses rather than truncates): build_variant's `except InputError: continue` dropped it
    # from that bucket's calibration without a word, and the record counted it.
    pytest.importorskip("onnxruntime")
    import itertools

    from edge_runtime.converters import build_variant as bv
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.request import ConvertRequest
    from edge_runtime.errors import InputError as IE
    from factories import WORDS, tiny_tokenizer_json

    real_task = bv.Job.task

    def task(self, buckets):
        t = real_task(self, buckets)
        if len(buckets) == 1 and buckets[0]["name"] == "seq4":
            prepare = t.prepare

            def strict(raw, limits):     # refuse what does not fit untruncated
                p = prepare(raw, limits)
                if p.truncated:
                    raise IE("text is longer than the bucket", code=ec.INPUT_TOO_LONG)
                return p

            t.prepare = strict
        return t

    monkeypatch.setattr(bv.Job, "task", task)
    (tmp_path / "tokenizer.json").write_text(tiny_tokenizer_json())
    short = [" ".join(p) for p in itertools.permutations(WORDS[:6], 2)][:100]      # 4 tokens with [CLS] [SEP]
    long = [" ".join(p) for p in itertools.permutations(WORDS[6:], 4)][:30]        # 6 tokens: seq8 only
    (tmp_path / "cal.txt").write_text("\n".join(short + long) + "\n")
    lines: list[str] = []
    man = convert(ConvertRequest(source=_tiny_text_model(tmp_path / "model.onnx"), out=tmp_path / "art",
                                 task="text-classification", targets=["onnx-int8"], calibration=tmp_path / "cal.txt",
                                 tokenizer=tmp_path / "tokenizer.json", buckets=[4, 8], probe_samples=0,
                                 recipe_overrides={"exclude_gelu_matmuls": False}, min_parity_samples=8),
                  lines.append)
    cal = man["variants"][0]["quantization"]["calibration"]
    n_long = cal["given"] - cal["per_bucket"]["seq4"]
    assert n_long > 0 and cal["per_bucket"]["seq8"] == cal["given"] == cal["samples"]
    assert f"bucket seq4: {n_long} its task cannot prepare" in cal["not_used"]
    assert "text is longer than the bucket" in cal["not_used"]
    assert any(x.startswith(f"warning: onnx-int8: calibration: bucket seq4: {n_long} its task") for x in lines), lines


# -- 3. float variants ------------------------------------------------------------------------------

def test_a_float_variant_records_that_no_calibration_was_used(tmp_path):
    pytest.importorskip("onnxruntime")
    from edge_runtime import diff
    from edge_runtime.cli import main

    man, _, _ = _convert(tmp_path / "a", targets=["onnx-fp32", "onnx-int8"])
    fp32, int8 = _variant(man, "onnx-fp32"), _variant(man, "onnx-int8")
    assert fp32["quantization"]["scheme"] == "float (not quantized)"
    cal = fp32["quantization"]["calibration"]
    # before: {"samples": 200, "fingerprint": ..., "source": "calibration", ...} for a model never calibrated
    assert cal["samples"] == 0 and cal["used"] is False and "fingerprint" not in cal and "source" not in cal
    assert "onnx-fp32 (float (not quantized)) calibrated on no sample" in cal["not_used"]
    assert int8["quantization"]["calibration"]["samples"] == 200 and "used" not in int8["quantization"]["calibration"]
    # its readers still read it: inspect, diff
    from click.testing import CliRunner

    res = CliRunner().invoke(main, ["inspect", str(tmp_path / "a"), "--json"])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.output)
    assert next(v for v in shown["variants"] if v["target"] == "onnx-fp32")["quantization"]["calibration"] == cal
    assert CliRunner().invoke(main, ["inspect", str(tmp_path / "a")]).exit_code == 0
    # diff: an artifact of the old record against this one names the calibration change, as prediction
    old = json.loads(json.dumps(man))
    _variant(old, "onnx-fp32")["quantization"]["calibration"] = dict(int8["quantization"]["calibration"])
    paths = {d.path: d.side for d in diff.diff_manifests(old, man)}
    assert paths["variants[onnx-fp32].quantization.calibration.samples"] == diff.PREDICTION
    assert paths["variants[onnx-fp32].quantization.calibration.used"] == diff.PREDICTION


# -- hunted further: onnx-int8 records -------------------------------------------------------------

def test_onnx_int8_percentile_records_the_percentile_ort_used(tmp_path):
    # before: "percentile": null although ORT calibrated at its default 99.999
    pytest.importorskip("onnxruntime")
    man, _, _ = _convert(tmp_path / "a", recipe_overrides={"calibrate_method": "Percentile"})
    q = man["variants"][0]["quantization"]
    assert q["calibrate_method"] == "Percentile" and q["percentile"] == 99.999
    man, _, _ = _convert(tmp_path / "b", recipe_overrides={"calibrate_method": "Percentile",
                                                         "extra_options": {"CalibPercentile": 99.9}})
    assert man["variants"][0]["quantization"]["percentile"] == 99.9


def test_onnx_int8_that_quantizes_nothing_is_refused_not_recorded_as_int8(tmp_path):
    # before: op types the model has none of gave a float model recorded as "static-qdq" int8
    pytest.importorskip("onnxruntime")
    with pytest.raises(InputError) as exc:
        _convert(tmp_path / "a", recipe_overrides={"op_types_to_quantize": ["Gather"]})
    assert exc.value.code == ec.CONVERT_RECIPE_INVALID and "quantized no node" in exc.value.message


# -- hunted further: parity trials ------------------------------------------------------------------

def test_a_runtime_trial_that_compares_nothing_is_no_figure_and_never_the_fastest_within_budget(monkeypatch,
                                                                                               tmp_path):
    # A detector whose held-out images hold nothing either side detects: each OpenVINO precision's F1 is
    # 1.0 over no box. Before: both counted as within budget, bf16 was kept as "fastest within the parity
    # budget" and runtime_trials recorded 1.0 for each (verify read it back as the recorded figure),
    # while parity.value said no figure.
    from edge_runtime.converters import parity, parity_trials
    from edge_runtime.converters.base import BucketBuild, Converter
    from edge_runtime.converters.build_variant import Built, Samples, variant_record

    class TwoPrecisions(Converter):
        target = "openvino"

        def runtime_candidates(self):
            return [{"precision": "f32"}, {"precision": "bf16"}]

        def build_bucket(self, fp32_path, out_path, calibration_feeds, ctx):
            return BucketBuild({})

        def toolchain(self):
            return {}

    class Session:
        device = "openvino:cpu"

        def close(self):
            pass

    none = {"metric": "detection_f1", "value": 1.0, "matched": 0, "unmatched_reference": 0, "unmatched_candidate": 0,
            "samples": 12}
    figures = iter([{**none, "per_bucket": {"static": dict(none)}, "device_ms_median": ms} for ms in (10.0, 5.0)])
    monkeypatch.setattr(parity_trials, "_target_sessions", lambda *a, **k: [Session()])
    monkeypatch.setattr(parity, "measure", lambda *a, **k: next(figures))

    class Task:
        parity_metric = "detection_f1"

    ref = parity_trials.Reference(Task(), [], ["x"] * 12, "held_out (12 samples)", None)
    conv = TwoPrecisions()
    measured = parity_trials.measure_target(ref, "openvino", conv, tmp_path, [{"name": "static"}], None, {}, [],
                                            0.9, lambda line: None)
    assert measured.parity["value"] is None and measured.parity["passed"] is None
    assert "compares nothing" in measured.parity["not_judged"]
    assert measured.options == {"precision": "f32"} and measured.why is None     # the first, most exact one
    # its bucket's figure said 1.0 under a parity.value of none
    static = measured.parity["per_bucket"]["static"]
    assert static["value"] is None and "compares nothing" in static["not_judged"]
    samples = Samples([], [], "", {"parity": {"min_samples": 8, "warn_below": 32}})
    variant = variant_record("openvino", conv, Built([], {}, measured), samples)
    assert [t["parity"] for t in variant["runtime_trials"]] == [None, None]
    assert variant["runtime"] == {"precision": "f32"}


def test_a_bucket_too_short_for_any_text_is_a_typed_request_error(tmp_path):
    # --buckets 2 8 with a tokenizer that adds [CLS] [SEP]: the one-bucket contract of bucket 2 raised
    # an ArtifactError about "manifest.json" (exit 3, an artifact fault) in the middle of a convert
    pytest.importorskip("onnxruntime")
    import itertools

    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.request import ConvertRequest
    from factories import WORDS, tiny_tokenizer_json

    (tmp_path / "tokenizer.json").write_text(tiny_tokenizer_json())
    (tmp_path / "cal.txt").write_text("\n".join(" ".join(p) for p in itertools.permutations(WORDS[:6], 2)) + "\n")
    with pytest.raises(InputError) as exc:
        convert(ConvertRequest(source=_tiny_text_model(tmp_path / "model.onnx"), out=tmp_path / "art",
                               task="text-classification", targets=["onnx-int8"], calibration=tmp_path / "cal.txt",
                               tokenizer=tmp_path / "tokenizer.json", buckets=[2, 8], probe_samples=0,
                               recipe_overrides={"exclude_gelu_matmuls": False}, allow_few_samples=True))
    assert exc.value.code == ec.CONVERT_BUCKETS_INVALID and "bucket seq2" in exc.value.message
