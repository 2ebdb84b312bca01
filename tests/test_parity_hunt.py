"""The parity convert records and verify measures must be what they say: held-out parity on
samples the quantizer did not calibrate on, a probe set that samples the held-out data rather
than its first class, ... (the 2026-12-07 parity hunt)."""

from __future__ import annotations

import shutil

import pytest

from edge_runtime.converters.zoo import ZOO, convert_request

DIGITS = ZOO / "digits-cnn"


def _convert(out, **kw):
    from edge_runtime.converters.pipeline import convert

    lines: list[str] = []
    return convert(convert_request("digits-cnn", "image-classification", out, **kw), lines.append), lines


def test_parity_data_that_is_the_calibration_data_is_refused(tmp_path):
    # before: "parity top1_agreement 1.0000 on 200 held-out samples", exit 0, the 200 being the
    # very images the activation ranges were calibrated on
    from edge_runtime.errors import InputError

    with pytest.raises(InputError) as exc:
        _convert(tmp_path / "a", parity_data=DIGITS / "calibration")
    assert exc.value.code == "convert_parity_is_calibration"
    assert "also a calibration sample" in exc.value.message
    assert not (tmp_path / "a").exists()


def test_parity_samples_shared_with_calibration_are_left_out_and_said(tmp_path):
    par = tmp_path / "par"
    held = sorted((DIGITS / "held_out").rglob("*.png"))[::18]          # 20 held-out digits
    cal = sorted((DIGITS / "calibration").rglob("*.png"))[:10]         # and 10 calibration ones
    for i, f in enumerate(held + cal):
        (par / f"{i % 10}").mkdir(parents=True, exist_ok=True)
        shutil.copy(f, par / f"{i % 10}" / f"{i:03d}.png")
    man, lines = _convert(tmp_path / "a", parity_data=par, probe_samples=0)
    p = man["variants"][0]["parity"]
    assert p["samples"] == 20, p
    assert "10 that are also calibration samples left out" in p["data"]
    assert any(line.startswith("warning: 10 of the 30 --parity-data samples are also calibration samples")
               for line in lines), lines


def test_the_probe_set_spreads_over_a_parity_folder_sorted_by_label(digits_artifact):
    # held_out/0..9 loads sorted: the probe set was its first 32 images, every one a "0", so verify
    # checked one class of ten while saying "pass"
    from edge_runtime.artifact import load_artifact
    from edge_runtime.probe import read

    probe = read(load_artifact(digits_artifact))
    classes = {r.prediction for r in probe.reference}
    assert len(probe.inputs) == 32 and classes == set("0123456789"), classes


def test_spread_takes_every_kth_first():
    from edge_runtime.converters.probe_select import spread

    assert spread(list(range(10)), 3) == [0, 4, 8, 1, 5, 9, 2, 6, 3, 7]
    assert spread(list(range(4)), 8) == [0, 1, 2, 3]
    assert sorted(spread(list(range(360)), 32)) == list(range(360))


def test_a_detection_f1_over_no_box_is_not_a_pass(tmp_path, monkeypatch):
    # YOLOX-Nano with parity images in which the fp32 source finds nothing (8 blank photos): F1 is 1.0
    # by definition (no box, no miss), and convert recorded "detection_f1 1.0000 ... passed: true".
    # The seam: parity.measure answers what it measured there; the record must not call it a figure
    from click.testing import CliRunner

    from edge_runtime.cli import main
    from edge_runtime.converters import parity

    def nothing_detected(task_ref, sessions_ref, task_cand, sessions_cand, samples, limits=None):
        return {"metric": "detection_f1", "value": 1.0, "samples": 8, "matched": 0, "unmatched_reference": 0,
                "unmatched_candidate": 0, "per_bucket": {}, "device_ms_median": 0.1}

    monkeypatch.setattr(parity, "measure", nothing_detected)
    man, _ = _convert(tmp_path / "a", probe_samples=0)
    p = man["variants"][0]["parity"]
    assert p["value"] is None and p["passed"] is None, p
    assert "an F1 over no box compares nothing" in p["not_judged"]
    res = CliRunner().invoke(main, ["convert", str(DIGITS / "model.onnx"), "-o", str(tmp_path / "b"), "--task",
                                    "image-classification", "--calibration", str(DIGITS / "calibration"),
                                    "--parity-data", str(DIGITS / "held_out"), "--labels", str(DIGITS / "labels.txt"),
                                    "--preprocess", str(DIGITS / "preprocess.json"), "--probe-samples", "0"])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.stdout.splitlines() if x.startswith("onnx-int8:"))
    assert "parity not judged: neither the fp32 source nor the candidate detects anything" in line, line


def test_recipe_auto_refuses_on_a_measured_trial_when_the_later_ones_cannot_be_built(tmp_path, monkeypatch):
    # a trial under budget, then one the toolchain cannot build: "KeyError: 'error'" (exit 1) and the
    # measured trial's figures lost; now the parity refusal (exit 7) with every trial
    from edge_runtime.converters.base import RecipeTrial
    from edge_runtime.converters.onnx_int8 import OnnxInt8Converter
    from edge_runtime.errors import ParityError

    clipped = {"calibrate_method": "Percentile", "percentile": 50.0}
    monkeypatch.setattr(OnnxInt8Converter, "auto_recipes", lambda self, task: [
        RecipeTrial("cnn", clipped, "clipped (fails)"), RecipeTrial("no-such-recipe", {}, "cannot build")])
    with pytest.raises(ParityError) as exc:
        _convert(tmp_path / "a", recipe="auto", probe_samples=0)
    (v,) = exc.value.details["variants"]
    rows = v["recipe_trials"]
    assert rows[0]["passed"] is False and rows[0]["kept"] and rows[0]["parity"] == v["parity"]["value"] < 0.99
    assert "unknown quantization recipe" in rows[1]["error"]
    assert not (tmp_path / "a").exists()


