"""The detector head guard on TFLite graphs and YOLOv5-style heads, the convert source's check, and
an imported float TFLite's recorded precision.

1. ``import model.tflite --family yolo`` of a YOLOX (onnx2tf's export of YOLOX-Nano) was accepted
   (exit 0, 81 "classes", class "1" at .70 with boxes spanning the image on bus.jpg): the guard read
   ONNX graphs only. ``converters.tflite_head`` walks the TFLite graph the same way.
2. ``convert --family yolo`` of a float YOLOX is not checked (its parity reference decodes the same
   wrong way): ``onnx_head.check_source_head`` is the check for the convert source
   (``convert_family_mismatch``); the convert pipeline is to call it on the sections it builds.
3. A YOLOv5-style head (one Sigmoid over 4 box + 1 objectness + C class columns, split and the boxes
   decoded) was read as "no objectness column": refused under ``yolo`` with objectness (the decode
   that fits) and accepted without it (81 "classes", objectness read as class 0).
4. A float TFLite imported as target ``tflite-int8`` recorded "imported (as quantized by its
   producer)": its ``quantization`` record now says what the graph computes in.

The small heads are built here, with TensorFlow's TFLite converter and onnx.helper, at 96x96
(strides 8/16/32: 189 cells, 567 YOLOv5 anchors); the real models come from ../shared/data.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import edge_runtime as er
from conftest import shared
from edge_runtime.cli import main
from factories import import_detector, refused_detector_import

FAMILY_MISMATCH = "import_family_mismatch"
HW, STRIDES, C = 96, (8, 16, 32), 80
CELLS = sum((HW // s) ** 2 for s in STRIDES)          # 189


_import, _refused = import_detector, refused_detector_import


def _bus():
    return str(shared("detection", "images", "bus.jpg"))


def _labels():
    return shared("detection", "nanodet", "coco.names")


# -- the heads: TFLite through TensorFlow's converter --------------------------------------------

def _tf_head(tf, kind: str, float16: bool = False) -> bytes:
    """A [1, 96, 96, 3] float detector with a ``kind`` head: ``yolox`` (per level a box Conv, a
    Sigmoid objectness Conv, Sigmoid class Conv, concatenated: [1, 189, 85]), ``yolov8`` (DFL boxes
    decoded around the cell centres x stride, Sigmoid classes: [1, 189, 84], channels last) or
    ``yolov5`` (one Conv of 3 anchors x 85, one Sigmoid, split 2/2/81, xy and wh decoded with the
    grid and anchors: [1, 567, 85])."""
    rng = np.random.default_rng(0)

    def w(*shape):
        return tf.constant(rng.normal(0, 0.1, shape).astype(np.float32))

    stem = {s: w(1, 1, 3, 16) for s in STRIDES}
    widths = {"yolox": (4, 1, C), "yolov8": (64, C), "yolov5": (3 * (5 + C),)}[kind]
    heads = {s: [w(1, 1, 16, n) for n in widths] for s in STRIDES}
    anchors = {s: tf.constant(rng.uniform(10, 60, (1, 1, 1, 3, 2)).astype(np.float32)) for s in STRIDES}

    @tf.function(input_signature=[tf.TensorSpec([1, HW, HW, 3], tf.float32, name="images")])
    def fn(x):
        levels = []
        for s in STRIDES:
            n = HW // s
            f = tf.nn.relu(tf.nn.conv2d(x, stem[s], strides=s, padding="VALID"))
            outs = [tf.nn.conv2d(f, k, 1, "VALID") for k in heads[s]]
            yy, xx = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
            if kind == "yolox":
                reg, obj, cls = outs
                levels.append(tf.reshape(tf.concat([reg, tf.sigmoid(obj), tf.sigmoid(cls)], -1), [1, n * n, 5 + C]))
            elif kind == "yolov8":
                box, cls = outs
                d = tf.nn.softmax(tf.reshape(box, [1, n * n, 4, 16]), -1)
                d = tf.reduce_sum(d * tf.range(16, dtype=tf.float32), -1)            # l, t, r, b in cells
                centre = tf.constant(np.stack([xx, yy], -1).reshape(1, n * n, 2).astype(np.float32) + 0.5)
                x1y1, x2y2 = centre - d[..., :2], centre + d[..., 2:]
                xywh = tf.concat([(x1y1 + x2y2) / 2, x2y2 - x1y1], -1) * float(s)
                levels.append(tf.concat([xywh, tf.sigmoid(tf.reshape(cls, [1, n * n, C]))], -1))
            else:
                y = tf.sigmoid(tf.reshape(outs[0], [1, n, n, 3, 5 + C]))
                xy, wh, conf = tf.split(y, [2, 2, 1 + C], -1)
                grid = tf.constant(np.stack([xx, yy], -1).reshape(1, n, n, 1, 2).astype(np.float32))
                xy = (xy * 2 - 0.5 + grid) * float(s)
                wh = (wh * 2) ** 2 * anchors[s]
                levels.append(tf.reshape(tf.concat([xy, wh, conf], -1), [1, n * n * 3, 5 + C]))
        return tf.concat(levels, 1)

    conv = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()], fn)
    if float16:
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.target_spec.supported_types = [tf.float16]
    return bytes(conv.convert())


@pytest.fixture(scope="module")
def tfl(tmp_path_factory):
    """The TFLite heads (TensorFlow is imported once, ~10 s; each conversion ~1 s)."""
    tf = pytest.importorskip("tensorflow")
    pytest.importorskip("ai_edge_litert")
    tmp = tmp_path_factory.mktemp("tflite-heads")
    found = {"tmp": tmp}
    for kind in ("yolox", "yolov8", "yolov5"):
        found[kind] = tmp / f"{kind}.tflite"
        found[kind].write_bytes(_tf_head(tf, kind))
    found["yolox_fp16"] = tmp / "yolox_fp16.tflite"
    found["yolox_fp16"].write_bytes(_tf_head(tf, "yolox", float16=True))
    return found


# -- the heads: YOLOv5's ONNX export -------------------------------------------------------------

def _onnx_yolov5(path, cut: str = "split"):
    """YOLOv5's Detect as exported to ONNX, at 96x96: per level one Conv [1, 3*85, n, n], Reshape
    [1, 3, 85, n, n], Transpose to [1, 3, n, n, 85], Sigmoid, then ``Split`` 2/2/81 (v6+ exports) or
    three ``Slice``s (the older ``y[..., 4:]``), xy = (2*xy - 0.5 + grid)*stride, wh = (2*wh)^2 *
    anchor_grid, Concat, Reshape [1, 3*n*n, 85]; the levels concatenated: [1, 567, 85]."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    nodes, inits, levels = [], [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    for s in STRIDES:
        n, p = HW // s, f"l{s}_"
        const(p + "ws", rng.normal(0, 0.1, (16, 3, s, s)).astype(np.float32))
        const(p + "wh", rng.normal(0, 0.1, (3 * (5 + C), 16, 1, 1)).astype(np.float32))
        yy, xx = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        grid = np.broadcast_to(np.stack([xx, yy], -1)[None, None], (1, 3, n, n, 2)).astype(np.float32) - 0.5
        const(p + "grid", grid)
        const(p + "anchors", np.broadcast_to(rng.uniform(10, 60, (1, 3, 1, 1, 2)), (1, 3, n, n, 2)).astype(np.float32))
        const(p + "shape5", np.array([1, 3, 5 + C, n, n], dtype=np.int64))
        const(p + "shape3", np.array([1, 3 * n * n, 5 + C], dtype=np.int64))
        nodes += [helper.make_node("Conv", ["images", p + "ws"], [p + "f0"], strides=[s, s]),
                  helper.make_node("Relu", [p + "f0"], [p + "f"]),
                  helper.make_node("Conv", [p + "f", p + "wh"], [p + "raw"]),
                  helper.make_node("Reshape", [p + "raw", p + "shape5"], [p + "r5"]),
                  helper.make_node("Transpose", [p + "r5"], [p + "t"], perm=[0, 1, 3, 4, 2]),
                  helper.make_node("Sigmoid", [p + "t"], [p + "y"])]
        if cut == "split":
            const(p + "sizes", np.array([2, 2, 1 + C], dtype=np.int64))
            nodes.append(helper.make_node("Split", [p + "y", p + "sizes"], [p + "xy", p + "wh0", p + "conf"], axis=4))
        else:
            for name, lo, hi in (("xy", 0, 2), ("wh0", 2, 4), ("conf", 4, 5 + C)):
                const(p + name + "_lo", np.array([lo], dtype=np.int64))
                const(p + name + "_hi", np.array([hi], dtype=np.int64))
                const(p + name + "_ax", np.array([4], dtype=np.int64))
                nodes.append(helper.make_node("Slice", [p + "y", p + name + "_lo", p + name + "_hi", p + name + "_ax"],
                                              [p + name]))
        const(p + "two", np.array(2.0, dtype=np.float32))
        const(p + "stride", np.array(float(s), dtype=np.float32))
        nodes += [helper.make_node("Mul", [p + "xy", p + "two"], [p + "xy2"]),
                  helper.make_node("Add", [p + "xy2", p + "grid"], [p + "xyg"]),
                  helper.make_node("Mul", [p + "xyg", p + "stride"], [p + "xyp"]),
                  helper.make_node("Mul", [p + "wh0", p + "two"], [p + "wh2"]),
                  helper.make_node("Pow", [p + "wh2", p + "two"], [p + "whs"]),
                  helper.make_node("Mul", [p + "whs", p + "anchors"], [p + "whp"]),
                  helper.make_node("Concat", [p + "xyp", p + "whp", p + "conf"], [p + "cat"], axis=4),
                  helper.make_node("Reshape", [p + "cat", p + "shape3"], [p + "out"])]
        levels.append(p + "out")
    nodes.append(helper.make_node("Concat", levels, ["output0"], axis=1))
    graph = helper.make_graph(nodes, "yolov5_head",
                              [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, HW, HW])],
                              [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 3 * CELLS, 5 + C])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


