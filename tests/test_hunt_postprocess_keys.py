"""``import --postprocess '{"score_treshold": 0.9}'`` (a typo) was written into the manifest and never read:
the default 0.25 decided every detection, exit 0. A key the detector's family does not read is now refused at
import (and convert), with the nearest key it reads; a key a family ignores (rerun_nms without a graph NMS)
too. Artifacts already built still load."""

from __future__ import annotations

import pytest

import edge_runtime as er
from conftest import shared


def _import(tmp_path, post: str):
    from click.testing import CliRunner

    from edge_runtime.cli import main

    model = shared("detection", "yolov8n_tflite", "yolov8n_full_integer_quant.tflite")
    return CliRunner().invoke(main, ["import", str(model), "-o", str(tmp_path / "a"), "--task", "object-detection",
                                     "--postprocess", post])


@pytest.mark.parametrize("post,hint", [('{"score_treshold": 0.9}', "did you mean 'score_threshold'"),
                                       ('{"iou": 0.5}', "iou_threshold"),
                                       ('{"rerun_nms": true}', "rerun_nms")])
def test_a_postprocess_key_the_family_does_not_read_is_refused(tmp_path, post, hint):
    r = _import(tmp_path, post)
    assert r.exit_code == 2 and "is not read by the yolo family" in r.output and hint in r.output, r.output
    assert not (tmp_path / "a" / "manifest.json").exists()


def test_the_keys_it_reads_still_import_and_decide(tmp_path):
    r = _import(tmp_path, '{"score_threshold": 0.9}')
    assert r.exit_code == 0, r.output
    with er.load(tmp_path / "a", device="tflite") as rt:
        dets = rt.infer(str(shared("detection", "images", "bus.jpg"))).detections
    assert dets and min(d["score"] for d in dets) >= 0.9


def test_an_artifact_built_before_the_refusal_is_refused_at_load_not_read_with_the_default(tmp_path):
    """An artifact imported before the refusal above kept its typo in the manifest: it loaded, and the default
    threshold 0.25 decided every detection, exit 0. Now its load is refused (``manifest_field_invalid``) naming
    the key and the one the family reads; an artifact the importer writes today loads as before."""
    from factories import rewrite_manifest

    from edge_runtime import error_codes as ec
    from edge_runtime.errors import ArtifactError

    assert _import(tmp_path, '{"score_threshold": 0.9}').exit_code == 0
    with er.load(tmp_path / "a", device="tflite", warmup=False):
        pass

    def typo(m):
        m["postprocess"]["score_treshold"] = m["postprocess"].pop("score_threshold")
    rewrite_manifest(tmp_path / "a", typo)
    with pytest.raises(ArtifactError) as err:
        er.load(tmp_path / "a", device="tflite", warmup=False)
    assert err.value.code == ec.MANIFEST_FIELD_INVALID
    assert "'score_treshold' is not read by the yolo family" in err.value.message
    assert "did you mean 'score_threshold'" in err.value.message


@pytest.mark.parametrize("extra,offset,hint", [(10, 0, "which no --label-offset fixes"),
                                               (-1, 0, "--label-offset 1 if the file lacks 1 leading"),
                                               (-1, 2, "--label-offset 1 (the file holds")])
def test_a_labels_count_that_no_offset_fixes_is_not_told_to_adjust_the_offset(tmp_path, extra, offset, hint):
    """A 90-line labels file on the 80-class YOLOv8n was told 'adjust --label-offset', which only adds names
    in front: the hint now says what can make the count fit."""
    from click.testing import CliRunner

    from edge_runtime.cli import main

    labels = tmp_path / "labels.txt"
    labels.write_text("".join(f"c{i}\n" for i in range(80 + extra)))
    model = shared("detection", "yolov8n_tflite", "yolov8n_full_integer_quant.tflite")
    r = CliRunner().invoke(main, ["import", str(model), "-o", str(tmp_path / "a"), "--task", "object-detection",
                                  "--labels", str(labels), "--label-offset", str(offset)])
    assert r.exit_code == 2 and "import_labels_mismatch" in r.output and hint in r.output, r.output
