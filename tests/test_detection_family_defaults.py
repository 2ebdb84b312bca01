"""A detector family's usual input and decode are the defaults (bug hunt, vision §1, §2, §4c).

- ``--family yolo`` alone (or the family guessed from YOLOv8n's output) feeds Ultralytics'
  RGB/255, also to the full-int8 TFLite, whose input quantization (scale 0.018658, zero
  point -14: -2.1..2.6, the range of ImageNet mean/std, as an export calibrated on
  ImageNet-normalised samples leaves it) is no guide to what the model was trained on.
  Before, both got the generic [-1, 1]: the ONNX YOLOv8n lost the bus on bus.jpg, the TFLite
  one read it .39 with a truck .29.
- ``--family gfl`` alone feeds NanoDet's BGR (x - mean) / std, stretched, and decodes each cell
  around ``(idx + 0.5)·stride`` (NanoDet's GFL head); before, [-1, 1] RGB (bus .65 → .27) and
  every box up-left by half a stride. A stated ``center_offset`` (0 for NanoDet-Plus) and a
  stated --scale/--mean/--std are kept; an artifact records its ``center_offset``, so one
  imported before keeps the 0.0 it recorded.
- Per-call detection options take numpy numbers as Python's.

Expected detections: the data README's (``../shared/data/detection``). Box positions are
checked against YOLOX-Nano fp32's (imported, unchanged by this fix) on the five photos.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import edge_runtime as er
from conftest import need_litert, shared
from edge_runtime.cli import main
from edge_runtime.models.base import TaskMismatch
from edge_runtime.models.detection_decode import box_iou
from edge_runtime.models.object_detection import ObjectDetection
from test_object_detection import IMG64, _finish, _task, coco80

pytest.importorskip("onnxruntime")

PHOTOS = ("bus.jpg", "zidane.jpg", "dog.jpg", "person.jpg", "street.jpg")
NANODET_MEAN, NANODET_STD = [103.53, 116.28, 123.675], [57.375, 57.12, 58.395]


def _photo(name):
    return str(shared("detection", "images", name))


def _dets(art, names=PHOTOS):
    with er.load(art) as rt:
        return {n: rt.infer(_photo(n)).detections for n in names}


def _manifest(art) -> dict:
    return json.loads((art / "manifest.json").read_text())


def _over(dets, score):
    return sorted((d["label"], round(d["score"], 2)) for d in dets if d["score"] >= score)


@pytest.fixture(scope="module")
def arts(tmp_path_factory):
    """The real detectors imported with the family alone (the CLI for NanoDet, as the report ran it)."""
    from edge_runtime.converters.import_common import import_model

    tmp = tmp_path_factory.mktemp("family-defaults")
    labels = coco80(tmp)
    out = {"tmp": tmp, "labels": labels}
    nanodet = shared("detection", "nanodet", "nanodet_m.onnx")
    res = CliRunner().invoke(main, ["import", str(nanodet), "-o", str(tmp / "nanodet"), "--task", "object-detection",
                                    "--family", "gfl", "--labels", str(labels)])
    assert res.exit_code == 0, res.output
    out["nanodet"] = tmp / "nanodet"
    import_model(nanodet, tmp / "nanodet_plus_offset", task="object-detection", labels=labels, family="gfl",
                 postprocess={"center_offset": 0})
    out["nanodet_offset0"] = tmp / "nanodet_plus_offset"
    import_model(shared("detection", "yolov8n_onnx_dynamic", "yolov8n_int8.onnx"), tmp / "yolo_onnx",
                 task="object-detection", labels=labels, family="yolo")
    out["yolo_onnx"] = tmp / "yolo_onnx"
    import_model(shared("detection", "yolox_nano", "yolox_nano.onnx"), tmp / "yolox", task="object-detection",
                 labels=labels, family="yolox")
    out["yolox"] = tmp / "yolox"
    out["yolox_dets"] = _dets(out["yolox"])
    return out


def _mean_iou_against(dets: dict, ref: dict, min_score=0.4, ref_score=0.5) -> tuple[float, int]:
    """Mean IoU of each detection (>= min_score) with its best same-class reference box (>= ref_score)."""
    ious = []
    for name, got in dets.items():
        for d in got:
            same = [r["box"] for r in ref[name] if r["label"] == d["label"] and r["score"] >= ref_score]
            if d["score"] >= min_score and same:
                ious.append(float(box_iou(np.array([d["box"]]), np.array(same))[0].max()))
    return float(np.mean(ious)), len(ious)


# -- yolo: Ultralytics' RGB/255 ----------------------------------------------------------

def test_yolo_family_alone_feeds_rgb_over_255_and_finds_the_bus(arts):
    pre = _manifest(arts["yolo_onnx"])["preprocess"]
    assert (pre["scale"], pre["mean"], pre["std"]) == (1 / 255, [0.0], [1.0])
    assert pre["normalisation_source"] == "family yolo" and pre.get("channel_order", "RGB") == "RGB"
    assert (pre["resize"], pre["pad"], pre["pad_position"]) == ("letterbox", 114, "center")
    dets = _dets(arts["yolo_onnx"], ["bus.jpg"])["bus.jpg"]
    # data README: 4 persons .89-.90 (the 4th, cut by the frame, reads .39 here), bus .81
    person = ("person", pytest.approx(0.89, abs=0.02))
    assert _over(dets, 0.5) == [("bus", pytest.approx(0.81, abs=0.02)), person, person, person]


def test_yolov8n_int8_tflite_imported_as_it_is_gets_rgb_over_255(arts):
    """No --family, no --scale: the family guessed from [1, 84, 8400] brings RGB/255, quantized with
    the input's own scale/zero point (not the [-1, 1] int8 default, nor the ImageNet mean/std
    its input range resembles)."""
    from edge_runtime.converters.tflite_import import import_tflite

    need_litert()
    out = arts["tmp"] / "yolo_tflite"
    man = import_tflite(shared("detection", "yolov8n_tflite", "yolov8n_full_integer_quant.tflite"), out,
                        task="object-detection", labels=arts["labels"])
    pre, post = man["preprocess"], man["postprocess"]
    assert post["family"] == "yolo" and post["box_units"] == "normalized"
    assert (pre["scale"], pre["mean"], pre["std"], pre["input"]) == (1 / 255, [0.0], [1.0], "quantized")
    assert pre["normalisation_source"] == "family yolo"
    assert not any("ImageNet" in w or "[-1, 1]" in w for w in man["model"]["source"].get("warnings", []))
    dets = _dets(out, ["bus.jpg"])["bus.jpg"]
    # data README: persons .90/.88/.88, bus .86; before: bus .39 and a truck .29
    assert _over(dets, 0.5) == [("bus", pytest.approx(0.86, abs=0.02)), ("person", pytest.approx(0.88, abs=0.02)),
                                ("person", pytest.approx(0.88, abs=0.02)), ("person", pytest.approx(0.90, abs=0.02))]
    assert "truck" not in {d["label"] for d in dets}
    bus = next(d for d in dets if d["label"] == "bus")
    assert box_iou(np.array([bus["box"]]), np.array([[20, 230, 805, 750]]))[0, 0] > 0.9


def test_a_stated_normalisation_replaces_the_familys(arts):
    from edge_runtime.converters.import_common import import_model

    man = import_model(shared("detection", "yolov8n_onnx_dynamic", "yolov8n_int8.onnx"), arts["tmp"] / "yolo_stated",
                       task="object-detection", labels=arts["labels"], family="yolo", scale="1/127.5", mean="1")
    pre = man["preprocess"]
    assert (pre["scale"], pre["mean"], pre["std"], pre["normalisation_source"]) == (1 / 127.5, [1.0], [1.0], "stated")
    man = import_model(shared("detection", "nanodet", "nanodet_m.onnx"), arts["tmp"] / "gfl_stated",
                       task="object-detection", labels=arts["labels"], family="gfl", scale="1/255")
    pre = man["preprocess"]
    assert (pre["scale"], pre["mean"], pre["std"], pre["normalisation_source"]) == (1 / 255, [0.0], [1.0], "stated")
    assert pre["channel_order"] == "BGR" and pre["resize"] == "stretch"       # the family's geometry stays


def test_a_family_normalisation_the_quantized_input_cannot_hold_is_refused_naming_the_family():
    """A uint8 input quantized for 0..0.5 cannot hold RGB/255: a typed refusal that says the
    normalisation was the family's default, never a silently clipped input."""
    spec = {"name": "images", "dtype": "uint8", "shape": [1, 64, 64, 3],
            "quantization": {"scale": 0.5 / 255, "zero_point": 0}}
    model = {"inputs": [spec], "outputs": [{"name": "out", "dtype": "float32", "shape": [1, 6, 84]}]}
    with pytest.raises(er.InputError, match="yolo family's usual input, scale 1/255") as ei:
        ObjectDetection.import_sections(model, {"family": "yolo"}, [])
    assert ei.value.code == "import_normalisation_clips"


