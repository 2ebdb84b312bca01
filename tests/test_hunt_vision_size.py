"""A segmentation or pose artifact whose ``preprocess.size`` (or channels) is not its model input's shape
loaded, and every call then failed as our ``inference_failed`` (a feed of another shape), while detection
already refused such an artifact at load. Every vision task now refuses it at load, as the operator's
``manifest_field_invalid`` (exit 3)."""

from __future__ import annotations

import pytest

import edge_runtime as er
from edge_runtime.errors import ArtifactError


@pytest.mark.parametrize("task", ["semantic-segmentation", "pose-estimation", "object-detection"])
@pytest.mark.parametrize("change", [{"size": [17, 16]}, {"channels": 1}])
def test_a_preprocess_size_unlike_the_input_is_refused_at_load(make_artifact, task, change):
    from factories import rewrite_manifest

    art = make_artifact(task)
    with er.load(art, device="fake", warmup=False) as rt:        # as built: loads and answers
        rt.infer(rt.task.warmup_sample())
    rewrite_manifest(art, lambda m: m["preprocess"].update(change))
    with pytest.raises(ArtifactError) as ei:
        er.load(art, device="fake", warmup=False)
    assert ei.value.code == "manifest_field_invalid", ei.value
