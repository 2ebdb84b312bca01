"""A labels file is UTF-8 text, read as inspect reads it: a byte of another encoding is refused at
convert (exit 2) and at load (``artifact_file_invalid``), never served as mojibake ("z\ufffdro")
with exit 0; a byte-order mark is no part of the first label."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from click.testing import CliRunner

import edge_runtime as er
from edge_runtime.cli import main
from edge_runtime.errors import ArtifactError
from factories import make_artifact, rewrite_manifest

ZOO = Path(__file__).resolve().parents[1] / "models" / "zoo" / "digits-cnn"


def _relabel(art: Path, data: bytes) -> None:
    """Replace the artifact's labels.txt with ``data``, its hash and the seal kept true (a deliberate
    build, not corruption)."""
    (art / "labels.txt").write_bytes(data)

    def fix(m):
        m["files"]["labels.txt"] = {**m["files"]["labels.txt"], "sha256": hashlib.sha256(data).hexdigest(),
                                    "bytes": len(data)}

    rewrite_manifest(art, fix)


def test_a_latin1_labels_file_is_refused_at_load(tmp_path):
    art = make_artifact(tmp_path / "a", "text-classification", labels=("n\xe9gatif", "positif"))
    _relabel(art, "n\xe9gatif\npositif\n".encode("latin-1"))
    with pytest.raises(ArtifactError) as e:
        er.load(art, device="fake")
    assert e.value.code == "artifact_file_invalid" and "not UTF-8" in e.value.message, e.value.to_dict()


def test_a_utf8_labels_file_with_a_bom_keeps_its_first_label_clean(tmp_path):
    art = make_artifact(tmp_path / "a", "text-classification", labels=("négatif", "positif"))
    _relabel(art, "\ufeffnégatif\npositif\n".encode("utf-8"))
    with er.load(art, device="fake") as rt:
        assert rt.task.labels == ["négatif", "positif"]
        assert set(rt.infer("good movie").scores) == {"négatif", "positif"}


@pytest.mark.skipif(not (ZOO / "model.onnx").exists(), reason="the digits zoo model")
def test_convert_refuses_a_labels_file_that_is_not_utf8(tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_bytes("z\xe9ro\n".encode("latin-1") + b"".join(f"{i}\n".encode() for i in range(1, 10)))
    res = CliRunner().invoke(main, [
        "convert", str(ZOO / "model.onnx"), "-o", str(tmp_path / "out"), "--task", "image-classification",
        "--target", "onnx-int8", "--calibration", str(ZOO / "calibration"), "--parity-data", str(ZOO / "held_out"),
        "--labels", str(labels), "--preprocess", str(ZOO / "preprocess.json"), "--force"])
    assert res.exit_code == 2, res.output
    assert "not UTF-8" in res.output and not (tmp_path / "out" / "manifest.json").exists()
