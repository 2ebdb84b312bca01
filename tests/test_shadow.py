"""``edge-infer shadow``: two inference versions on the same inputs, on real digits artifacts.

Two recipes of one model agree (the real figure is printed), a deliberately broken B
(its int8 weights permuted, the manifest re-sealed) falls under --min-agreement and exits 7,
one artifact on ONNX Runtime vs OpenVINO reports its real agreement, nothing is lost
across a resume, and the per-task comparisons are checked on hand-made results.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edge_runtime.cli import main
from edge_runtime.converters.zoo import ZOO
from edge_runtime.shadow_compare import compare

HELD_OUT = ZOO / "digits-cnn" / "held_out"


def digits_recipe_b(tmp_path_factory) -> Path:
    """digits-cnn on onnx-int8 with another recipe than the default ``cnn``: ``transformer-basic``
    (MatMul/Gemm/Gather only: the convolutions stay float). Built once per session (~5 s)."""
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.zoo import convert_request

    out = tmp_path_factory.getbasetemp() / "shadow-digits-recipe-b" / "digits"
    if not (out / "manifest.json").exists():
        convert(convert_request("digits-cnn", "image-classification", out, recipe="transformer-basic",
                                recipe_overrides={"exclude_gelu_matmuls": False}))
    return out


def perturbed_copy(src: Path, dst: Path, seed: int = 0) -> Path:
    """A copy of ``src`` whose onnx-int8 weights (every int8/uint8 initializer) are permuted,
    re-hashed and re-sealed: a valid artifact that computes something else."""
    import onnx
    from onnx import numpy_helper

    from factories import rewrite_manifest
    from edge_runtime.artifact import sha256_file

    shutil.copytree(src, dst)
    man = json.loads((dst / "manifest.json").read_text())
    rel = next(v for v in man["variants"] if v["target"] == "onnx-int8")["buckets"][0]["file"]
    model = onnx.load(dst / rel)
    rng = np.random.default_rng(seed)
    changed = 0
    for init in model.graph.initializer:
        arr = numpy_helper.to_array(init)
        if arr.dtype in (np.int8, np.uint8) and arr.size > 16:
            init.CopyFrom(numpy_helper.from_array(rng.permutation(arr.ravel()).reshape(arr.shape), init.name))
            changed += 1
    assert changed, "no int8 weights found to perturb"
    onnx.save(model, dst / rel)
    size, digest = (dst / rel).stat().st_size, sha256_file(dst / rel)
    rewrite_manifest(dst, lambda m: m["files"][rel].update(sha256=digest, bytes=size))
    return dst


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def subset(tmp_path: Path, per_label: int = 4) -> Path:
    """A labelled image folder of ``per_label`` held-out images per digit."""
    root = tmp_path / "subset"
    for d in sorted(HELD_OUT.iterdir()):
        (root / d.name).mkdir(parents=True)
        for f in sorted(d.iterdir())[:per_label]:
            shutil.copy(f, root / d.name / f.name)
    return root


def test_two_recipes_of_digits_agree_and_every_input_has_its_line(digits_artifact, tmp_path_factory, tmp_path):
    b = digits_recipe_b(tmp_path_factory)
    out, report = tmp_path / "pairs.jsonl", tmp_path / "shadow.html"
    res = run("shadow", digits_artifact, b, HELD_OUT, "-o", out, "--report", report, "--json", "--quiet",
              "--min-agreement", "0.95")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    print(f"digits cnn vs transformer-basic recipe: agreement {s['agreement']} over {s['compared']}, "
          f"accuracy A {s['accuracy']['a']} B {s['accuracy']['b']}, latency p50 A {s['latency_ms']['a']['p50']} "
          f"B {s['latency_ms']['b']['p50']} ms [{s['cpu']}]")
    assert s["total"] == s["compared"] == 360 and s["kind"] == "classification"
    assert 0.95 <= s["agreement"] <= 1.0
    assert s["accuracy"]["samples"] == 360 and s["accuracy"]["a"] > 0.9 and s["accuracy"]["b"] > 0.9
    assert sum(map(sum, s["matrix"]["counts"])) == 360 and s["matrix"]["labels"] == [str(i) for i in range(10)]
    assert len(s["worst"]) == 10 and s["latency_ms"]["a"]["p50"] > 0 and s["latency_ms"]["b"]["p99"] > 0
    assert s["a"]["manifest_sha256"] != s["b"]["manifest_sha256"]
    got = lines(out)
    assert [x["index"] for x in got] == list(range(360))
    first = got[0]
    assert first["id"] == "0/" + sorted((HELD_OUT / "0").iterdir())[0].name and first["truth"] == "0"
    assert first["a"]["ok"] and first["b"]["ok"] and first["compare"]["kind"] == "classification"
    assert {"top1_match", "margin", "score_diff"} <= set(first["compare"])
    assert sum(x["agree"] for x in got) == s["agree"]
    job = json.loads((tmp_path / "pairs.jsonl.job.json").read_text())
    assert job["options"]["shadow_b"]["manifest_sha256"] == s["b"]["manifest_sha256"]
    page = report.read_text()
    assert "<svg" in page and 'id="worst"' in page and "data:image/png;base64," in page and "http" not in \
        page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_a_broken_b_falls_under_the_threshold_and_exits_7(digits_artifact, tmp_path):
    broken = perturbed_copy(digits_artifact, tmp_path / "broken")
    data = subset(tmp_path, per_label=6)
    res = run("shadow", digits_artifact, broken, data, "--min-agreement", "0.9", "--json", "--quiet")
    assert res.exit_code == 7, res.output
    s = json.loads(res.stdout)
    print(f"digits vs its permuted-weights twin: agreement {s['agreement']} (accuracy B {s['accuracy']['b']})")
    assert s["agreement"] < 0.9 and s["error"]["code"] == "shadow_agreement_below"
    assert s["flips"] and s["accuracy"]["b"] < s["accuracy"]["a"]
    assert all(not w["agree"] for w in s["worst"]) and s["worst"][0]["compare"]["margin"] < 0
    # the human summary names the figure and the threshold
    res = run("shadow", digits_artifact, broken, data, "--min-agreement", "0.9", "--quiet", "--worst", "3")
    assert res.exit_code == 7 and "agreement" in res.output and "label flips (A -> B)" in res.output


def test_one_artifact_on_onnxruntime_vs_openvino(ov_digits_artifact):
    res = run("shadow", ov_digits_artifact, ov_digits_artifact, HELD_OUT, "--device-a", "onnxruntime",
              "--device-b", "openvino", "--json", "--quiet", "--worst", "3")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    print(f"digits onnx-int8 on onnxruntime vs openvino on openvino: agreement {s['agreement']} "
          f"({s['agree']}/{s['compared']}), flips {s['flips']}, latency p50 A {s['latency_ms']['a']['p50']} "
          f"B {s['latency_ms']['b']['p50']} ms [{s['cpu']}]")
    assert s["a"]["target"] == "onnx-int8" and s["a"]["device"].startswith("onnxruntime")
    assert s["b"]["target"] == "openvino" and s["b"]["device"].startswith("openvino")
    assert s["a"]["manifest_sha256"] == s["b"]["manifest_sha256"]
    assert s["agreement"] >= 0.97 and s["compared"] == 360


def test_resume_after_a_crash_loses_nothing_and_refuses_another_b(digits_artifact, tmp_path_factory, tmp_path):
    data = subset(tmp_path)
    out = tmp_path / "pairs.jsonl"
    assert run("shadow", digits_artifact, digits_artifact, data, "-o", out, "--quiet").exit_code == 0
    full = out.read_bytes().splitlines(keepends=True)
    assert len(full) == 40
    out.write_bytes(b"".join(full[:13]) + full[13][:25])          # a crash mid-line
    res = run("shadow", digits_artifact, digits_artifact, data, "-o", out, "--resume", "--json", "--quiet")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["resumed_from"] == 13 and s["total"] == 40 and s["agreement"] == 1.0
    assert [x["index"] for x in lines(out)] == list(range(40))
    other = digits_recipe_b(tmp_path_factory)
    res = run("shadow", digits_artifact, other, data, "-o", out, "--resume", "--quiet")
    assert res.exit_code == 2 and "score_output_mismatch" in res.output and "shadow_b" in res.output
    res = run("shadow", digits_artifact, digits_artifact, data, "-o", out, "--quiet")
    assert res.exit_code == 2 and "score_output_exists" in res.output


def test_text_tsv_labels_and_a_task_mismatch(make_artifact, tmp_path):
    a = make_artifact("text-classification")
    b = make_artifact("text-classification", seed=3)
    tsv = tmp_path / "data.tsv"
    tsv.write_text("text\tlabel\ngood movie\tpositive\nawful movie\t0\nthe market rises\t1\n\tpositive\n")
    res = run("shadow", a, b, tsv, "--json", "--quiet", "-o", tmp_path / "o.jsonl")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["total"] == 4 and s["accuracy"]["samples"] == 4
    got = lines(tmp_path / "o.jsonl")
    assert [x["truth"] for x in got] == ["positive", "negative", "positive", "positive"]
    assert got[3]["a"]["ok"] is False and got[3]["agree"] is None and s["both_failed"] == 1
    assert s["compared"] == 3
    emb = make_artifact("text-embedding")
    res = run("shadow", a, emb, tsv, "--quiet")
    assert res.exit_code == 2 and "shadow_task_mismatch" in res.output
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    res = run("shadow", a, b, empty, "--quiet")
    assert res.exit_code == 2 and "score_input_empty" in res.output


def _cls(top):
    return {"prediction": top[0][1], "class_id": top[0][0],
            "top_k": [{"index": i, "label": lab, "score": s} for i, lab, s in top]}


def test_comparisons_per_task():
    a = _cls([(3, "3", 0.7), (8, "8", 0.2)])
    same = compare(a, _cls([(3, "3", 0.6), (8, "8", 0.3)]))
    assert same["agree"] and same["margin"] == pytest.approx(0.3) and same["score_diff"] == pytest.approx(0.1)
    flip = compare(a, _cls([(8, "8", 0.55), (3, "3", 0.4)]))
    assert not flip["agree"] and flip["margin"] == pytest.approx(-0.15) and flip["badness"] > same["badness"]
    outside = compare(a, _cls([(8, "8", 0.9), (1, "1", 0.05)]))
    assert outside["margin_bound"] and outside["margin"] == pytest.approx(-0.9)
    e1, e2 = {"embedding": [1.0, 0.0, 0.0]}, {"embedding": [0.99, 0.1, 0.0]}
    emb = compare(e1, e2)
    assert emb["kind"] == "embedding" and emb["cosine"] == pytest.approx(0.99 / np.sqrt(0.9901), abs=1e-6) and emb["agree"]
    assert not compare(e1, e2, agree_at=0.999)["agree"]
    d = {"label": "cat", "class_id": 0, "score": 0.9, "box": [0, 0, 10, 10]}
    moved = dict(d, box=[1, 1, 11, 11])
    det = compare({"detections": [d]}, {"detections": [moved, dict(d, class_id=1)]})
    assert det["kind"] == "detection" and det["f1"] == pytest.approx(2 / 3) and not det["agree"]
    assert det["mean_iou"] == pytest.approx(81 / 119, abs=1e-4)
    assert compare({"detections": []}, {"detections": []})["f1"] == 1.0
    seg = compare({"outputs": {"mask": [[0, 1], [1, 1]]}}, {"outputs": {"mask": [[0, 1], [1, 0]]}})
    assert seg["kind"] == "segmentation" and seg["pixel_agreement"] == 0.75 and not seg["agree"]
    ten = compare({"outputs": {"y": {"data": [1.0, 2.0]}}}, {"outputs": {"y": {"data": [1.0, 2.0]}}})
    assert ten["kind"] == "tensors" and ten["cosine"] == pytest.approx(1.0) and ten["agree"]


def test_a_nan_result_is_written_as_that_sides_failure():
    from edge_runtime.score_inputs import Record
    from edge_runtime.shadow import ShadowSummary, _dumps, shadow_line

    class Res:
        def __init__(self, emb):
            self.emb = emb

        def to_dict(self):
            return {"prediction": None, "embedding": self.emb, "latency_ms": 1.0}

    line = shadow_line(Record(0, "r0", "text", line=1), Res([1.0, 0.0]), Res([float("nan"), 0.0]), None, None)
    text, written = _dumps(line)
    back = json.loads(text)
    assert ": NaN" not in text and "NaN," not in text and back == written
    assert back["a"]["ok"] and back["b"]["error"]["code"] == "result_nonfinite" and back["agree"] is False
    s = ShadowSummary()
    s.add(written)
    assert s.compared == 1 and s.only_b_failed == 1 and s.agreement == 0.0


def test_detection_and_segmentation_run_end_to_end(make_artifact, tmp_path):
    """The CLI path of the vision tasks on tiny fake-backend artifacts (the comparison itself is
    checked above): every image gets its line with the task's figure."""
    from factories import png_bytes

    folder = tmp_path / "imgs"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        (folder / f"{i}.png").write_bytes(png_bytes(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)))
    for task, figure in (("object-detection", "f1"), ("semantic-segmentation", "pixel_agreement")):
        a = make_artifact(task)
        b = make_artifact(task, seed=5)
        out = tmp_path / f"{task}.jsonl"
        res = run("shadow", a, b, folder, "-o", out, "--json", "--quiet", "--report", tmp_path / f"{task}.html")
        assert res.exit_code == 0, res.output
        s = json.loads(res.stdout)
        got = lines(out)
        assert s["total"] == 3 and s["compared"] == 3 and s["kind"] == figure.replace("f1", "detection").replace(
            "pixel_agreement", "segmentation")
        assert all(figure in x["compare"] for x in got) and s["figures"][figure]["mean"] is not None
        assert s["accuracy"] is None and "<svg" in (tmp_path / f"{task}.html").read_text()
