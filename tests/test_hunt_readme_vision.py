"""README "Detection, pose, segmentation" and "Reliability" held against the program (h38).

- A segmentation mask's per-class counts (``edge-infer infer --json``, ``score``'s lines, the drawn
  legend: ``edge_runtime.draw.mask_classes``) named each class by the first ``scores`` entry whose
  share was within 1e-6 of its own: on a 4-MP mask two classes a pixel apart differ by 2.5e-7, and
  the larger (listed first) one's label went to the other class, the other's to it.
- A detector family's parameter *values* were not checked: ``class_activation``/``activation``
  "softmax" or "Sigmoid" read as none (logits reported as scores), ``objectness`` "false" as true,
  strides 32.5 as 32, reg_max 7.5 as 7, exit 0; strides 8 or 0, a string reg_max or an SSD
  ``outputs`` that is not the four names crashed import with a bare TypeError/ZeroDivisionError/
  AttributeError/KeyError (exit 1). Now a ``TaskMismatch`` (import: ``import_task_mismatch``,
  exit 2; load: ``artifact_task_mismatch``).
"""

from __future__ import annotations

import numpy as np
import pytest

import edge_runtime as er
from edge_runtime.draw import mask_classes, summarize
from edge_runtime.models.base import TaskMismatch
from edge_runtime.models.object_detection import resolve


def _segmentation_scores(mask: np.ndarray, names: dict[int, str]) -> dict[str, float]:
    """``scores`` as the segmentation task gives them: share per class, largest first (ties by id)."""
    ids, counts = np.unique(mask, return_counts=True)
    order = np.argsort(-counts, kind="stable")
    return {names[int(ids[i])]: float(counts[i]) / float(mask.size) for i in order}


def test_mask_classes_name_classes_a_pixel_apart_on_a_large_mask():
    mask = np.zeros((2000, 2000), np.uint8)             # 4 MP: one pixel is 2.5e-7 of the mask
    mask.flat[:1000] = 3                                # cat: 1000 pixels
    mask.flat[1000:2001] = 5                            # dog: 1001 pixels (listed first in scores)
    d = {"scores": _segmentation_scores(mask, {0: "background", 3: "cat", 5: "dog"})}
    got = {c["class_id"]: (c["label"], c["pixels"]) for c in mask_classes(d, mask)}
    assert got == {0: ("background", 3997999), 3: ("cat", 1000), 5: ("dog", 1001)}
    # the CLI's --json and score's lines go through summarize
    summary = summarize({**d, "outputs": {"mask": {"dtype": "uint8", "data": mask.tolist()}}})
    assert [(c["class_id"], c["label"]) for c in summary["outputs"]["mask"]["classes"]] == \
        [(0, "background"), (3, "cat"), (5, "dog")]
    # equal shares still go by class id (scores list ties by id)
    small = np.zeros((10, 10), np.uint8)
    small.flat[:5], small.flat[5:10] = 2, 1
    d = {"scores": _segmentation_scores(small, {0: "bg", 1: "one", 2: "two"})}
    assert [(c["class_id"], c["label"]) for c in mask_classes(d, small)] == [(0, "bg"), (1, "one"), (2, "two")]


IMAGE = [{"name": "images", "dtype": "float32", "shape": [1, 3, 64, 64]}]
YOLO_OUT = [{"name": "out", "dtype": "float32", "shape": [1, 84, 84]}]      # 64x64: 64+16+4 = 84 anchors
YOLOX_OUT = [{"name": "out", "dtype": "float32", "shape": [1, 84, 85]}]
GFL_OUT = [{"name": f"{k}{n}", "dtype": "float32", "shape": [1, n, w]}
           for n in (64, 16, 4) for k, w in (("cls", 80), ("reg", 32))]
SSD_OUT = [{"name": "b", "dtype": "float32", "shape": [1, 10, 4]}, {"name": "c", "dtype": "float32", "shape": [1, 10]},
           {"name": "s", "dtype": "float32", "shape": [1, 10]}, {"name": "n", "dtype": "float32", "shape": [1]}]


GOOD = {"yolo": {"class_activation": "sigmoid", "objectness": False}, "yolox": {"activation": "sigmoid",
         "strides": [8, 16, 32]}, "gfl": {"activation": "none", "reg_max": 7, "strides": [8, 16, 32]},
         "ssd-postprocess": {"outputs": {"boxes": "b", "classes": "c", "scores": "s", "count": "n"}}}


