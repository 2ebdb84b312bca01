"""Silent wrong answers (#15, part A): input quantization, class indices,
high-bit-depth images, the classifier contract, tensors outputs.

Real third-party models from ../shared/data (Coral, TFLM, detection); each
model is imported once per module.
"""

import io
import json
import logging
import struct
import zlib

import numpy as np
import pytest

import edge_runtime as er
from conftest import need_litert, shared

need_litert()

IMAGENET_STD = "--scale 1/255 --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225"


def _import(model, out, **kw):
    from edge_runtime.converters.tflite_import import import_tflite

    return import_tflite(model, out, **kw)


@pytest.fixture(scope="module")
def labels_1000(tmp_path_factory):
    """Coral's ImageNet labels without the background line (for 1000-class models)."""
    lines = shared("coral", "imagenet_labels.txt").read_text().splitlines()
    assert lines[0] == "background"
    p = tmp_path_factory.mktemp("labels") / "imagenet_1000.txt"
    p.write_text("\n".join(lines[1:]) + "\n")
    return p


@pytest.fixture(scope="module")
def tflm_imagenet(tmp_path_factory, labels_1000):
    """TFLM's PyTorch MobileNetV2 (NCHW int8) with the ImageNet normalisation its input
    quantization was calibrated on (range -2.127..2.631 = ImageNet's -2.118..2.640)."""
    out = tmp_path_factory.mktemp("tflm") / "mnv2"
    man = _import(shared("tflm", "mobilenet_v2_quantized_1x3x224x224.tflite"), out, labels=labels_1000,
                  scale="1/255", mean="0.485,0.456,0.406", std="0.229,0.224,0.225")
    return out, man


@pytest.fixture(scope="module")
def renamed_labels_mnv2(tmp_path_factory):
    """Coral MobileNetV2 with 'tabby, tabby cat' renamed 'Egyptian cat' in a copy of the labels."""
    lines = shared("coral", "imagenet_labels.txt").read_text().splitlines()
    assert lines[282] == "tabby, tabby cat" and lines[286] == "Egyptian cat"
    lines[282] = "Egyptian cat"
    d = tmp_path_factory.mktemp("renamed")
    labels = d / "labels.txt"
    labels.write_text("\n".join(lines) + "\n")
    out = d / "mnv2"
    man = _import(shared("coral", "mobilenet_v2_1.0_224_quant.tflite"), out, labels=labels)
    return out, man


def _pixels(path, size, mode="RGB"):
    """The reference pre-processing: decode, half-pixel bilinear in float, truncate."""
    from PIL import Image

    from edge_runtime.models.image import resize_half_pixel

    x = np.asarray(Image.open(path).convert(mode))
    if x.ndim == 2:
        x = x[:, :, None]
    return np.floor(np.clip(resize_half_pixel(x, *size), 0, 255))


# -- 1. int8 inputs are quantized with the model's own parameters ------------------

def test_yolov8n_int8_input_is_quantized_with_its_own_scale_and_zero_point():
    from PIL import Image

    from edge_runtime.converters.tflite_import import image_preprocess, read_model
    from edge_runtime.models.image import to_tensor

    spec = read_model(shared("detection", "yolov8n_tflite", "yolov8n_full_integer_quant.tflite"))["inputs"][0]
    assert spec["dtype"] == "int8" and spec["quantization"]["zero_point"] == -14
    s = spec["quantization"]["scale"]
    assert abs(s - 0.018658) < 1e-6
    pre = image_preprocess(spec, scale="1/255", mean="0", std="1")     # Ultralytics: RGB / 255
    assert pre["input"] == "quantized" and pre["layout"] == "NHWC" and pre["size"] == [640, 640]
    bus = shared("detection", "images", "bus.jpg")
    x = to_tensor(Image.open(bus).convert("RGB"), pre, spec)
    p = _pixels(bus, (640, 640))
    want = np.clip(np.round(p / 255.0 / s - 14), -128, 127).astype(np.int8)[None]
    assert x.dtype == np.int8 and x.shape == (1, 640, 640, 3)
    np.testing.assert_array_equal(x, want)
    assert x.min() >= -14 and x.max() <= 40                  # /255 uses levels -14..40, never p - 128


