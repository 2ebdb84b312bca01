"""A vision artifact whose preprocess layout is not its model's is refused at load.

The size check took either layout (``[1, 3, 16, 16]`` and ``[1, 16, 16, 3]`` both fit 16x16x3), so
``"layout": "NHWC"`` on an NCHW model loaded with a warm-up warning and every call failed with
``inference_failed`` (a feed of another shape): the operator's artifact error reached callers as ours.
"""

from __future__ import annotations

import numpy as np
import pytest

import edge_runtime as er
from factories import rewrite_manifest


@pytest.mark.parametrize("task", ["semantic-segmentation", "pose-estimation", "object-detection"])
def test_a_layout_unlike_the_models_is_refused_at_load(make_artifact, task):
    art = make_artifact(task)
    rewrite_manifest(art, lambda m: m["preprocess"].update(layout="NHWC"))
    with pytest.raises(er.ArtifactError) as err:
        er.load(art, device="fake")
    assert err.value.code in ("manifest_field_invalid", "artifact_task_mismatch"), err.value
    assert "NHWC" in str(err.value) and "[1, 3, 16, 16]" in str(err.value)


def test_the_models_own_layout_loads_and_answers(make_artifact):
    art = make_artifact("semantic-segmentation")
    with er.load(art, device="fake") as rt:
        res = rt.infer(np.full((20, 30, 3), 80, np.uint8))
    assert res.outputs["mask"].shape == (20, 30)