@pytest.mark.parametrize("outputs,post", [
    (YOLO_OUT, {"family": "yolo", "class_activation": "softmax"}),
    (YOLO_OUT, {"family": "yolo", "class_activation": "Sigmoid"}),
    (YOLO_OUT, {"family": "yolo", "objectness": "false"}),
    (YOLO_OUT, {"family": "yolo", "objectness": 1}),
    (YOLOX_OUT, {"family": "yolox", "activation": "Sigmoid"}),
    (YOLOX_OUT, {"family": "yolox", "strides": 8}),
    (YOLOX_OUT, {"family": "yolox", "strides": [8, 16, 0]}),
    (YOLOX_OUT, {"family": "yolox", "strides": ["8", "16", "32"]}),
    (YOLOX_OUT, {"family": "yolox", "strides": [8, 16, 32.5]}),
    (GFL_OUT, {"family": "gfl", "activation": "softmax"}),
    (GFL_OUT, {"family": "gfl", "reg_max": 7.5}),
    (GFL_OUT, {"family": "gfl", "reg_max": "x"}),
    (SSD_OUT, {"family": "ssd-postprocess", "outputs": ["b", "c", "s", "n"]}),
    (SSD_OUT, {"family": "ssd-postprocess", "outputs": {"boxes": "b"}}),
])
def test_family_parameter_values_are_checked(outputs, post):
    with pytest.raises(TaskMismatch) as ei:
        resolve(IMAGE, outputs, post)
    assert post["family"] in str(ei.value)
    # the same keys with values the family decodes still resolve
    good = {"family": post["family"], **{k: v for k, v in GOOD[post["family"]].items() if k in post}}
    assert resolve(IMAGE, outputs, good)["family"] == post["family"]


def test_an_artifact_with_an_activation_its_family_cannot_apply_is_refused_at_load(make_artifact):
    from factories import rewrite_manifest

    art = make_artifact("object-detection")
    rewrite_manifest(art, lambda m: m["postprocess"].update(class_activation="softmax"))
    with pytest.raises(er.ArtifactError) as ei:
        er.load(art, device="fake", warmup=False)
    assert ei.value.code == "artifact_task_mismatch" and "class_activation" in ei.value.message


def test_class_wise_nms_is_not_blurred_by_one_huge_box_of_another_class():
    """Classes are shifted apart by 2 x the largest coordinate: in float32 a single 5e6-pixel junk box (a
    broken anchor at a low score) made class 79's offset 7.9e8, whose float32 step (64 px) merged two of its
    boxes that overlap at IoU 0.25, and NMS at 0.45 dropped one: a person gone, exit 0."""
    from edge_runtime.models.detection_decode import nms

    boxes = np.array([[100, 100, 200, 200], [160, 100, 260, 200], [0, 0, 5e6, 5e6]], np.float32)
    scores = np.array([0.9, 0.8, 0.3], np.float32)
    ids = np.array([79, 79, 0])
    assert nms(boxes[:2], scores[:2], ids[:2], 0.45, 10).tolist() == [0, 1]
    assert nms(boxes, scores, ids, 0.45, 10).tolist() == [0, 1, 2]
    # and a real overlap in that class is still suppressed
    boxes[1] = [110, 100, 210, 200]
    assert nms(boxes, scores, ids, 0.45, 10).tolist() == [0, 2]


def test_a_cancel_hook_added_after_the_deadline_fired_runs_at_once():
    """The watchdog may fire a call's token between arming it and the session hooking its cancel in (ONNX
    Runtime's ``RunOptions.terminate``, OpenVINO's ``cancel()``): the hook was never run, and the call ran to
    its end past the deadline (README: deadlines within the deadline + 10 %)."""
    from edge_runtime.watchdog import CancelToken

    token = CancelToken(0.0)
    token.fire()
    hit = []
    token.on_cancel(lambda: hit.append(1))
    assert hit == [1]
    token.on_cancel(lambda: 1 / 0)          # a failing hook is swallowed, as fire() swallows it
    fresh = CancelToken(None)
    fresh.on_cancel(lambda: hit.append(2))
    assert hit == [1]
    fresh.fire()
    assert hit == [1, 2]


def test_a_raw_v5_head_gets_its_sigmoid_on_the_objectness_too():
    """``class_activation: sigmoid`` with ``objectness``: the class logits went through the sigmoid but the
    objectness logit did not, so a score was sigmoid(cls) x logit: 2.9 for logits 3 and 3, negative for a
    negative objectness."""
    from edge_runtime.models.detection_decode import FAMILIES

    p = {"output": "out", "layout": "channels_last", "objectness": True, "box_units": "pixels",
         "class_activation": "sigmoid", "classes": 2}
    rows = np.array([[[10, 10, 4, 4, 3.0, 3.0, -2.0], [20, 20, 4, 4, -1.0, -3.0, 1.0]]], np.float32)
    _, scores, ids = FAMILIES["yolo"].decode({"out": rows}, p, (32, 32))
    sig = lambda x: 1 / (1 + np.exp(-x))        # noqa: E731
    assert ids.tolist() == [0, 1]
    assert scores == pytest.approx([sig(3.0) * sig(3.0), sig(1.0) * sig(-1.0)], rel=1e-6)
    # an exported head (sigmoid applied in the graph) is read as it is
    _, scores, _ = FAMILIES["yolo"].decode({"out": rows.clip(0, 1)}, {**p, "class_activation": "none"}, (32, 32))
    assert scores.tolist() == [1.0, 0.0]