def test_a_pixels_manifest_that_states_its_normalisation_is_honoured():
    """The old pixel path fed int8 as p - 128 whatever the manifest said."""
    from PIL import Image

    from edge_runtime.models.image import to_tensor

    spec = {"name": "images", "dtype": "int8", "shape": [1, 4, 4, 3],
            "quantization": {"scale": 0.01865844801068306, "zero_point": -14}}
    pre = {"kind": "image", "size": [4, 4], "channels": 3, "layout": "NHWC", "resize": "bilinear-half-pixel",
           "input": "pixels", "scale": 1 / 255, "mean": [0.0], "std": [1.0]}
    arr = np.arange(48, dtype=np.uint8).reshape(4, 4, 3) * 5
    x = to_tensor(Image.fromarray(arr), pre, spec)
    want = np.clip(np.round(arr / 255.0 / 0.01865844801068306 - 14), -128, 127).astype(np.int8)
    np.testing.assert_array_equal(x[0], want)


def test_tflm_nchw_int8_classifier_with_imagenet_normalisation(tflm_imagenet):
    art, man = tflm_imagenet
    pre = man["preprocess"]
    assert pre["layout"] == "NCHW" and pre["size"] == [224, 224] and pre["channels"] == 3
    assert pre["input"] == "quantized" and pre["normalisation_source"] == "stated"
    assert pre["scale"] == pytest.approx(1 / 255) and pre["mean"] == [0.485, 0.456, 0.406]
    assert pre["std"] == [0.229, 0.224, 0.225]
    cat = shared("coral", "cat.bmp")
    with er.load(art) as rt:
        spec = rt.variant["buckets"][0]["inputs"][0]
        q = spec["quantization"]
        fed = rt.task.prepare(str(cat), rt.limits).feeds[spec["name"]]
        p = _pixels(cat, (224, 224))
        x = (p / 255.0 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
        want = np.clip(np.round(x / q["scale"] + q["zero_point"]), -128, 127).astype(np.int8)
        np.testing.assert_array_equal(fed, want.transpose(2, 0, 1)[None])
        res = rt.infer(str(cat))
    assert res.prediction == "Egyptian cat" and res.class_id == 285       # 1000 classes: Coral's 286 - 1
    assert {t["index"] for t in res.top_k[:3]} <= {281, 282, 283, 285, 287}  # tabby, tiger, Egyptian, lynx...
    assert 0.3 < res.top_k[0]["score"] <= 1 and sum(res.scores.values()) <= 1 + 1e-6


def test_int8_default_normalisation_is_documented_and_warns_with_the_range(tmp_path, labels_1000, caplog):
    with caplog.at_level(logging.WARNING, logger="edge_runtime"):
        man = _import(shared("tflm", "mobilenet_v2_quantized_1x3x224x224.tflite"), tmp_path / "a",
                      labels=labels_1000)
    pre = man["preprocess"]
    assert pre["normalisation_source"] == "default"
    assert (pre["scale"], pre["mean"], pre["std"]) == (pytest.approx(1 / 127.5), [1.0], [1.0])
    warnings = man["model"]["source"]["warnings"]
    said = [w for w in warnings if "no normalisation stated" in w]
    assert said and "ImageNet mean/std" in said[0] and IMAGENET_STD in said[0]
    assert any("ImageNet mean/std" in r.getMessage() for r in caplog.records)


def test_a_normalisation_that_clips_is_refused_and_tiny_coverage_warns(tmp_path):
    tflm = shared("tflm", "mobilenet_v2_quantized_1x3x224x224.tflite")
    with pytest.raises(er.InputError) as ei:          # 0..255 floats into an input quantized for -2.1..2.6
        _import(tflm, tmp_path / "a", scale="1")
    assert ei.value.code == "import_normalisation_clips" and "clipped" in ei.value.message
    assert "ImageNet mean/std" in ei.value.message and not (tmp_path / "a").exists()
    with pytest.raises(er.InputError) as ei:          # Coral's uint8 [-1, 1] input fed 0..255
        _import(shared("coral", "mobilenet_v1_0.25_128_quant.tflite"), tmp_path / "b", scale="1")
    assert ei.value.code == "import_normalisation_clips"
    with pytest.raises(er.InputError) as ei:          # 0..0.01: one quantization step, every image alike
        _import(tflm, tmp_path / "c", scale="1/255", std="100")
    assert ei.value.code == "import_normalisation_collapses" and not (tmp_path / "c").exists()
    man = _import(tflm, tmp_path / "c2", scale="1/255", std="2.1")  # 0..0.48: about 10% of the steps, a warning
    assert any("steps of the int8 input" in w for w in man["model"]["source"]["warnings"])
    with pytest.raises(er.InputError) as ei:
        _import(tflm, tmp_path / "d", mean="0.1,0.2")
    assert ei.value.code == "import_preprocess_invalid"
    with pytest.raises(er.InputError) as ei:
        _import(tflm, tmp_path / "e", std="0")
    assert ei.value.code == "import_preprocess_invalid"


def test_coral_uint8_keeps_the_identity_fast_path(coral_artifact):
    man = json.loads((coral_artifact / "manifest.json").read_text())
    pre = man["preprocess"]
    assert pre["input"] == "pixels" and pre["normalisation_source"] == "default"
    assert (pre["scale"], pre["mean"], pre["std"]) == (0.0078125, [1.0], [1.0])    # q = p exactly
    cat = shared("coral", "cat.bmp")
    with er.load(coral_artifact) as rt:
        assert rt.task.plan[0] == "cast"              # the pixels are cast, no per-pixel arithmetic
        spec = rt.variant["buckets"][0]["inputs"][0]
        fed = rt.task.prepare(str(cat), rt.limits).feeds[spec["name"]]
    assert fed.dtype == np.uint8
    np.testing.assert_array_equal(fed[0], _pixels(cat, (128, 128)).astype(np.uint8))


def test_tf2_ptq_uint8_zero_point_127_is_still_the_identity(tmp_path):
    man = _import(shared("coral", "tf2_mobilenet_v2_1.0_224_ptq.tflite"), tmp_path / "a")
    assert man["preprocess"]["input"] == "pixels"
    assert man["preprocess"]["mean"] == [pytest.approx(127 * 0.007843137718737125)]


def test_cli_import_states_the_normalisation(tmp_path, labels_1000):
    from click.testing import CliRunner

    from edge_runtime.cli import main

    tflm = str(shared("tflm", "mobilenet_v2_quantized_1x3x224x224.tflite"))
    r = CliRunner().invoke(main, ["import", tflm, "-o", str(tmp_path / "a"), "--labels", str(labels_1000),
                                  *IMAGENET_STD.split(), "--json"])
    assert r.exit_code == 0, r.output
    pre = json.loads(r.stdout)["preprocess"]
    assert pre["mean"] == [0.485, 0.456, 0.406] and pre["normalisation_source"] == "stated"
    r = CliRunner().invoke(main, ["import", tflm, "-o", str(tmp_path / "b"), "--scale", "one"])
    assert r.exit_code == 2 and "import_preprocess_invalid" in r.output


# -- 2. results carry the class index; duplicate labels keep both entries -----------

def test_duplicate_labels_keep_both_scores(renamed_labels_mnv2, caplog):
    art, man = renamed_labels_mnv2
    assert any("'Egyptian cat' at classes 282, 286" in w for w in man["model"]["source"]["warnings"])
    with caplog.at_level(logging.INFO, logger="edge_runtime"):
        rt = er.load(art)
    with rt:
        said = [r for r in caplog.records if "duplicate label" in r.getMessage()]
        assert said and all(r.levelno == logging.INFO for r in said)    # logged at load; import warned
        assert rt.task.keys[282] == "Egyptian cat#282" and rt.task.keys[135] == "crane#135"
        assert rt.task.keys[517 + 1] == "crane#518" and rt.task.keys[1] == "tench, Tinca tinca"
        res = rt.infer(str(shared("coral", "cat.bmp")))
    assert res.prediction == "Egyptian cat" and res.class_id == 286
    assert res.scores["Egyptian cat#286"] == pytest.approx(0.81, abs=0.02)
    assert res.scores["Egyptian cat#282"] == pytest.approx(0.11, abs=0.02)
    assert "Egyptian cat" not in res.scores
    assert [t["index"] for t in res.top_k[:2]] == [286, 282]
    assert res.top_k[0] == {"index": 286, "label": "Egyptian cat", "score": res.scores["Egyptian cat#286"]}
    d = json.loads(json.dumps(res.to_dict()))
    assert d["class_id"] == 286 and d["top_k"][1]["label"] == "Egyptian cat" and d["top_k"][1]["index"] == 282
    assert d["prediction"] == "Egyptian cat" and isinstance(d["scores"], dict)


def test_unique_labels_stay_plain_keys(coral_artifact):
    with er.load(coral_artifact) as rt:
        res = rt.infer(str(shared("coral", "cat.bmp")))
    assert res.prediction in res.scores and res.class_id == rt.task.labels.index(res.prediction)
    assert [t["label"] for t in res.top_k] == list(res.scores)          # same order, same classes


def test_classification_parity_compares_class_indices():
    from edge_runtime.models.base import TaskOutput, classification_parity, rank_classes

    labels = ["crane", "dog", "crane"]
    a = rank_classes(np.array([0.7, 0.1, 0.2]), labels, 3)
    b = rank_classes(np.array([0.2, 0.1, 0.7]), labels, 3)
    assert a[0] == b[0] == "crane" and (a[1], b[1]) == (0, 2)
    ref = [TaskOutput(prediction=a[0], scores=a[2])]
    cand = [TaskOutput(prediction=b[0], scores=b[2])]
    assert ref[0].class_id == 0 and cand[0].class_id == 2
    rep = classification_parity(ref, cand)
    assert rep["value"] == 0.0 and rep["max_score_diff"] == pytest.approx(0.5)
    assert classification_parity(ref, ref)["value"] == 1.0


# -- 3. high-bit-depth images scale to 8 bits --------------------------------------

def _png16(arr: np.ndarray) -> bytes:
    """A 16-bit PNG (gray, gray+alpha, RGB or RGBA), written by hand: PIL cannot write 16-bit RGB."""
    h, w = arr.shape[:2]
    c = 1 if arr.ndim == 2 else arr.shape[2]
    rows = arr.reshape(h, w * c).astype(">u2")
    raw = b"".join(b"\x00" + rows[y].tobytes() for y in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    colour = {1: 0, 2: 4, 3: 2, 4: 6}[c]
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, colour, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def _png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["gray-pil-I;16", "gray-written", "rgb", "rgba"])
def test_a_16bit_png_answers_like_its_8bit_copy(coral_artifact, kind):
    from PIL import Image

    cat = Image.open(shared("coral", "cat.bmp"))
    if kind.startswith("gray"):
        eight = np.asarray(cat.convert("L"))
        wide = eight.astype(np.uint16) * 257
        data16 = _png(Image.fromarray(wide)) if kind == "gray-pil-I;16" else _png16(wide)
        assert Image.open(io.BytesIO(data16)).mode == "I;16"
    else:
        eight = np.asarray(cat.convert("RGB"))
        wide = eight.astype(np.uint16) * 257
        if kind == "rgba":
            wide = np.concatenate([wide, np.full(wide.shape[:2] + (1,), 65535, np.uint16)], axis=2)
        data16 = _png16(wide)
    data8 = _png(Image.fromarray(eight))
    with er.load(coral_artifact) as rt:
        a, b = rt.infer(data8), rt.infer(data16)
    assert b.prediction == a.prediction and b.class_id == a.class_id
    assert b.scores == pytest.approx(a.scores, abs=1e-6)


def test_wide_and_alpha_modes_decode_by_scaling():
    from PIL import Image

    from edge_runtime.limits import DEFAULT_LIMITS
    from edge_runtime.models.image import decode, to_8bit

    v16 = np.array([[0, 257, 32896, 65535], [128, 129, 65407, 65408]], dtype=np.uint16)
    want = np.round(v16 / 257).astype(np.uint8)
    for mode in ("I;16", "I;16B"):
        img = Image.frombytes(mode, (4, 2), v16.astype("<u2" if mode == "I;16" else ">u2").tobytes())
        np.testing.assert_array_equal(np.asarray(to_8bit(img)), want)
    img = Image.fromarray(v16.astype(np.int32), mode="I")
    np.testing.assert_array_equal(np.asarray(to_8bit(img)), want)      # PIL's convert("L") clips to 255
    gray = decode(_png16(v16), DEFAULT_LIMITS, "L")
    np.testing.assert_array_equal(np.asarray(gray), want)
    la = decode(_png16(np.stack([v16, np.full_like(v16, 100)], axis=2)), DEFAULT_LIMITS, "L")
    # 16-bit colour PNGs reach us as PIL's high byte (floor(v / 256)): within one level of the
    # rounded scaling, alpha dropped, never wrapped or clipped to white
    assert np.abs(np.asarray(la).astype(int) - want).max() <= 1
    pal = Image.new("P", (2, 1))
    pal.putpalette([0, 0, 0, 200, 100, 50] + [0] * 762)
    pal.putpixel((1, 0), 1)
    buf = io.BytesIO()
    pal.save(buf, format="PNG", transparency=0)
    rgb = decode(buf.getvalue(), DEFAULT_LIMITS, "RGB")
    assert np.asarray(rgb)[0, 1].tolist() == [200, 100, 50]
    cmyk = Image.new("CMYK", (8, 8), (0, 255, 255, 0))                 # pure red in CMYK
    buf = io.BytesIO()
    cmyk.save(buf, format="JPEG", quality=95)
    px = np.asarray(decode(buf.getvalue(), DEFAULT_LIMITS, "RGB"))[4, 4].astype(int)
    assert px[0] > 200 and px[1] < 60 and px[2] < 60


def _with_orientation(pixels: np.ndarray, tag: int | None, fmt: str = "PNG") -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    kw = {}
    if tag is not None:
        exif = Image.Exif()
        exif[0x0112] = tag
        kw["exif"] = exif.tobytes()
    Image.fromarray(pixels).save(buf, format=fmt, **kw)
    return buf.getvalue()


def test_exif_orientation_is_applied_as_a_viewer_shows_the_image(coral_artifact):
    """A phone photo stored sideways with its EXIF orientation decodes upright (PIL's own
    ``exif_transpose``): the parrot stored rotated or mirrored, with the tag that undoes it, gives the
    upright pixels exactly and the same answer; without the tag it is another image."""
    from PIL import Image

    from edge_runtime.limits import DEFAULT_LIMITS
    from edge_runtime.models.image import decode

    upright = np.asarray(Image.open(shared("coral", "parrot.jpg")).convert("RGB"))
    stored = {6: np.rot90(upright, 1), 8: np.rot90(upright, -1), 3: upright[::-1, ::-1], 2: upright[:, ::-1]}
    with er.load(coral_artifact) as rt:
        want = rt.infer(upright)
        for tag, pixels in stored.items():
            data = _with_orientation(np.ascontiguousarray(pixels), tag)
            np.testing.assert_array_equal(np.asarray(decode(data, DEFAULT_LIMITS, "RGB")), upright)
            got = rt.infer(data)
            assert (got.prediction, got.scores) == (want.prediction, want.scores), tag
        sideways = np.asarray(decode(_with_orientation(np.ascontiguousarray(stored[6]), None), DEFAULT_LIMITS, "RGB"))
        assert sideways.shape == stored[6].shape                  # no tag: the stored layout
    # a JPEG's tag too, and an orientation PIL cannot read is the stored layout, not an error
    jpeg = _with_orientation(np.ascontiguousarray(stored[6]), 6, "JPEG")
    assert np.asarray(decode(jpeg, DEFAULT_LIMITS, "RGB")).shape == upright.shape
    assert np.asarray(decode(_with_orientation(upright, 9, "JPEG"), DEFAULT_LIMITS, "RGB")).shape == upright.shape


# -- 4. the classifier contract: checked at import and at load -----------------------

@pytest.mark.parametrize("model,needle", [
    (("detection", "yolov8n_tflite", "yolov8n_full_integer_quant.tflite"),
     "[1, 84, 8400]: [boxes + class scores] x anchors looks like a YOLO detector"),
    (("coral", "deeplabv3_mnv2_pascal_quant.tflite"),
     "[1, 513, 513]: a per-pixel class map looks like semantic segmentation"),
    (("detection", "ssd_mobilenet_v1", "ssd_mobilenet_v1_1_metadata_1.tflite"),
     "4 outputs (boxes, classes, scores, count) look like an SSD detector"),
    (("coral", "movenet_single_pose_lightning_ptq.tflite"),
     "[1, 1, 17, 3]: per-keypoint (y, x, score) rows look like pose estimation"),
], ids=["yolov8n", "deeplab", "ssd", "movenet"])
def test_models_of_another_task_are_refused_at_import(tmp_path, model, needle):
    labels = shared("detection", "ssd_mobilenet_v1", "labelmap.txt")      # 90 labels: the advice must not be about them
    with pytest.raises(er.InputError) as ei:
        _import(shared(*model), tmp_path / "a", labels=labels)
    assert ei.value.code == "import_task_mismatch", ei.value.message
    # the advice names the task that fits, now that each of these has one (#18)
    assert needle in ei.value.message and "import it with --task " in ei.value.message
    assert "--task tensors" not in ei.value.message
    assert "labels" not in ei.value.message and not (tmp_path / "a").exists()


def test_a_non_classifier_artifact_is_refused_at_load(tmp_path):
    from factories import rewrite_manifest

    from edge_runtime.converters.tflite_import import image_preprocess

    art = tmp_path / "yolo"
    man = _import(shared("detection", "yolov8n_tflite", "yolov8n_full_integer_quant.tflite"), art, task="tensors")
    pre = image_preprocess(man["variants"][0]["buckets"][0]["inputs"][0], scale="1/255")

    def as_classifier(m):
        m["task"], m["preprocess"], m["postprocess"] = "image-classification", pre, {"top_k": 5}

    rewrite_manifest(art, as_classifier)
    with pytest.raises(er.ArtifactError) as ei:
        er.load(art)
    assert ei.value.code == "artifact_task_mismatch"
    assert "'PartitionedCall:0' has shape [1, 84, 8400]" in ei.value.message and "YOLO" in ei.value.message


def test_classifier_output_shapes():
    from edge_runtime.models.image_classification import NotAClassifier, classifier_output

    def t(shape, name="y"):
        return {"name": name, "dtype": "float32", "shape": shape}

    assert classifier_output([t([1, 1001])])[1] == 1001
    assert classifier_output([t([10])])[1] == 10
    assert classifier_output([t([1, 1000, 1, 1])])[1] == 1000
    assert classifier_output([t([1, 3]), t([1, 5], "z")], "z")[1] == 5
    for outs in ([t([1, 1])], [t([1, 10]), t([1, 4], "z")], [t([2, 10])], [t([1, 3549, 85])]):
        with pytest.raises(NotAClassifier):
            classifier_output(outs)


# -- reach: tensors artifacts, import's output path, its help -----------------------

def test_tensors_outputs_are_dequantized_and_the_raw_ones_kept(tmp_path):
    _import(shared("tflm", "hello_world_int8.tflite"), tmp_path / "h", task="tensors")
    with er.load(tmp_path / "h") as rt:
        ins, outs = rt.variant["buckets"][0]["inputs"][0], rt.variant["buckets"][0]["outputs"][0]
        qi, qo = ins["quantization"], outs["quantization"]
        x = np.array([[round(1.57 / qi["scale"] + qi["zero_point"])]], dtype=np.int8)     # sin(pi/2)
        res = rt.infer({ins["name"]: x})
    y, raw = res.outputs[outs["name"]], res.raw_outputs[outs["name"]]
    assert raw.dtype == np.int8 and y.dtype == np.float32
    np.testing.assert_allclose(y, (raw.astype(np.float32) - qo["zero_point"]) * qo["scale"])
    assert 0.8 < float(y.ravel()[0]) < 1.2                                     # the sine, not an int8 code
    d = json.loads(json.dumps(res.to_dict()))
    assert d["outputs"][outs["name"]]["dtype"] == "float32" and d["raw_outputs"][outs["name"]]["dtype"] == "int8"


def test_tensors_import_records_real_output_shapes_and_refuses_labels(tmp_path):
    ssd = shared("detection", "ssd_mobilenet_v1", "ssd_mobilenet_v1_1_metadata_1.tflite")
    man = _import(ssd, tmp_path / "s", task="tensors")
    assert [o["shape"] for o in man["variants"][0]["buckets"][0]["outputs"]] == [[1, 10, 4], [1, 10], [1, 10], [1]]
    with pytest.raises(er.InputError) as ei:
        _import(ssd, tmp_path / "t", task="tensors", labels=shared("detection", "ssd_mobilenet_v1", "labelmap.txt"))
    assert ei.value.code == "import_labels_unused" and "--labels" in ei.value.message
    assert not (tmp_path / "t").exists()


def test_import_to_an_existing_file_is_an_input_error(tmp_path):
    f = tmp_path / "artifact"
    f.write_text("not a directory")
    model = shared("coral", "mobilenet_v1_0.25_128_quant.tflite")
    for out in (f, f / "sub"):
        with pytest.raises(er.InputError) as ei:
            _import(model, out)
        assert ei.value.code == "import_out_not_a_directory" and str(f) in ei.value.message
    assert f.read_text() == "not a directory"


def test_import_help_shows_examples():
    from click.testing import CliRunner

    from edge_runtime.cli import main

    r = CliRunner().invoke(main, ["import", "--help"])
    assert r.exit_code == 0
    assert "Examples:\n    edge-infer import mobilenet_v2_1.0_224_quant.tflite -o out/mnv2" in r.output
    assert "--scale 1/255 --mean 0.485,0.456,0.406" in r.output and "--task tensors" in r.output
