"""``convert --recipe auto``: trials fastest first, the first within budget kept, every
trial recorded; a refused trial leaves no file behind; nothing passing is refused."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import edge_runtime as er
from edge_runtime.cli import main
from edge_runtime.converters.base import RecipeTrial
from edge_runtime.converters.onnx_int8 import OnnxInt8Converter
from edge_runtime.converters.openvino_int8 import OpenVinoConverter
from edge_runtime.converters.pipeline import convert
from edge_runtime.converters.zoo import ZOO, convert_request
from edge_runtime.errors import ParityError

# a 50th-percentile activation range clips every activation above the median: top-1 collapses
CLIPPED = {"calibrate_method": "Percentile", "percentile": 50.0}


def _trials(monkeypatch, trials):
    monkeypatch.setattr(OnnxInt8Converter, "auto_recipes", lambda self, task: list(trials))


def test_auto_keeps_the_first_trial_that_meets_the_budget_and_records_all(tmp_path, monkeypatch):
    _trials(monkeypatch, [RecipeTrial("cnn", CLIPPED, "clipped (fails)"),
                          RecipeTrial("no-such-recipe", {}, "cannot build"),
                          RecipeTrial("cnn", {"reduce_range": True}, "7-bit weights"),
                          RecipeTrial("cnn", {"weights": "uint8"}, "never reached")])
    out = tmp_path / "digits"
    m = convert(convert_request("digits-cnn", "image-classification", out, recipe="auto"))
    v = m["variants"][0]
    rows = v["recipe_trials"]
    assert [r.get("kept", False) for r in rows] == [False, False, True]     # the 4th is never built
    assert rows[0]["passed"] is False and rows[0]["parity"] < rows[0]["budget"]
    assert rows[0]["overrides"] == CLIPPED and rows[0]["device_ms_median"] > 0 and rows[0]["seconds"] >= 0
    assert "unknown quantization recipe" in rows[1]["error"]
    assert rows[2]["passed"] is True and rows[2]["parity"] == v["parity"]["value"]
    assert v["quantization"]["recipe_auto"] == {"kept": "cnn", "trials": 3,
                                                "why": "the first recipe (fastest first) that met the parity budget"}
    # only the kept trial's files are in the artifact, and they verify
    files = json.loads((out / "manifest.json").read_text())["files"]
    assert sorted(f for f in files if f.startswith("onnx-int8/")) == ["onnx-int8/static.onnx"]
    assert sorted(p.relative_to(out).as_posix() for p in (out / "onnx-int8").rglob("*")) == ["onnx-int8/static.onnx"]
    rt = er.load(out)
    image = sorted((ZOO / "digits-cnn" / "held_out" / "3").iterdir())[0]
    assert rt.infer(image).prediction == "3"


def test_auto_with_no_trial_in_budget_is_refused_with_every_figure(tmp_path, monkeypatch):
    _trials(monkeypatch, [RecipeTrial("cnn", CLIPPED, "clipped"),
                          RecipeTrial("cnn", {**CLIPPED, "percentile": 60.0}, "clipped less")])
    with pytest.raises(ParityError) as exc:
        convert(convert_request("digits-cnn", "image-classification", tmp_path / "d", recipe="auto"))
    trials = exc.value.details["variants"][0]["recipe_trials"]
    assert len(trials) == 2 and all(t["passed"] is False for t in trials) and trials[-1]["kept"]
    assert not (tmp_path / "d").exists()


def test_cli_prints_every_trial_and_its_fate(tmp_path, monkeypatch):
    _trials(monkeypatch, [RecipeTrial("cnn", CLIPPED, "clipped"), RecipeTrial("cnn", {"reduce_range": True}, "")])
    z = ZOO / "digits-cnn"
    res = CliRunner().invoke(main, ["convert", str(z / "model.onnx"), "--out", str(tmp_path / "a"),
                                    "--task", "image-classification", "--calibration", str(z / "calibration"),
                                    "--parity-data", str(z / "held_out"), "--labels", str(z / "labels.txt"),
                                    "--preprocess", (z / "preprocess.json").read_text(), "--recipe", "auto",
                                    "--json"])
    assert res.exit_code == 0, res.output
    v = json.loads(res.stdout)["variants"][0]
    assert v["recipe"] == "cnn" and [t.get("kept", False) for t in v["recipe_trials"]] == [False, True]
    res = CliRunner().invoke(main, ["convert", str(z / "model.onnx"), "--out", str(tmp_path / "b"),
                                    "--task", "image-classification", "--calibration", str(z / "calibration"),
                                    "--parity-data", str(z / "held_out"), "--labels", str(z / "labels.txt"),
                                    "--preprocess", (z / "preprocess.json").read_text(), "--recipe", "onnx-int8=auto"])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.splitlines() if "recipe auto" in ln]
    assert len(lines) == 2 and "under budget" in lines[0] and lines[1].endswith("kept")
    assert "percentile=50.0" in lines[0] and "reduce_range=True" in lines[1]


def test_every_auto_list_is_saturation_free_on_x86():
    """The figures a build host measures must hold on AVX2 and VNNI alike: every static int8 trial
    has 7-bit weights (OpenVINO overflow_fix, ORT reduce_range) or no u8*s8 product (U8U8), or
    no int8 activation at all (weights-int8)."""
    for task in ("text-classification", "text-embedding", "image-classification"):
        for t in OpenVinoConverter().auto_recipes(task):
            assert t.overrides.get("overflow_fix") == "enable" or t.recipe == "weights-int8", t
        for t in OnnxInt8Converter().auto_recipes(task):
            from edge_runtime.converters.onnx_quant import resolve

            cfg = resolve(t.recipe, t.overrides)
            assert cfg["reduce_range"] or cfg["weights"] == "uint8", t