# -- 1. TFLite: YOLOX read as yolo, YOLOv8 read as yolox ------------------------------------------

def test_tflite_yolox_as_yolo_is_refused_naming_yolox(tfl, tmp_path):
    msg = _refused(tfl["yolox"], tmp_path / "a", family="yolo")
    assert "looks like a YOLOX head" in msg and "85 = 5 + 80" in msg and "81 classes" in msg
    assert "use --family yolox" in msg


def test_tflite_yolox_as_yolo_with_objectness_is_refused_too(tfl, tmp_path):
    msg = _refused(tfl["yolox"], tmp_path / "a", family="yolo", postprocess={"objectness": True})
    assert "raw box offsets" in msg and "--family yolox" in msg


def test_tflite_yolox_as_yolo_on_the_cli_exits_2(tfl, tmp_path):
    res = CliRunner().invoke(main, ["import", str(tfl["yolox"]), "-o", str(tmp_path / "a"), "--task",
                                    "object-detection", "--family", "yolo"])
    assert res.exit_code == 2, res.output
    assert FAMILY_MISMATCH in res.output and "--family yolox" in res.output
    assert not (tmp_path / "a").exists()


def test_tflite_yolox_as_yolox_imports_and_runs(tfl, tmp_path):
    man = _import(tfl["yolox"], tmp_path / "a", family="yolox")
    assert man["postprocess"]["family"] == "yolox" and man["postprocess"]["classes"] == C
    with er.load(tmp_path / "a", limits={"max_request_bytes": 16 << 20}) as rt:
        dets = rt.infer(_bus()).detections
    assert all(0.0 <= d["score"] <= 1.0 for d in dets)


