"""Parity of the pose and segmentation tasks does not pass a candidate that visibly fails.

- Segmentation: pixel agreement is mostly background. A candidate that segments nothing read 0.97
  against a 3 % object, over the 0.97 budget: a sample where the candidate labels under half of the
  pixels of a class holding >= 1 % of the reference's now agrees nowhere (shadow: either way).
- Pose: positions alone were compared. Every keypoint in place with score 0.0 against 0.9 (hidden
  at any threshold) read PCK 1.0: a sample whose mean keypoint score moved by over 0.25 agrees
  nowhere (per keypoint a score is no test: MoveNet's differ by up to 0.5 between two resizes).
Both found by the h43 hunt; faithful candidates keep their figures (tested beside).
"""

from __future__ import annotations

import numpy as np

from edge_runtime.models.base import TaskOutput
from edge_runtime.models.pose_estimation import PoseEstimation
from edge_runtime.models.semantic_segmentation import SemanticSegmentation, missed_class


def _seg(mask) -> TaskOutput:
    return TaskOutput(prediction=None, outputs={"mask": np.asarray(mask, np.uint8)})


def test_a_segmenter_that_misses_the_object_fails_the_budget():
    ref = np.zeros((100, 100), np.uint8)
    ref[10:27, 10:28] = 7                                   # a 3 % object
    nothing = np.zeros_like(ref)
    out = SemanticSegmentation.compare([_seg(ref)], [_seg(nothing)])
    assert out["value"] == 0.0 and out["value"] < 0.97
    assert missed_class(ref, nothing) == 7


def test_a_faithful_segmenter_keeps_its_pixel_agreement():
    ref = np.zeros((100, 100), np.uint8)
    ref[10:27, 10:28] = 7
    near = ref.copy()
    near[10, 10:28] = 0                                     # one boundary row off
    out = SemanticSegmentation.compare([_seg(ref), _seg(ref)], [_seg(near), _seg(ref)])
    assert out["value"] == (float(np.mean(ref == near)) + 1.0) / 2 and out["value"] > 0.99
    tiny = ref.copy()
    tiny[50, 50] = 3                                        # a 1-pixel class the candidate misses: under 1 %
    assert missed_class(tiny, ref) is None


def test_the_general_path_of_other_dtypes_agrees():
    ref = np.zeros((10, 10), np.int32)
    ref[:3] = 300
    assert missed_class(ref, np.zeros_like(ref)) == 300 and missed_class(ref, ref) is None


def _pose(score: float, dx: float = 0.0) -> TaskOutput:
    kps = [{"name": f"k{i}", "x": 10.0 * i + dx, "y": 20.0, "score": score} for i in range(17)]
    return TaskOutput(prediction=score, keypoints=kps, outputs={"image_size": np.array([192, 192])})


def test_pose_keypoints_in_place_with_another_score_do_not_agree():
    out = PoseEstimation.compare([_pose(0.9)], [_pose(0.0)])
    assert out["value"] == 0.0


def test_pose_keypoints_in_place_with_a_drifted_score_agree():
    out = PoseEstimation.compare([_pose(0.9)], [_pose(0.7, dx=1.0)])
    assert out["value"] == 1.0
    ref, cand = _pose(0.5), _pose(0.5)
    for i, k in enumerate(cand.keypoints):      # single keypoints moving by 0.5 either way: the mean holds
        k["score"] = 0.0 if i % 2 else 1.0
    assert PoseEstimation.compare([ref], [cand])["value"] == 1.0


def test_a_candidate_painting_a_class_the_reference_lacks_keeps_its_pixel_share_in_parity():
    """Parity zeroes a sample for a missed class only: DeepLab dm0.5 paints a 1.6 % blob of another
    class on bird.bmp (libcoral accepts that answer); its pixel share already counts it. shadow, whose
    verdict is a yes/no beside the share, calls it a disagreement (below)."""
    ref = np.zeros((100, 100), np.uint8)
    blob = ref.copy()
    blob[60:77, 60:78] = 5                                  # a 3 % class out of nowhere
    assert SemanticSegmentation.compare([_seg(ref)], [_seg(blob)])["value"] == float(np.mean(ref == blob))
    from edge_runtime.shadow_compare import compare_segmentation

    out = compare_segmentation({"outputs": {"mask": ref}}, {"outputs": {"mask": blob}}, 0.9)
    assert out["agree"] is False and out["missed_class"] == 5 and out["pixel_agreement"] > 0.9


def test_shadow_records_the_same_defects_as_disagreements():
    from edge_runtime.shadow_compare import compare_keypoints, compare_segmentation

    ref = np.zeros((100, 100), np.uint8)
    ref[10:25, 10:27] = 7                                   # a 2.55 % object: a share over 0.97 without it
    a, b = {"outputs": {"mask": ref}}, {"outputs": {"mask": np.zeros_like(ref)}}
    out = compare_segmentation(a, b, 0.97)
    assert out["agree"] is False and out["missed_class"] == 7 and out["pixel_agreement"] >= 0.97
    assert compare_segmentation(a, a, 0.97)["agree"] is True
    pa, pb = _pose(0.9), _pose(0.0)
    out = compare_keypoints({"keypoints": pa.keypoints}, {"keypoints": pb.keypoints}, 0.95)
    assert out["agree"] is False and out["pck"] == 1.0 and out["score_shift"] == 0.9
    assert compare_keypoints({"keypoints": pa.keypoints}, {"keypoints": _pose(0.8).keypoints}, 0.95)["agree"] is True
