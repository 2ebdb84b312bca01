"""Wrong answers with exit 0 (and untyped crashes) in ``edge-infer convert`` for the vision tasks (the hunt
of 2026-12-07), each refused or fixed:

- a ``--preprocess`` layout unlike the source's input (``{"layout": "NHWC"}`` for an NCHW model): the vision
  tasks take a size that fits either layout, so the wrong tensor reached onnxruntime (``InvalidArgument`` or a
  ``ValueError``, exit 1 ``unexpected``); now ``convert_preprocess_invalid`` (exit 2) before any model runs;
- a detector's parity over held-out images most of which hold no object: F1 is over the images with a
  detection on either side only, yet "detection_f1 1.0000 on 8 held-out samples" passed (exit 0) on one
  image with a box. The parity now counts ``samples_compared`` and the sample policy
  (``--min-parity-samples``) holds to them: refused as too few samples, or with ``--allow-few-samples``
  recorded and said;
- a probe set the byte cap cut to 2 images was recorded as "at least 4 per bucket" (``probe.source``).

The models are tiny float ONNX graphs made here (no third-party data needed).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from edge_runtime.cli import main

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def _save(path, nodes, inits, out_shape):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("images", TensorProto.FLOAT,
                                                                               [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, out_shape)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def _segmenter(path):
    """float32 [1, 3, 32, 32] -> [1, 4, 32, 32] class scores (a 3x3 conv)."""
    from onnx import helper, numpy_helper

    w = np.random.default_rng(0).normal(0, 1, (4, 3, 3, 3)).astype(np.float32)
    return _save(path, [helper.make_node("Conv", ["images", "w"], ["out"], pads=[1, 1, 1, 1])],
                 [numpy_helper.from_array(w, "w")], [1, 4, 32, 32])


def _bright_detector(path):
    """A YOLO-shaped [1, 6, 64] head: one fixed box (cx 16, cy 16, 12x12) on every anchor, both class scores
    clip(3 * (mean pixel - 0.6), 0, 1): a box on a bright image, none on a dark one."""
    from onnx import helper, numpy_helper as nh

    boxes = np.zeros((1, 4, 64), np.float32)
    boxes[0, :2], boxes[0, 2:] = 16, 12
    nodes = [helper.make_node("ReduceMean", ["images"], ["m"], axes=[1, 2, 3], keepdims=1),
             helper.make_node("Sub", ["m", "c06"], ["d"]), helper.make_node("Mul", ["d", "c3"], ["e"]),
             helper.make_node("Clip", ["e", "lo", "hi"], ["s"]),
             helper.make_node("Reshape", ["s", "s3"], ["s1"]), helper.make_node("Expand", ["s1", "shp"], ["sc"]),
             helper.make_node("Concat", ["boxes", "sc"], ["out"], axis=1)]
    inits = [nh.from_array(boxes, "boxes"), nh.from_array(np.array(0.6, np.float32), "c06"),
             nh.from_array(np.array(3.0, np.float32), "c3"), nh.from_array(np.array(0.0, np.float32), "lo"),
             nh.from_array(np.array(1.0, np.float32), "hi"), nh.from_array(np.array([1, 1, 1], np.int64), "s3"),
             nh.from_array(np.array([1, 2, 64], np.int64), "shp")]
    return _save(path, nodes, inits, [1, 6, 64])


def _images(root, n_calib=16, n_parity=8, bright_parity=1):
    """Calibration: every other image bright; parity: the first ``bright_parity`` bright, the rest dark."""
    from PIL import Image

    rng = np.random.default_rng(3)
    for side, n in (("calib", n_calib), ("parity", n_parity)):
        (root / side).mkdir()
        for i in range(n):
            bright = i % 2 == 0 if side == "calib" else i < bright_parity
            lo, hi = (220, 256) if bright else (0, 60)
            Image.fromarray(rng.integers(lo, hi, (30 + i, 40, 3)).astype(np.uint8)).save(root / side / f"{i}.png")
    return root / "calib", root / "parity"


def _convert(model, out, calib, parity, *extra, probes=0):
    return CliRunner().invoke(main, ["convert", str(model), "-o", str(out), "--target", "onnx-int8",
                                     "--calibration", str(calib), "--parity-data", str(parity),
                                     "--probe-samples", str(probes), "--json", *extra])


def _error(res) -> dict:
    return next(json.loads(line) for line in res.stdout.splitlines() if line.startswith('{"error"'))["error"]


# -- a --preprocess layout the source's input does not have ------------------------------------------------

@pytest.mark.parametrize("task", ["semantic-segmentation", "object-detection"])
def test_a_layout_unlike_the_sources_input_is_refused_before_any_model_runs(tmp_path, task):
    # before: exit 1, {"type": "ValueError", "code": "unexpected"} from the fp32 reference's first call (the
    # probe set's; without one, the quantizer's refusal blamed the recipe: convert_recipe_invalid)
    calib, parity = _images(tmp_path)
    if task == "object-detection":      # the family fills the rest of the input
        model, pre, extra = _bright_detector(tmp_path / "det.onnx"), {}, ["--family", "yolo"]
        (tmp_path / "labels.txt").write_text("a\nb\n")
    else:
        model, pre, extra = _segmenter(tmp_path / "seg.onnx"), {"size": [32, 32]}, []
        (tmp_path / "labels.txt").write_text("background\na\nb\nc\n")
    args = ["--task", task, "--labels", str(tmp_path / "labels.txt"), *extra]
    res = _convert(model, tmp_path / "art", calib, parity, *args, "--preprocess", json.dumps({**pre, "layout": "NHWC"}),
                   probes=4)
    assert res.exit_code == 2, res.output
    err = _error(res)
    # the vision contract refuses it as it builds (manifest_field_invalid, "from --preprocess"); the sample
    # check in convert_inputs (convert_preprocess_invalid) is the net for a task whose contract does not
    assert err["code"] in ("manifest_field_invalid", "convert_preprocess_invalid"), err
    assert "[1, 32, 32, 3]" in err["message"] and "[1, 3, 32, 32]" in err["message"], err
    assert not (tmp_path / "art").exists()
    # the layout the model has still converts
    ok = _convert(model, tmp_path / "ok", calib, parity, *args, "--preprocess", json.dumps({**pre, "layout": "NCHW"}),
                  "--allow-few-samples")
    assert ok.exit_code == 0, ok.output


# -- a detector's F1 over the images with a box, not over every held-out image -----------------------------

def test_detection_parity_counts_the_samples_it_compares():
    from edge_runtime.models.base import TaskOutput
    from edge_runtime.models.detection_parity import detection_parity

    box = {"label": "a", "class_id": 0, "score": 0.9, "box": [10.0, 10.0, 20.0, 20.0]}
    empty = TaskOutput(detections=[], near_detections=[])
    ref = [TaskOutput(detections=[box], near_detections=[])] + [empty] * 7
    only_cand = [empty] * 6 + [TaskOutput(detections=[box], near_detections=[])] + [empty]
    r = detection_parity(ref, ref)
    assert r["value"] == 1.0 and r["samples"] == 8 and r["samples_compared"] == 1, r
    r = detection_parity(ref, only_cand)        # a false box on an image the reference finds empty compares too
    assert r["samples_compared"] == 2 and r["value"] == 0.0, r


@pytest.mark.slow
def test_a_detector_parity_over_one_image_with_objects_is_too_few_samples(tmp_path):
    # before: "detection_f1 1.0000 on 8 held-out samples (budget 0.9)", passed, exit 0: 7 of the 8 parity
    # images are dark and hold no box on either side, so the figure was one image's
    calib, parity = _images(tmp_path)
    (tmp_path / "labels.txt").write_text("a\nb\n")
    model = _bright_detector(tmp_path / "det.onnx")
    args = ["--task", "object-detection", "--family", "yolo", "--labels", str(tmp_path / "labels.txt")]
    res = _convert(model, tmp_path / "art", calib, parity, *args)
    assert res.exit_code == 2, res.output
    err = _error(res)
    assert err["code"] == "convert_too_few_samples", err
    assert "only 1 of the 8 held-out samples has a detection on either side" in err["message"], err
    assert not (tmp_path / "art").exists()

    res = _convert(model, tmp_path / "art", calib, parity, *args, "--allow-few-samples")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)["variants"][0]
    assert summary["parity"]["samples"] == 8 and summary["parity"]["samples_compared"] == 1, summary
    assert "only 1 of the 8 held-out samples has a detection" in summary["parity_warning"], summary
    par = json.loads((tmp_path / "art" / "manifest.json").read_text())["variants"][0]["parity"]
    assert par["samples_compared"] == 1 and "--allow-few-samples" in par["compared_warning"], par
    text = CliRunner().invoke(main, ["convert", str(model), "-o", str(tmp_path / "art2"), "--target", "onnx-int8",
                                     "--calibration", str(calib), "--parity-data", str(parity), "--probe-samples",
                                     "0", "--allow-few-samples", *args])
    assert text.exit_code == 0, text.output
    assert "on 8 held-out samples, 1 with a detection (budget 0.9)" in text.stdout, text.stdout


@pytest.mark.slow
def test_a_detector_parity_over_images_that_all_hold_objects_is_unchanged(tmp_path):
    calib, parity = _images(tmp_path, bright_parity=8)
    (tmp_path / "labels.txt").write_text("a\nb\n")
    res = _convert(_bright_detector(tmp_path / "det.onnx"), tmp_path / "art", calib, parity, "--task",
                   "object-detection", "--family", "yolo", "--labels", str(tmp_path / "labels.txt"))
    assert res.exit_code == 0, res.output
    par = json.loads((tmp_path / "art" / "manifest.json").read_text())["variants"][0]["parity"]
    assert par["samples_compared"] == 8 and "compared_warning" not in par and par["passed"] is True, par


@pytest.mark.slow
def test_the_probe_sections_source_states_the_count_the_byte_cap_kept(tmp_path):
    # before: probe.samples 2 (the --probe-max-bytes cap), probe.source "... at least 4 per bucket ..."
    calib, parity = _images(tmp_path, bright_parity=8)
    (tmp_path / "labels.txt").write_text("a\nb\n")
    res = _convert(_bright_detector(tmp_path / "det.onnx"), tmp_path / "art", calib, parity, "--task",
                   "object-detection", "--family", "yolo", "--labels", str(tmp_path / "labels.txt"),
                   "--probe-max-bytes", "9000", probes=8)
    assert res.exit_code == 0, res.output
    probe = json.loads((tmp_path / "art" / "manifest.json").read_text())["probe"]
    assert 1 <= probe["samples"] < 4 and probe["max_samples"] == 8, probe
    assert f"at least {probe['samples']} per bucket" in probe["source"], probe