def test_tflite_yolov8_channels_last_as_yolox_is_refused_naming_yolo(tfl, tmp_path):
    msg = _refused(tfl["yolov8"], tmp_path / "a", family="yolox")
    assert "looks like a YOLOv8 head" in msg and "84 = 4 + 80" in msg and "use --family yolo" in msg


def test_tflite_yolov8_channels_last_as_yolo_imports(tfl, tmp_path):
    man = _import(tfl["yolov8"], tmp_path / "a", family="yolo")
    post = man["postprocess"]
    assert (post["layout"], post["objectness"], post["classes"]) == ("channels_last", False, C)


def test_real_yolov8_tflite_graph_shows_decoded_boxes_and_sigmoid_classes(tmp_path):
    """Ultralytics' full-integer YOLOv8n: its boxes decoded in the graph (DFL SOFTMAX, slices
    subtracted and added), LOGISTIC classes; it imports as yolo as before, and objectness true (which
    would read the first class as one) is refused."""
    pytest.importorskip("ai_edge_litert")
    from edge_runtime.converters.tflite_import import read_model

    model = shared("detection", "yolov8n_tflite", "yolov8n_full_integer_quant.tflite")
    assert read_model(model)["head_columns"] == {
        "PartitionedCall:0": {1: [[2, "decoded"], [2, "decoded"], [80, "sigmoid"]]}}
    man = _import(model, tmp_path / "a", family="yolo", labels=_labels())
    assert man["postprocess"]["classes"] == 80 and man["postprocess"]["objectness"] is False
    msg = _refused(model, tmp_path / "b", family="yolo", postprocess={"objectness": True})
    assert "no objectness column" in msg