# -- gfl (NanoDet): its input and its cell centres -------------------------------------------

def test_gfl_family_alone_feeds_nanodets_bgr_mean_std_stretched(arts):
    man = _manifest(arts["nanodet"])
    pre, post = man["preprocess"], man["postprocess"]
    assert (pre["scale"], pre["mean"], pre["std"], pre["channel_order"]) == (1.0, NANODET_MEAN, NANODET_STD, "BGR")
    assert pre["normalisation_source"] == "family gfl" and pre["resize"] == "stretch"
    assert post["center_offset"] == 0.5
    dets = _dets(arts["nanodet"], ["bus.jpg"])["bus.jpg"]
    top = _over(dets, 0.5)           # data README: person .78, bus .65 (before: bus .27)
    assert top == [("bus", pytest.approx(0.65, abs=0.02)), ("person", pytest.approx(0.78, abs=0.02))], top


def test_nanodet_boxes_sit_on_the_objects(arts):
    """Against YOLOX-Nano's boxes on the five photos: mean IoU 0.77 with the half-cell centres
    (0.5 off the best of 0, .25, .5, .75, 1); 0.58 with ``center_offset`` 0 (every box 20-30 px
    up-left in the photo), which a stated 0 still gives."""
    centred, n = _mean_iou_against(_dets(arts["nanodet"]), arts["yolox_dets"])
    assert centred > 0.7 and n >= 20, (centred, n)
    shifted, _ = _mean_iou_against(_dets(arts["nanodet_offset0"]), arts["yolox_dets"])
    assert shifted < 0.65 and centred - shifted > 0.12, (centred, shifted)
    person = next(d for d in _dets(arts["nanodet"], ["bus.jpg"])["bus.jpg"] if d["label"] == "person")
    # the left passenger: YOLOv8n and SSD put it at about 54, 400, 244, 905
    assert box_iou(np.array([person["box"]]), np.array([[54, 400, 244, 905]]))[0, 0] > 0.85, person


