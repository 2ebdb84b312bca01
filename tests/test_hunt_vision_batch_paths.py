"""Hunt: the batch and version paths (``score``, ``shadow``, ``diff``) on the real vision models.

Each test was a wrong answer, or a run that measured nothing, before 2026-12-07:

- ``shadow ART ART --device-a tflite --device-b onnxruntime`` on a TFLite-only detector: B fell
  back to LiteRT, so the run compared one path with itself and printed "agreement 1.0000", exit 0,
  as if LiteRT and ONNX Runtime had been compared. Now ``device_fell_back``, exit 4, nothing written.
- ``score ART photo.jpg`` (one image, not a folder) read the JPEG as text lines: 579
  ``input_bad_encoding`` lines for bus.jpg (for a text model the runs that decoded were scored
  ``ok``). Now refused before any line (``input_invalid``, exit 2) naming what reads images.
- ``diff`` of two MoveNet imports, one with ``--channel-order RGB`` (the default stated): "different:
  1 prediction", exit 1, for two artifacts that predict alike. Now "same"; ``BGR`` is still a difference.

The real models (YOLOv8n full-int8 TFLite, MoveNet) are imported once per module from ``../shared/data``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import need_litert, shared


def cli(*args, cwd=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "edge_runtime", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def arts(tmp_path_factory):
    import re

    from edge_runtime.converters.tflite_import import import_tflite

    need_litert()
    root = tmp_path_factory.mktemp("h42")
    text = shared("detection", "yolov8n_tflite", "metadata.yaml").read_text()
    names = dict((int(k), v.strip()) for k, v in re.findall(r"^\s+(\d+):\s*(.+)$", text, flags=re.M))
    (root / "coco80.txt").write_text("\n".join(names[i] for i in range(80)) + "\n")
    import_tflite(shared("detection", "yolov8n_tflite", "yolov8n_full_integer_quant.tflite"), root / "det",
                  task="object-detection", labels=root / "coco80.txt", scale="1/255")
    pose = shared("coral", "movenet_single_pose_lightning_ptq.tflite")
    import_tflite(pose, root / "pose", task="pose-estimation")
    import_tflite(pose, root / "pose-rgb", task="pose-estimation", channel_order="RGB")
    import_tflite(pose, root / "pose-bgr", task="pose-estimation", channel_order="BGR")
    (root / "imgs").mkdir()
    shutil.copy(shared("detection", "images", "bus.jpg"), root / "imgs" / "bus.jpg")
    return root


def _error(proc) -> str:
    return proc.stderr.strip().splitlines()[-1]


def test_shadow_refuses_a_side_that_fell_back_onto_the_other_sides_path(arts):
    out = arts / "pairs.jsonl"
    proc = cli("shadow", arts / "det", arts / "det", arts / "imgs", "-o", out, "--device-a", "tflite",
               "--device-b", "onnxruntime", "--quiet")
    assert proc.returncode == 4, (proc.returncode, proc.stdout, proc.stderr)
    err = _error(proc)
    assert "device_fell_back" in err and "side B" in err and "onnxruntime" in err and "itself" in err, err
    assert "agreement" not in proc.stdout
    assert not out.exists() and not (arts / "pairs.jsonl.job.json").exists()
    # the same artifact on the same device nobody asked to change still compares (a determinism check)
    same = cli("shadow", arts / "det", arts / "det", arts / "imgs", "-o", arts / "same.jsonl", "--quiet", "--json")
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["agreement"] == 1.0


def test_shadow_fallback_check_through_the_api(arts):
    import edge_runtime as er
    from edge_runtime import error_codes as ec
    from edge_runtime.score_inputs import read_records
    from edge_runtime.shadow import shadow

    with er.load(arts / "det", device="tflite") as a, er.load(arts / "det", device="onnxruntime") as b:
        assert b.choice.fallback and b.device == a.device
        with pytest.raises(er.DeviceError) as ei:
            shadow(a, b, read_records(arts / "imgs", field="image"))
    assert ei.value.code == ec.DEVICE_FELL_BACK


@pytest.mark.parametrize("name", ["bus.jpg", "bus.png", "bus.bmp"])
def test_score_refuses_one_image_file_as_its_input(arts, name, tmp_path):
    from PIL import Image

    img = tmp_path / name
    Image.open(arts / "imgs" / "bus.jpg").convert("RGB").resize((64, 48)).save(img)
    out = tmp_path / "scores.jsonl"
    proc = cli("score", arts / "det", img, "-o", out, "--quiet")
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    err = _error(proc)
    assert "input_invalid" in err and "image" in err and "--image" in err, err
    assert not out.exists()         # refused before any line (was one input_bad_encoding line per "line")


def test_shadow_refuses_one_image_file_as_its_input(arts, tmp_path):
    proc = cli("shadow", arts / "det", arts / "det", arts / "imgs" / "bus.jpg", "-o", tmp_path / "p.jsonl", "--quiet")
    assert proc.returncode == 2, proc.stderr
    assert "input_invalid" in _error(proc) and "JPEG image" in _error(proc)


def test_image_signatures_are_not_guessed_from_text():
    from edge_runtime.score_inputs import image_kind

    assert image_kind(b"BMW is a car\nBMX\n") is None          # a text line may start with "BM"
    assert image_kind(b"GIF is a format") is None
    assert image_kind(shared("coral", "squat.bmp").read_bytes()[:16]) == "BMP"
    assert image_kind(shared("detection", "images", "bus.jpg").read_bytes()[:16]) == "JPEG"


def test_diff_a_stated_default_channel_order_is_no_difference(arts):
    proc = cli("diff", arts / "pose", arts / "pose-rgb", "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["same"], [d["path"] for d in report["differences"]]
    bgr = cli("diff", arts / "pose", arts / "pose-bgr", "--json")
    paths = [d["path"] for d in json.loads(bgr.stdout)["differences"] if d["side"] == "prediction"]
    assert bgr.returncode == 1 and paths == ["preprocess.channel_order"], paths


def test_diff_a_pad_under_stretch_is_no_difference(arts, tmp_path):
    """A stretch fills the model input: no padding, so a stated pad (or two pads) changes nothing; it read
    "different: 1 prediction". Under a letterbox the pad is a difference."""
    from factories import rewrite_manifest

    shutil.copytree(arts / "pose", tmp_path / "pose-pad")
    rewrite_manifest(tmp_path / "pose-pad", lambda m: m["preprocess"].update(pad=114, pad_position="center"))
    proc = cli("diff", arts / "pose", tmp_path / "pose-pad", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["same"], proc.stdout[-400:]
    for side, pad in (("a", 0), ("b", 114)):
        shutil.copytree(arts / "pose", tmp_path / f"lb-{side}")
        rewrite_manifest(tmp_path / f"lb-{side}", lambda m, pad=pad: m["preprocess"].update(resize="letterbox", pad=pad))
    lb = cli("diff", tmp_path / "lb-a", tmp_path / "lb-b", "--json")
    paths = [d["path"] for d in json.loads(lb.stdout)["differences"] if d["side"] == "prediction"]
    assert lb.returncode == 1 and paths == ["preprocess.pad"], paths