@pytest.mark.slow
def test_real_yolox_exported_by_onnx2tf_is_refused_as_yolo_and_detects_the_bus_as_yolox(tmp_path):
    """The reported case: YOLOX-Nano through onnx2tf (the toolchain of the project's tflite-int8
    converter; the input kept NCHW, as that converter keeps it), ~20 s."""
    pytest.importorskip("onnx2tf")
    pytest.importorskip("tensorflow")
    from edge_runtime.converters.tflite_int8 import _onnx2tf

    _onnx2tf(shared("detection", "yolox_nano", "yolox_nano.onnx"), tmp_path / "tf", ["images"], False)
    model = tmp_path / "tf" / "yolox_nano_float32.tflite"
    msg = _refused(model, tmp_path / "a", family="yolo", labels=_labels())
    assert "looks like a YOLOX head" in msg and "--family yolox" in msg
    man = _import(model, tmp_path / "b", family="yolox", labels=_labels())
    assert man["variants"][0]["quantization"]["precision"] == "fp32"
    with er.load(tmp_path / "b", limits={"max_request_bytes": 16 << 20}) as rt:
        top = [(d["label"], round(d["score"], 2)) for d in rt.infer(_bus()).detections][:4]
    assert top == [("bus", 0.92), ("person", 0.85), ("person", 0.81), ("person", 0.68)]   # the data README's


# -- 2. convert: the ONNX source's head against the stated family ---------------------------------

def _resolved(source, family: str, **post) -> dict:
    from edge_runtime.converters.onnx_io import io_specs
    from edge_runtime.models import get_task

    ins, outs = io_specs(source)
    return get_task("object-detection").sections_for(ins, outs, {"family": family, **post})


def _source_refused(src, post) -> str:
    from edge_runtime.converters.onnx_head import check_source_head

    with pytest.raises(er.InputError) as ei:
        check_source_head(src, post)
    assert ei.value.code == "convert_family_mismatch" and ei.value.exit_code == 2
    return str(ei.value)