def test_the_320_export_decodes_with_the_same_defaults(arts):
    from edge_runtime.converters.import_common import import_model

    out = arts["tmp"] / "nanodet320"
    import_model(shared("detection", "nanodet", "nanodet.onnx"), out, task="object-detection",
                 labels=arts["labels"], family="gfl")
    dets = _dets(out)
    bus = [d for d in dets["bus.jpg"] if d["label"] == "bus"][0]      # data README: bus .80, persons
    assert bus["score"] == pytest.approx(0.79, abs=0.03)
    iou, n = _mean_iou_against(dets, arts["yolox_dets"])      # 0.82 (0.59 with center_offset 0)
    assert iou > 0.75 and n >= 20, (iou, n)


def test_an_artifact_keeps_the_center_offset_it_recorded(arts, tmp_path):
    """Every gfl artifact records its center_offset: one imported before the default moved keeps
    its 0.0 (its boxes do not move under it); a manifest without one gets 0.5."""
    from factories import rewrite_manifest

    assert _manifest(arts["nanodet_offset0"])["postprocess"]["center_offset"] == 0.0
    want_shifted = _dets(arts["nanodet_offset0"], ["bus.jpg"])["bus.jpg"]
    want_centred = _dets(arts["nanodet"], ["bus.jpg"])["bus.jpg"]
    old = tmp_path / "old"
    shutil.copytree(arts["nanodet"], old)
    rewrite_manifest(old, lambda m: m["postprocess"].update(center_offset=0.0))
    assert _dets(old, ["bus.jpg"])["bus.jpg"] == want_shifted
    rewrite_manifest(old, lambda m: m["postprocess"].pop("center_offset"))
    assert _dets(old, ["bus.jpg"])["bus.jpg"] == want_centred


