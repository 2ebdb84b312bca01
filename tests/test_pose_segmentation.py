"""pose-estimation and semantic-segmentation: third-party oracles, geometry, parity metrics, refusals.

Oracles (Coral's own models and test data, google-coral/test_data, run on ai-edge-litert):

- MoveNet SinglePose Lightning on ``squat.bmp`` against libcoral's
  ``movenet_single_pose_lightning_ptq_reference.csv`` the way libcoral checks it
  (google-coral/libcoral ``coral/pose_estimation/movenet_test.cc`` and
  ``test_utils.cc: CheckPoseEstimationResults(poses, expected, 0.4)``): the image
  stretched to the input with TFLite's bilinear resize, half-pixel centres, truncated
  to uint8 (``coral/test_utils.cc: CopyResizedImage``); only keypoints whose score is
  over 0.4 in both the reference and the result are checked, each x and y within
  0.04 (normalised coordinates: the CSV's x/y are fractions of the image), and at
  least 17 / 2 = 8 keypoints must be checked. (libcoral's pose-score check compares
  1.0 with 1.0 — MoveNet has no pose score — so there is nothing to take over.)
- DeepLabV3 MobileNetV2 PASCAL (dm 1.0 and dm 0.5) on ``bird_segmentation.bmp``
  against ``bird_segmentation_mask.bmp`` the way libcoral measures it
  (google-coral/libcoral ``coral/segmentation_models_test.cc``; pycoral
  ``tests/segment_test.py`` alike): mask value 255 (VOC's "ignore") read as 0, then
  ``IntersectionOverUnion = equal / (2N - equal)`` over all N pixels ``> 0.9``.
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

import edge_runtime as er
from conftest import need_litert, shared
from edge_runtime.errors import ArtifactError, EdgeRuntimeError, InputError
from edge_runtime.limits import DEFAULT_LIMITS
from edge_runtime.models.base import Prepared, TaskMismatch, TaskOutput
from edge_runtime.models.pose_estimation import KEYPOINT_NAMES, SKELETON, PoseEstimation
from edge_runtime.models.semantic_segmentation import SemanticSegmentation, to_original
from edge_runtime.models.vision import Geometry

POSE_MODEL = "movenet_single_pose_lightning_ptq.tflite"
DEEPLAB = ("deeplabv3_mnv2_pascal_quant.tflite", "deeplabv3_mnv2_dm05_pascal_quant.tflite")


def _import(tmp_path_factory, model: str, task: str, **kw):
    from edge_runtime.converters.tflite_import import import_tflite

    need_litert()
    coral = shared("coral")
    out = tmp_path_factory.mktemp(task) / model.replace(".tflite", "")
    import_tflite(coral / model, out, task=task, **kw)
    return out


@pytest.fixture(scope="session")
def movenet_artifact(tmp_path_factory):
    return _import(tmp_path_factory, POSE_MODEL, "pose-estimation")


@pytest.fixture(scope="session")
def deeplab_artifacts(tmp_path_factory):
    labels = shared("coral", "pascal_voc_segmentation_labels.txt")
    return {m: _import(tmp_path_factory, m, "semantic-segmentation", labels=labels) for m in DEEPLAB}


# -- the oracles -----------------------------------------------------------------------

def test_movenet_matches_libcoral_reference_keypoints(movenet_artifact):
    from PIL import Image

    man = json.loads((movenet_artifact / "manifest.json").read_text())
    assert man["task"] == "pose-estimation" and man["preprocess"]["resize"] == "stretch"
    assert man["preprocess"]["interpolation"] == "bilinear-half-pixel" and man["preprocess"]["input"] == "pixels"
    image = shared("coral", "squat.bmp")
    width, height = Image.open(image).size
    with er.load(movenet_artifact) as rt:
        res = rt.infer(str(image))
    with open(shared("coral", "movenet_single_pose_lightning_ptq_reference.csv"), newline="") as f:
        ref = list(csv.DictReader(f))
    assert [kp["name"] for kp in res.keypoints] == list(KEYPOINT_NAMES) and len(ref) == 17
    checked, worst = 0, 0.0
    for r, kp in zip(ref, res.keypoints):
        assert 0 <= kp["x"] <= width and 0 <= kp["y"] <= height     # original-image pixels
        if float(r["keypoint_score"]) > 0.4 and kp["score"] > 0.4:
            checked += 1
            dx, dy = abs(kp["x"] / width - float(r["keypoint_x"])), abs(kp["y"] / height - float(r["keypoint_y"]))
            worst = max(worst, dx, dy)
            assert dx <= 0.04 and dy <= 0.04, (kp, r)
    assert checked >= 17 // 2, checked
    assert res.scores == {kp["name"]: kp["score"] for kp in res.keypoints}
    assert res.prediction == pytest.approx(np.mean([kp["score"] for kp in res.keypoints]))
    # the task's own parity metric against the reference, as pixels of this image: all within 5% of the diagonal
    reference = TaskOutput(keypoints=[{"name": n, "x": float(r["keypoint_x"]) * width,
                                       "y": float(r["keypoint_y"]) * height, "score": float(r["keypoint_score"])}
                                      for n, r in zip(KEYPOINT_NAMES, ref)],
                           outputs={"image_size": np.array([height, width])})
    got = PoseEstimation.compare([reference], [TaskOutput(keypoints=res.keypoints, outputs=res.outputs)])
    assert got["metric"] == "keypoint_pck" and got["value"] == 1.0 and got["keypoints"] == 17
    assert got["max_pixel_distance"] < 0.05 * math.hypot(width, height) and worst < 0.04


@pytest.mark.parametrize("model", DEEPLAB)
def test_deeplab_matches_the_bird_mask_as_libcoral_measures_it(deeplab_artifacts, model):
    from PIL import Image

    with er.load(deeplab_artifacts[model]) as rt:
        res = rt.infer(str(shared("coral", "bird_segmentation.bmp")))
        assert rt.task.labels[:21][3] == "bird" and rt.task.classes is None        # an int64 ArgMax class map
    reference = np.asarray(Image.open(shared("coral", "bird_segmentation_mask.bmp"))).copy()
    reference[reference == 255] = 0
    mask = res.outputs["mask"]
    assert mask.dtype == np.uint8 and mask.shape == reference.shape == (513, 513)
    equal = int((mask == reference).sum())
    assert equal / (2 * mask.size - equal) > 0.9          # libcoral's IntersectionOverUnion threshold
    assert res.prediction == "bird" and res.class_id == 3
    assert set(res.scores) >= {"background", "bird"} and sum(res.scores.values()) == pytest.approx(1.0)
    got = SemanticSegmentation.compare([TaskOutput(outputs={"mask": reference})], [TaskOutput(outputs=res.outputs)])
    assert got["metric"] == "pixel_agreement" and got["value"] == pytest.approx(equal / mask.size)
    assert got["value"] > 0.95 and 0 < got["mean_iou"] <= 1


def test_import_refuses_the_other_tasks_models(tmp_path):
    from edge_runtime.converters.tflite_import import import_tflite

    need_litert()
    coral = shared("coral")
    with pytest.raises(InputError) as ei:
        import_tflite(coral / DEEPLAB[1], tmp_path / "a", task="pose-estimation")
    assert ei.value.code == "import_task_mismatch" and "'ArgMax'" in ei.value.message and "513" in ei.value.message
    with pytest.raises(InputError) as ei:
        import_tflite(coral / POSE_MODEL, tmp_path / "b", task="semantic-segmentation")
    assert ei.value.code == "import_task_mismatch" and "[1, 1, 17, 3]" in ei.value.message
    with pytest.raises(InputError) as ei:
        import_tflite(coral / "mobilenet_v1_0.25_128_quant.tflite", tmp_path / "c", task="semantic-segmentation")
    assert ei.value.code == "import_task_mismatch" and "[1, 1001]" in ei.value.message


# -- geometry, metrics and refusals on the tiny fake artifacts ---------------------------------

def test_pose_keypoints_map_back_through_a_letterbox(make_artifact):
    from factories import rewrite_manifest

    art = make_artifact("pose-estimation")
    rewrite_manifest(art, lambda m: m["preprocess"].update(resize="letterbox"))
    with er.load(art, device="fake", warmup=False) as rt:
        task = rt.task
    # a 32 x 16 (w x h) image in the 16 x 16 input: scale 0.5, content rows 0..8, padding below
    geo = task.vision.geometry(32, 16)
    prep = Prepared(bucket=0, feeds={}, meta={"geometry": geo})
    rows = np.zeros((1, 1, 17, 3), np.float32)
    rows[0, 0, :, 0], rows[0, 0, :, 1], rows[0, 0, :, 2] = 0.25, 0.5, 0.9   # y = 4, x = 8 input pixels
    rows[0, 0, 1, :2] = 1.0                                                   # in the padding: clipped
    out = task.finish({"keypoints": rows}, prep)
    assert out.keypoints[0] == {"name": "nose", "x": 16.0, "y": 8.0, "score": pytest.approx(0.9)}
    assert (out.keypoints[1]["x"], out.keypoints[1]["y"]) == (32.0, 16.0)
    assert out.outputs["image_size"].tolist() == [16, 32]
    assert all(0 <= a < 17 and 0 <= b < 17 for a, b in SKELETON) and len(SKELETON) == 18


def test_keypoint_pck_counts_keypoints_within_five_percent_of_the_diagonal():
    size = {"image_size": np.array([300, 400])}                                # diagonal 500: 25 px
    ref = TaskOutput(keypoints=[{"name": n, "x": 100.0, "y": 100.0, "score": 0.9} for n in "abcd"], outputs=size)
    moved = [{"name": n, "x": 100.0 + d, "y": 100.0, "score": 0.9} for n, d in zip("abcd", (0, 10, 24.9, 30))]
    got = PoseEstimation.compare([ref, ref], [TaskOutput(keypoints=moved, outputs=size), ref])
    assert got["value"] == pytest.approx(7 / 8) and got["keypoints"] == 8 and got["samples"] == 2
    assert got["max_pixel_distance"] == pytest.approx(30) and got["mean_pixel_distance"] == pytest.approx(64.9 / 8)


def test_segmentation_mask_undoes_the_letterbox():
    # a 4 x 2 (w x h) image letterboxed into 8 x 8 at the centre: scale 2, content rows 2..6
    geo = Geometry(4, 2, 2.0, 2.0, 0.0, 2.0)
    cmap = np.zeros((8, 8), np.uint8)
    cmap[2:4, :4], cmap[4:6, 4:] = 1, 2          # top-left and bottom-right quarters of the content
    assert to_original(cmap, geo, 8, 8).tolist() == [[1, 1, 0, 0], [0, 0, 2, 2]]
    # a class map at half the input's resolution samples the same places
    assert to_original(cmap[::2, ::2], geo, 8, 8).tolist() == [[1, 1, 0, 0], [0, 0, 2, 2]]


def test_segmentation_finish_reports_the_largest_foreground_class(make_artifact):
    with er.load(make_artifact("semantic-segmentation"), device="fake", warmup=False) as rt:
        task = rt.task
    prep = task.prepare(task.warmup_sample(), DEFAULT_LIMITS)
    logits = np.zeros((1, 16, 16, 3), np.float32)
    logits[0, :, :, 0] = 1.0
    logits[0, :4, :, 2] = 2.0               # a quarter "dog", the rest background
    out = task.finish({"logits": logits}, prep)
    assert out.prediction == "dog" and out.class_id == 2
    assert out.scores == {"background": 0.75, "dog": 0.25}
    assert out.outputs["mask"].shape == (16, 16) and out.outputs["mask"].dtype == np.uint8
    logits[0, :, :, 2] = 0.0
    assert task.finish({"logits": logits}, prep).prediction == "background"


def test_pixel_agreement_and_mean_iou():
    a = np.zeros((4, 4), np.uint8)
    b = a.copy()
    b[:2] = 1
    got = SemanticSegmentation.compare([TaskOutput(outputs={"mask": a})] * 2,
                                       [TaskOutput(outputs={"mask": b}), TaskOutput(outputs={"mask": a})])
    assert got["value"] == pytest.approx(0.75) and got["samples"] == 2
    assert got["mean_iou"] == pytest.approx((0.25 + 1.0) / 2)      # classes 0 (IoU .5) and 1 (IoU 0); then 1.0
    other = SemanticSegmentation.compare([TaskOutput(outputs={"mask": a})], [TaskOutput(outputs={"mask": a[:2]})])
    assert other["value"] == 0.0


@pytest.mark.parametrize("task,shape", [("pose-estimation", [1, 10]), ("pose-estimation", [1, 17, 2]),
                                        ("semantic-segmentation", [1, 10]),
                                        ("semantic-segmentation", [1, 16, 16, 1])])
def test_a_manifest_whose_output_does_not_fit_is_refused_at_load(make_artifact, task, shape):
    from factories import rewrite_manifest

    art = make_artifact(task)
    rewrite_manifest(art, lambda m: m["variants"][0]["buckets"][0]["outputs"][0].update(shape=shape))
    with pytest.raises(ArtifactError) as ei:
        er.load(art, device="fake", warmup=False)
    assert ei.value.code == "artifact_task_mismatch" and str(shape) in ei.value.message
    name = "keypoints" if task == "pose-estimation" else "logits"
    assert repr(name) in ei.value.message


def test_check_io_names_the_tensor_and_refuses_non_image_inputs():
    image = [{"name": "img", "dtype": "uint8", "shape": [1, 8, 8, 3]}]
    with pytest.raises(TaskMismatch) as ei:
        PoseEstimation.check_io(image, [{"name": "a", "dtype": "float32", "shape": [1, 4]},
                                        {"name": "b", "dtype": "float32", "shape": [1, 4]}])
    assert "'a'" in str(ei.value) and "'b'" in str(ei.value)
    with pytest.raises(TaskMismatch) as ei:
        SemanticSegmentation.check_io([{"name": "t", "dtype": "float32", "shape": [1, 4]}],
                                      [{"name": "m", "dtype": "int64", "shape": [1, 8, 8]}])
    assert ei.value.part == "inputs" and "'t'" in str(ei.value)
    assert PoseEstimation.check_io(image, [{"name": "k", "dtype": "float32", "shape": [1, 13, 3]}])["keypoints"] == 13
    assert SemanticSegmentation.check_io(image, [{"name": "m", "dtype": "int64", "shape": [8, 8]}]) == {
        "output": {"name": "m", "dtype": "int64", "shape": [8, 8]}}
    with pytest.raises(TaskMismatch, match="at most 256"):
        SemanticSegmentation.check_io(image, [{"name": "m", "dtype": "float32", "shape": [1, 8, 8, 300]}])


def test_class_ids_beyond_the_labels_are_a_typed_error(make_artifact):
    from factories import rewrite_manifest

    art = make_artifact("semantic-segmentation")
    rewrite_manifest(art, lambda m: m["variants"][0]["buckets"][0]["outputs"][0].update(dtype="int64",
                                                                                        shape=[1, 16, 16]))
    with er.load(art, device="fake", warmup=False) as rt:
        task = rt.task
    prep = task.prepare(task.warmup_sample(), DEFAULT_LIMITS)
    cmap = np.zeros((1, 16, 16), np.int64)
    assert task.finish({"logits": cmap}, prep).prediction == "background"
    cmap[0, 0, 0] = 3                       # three labels: background, cat, dog
    with pytest.raises(EdgeRuntimeError) as ei:
        task.finish({"logits": cmap}, prep)
    assert ei.value.code == "artifact_labels_mismatch" and "class id 3" in ei.value.message


@pytest.mark.parametrize("task", ["pose-estimation", "semantic-segmentation"])
def test_the_probe_set_round_trips_keypoints_and_masks(make_artifact, task):
    from edge_runtime.verify import verify_runtime

    art = make_artifact(task, probe=4)
    with er.load(art, device="fake") as rt:
        row = verify_runtime(rt)
    assert row["metric"] == {"pose-estimation": "keypoint_pck", "semantic-segmentation": "pixel_agreement"}[task]
    assert row["value"] == 1.0 and row["samples"] == 4 and row["passed"] is True