def test_convert_source_check_refuses_a_float_yolox_as_yolo():
    pytest.importorskip("onnx")
    from edge_runtime.converters.onnx_head import check_source_head

    src = shared("detection", "yolox_nano", "yolox_nano.onnx")
    msg = _source_refused(src, _resolved(src, "yolo"))
    assert msg.startswith("--family yolo: ") and "looks like a YOLOX head" in msg and "use --family yolox" in msg
    check_source_head(src, _resolved(src, "yolox"))


def test_convert_of_a_float_yolox_as_yolo_exits_2_and_writes_nothing(tmp_path):
    """The pipeline calls the check: ``edge-infer convert yolox_nano.onnx --family yolo`` exited 0
    (parity detection_f1 1.0 against a reference decoding the same wrong way)."""
    pytest.importorskip("onnxruntime")
    from PIL import Image

    photos = tmp_path / "photos"
    photos.mkdir()
    with Image.open(_bus()) as im:
        for i in range(2):
            im.convert("RGB").resize((416 - 32 * i, 416)).save(photos / f"{i}.jpg")
    out = tmp_path / "art"
    res = CliRunner().invoke(main, [
        "convert", str(shared("detection", "yolox_nano", "yolox_nano.onnx")), "-o", str(out),
        "--task", "object-detection", "--family", "yolo", "--target", "onnx-int8", "--labels", str(_labels()),
        "--calibration", str(photos), "--parity-data", str(photos), "--allow-few-samples", "--json"])
    assert res.exit_code == 2, res.output
    err = next(json.loads(line) for line in res.output.splitlines() if line.startswith("{"))
    assert err["error"]["code"] == "convert_family_mismatch"
    assert "use --family yolox" in res.output and not out.exists()


def test_convert_source_check_passes_yolov8_as_yolo_and_refuses_its_objectness():
    pytest.importorskip("onnx")
    from edge_runtime.converters.onnx_head import check_source_head

    src = shared("detection", "yolov8n_onnx_dynamic", "yolov8n_int8.onnx")
    check_source_head(src, _resolved(src, "yolo"))
    assert "no objectness column" in _source_refused(src, _resolved(src, "yolo", objectness=True))


# -- 3. YOLOv5-style heads: objectness inside the one Sigmoid -------------------------------------

@pytest.mark.parametrize("cut", ["split", "slice"])
def test_onnx_yolov5_as_yolo_with_objectness_imports(tmp_path, cut):
    """The decode that fits a YOLOv5 head (yolo, objectness true) was refused ('no objectness column')."""
    pytest.importorskip("onnxruntime")
    model = _onnx_yolov5(tmp_path / "v5.onnx", cut)
    man = _import(model, tmp_path / "a", family="yolo", postprocess={"objectness": True}, labels=_labels())
    post = man["postprocess"]
    assert (post["layout"], post["objectness"], post["classes"]) == ("channels_last", True, C)
    with er.load(tmp_path / "a", limits={"max_request_bytes": 16 << 20}) as rt:
        rt.infer(_bus())


@pytest.mark.parametrize("cut", ["split", "slice"])
def test_onnx_yolov5_as_yolo_without_objectness_is_refused(tmp_path, cut):
    """Without objectness the yolo decoder reads it as class 0 of 81: that was imported."""
    pytest.importorskip("onnxruntime")
    model = _onnx_yolov5(tmp_path / "v5.onnx", cut)
    msg = _refused(model, tmp_path / "a", family="yolo")
    assert "YOLOv5-style head" in msg and "85 = 4 + 1 objectness + 80 classes" in msg
    assert "81 classes" in msg and "\"objectness\": true" in msg


def test_tflite_yolov5_objectness_is_read_through_the_split(tfl, tmp_path):
    from edge_runtime.converters.tflite_import import read_model

    assert read_model(tfl["yolov5"])["head_columns"]["Identity"][2] == [
        [2, "decoded"], [2, "decoded"], [81, "sigmoid", [85, 4]]]
    msg = _refused(tfl["yolov5"], tmp_path / "a", family="yolo")
    assert "YOLOv5-style head" in msg
    man = _import(tfl["yolov5"], tmp_path / "b", family="yolo", postprocess={"objectness": True})
    assert man["postprocess"]["objectness"] is True and man["postprocess"]["classes"] == C


