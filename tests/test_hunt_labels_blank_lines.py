"""A blank line between the names of a labels file, where no class count tells a stray newline from
an unused id (SSD's ``TFLite_Detection_PostProcess`` gives class ids, not a score per class): either
reading shifts every label after it for the other. Before 2026-12-07 import and load dropped it and
every later label named the next class (exit 0); now both refuse it, naming the line. Where the
class count is known (a classifier, a YOLO head), the count check decides as before."""

from __future__ import annotations

from pathlib import Path

import pytest

import edge_runtime as er
from factories import import_detector, relabel

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "detection"
SSD = SHARED / "ssd_mobilenet_v1"

pytestmark = pytest.mark.skipif(not SSD.exists(), reason="../shared/data/detection is not present")


def _labelmap_with_blank(tmp_path) -> Path:
    lines = (SSD / "labelmap.txt").read_text().splitlines()
    p = tmp_path / "labelmap_blank.txt"
    p.write_text("\n".join(lines[:3] + [""] + lines[3:]) + "\n\n")      # line 4 blank; trailing ones are fine
    return p


def test_import_refuses_a_blank_line_between_names_of_an_ssd_labelmap(tmp_path):
    with pytest.raises(er.InputError) as e:
        import_detector(SSD / "ssd_mobilenet_v1_1_metadata_1.tflite", tmp_path / "art",
                        labels=_labelmap_with_blank(tmp_path))
    assert e.value.code == "import_labels_mismatch" and "line(s) 4" in str(e.value) and "???" in str(e.value)
    assert not (tmp_path / "art").exists()


def test_trailing_blank_lines_are_no_class(tmp_path):
    p = tmp_path / "labelmap_trailing.txt"
    p.write_text((SSD / "labelmap.txt").read_text() + "\n\n\n")
    import_detector(SSD / "ssd_mobilenet_v1_1_metadata_1.tflite", tmp_path / "art", labels=p)
    with er.load(tmp_path / "art") as rt:
        assert rt.task.labels[0] == "person" and rt.task.labels_inner_blanks == []


def test_load_refuses_an_artifact_whose_labels_gained_a_blank_line(tmp_path):
    import_detector(SSD / "ssd_mobilenet_v1_1_metadata_1.tflite", tmp_path / "art", labels=SSD / "labelmap.txt")
    names = (tmp_path / "art" / "labels.txt").read_text().splitlines()
    relabel(tmp_path / "art", names[:3] + [""] + names[3:])
    with pytest.raises(er.ArtifactError) as e:
        er.load(tmp_path / "art")
    assert e.value.code == "artifact_labels_mismatch" and "line(s) 4" in str(e.value)