def test_gfl_cell_centres_are_half_a_stride_in_unless_stated():
    outs, arrays = [], {}
    for i, s in enumerate((8, 16, 32)):
        n = (64 // s) ** 2
        cls = np.zeros((1, n, 2), dtype=np.float32)
        reg = np.full((1, n, 32), -10.0, dtype=np.float32)
        if s == 16:
            cls[0, 5, 1] = 0.9                                    # row 1, column 1
            reg[0, 5].reshape(4, 8)[np.arange(4), [1, 0, 2, 1]] = 10.0   # l=1, t=0, r=2, b=1 bins
        outs += [{"name": f"cls{i}", "dtype": "float32", "shape": [1, n, 2]},
                 {"name": f"reg{i}", "dtype": "float32", "shape": [1, n, 32]}]
        arrays.update({f"cls{i}": cls, f"reg{i}": reg})
    (d,) = _finish(_task(IMG64, outs, {"family": "gfl"}), arrays)
    assert d["box"] == pytest.approx([24 - 16, 24 - 0, 24 + 32, 24 + 16], abs=1e-2)     # centre (1.5, 1.5)·16
    (d,) = _finish(_task(IMG64, outs, {"family": "gfl", "center_offset": 0}), arrays)  # NanoDet-Plus
    assert d["box"] == pytest.approx([16 - 16, 16 - 0, 16 + 32, 16 + 16], abs=1e-2)
    for bad in ("half", True, float("nan")):
        with pytest.raises(TaskMismatch, match="center_offset must be a number"):
            _task(IMG64, outs, {"family": "gfl", "center_offset": bad})


def test_a_converted_nanodet_decodes_around_the_half_cell_centres(arts, tmp_path):
    """The convert path resolves the same decode default (its input is the stated --preprocess):
    NanoDet-m to onnx-int8 (16 calibration images, 8 parity photos; ~10 s on 2 cores)."""
    from PIL import Image, ImageOps

    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.request import ConvertRequest
    from vision_data import photo_paths

    few_calib, few_parity = tmp_path / "calib16", tmp_path / "parity8"
    few_calib.mkdir()
    few_parity.mkdir()
    for i, path in enumerate(photo_paths()[:8]):       # parity: the photos; calibration: a flip and a crop of each
        shutil.copy(path, few_parity / f"{i:02d}{path.suffix}")
        img = Image.open(path).convert("RGB")
        img.thumbnail((640, 640))
        w, h = img.size
        ImageOps.mirror(img).save(few_calib / f"{i:02d}_m.png")
        img.crop((int(w * 0.3), int(h * 0.3), w, h)).save(few_calib / f"{i:02d}_c.png")
    pre = {"size": [416, 416], "layout": "NCHW", "scale": 1.0, "mean": NANODET_MEAN, "std": NANODET_STD,
           "resize": "stretch", "interpolation": "bilinear", "channel_order": "BGR"}
    out = tmp_path / "art"
    man = convert(ConvertRequest(source=shared("detection", "nanodet", "nanodet_m.onnx"), out=out,
                                 task="object-detection", targets=["onnx-int8"], calibration=few_calib,
                                 parity_data=few_parity, labels=arts["labels"], preprocess=pre,
                                 postprocess={"family": "gfl"}, probe_samples=0))
    assert man["postprocess"]["center_offset"] == 0.5
    iou, n = _mean_iou_against(_dets(out), arts["yolox_dets"])
    assert iou > 0.7 and n >= 20, (iou, n)


# -- per-call options: numpy numbers ------------------------------------------------------------

def test_detection_options_take_numpy_numbers(make_artifact):
    with er.load(make_artifact(task="object-detection"), device="fake") as rt:
        img = np.full((20, 30, 3), 90, dtype=np.uint8)
        for py, npv in [({"score_threshold": 0.0, "max_detections": 2},
                         {"score_threshold": np.float32(0.0), "max_detections": np.int64(2)}),
                        ({"iou_threshold": 0.5, "max_detections": 1},
                         {"iou_threshold": np.float16(0.5), "max_detections": np.uint8(1)}),
                        ({"score_threshold": 1.0}, {"score_threshold": np.float64(1.0)})]:
            assert rt.infer(img, options=npv).detections == rt.infer(img, options=py).detections
        one = {"score_threshold": np.float32(0), "max_detections": np.int32(1)}
        assert len(rt.infer(img, options=one).detections) <= 1
        for bad, msg in [({"score_threshold": np.bool_(True)}, "score_threshold must be a number"),
                         ({"max_detections": np.bool_(True)}, "positive integer"),
                         ({"max_detections": np.float32(2.0)}, "positive integer"),
                         ({"score_threshold": np.float32("nan")}, "score_threshold"),
                         ({"iou_threshold": np.float32(0)}, "iou_threshold"),
                         ({"max_detections": np.int64(301)}, "over the limit of 300")]:
            with pytest.raises(er.InputError, match=msg):
                rt.infer(img, options=bad)


def test_numpy_thresholds_stated_at_import_are_recorded_as_json_numbers():
    outs = [{"name": "output0", "dtype": "float32", "shape": [1, 6, 4]}]
    post = ObjectDetection.sections_for(IMG64, outs, {"family": "yolo", "layout": "channels_first",
                                                      "score_threshold": np.float32(0.5),
                                                      "max_detections": np.int64(7)})
    assert type(post["score_threshold"]) is float and type(post["max_detections"]) is int
    assert json.loads(json.dumps(post))["max_detections"] == 7
