"""A pose model answering in pixels (or any scale far from MoveNet's 0..1) had every keypoint clipped to
the image's corner, exit 0. Now coordinates past -4..5 are refused as not normalised keypoints
(artifact_task_mismatch, exit 3); the real MoveNet, whose rows are in 0..1, answers as before."""

from __future__ import annotations

import numpy as np
import pytest

import edge_runtime as er
from conftest import shared
from test_pose_segmentation import movenet_artifact  # noqa: F401 (the session fixture)


def _rows(rt, scale: float, score: float = 0.9):
    task = rt.task
    prep = task.prepare(str(shared("coral", "squat.bmp")), rt.limits)
    rows = np.zeros((1, 1, 17, 3), np.float32)
    rows[..., 0] = np.linspace(0.1, 0.9, 17) * scale
    rows[..., 1] = np.linspace(0.2, 0.8, 17) * scale
    rows[..., 2] = score
    return task, prep, {task.output: rows}


def test_pixel_coordinates_are_refused_not_clipped_to_the_corner(movenet_artifact):  # noqa: F811
    with er.load(movenet_artifact) as rt:
        task, prep, out = _rows(rt, 1.0)
        ok = task.finish(out, prep)
        assert 0 < ok.keypoints[0]["x"] < ok.keypoints[-1]["x"]
        for scale in (192.0, 7.0, -6.0):
            task, prep, out = _rows(rt, scale)
            with pytest.raises(er.ArtifactError) as ei:
                task.finish(out, prep)
            assert ei.value.code == "artifact_task_mismatch" and "not normalised keypoints" in ei.value.message


def test_the_real_movenet_still_answers(movenet_artifact):  # noqa: F811
    with er.load(movenet_artifact) as rt:
        res = rt.infer(str(shared("coral", "squat.bmp")))
    assert len(res.keypoints) == 17 and all(0 <= k["score"] <= 1 for k in res.keypoints)


def test_scores_that_are_no_probabilities_are_refused_and_overshoot_is_clipped(movenet_artifact):  # noqa: F811
    """A pose model answering logits for its keypoint scores (-3.2, 4.1) had them reported as scores, and a
    caller's 0.3 threshold judged them, exit 0. Now scores past -0.01..1.01 are refused
    (artifact_task_mismatch); a quantised overshoot within that slack is clipped to 0..1."""
    with er.load(movenet_artifact) as rt:
        for logit in (4.1, -3.2):
            task, prep, out = _rows(rt, 1.0, score=logit)
            with pytest.raises(er.ArtifactError) as ei:
                task.finish(out, prep)
            assert ei.value.code == "artifact_task_mismatch" and "not 0..1 (logits?" in ei.value.message
        task, prep, out = _rows(rt, 1.0, score=1.004)
        res = task.finish(out, prep)
        assert all(k["score"] == 1.0 for k in res.keypoints) and res.prediction == 1.0
