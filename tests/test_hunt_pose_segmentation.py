"""Wrong answers with exit 0 in semantic segmentation (the hunt of 2026-12-07), each refused or fixed:

- a labels file that repeats a name (two "thing" classes) kept one ``scores`` entry for both: the
  larger class's pixel share was overwritten by the smaller's (the shares no longer summed to 1).
  Now each class keeps its own entry, ``"label#id"`` for a repeated label, as a classifier's scores;
- ``postprocess.background`` was read as it stood: ``"0"`` (a string), ``1.0``, ``true`` (== class 1)
  or an id no class has silently changed which class ``prediction`` skips. Now anything but a
  class id of the model (or null: no background) is ``manifest_field_invalid`` at load;
- a class-map segmenter (DeepLab's ArgMax: no class count in the shape) with a blank line between
  label names named every id at or past the blank by the next line's label ("dog" for id 2 of
  ``background, cat, <blank>, dog``). Now such an id is ``artifact_labels_mismatch``, as the
  importer and the detector refuse the blank (ids before it are named as before).
"""

from __future__ import annotations

import numpy as np
import pytest

import edge_runtime as er
from edge_runtime.errors import ArtifactError, EdgeRuntimeError
from edge_runtime.limits import DEFAULT_LIMITS


def _segmenter(make_artifact, monkeypatch, labels, output=None):
    """The tiny fake segmentation artifact with ``labels`` (and ``output``, the output spec)."""
    import factories

    spec, post, _ = factories.VISION["semantic-segmentation"]
    monkeypatch.setitem(factories.VISION, "semantic-segmentation", (output or spec, post, list(labels)))
    return make_artifact("semantic-segmentation")


def test_a_repeated_label_keeps_each_class_share(make_artifact, monkeypatch):
    art = _segmenter(make_artifact, monkeypatch, ["background", "thing", "thing"])
    with er.load(art, device="fake", warmup=False) as rt:
        task = rt.task
    prep = task.prepare(task.warmup_sample(), DEFAULT_LIMITS)
    logits = np.zeros((1, 16, 16, 3), np.float32)
    logits[0, :, :, 0] = 1.0
    logits[0, :4, :, 1] = 2.0              # a quarter class 1
    logits[0, 4:6, :, 2] = 2.0             # an eighth class 2, the same name
    out = task.finish({"logits": logits}, prep)
    # before: {"background": 0.625, "thing": 0.125}: class 1's quarter gone, the shares summing to 0.75
    assert out.scores == {"background": 0.625, "thing#1": 0.25, "thing#2": 0.125}
    assert list(out.scores) == ["background", "thing#1", "thing#2"]          # largest first
    assert out.prediction == "thing" and out.class_id == 1


@pytest.mark.parametrize("background", ["0", 1.0, True, 3, -1])
def test_a_background_that_is_no_class_id_is_refused_at_load(make_artifact, background):
    from factories import rewrite_manifest

    art = make_artifact("semantic-segmentation")          # background, cat, dog
    rewrite_manifest(art, lambda m: m["postprocess"].update(background=background))
    with pytest.raises(ArtifactError) as ei:
        er.load(art, device="fake", warmup=False)
    assert ei.value.code == "manifest_field_invalid" and "'background'" in ei.value.message
    assert repr(background) in ei.value.message
    rewrite_manifest(art, lambda m: m["postprocess"].update(background=None))     # null: no background
    er.load(art, device="fake", warmup=False).close()


def test_a_class_map_id_past_a_blank_label_line_is_refused(make_artifact, monkeypatch):
    art = _segmenter(make_artifact, monkeypatch, ["background", "cat", "", "dog"],
                     output={"name": "logits", "dtype": "int64", "shape": [1, 16, 16]})
    with er.load(art, device="fake", warmup=False) as rt:
        task = rt.task
    prep = task.prepare(task.warmup_sample(), DEFAULT_LIMITS)
    cmap = np.zeros((1, 16, 16), np.int64)
    cmap[0, :4] = 1
    out = task.finish({"logits": cmap}, prep)                  # ids before the blank: named as before
    assert out.prediction == "cat" and out.scores == {"background": 0.75, "cat": 0.25}
    cmap[0, 4:6] = 2                        # the blank line's id (before: named "dog", the next line)
    with pytest.raises(EdgeRuntimeError) as ei:
        task.finish({"logits": cmap}, prep)
    assert ei.value.code == "artifact_labels_mismatch" and "class id 2" in ei.value.message
    assert "blank line 3" in ei.value.message


def test_a_tasks_typed_refusal_in_finish_keeps_its_code_through_infer(make_artifact):
    # runtime_call._finish wrapped every exception of task.finish, a typed ArtifactError included, as our
    # inference_failed: the operator's artifact_labels_mismatch (exit 3) reached the caller as a runtime failure
    def refuse(outputs, prepared):
        raise ArtifactError("output holds class id 7, past the labels", code="artifact_labels_mismatch")

    with er.load(make_artifact("text-classification"), device="fake", warmup=False) as rt:
        rt.task.finish = refuse
        with pytest.raises(ArtifactError) as ei:
            rt.infer("good film")
        assert ei.value.code == "artifact_labels_mismatch"
        got = rt.infer_batch(["good film", "bad film"])
        assert [type(g).__name__ for g in got] == ["ArtifactError"] * 2
        errors = {e["code"]: e["count"] for e in rt.metrics()["errors"]}
        assert errors == {"artifact_labels_mismatch": 3}, errors
