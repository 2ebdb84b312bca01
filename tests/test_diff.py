"""``edge-infer diff A B``: every manifest difference, grouped as prediction vs inference side."""

from __future__ import annotations

import json
import shutil

from click.testing import CliRunner

from edge_runtime.cli import main
from edge_runtime.diff import INFERENCE, PREDICTION, TIMING, diff_manifests, side_of
from factories import rewrite_manifest
from test_shadow import digits_recipe_b


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def by_path(report: dict) -> dict:
    return {d["path"]: d for d in report["differences"]}


def test_two_recipes_of_digits_differ_on_the_prediction_side_and_the_recipe_is_named(digits_artifact,
                                                                                        tmp_path_factory):
    b = digits_recipe_b(tmp_path_factory)
    res = run("diff", digits_artifact, b)
    assert res.exit_code == 1, res.output
    print(res.output)
    text = res.output
    pred = text.split("prediction side")[1].split("timings")[0]
    assert 'variants[onnx-int8].quantization.recipe: "cnn" -> "transformer-basic"' in pred
    assert 'files["onnx-int8/static.onnx"].sha256' in pred and "identity" not in text.split("different:")[1][:3]
    res = run("diff", digits_artifact, b, "--json")
    assert res.exit_code == 1
    r = json.loads(res.stdout)
    d = by_path(r)
    assert r["same"] is False and r["counts"]["identity"] == 0 and r["counts"]["prediction"] >= 3
    assert d["variants[onnx-int8].quantization.recipe"] == {
        "path": "variants[onnx-int8].quantization.recipe", "side": "prediction", "a": "cnn",
        "b": "transformer-basic", "change": "changed", "added": [], "removed": []}
    assert d['files["onnx-int8/static.onnx"].sha256']["side"] == PREDICTION
    assert all(x["side"] == TIMING for x in r["differences"] if x["path"] in ("created", "build.seconds"))
    assert not any(x["path"].startswith("variants[onnx-int8].toolchain") for x in r["differences"])


def test_an_artifact_and_its_copy_are_the_same(digits_artifact, tmp_path):
    shutil.copytree(digits_artifact, tmp_path / "copy")
    res = run("diff", digits_artifact, tmp_path / "copy")
    assert res.exit_code == 0, res.output
    assert "same: no difference" in res.output
    r = json.loads(run("diff", digits_artifact, tmp_path / "copy", "--json").stdout)
    assert r["same"] and r["differences"] == []


def test_each_field_lands_on_its_side(make_artifact):
    a = make_artifact("text-classification")
    b = make_artifact("text-classification")

    def edit(m):
        m["model"]["version"] = "2"
        m["preprocess"]["max_length"] = 8
        m["postprocess"]["softmax"] = False
        m["limits"]["max_text_chars"] = 500
        v = m["variants"][0]
        v["quantization"]["nodes_to_exclude"] = ["/ffn/Gemm", "/head/MatMul"]
        v["quantization"]["calibration"]["fingerprint"] = "f" * 64
        v["parity"]["value"] = 0.97
        v["toolchain"]["onnxruntime"] = "1.99"
        v["runtime"] = {"precision": "bf16", "why": "fastest 0.1 ms"}
        v["buckets"][0]["inputs"][0]["shape"] = [1, 9]
        m["build"] = {"host": "aarch64", "seconds": 3}

    rewrite_manifest(a, lambda m: m["variants"][0]["quantization"].update(nodes_to_exclude=["/ffn/Gemm", "/x"]))
    rewrite_manifest(b, edit)
    res = run("diff", a, b, "--json")
    assert res.exit_code == 1, res.output
    r = json.loads(res.stdout)
    sides = {d["path"]: d["side"] for d in r["differences"]}
    assert sides["model.version"] == "identity"
    for p in ("preprocess.max_length", "postprocess.softmax", "variants[fake].quantization.nodes_to_exclude",
              "variants[fake].quantization.calibration.fingerprint", "variants[fake].parity.value"):
        assert sides[p] == PREDICTION, p
    for p in ("limits.max_text_chars", "variants[fake].toolchain.onnxruntime", "variants[fake].runtime.precision",
              "variants[fake].buckets[seq8].inputs[input_ids].shape", "build.host"):
        assert sides[p] == INFERENCE, p
    assert sides["variants[fake].runtime.why"] == TIMING and sides["build.seconds"] == TIMING
    nodes = by_path(r)["variants[fake].quantization.nodes_to_exclude"]
    assert nodes["added"] == ["/head/MatMul"] and nodes["removed"] == ["/x"]
    text = run("diff", a, b).output
    assert "~ variants[fake].quantization.nodes_to_exclude: +1 [\"/head/MatMul\"]; -1 [\"/x\"]" in text
    assert "+ limits.max_text_chars: 500 (only in B)" in text


def test_a_variant_only_in_b_is_an_inference_difference():
    a = {"variants": [{"target": "onnx-int8", "buckets": []}]}
    b = {"variants": [{"target": "onnx-int8", "buckets": []}, {"target": "openvino", "buckets": []}]}
    diffs = diff_manifests(a, b)
    assert [(d.path, d.side, d.change) for d in diffs] == [("variants[openvino]", INFERENCE, "added")]
    assert side_of("probe.samples") == PREDICTION and side_of("variants[x].edgetpu_report.ops") == INFERENCE


def test_a_corrupt_artifact_is_refused_with_exit_3(make_artifact):
    a = make_artifact("text-classification")
    b = make_artifact("text-classification")
    (b / "tokenizer.json").write_text("{}")
    res = run("diff", a, b)
    assert res.exit_code == 3 and "artifact_hash_mismatch" in res.output and "tokenizer.json" in res.output