def test_yolov5_head_under_yolox_is_refused_naming_yolo_with_objectness(tmp_path):
    """Its boxes are decoded in the graph: yolox would decode them again. Its 3 anchors a cell already
    fail yolox's shape check (567 rows, not 189); the head says why where a shape would pass."""
    from edge_runtime.models.detection_head import head_mismatch

    pytest.importorskip("onnxruntime")
    with pytest.raises(er.InputError) as ei:
        _import(_onnx_yolov5(tmp_path / "v5.onnx"), tmp_path / "a", family="yolox")
    assert ei.value.code == "import_task_mismatch" and "[1, 189, 5+C]" in str(ei.value)
    v5 = {2: [[2, "decoded"], [2, "decoded"], [81, "sigmoid", [85, 4]]]}
    why = head_mismatch("yolox", {"output": "output0"}, v5) or ""
    assert "decoded already" in why and "--family yolo --postprocess '{\"objectness\": true}'" in why


def test_yolov8_style_head_still_says_no_objectness():
    """The YOLOv5 reading does not reach a YOLOv8 head: its classes are a branch of their own."""
    from edge_runtime.models.detection_head import head_mismatch

    v8 = {1: [[2, "decoded"], [2, "decoded"], [80, "sigmoid"]]}
    params = {"output": "o", "layout": "channels_first", "objectness": True}
    assert "no objectness column" in (head_mismatch("yolo", params, v8) or "")
    cut_elsewhere = {2: [[2, "decoded"], [2, "decoded"], [80, "sigmoid", [112, 32]]]}   # not at column 4
    for obj in (False, True):
        assert head_mismatch("yolo", {"output": "o", "layout": "channels_last", "objectness": obj},
                             cut_elsewhere) is None


# -- 4. a float TFLite's recorded precision --------------------------------------------------------

def test_float_tflite_import_records_fp32_and_still_loads(tfl, tmp_path):
    man = _import(tfl["yolox"], tmp_path / "a", family="yolox")
    v = man["variants"][0]
    assert v["target"] == "tflite-int8"            # the target the TFLite backend runs
    q = v["quantization"]
    assert q["precision"] == "fp32" and q["scheme"] == "float (not quantized)"
    assert q["weights"] == "float32 (as in the model)" and q["activations"].startswith("float32")
    assert "float model" in q["note"]
    res = CliRunner().invoke(main, ["inspect", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    assert "tflite-int8: buckets static; float (not quantized) w:float32" in res.output
    with er.load(tmp_path / "a", device="tflite", limits={"max_request_bytes": 16 << 20}) as rt:
        rt.infer(_bus())


def test_float16_tflite_import_records_fp16(tfl, tmp_path):
    q = _import(tfl["yolox_fp16"], tmp_path / "a", family="yolox")["variants"][0]["quantization"]
    assert q["precision"] == "fp16" and q["weights"] == "float16 (as in the model)"
    assert q["scheme"] == "float (not quantized, float16 weights)"


def test_int8_tflite_import_records_int8(tmp_path):
    pytest.importorskip("ai_edge_litert")
    model = shared("detection", "yolov8n_tflite", "yolov8n_full_integer_quant.tflite")
    q = _import(model, tmp_path / "a", family="yolo")["variants"][0]["quantization"]
    assert q["precision"] == "int8" and q["scheme"] == "imported (as quantized by its producer)"
    assert q["weights"] == "int8 (as in the model)" and q["activations"] == "int8; int8 I/O"
    assert json.loads((tmp_path / "a" / "manifest.json").read_text())["variants"][0]["quantization"] == q