def test_the_candidate_cap_keeps_score_ties_in_anchor_order(tmp_path, monkeypatch):
    """Over MAX_CANDIDATES (4096) boxes above the floor (YOLOv8n's 8400 at a low threshold), the cut kept
    argpartition's order, and NMS broke the int8 model's many score ties by it: at score_threshold 0.05 on
    bus.jpg three of nine detections were another box than without the cap (a handbag 6 px lower)."""
    from conftest import need_litert, shared
    from edge_runtime.converters.tflite_import import import_tflite
    import edge_runtime.models.object_detection as od

    need_litert()
    model = shared("detection", "yolov8n_tflite", "yolov8n_full_integer_quant.tflite")
    import_tflite(model, tmp_path / "y8", task="object-detection", family="yolo")
    image = str(shared("detection", "images", "bus.jpg"))
    with er.load(tmp_path / "y8", warmup=False) as rt:
        capped = rt.infer(image, options={"score_threshold": 0.05}).detections
        monkeypatch.setattr(od, "MAX_CANDIDATES", 10 ** 9)
        whole = rt.infer(image, options={"score_threshold": 0.05}).detections
    assert len(capped) == 9 and capped == whole


def test_an_isolated_deadline_does_not_wait_for_the_killed_worker_to_exit(make_artifact, monkeypatch):
    """README: under ``isolate=True`` the deadline is hard. At the deadline the worker was killed and then
    waited for in the caller's thread: the kernel freeing a loaded model's memory took 15-30 ms (YOLOX-Nano
    on ONNX Runtime: a 20 ms deadline answered at 37-55 ms). Here the exit is made slow (0.4 s): the
    caller must still be answered at its deadline, and the worker is reaped all the same."""
    import subprocess
    import time

    art = make_artifact("text-classification")
    with er.load(art, device="fake", isolate=True, warmup=False, device_options={"stall_ms": 5000}) as rt:
        slow_wait, waited = subprocess.Popen.wait, []

        def wait(self, timeout=None):
            time.sleep(0.4)
            waited.append(self.pid)
            return slow_wait(self, timeout)

        monkeypatch.setattr(subprocess.Popen, "wait", wait)
        t0 = time.perf_counter()
        with pytest.raises(er.InferenceTimeout):
            rt.infer("good", deadline_ms=200)
        took = time.perf_counter() - t0
        assert took < 0.2 * 1.1 + 0.05, took
        end = time.perf_counter() + 5
        while not waited and time.perf_counter() < end:
            time.sleep(0.02)
        assert waited, "the killed worker was never reaped"


def test_detection_scores_keep_one_entry_per_class_of_a_repeated_label(make_artifact, monkeypatch):
    """Import warns for a labels file that repeats a label (SSD's labelmap.txt: '???' at ten unused ids)
    "each class keeps its own entry (scores keys 'label#index' for these)"; a detector's ``scores`` still
    merged them under the bare label, the best of both kept."""
    import factories
    from edge_runtime.models.base import Prepared

    out, post, _ = factories.VISION["object-detection"]
    post = {**post, "class_activation": "none"}     # the rows below are the scores themselves
    monkeypatch.setitem(factories.VISION, "object-detection", (out, post, ["cat", "cat", "bird"]))
    art = make_artifact("object-detection")
    with er.load(art, device="fake", warmup=False) as rt:
        rows = np.zeros((1, 7, 12), np.float32)             # [1, 4 + 3 classes, 12 anchors]
        rows[0, :4, 0], rows[0, 4, 0] = [4, 4, 4, 4], 0.9   # anchor 0: class 0, box around (4, 4)
        rows[0, :4, 1], rows[0, 5, 1] = [12, 12, 4, 4], 0.8     # anchor 1: class 1, elsewhere
        res = rt.task.finish({"output0": rows}, Prepared(bucket=0, feeds={}, meta={"geometry": None}))
    assert [(d["label"], d["class_id"]) for d in res.detections] == [("cat", 0), ("cat", 1)]
    assert res.scores == {"cat#0": pytest.approx(0.9), "cat#1": pytest.approx(0.8)}


def test_a_stated_max_detections_over_the_artifacts_limit_is_refused_at_import_and_convert():
    """``--postprocess '{"max_detections": 1000}'`` was written into the manifest, and every answer was cut
    to the max_detections limit (300 by default) with exit 0: README's refusal of a max_detections over the
    limit held per call only. Now import and convert refuse it, unless the artifact's limits (a convert
    request's ``limits``) allow it."""
    from edge_runtime.models.object_detection import ObjectDetection

    post = {"family": "yolo", "max_detections": 1000}
    with pytest.raises(TaskMismatch, match="over the artifact's max_detections limit of 300"):
        ObjectDetection.sections_for(IMAGE, YOLO_OUT, dict(post))
    assert ObjectDetection.sections_for(IMAGE, YOLO_OUT, dict(post), {"max_detections": 1000})["max_detections"] == 1000
    assert ObjectDetection.sections_for(IMAGE, YOLO_OUT, {**post, "max_detections": 300})["max_detections"] == 300
    with pytest.raises(TaskMismatch, match="limit of 50"):
        ObjectDetection.sections_for(IMAGE, YOLO_OUT, {**post, "max_detections": 100}, {"max_detections": 50})