def test_a_figure_from_too_few_parity_samples_says_so_in_the_summary(tmp_path):
    # --allow-few-samples with 2 parity images: stdout said "parity top1_agreement 1.0000 on 2 held-out
    # samples (budget 0.99)" like any pass; the manifest's warning was only on stderr
    from click.testing import CliRunner

    from edge_runtime.cli import main

    par = tmp_path / "par" / "3"
    par.mkdir(parents=True)
    for f in sorted((DIGITS / "held_out" / "3").iterdir())[:2]:
        shutil.copy(f, par / f.name)
    args = ["convert", str(DIGITS / "model.onnx"), "-o", str(tmp_path / "a"), "--task", "image-classification",
            "--calibration", str(DIGITS / "calibration"), "--parity-data", str(tmp_path / "par"), "--labels",
            str(DIGITS / "labels.txt"), "--preprocess", str(DIGITS / "preprocess.json"), "--allow-few-samples",
            "--probe-samples", "0", "--force"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    line = next(x for x in res.stdout.splitlines() if x.startswith("onnx-int8:"))
    assert "on 2 held-out samples" in line and "only 2 held-out parity samples, under the minimum of 8" in line
    res = CliRunner().invoke(main, [*args, "--json"])
    assert res.exit_code == 0, res.output
    import json

    (v,) = json.loads(res.stdout)["variants"]
    assert "only 2 held-out parity samples" in v["parity_warning"]


def test_verify_all_shows_each_precision_hints_own_recorded_figure(tmp_path, monkeypatch):
    # OpenVINO's f32 and bf16 hints are each measured at convert (runtime_trials); verify --all showed
    # the kept hint's figure as "recorded" on the other hint's row too
    pytest.importorskip("openvino")
    import numpy as np

    from edge_runtime.converters import parity
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.request import ConvertRequest
    from edge_runtime.verify import verify_artifact

    real, calls = parity.measure, []

    def measure(*a, **kw):      # each option set's figure its own (on this CPU bf16 may equal f32 exactly)
        out = real(*a, **kw)
        calls.append(1)
        out["value"] -= 0.001 * (len(calls) - 1)
        return out

    monkeypatch.setattr(parity, "measure", measure)
    monkeypatch.setenv("EDGE_RUNTIME_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "cal.npz", image=rng.normal(size=(20, 1, 1, 8, 8)).astype(np.float32))
    np.savez(tmp_path / "par.npz", image=rng.normal(size=(8, 1, 1, 8, 8)).astype(np.float32))
    man = convert(ConvertRequest(source=DIGITS / "model.onnx", out=tmp_path / "a", task="tensors",
                                 targets=["openvino"], calibration=tmp_path / "cal.npz",
                                 parity_data=tmp_path / "par.npz", input_shapes={"image": [1, 1, 8, 8]},
                                 min_parity=0.5, min_calibration_samples=8))
    trials = man["variants"][0].get("runtime_trials") or []
    if len(trials) < 2:
        pytest.skip("OpenVINO offers one precision hint here")
    rows = [r for r in verify_artifact(tmp_path / "a", all_paths=True)["rows"] if "error" not in r]
    seen = 0
    for r in rows:
        own = [t["parity"] for t in trials if t["options"] == r["device_options"]]
        if own:
            seen += 1
            assert r["recorded"] == own[0], (r["device_options"], r["recorded"], trials)
    assert seen >= 2


def test_verify_gives_no_verdict_on_a_probe_set_with_no_box(make_artifact, own_cache, monkeypatch):
    # a detector whose probe set holds no box on either side: F1 1.0 over nothing, and verify said
    # "pass" (load(verify=True) too); now no verdict (passed null) and the reason
    from click.testing import CliRunner

    from edge_runtime.cli import main
    from edge_runtime.models.object_detection import ObjectDetection
    from edge_runtime.verify import verify_artifact

    art = make_artifact("object-detection", probe=4, budget=0.9)
    monkeypatch.setattr(ObjectDetection, "compare", staticmethod(lambda ref, cand: {
        "metric": "detection_f1", "value": 1.0, "samples": len(ref), "matched": 0, "unmatched_reference": 0,
        "unmatched_candidate": 0}))
    row = verify_artifact(art)["chosen"]
    assert row["passed"] is None and "an F1 over no box compares nothing" in row["not_judged"], row
    res = CliRunner().invoke(main, ["verify", str(art)])
    assert res.exit_code == 0, res.output
    assert "not judged (the probe set compares nothing)" in res.stdout and ": pass" not in res.stdout, res.stdout


def test_inspect_says_not_judged_rather_than_not_measured():
    # a detector's F1 over no box is recorded as not judged; inspect called it "not measured"
    from edge_runtime.cli_inspect import _parity_text

    text = _parity_text({"metric": "detection_f1", "value": None, "passed": None,
                         "not_judged": "no box in the reference or the candidate"})
    assert text == "parity detection_f1 not judged (no box in the reference or the candidate)"
    assert _parity_text({"metric": "none", "value": None, "not_measured": "Core ML off macOS"}) == \
        "parity not measured (Core ML off macOS)"
