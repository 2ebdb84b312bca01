"""``edge-infer import --family``: a detector head the graph shows to be another family's is refused.

YOLOX-Nano's ``[1, 3549, 85]`` (raw box offsets, an objectness column, 80 classes)
imported as ``--family yolo`` without labels was accepted (exit 0) as 81 "classes",
and decoded garbage: zero-width boxes in the corner, class "1" (person shifted by the
objectness column) at .70 on bus.jpg. The shapes cannot tell the heads apart; the
graph can (``converters.onnx_head``): YOLOX concatenates a box Conv, a Sigmoid
objectness and Sigmoid classes, YOLOv8 boxes decoded in the graph and Sigmoid classes.
The converse (YOLOv8 boxes read as ``yolox``) and a YOLOX export decoded in the graph
(``decode_in_inference=True``: ``yolo`` with ``objectness``) are checked on models
derived from the real ones by appending the ops their exports append. Real models from
/work/shared/data (skipped where absent); each import takes about a second.
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import edge_runtime as er
from conftest import shared
from edge_runtime.cli import main
from factories import import_detector, refused_detector_import

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

FAMILY_MISMATCH = "import_family_mismatch"
BUS_YOLOX = [("bus", 0.92), ("person", 0.85), ("person", 0.81), ("person", 0.68)]   # the data README's baseline


def _yolox():
    return shared("detection", "yolox_nano", "yolox_nano.onnx")


def _yolov8():
    return shared("detection", "yolov8n_onnx_dynamic", "yolov8n_int8.onnx")


def _labels():
    return shared("detection", "nanodet", "coco.names")


def _bus():
    return str(shared("detection", "images", "bus.jpg"))


_import, _refused = import_detector, refused_detector_import


def _yolox_decoded_in_graph(src, dst, hw=416, strides=(8, 16, 32)):
    """YOLOX-Nano with the decode YOLOX's export appends when ``decode_in_inference=True``:
    ``cat([(out[..., :2] + grid) * stride, exp(out[..., 2:4]) * stride, out[..., 4:]], -1)``."""
    from onnx import TensorProto, helper, numpy_helper

    m = onnx.load(str(src))
    g = m.graph
    out = g.output[0].name
    grids, steps = [], []
    for s in strides:
        n = hw // s
        yv, xv = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        grids.append(np.stack([xv, yv], -1).reshape(-1, 2))
        steps.append(np.full((n * n, 1), s))
    grid, stride = np.concatenate(grids)[None].astype(np.float32), np.concatenate(steps)[None].astype(np.float32)
    consts = {"dec_grid": grid, "dec_stride": stride, "s0": np.array([0]), "s2": np.array([2]),
              "s4": np.array([4]), "send": np.array([1 << 30]), "ax": np.array([2])}
    g.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    g.node.extend([helper.make_node("Slice", [out, "s0", "s2", "ax"], ["d_xy"]),
                   helper.make_node("Slice", [out, "s2", "s4", "ax"], ["d_wh"]),
                   helper.make_node("Slice", [out, "s4", "send", "ax"], ["d_rest"]),
                   helper.make_node("Add", ["d_xy", "dec_grid"], ["d_xyg"]),
                   helper.make_node("Mul", ["d_xyg", "dec_stride"], ["d_xyp"]),
                   helper.make_node("Exp", ["d_wh"], ["d_whe"]),
                   helper.make_node("Mul", ["d_whe", "dec_stride"], ["d_whp"]),
                   helper.make_node("Concat", ["d_xyp", "d_whp", "d_rest"], ["decoded"], axis=2)])
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("decoded", TensorProto.FLOAT, [1, grid.shape[1], 85]))
    onnx.save(m, str(dst))
    return dst


def _channels_last(src, dst):
    """YOLOv8n with its output transposed to [1, 8400, 84], as some exports give it: no family is
    guessed from that shape, and yolox's shape check lets it through (79 "classes")."""
    from onnx import TensorProto, helper

    m = onnx.load(str(src))
    g = m.graph
    g.node.append(helper.make_node("Transpose", [g.output[0].name], ["output_t"], perm=[0, 2, 1]))
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("output_t", TensorProto.FLOAT, [1, 8400, 84]))
    onnx.save(m, str(dst))
    return dst


@pytest.fixture(scope="module")
def arts(tmp_path_factory):
    """The derived models, and the artifacts more than one test reads (built once)."""
    tmp = tmp_path_factory.mktemp("family-guard")
    found = {"tmp": tmp,
             "yolox_decoded": _yolox_decoded_in_graph(_yolox(), tmp / "yolox_decoded.onnx"),
             "yolov8_last": _channels_last(_yolov8(), tmp / "yolov8_last.onnx")}
    _import(_yolox(), tmp / "yolox", family="yolox", labels=_labels())
    found["yolox"] = tmp / "yolox"
    return found


def _top(art, image=None) -> list[tuple[str, float]]:
    with er.load(art, limits={"max_request_bytes": 16 << 20}) as rt:
        dets = rt.infer(image or _bus()).detections
    return [(d["label"], round(d["score"], 2)) for d in dets]


# -- YOLOX as yolo: the reported defect -----------------------------------------------------------

def test_yolox_as_yolo_without_labels_is_refused_naming_yolox(tmp_path):
    msg = _refused(_yolox(), tmp_path / "a", family="yolo")
    assert "looks like a YOLOX head" in msg and "objectness column" in msg and "85 = 5 + 80" in msg
    assert "use --family yolox" in msg and "81 classes" in msg


def test_yolox_as_yolo_is_refused_on_the_cli_exit_2(tmp_path):
    res = CliRunner().invoke(main, ["import", str(_yolox()), "-o", str(tmp_path / "a"), "--task",
                                    "object-detection", "--family", "yolo"])
    assert res.exit_code == 2, res.output
    assert FAMILY_MISMATCH in res.output and "--family yolox" in res.output
    assert not (tmp_path / "a").exists()


def test_yolox_as_yolo_with_80_labels_names_the_family_not_the_label_count(tmp_path):
    """With 80 labels the old import refused only by the label count (81 classes): the fix that
    message suggested (a label more) would have imported the garbage."""
    msg = _refused(_yolox(), tmp_path / "a", family="yolo", labels=_labels())
    assert "--family yolox" in msg


def test_yolox_as_yolo_with_objectness_is_refused_too(tmp_path):
    """objectness true gets the class count right, yet the boxes are raw grid offsets."""
    msg = _refused(_yolox(), tmp_path / "a", family="yolo", postprocess={"objectness": True})
    assert "raw box offsets" in msg and "--family yolox" in msg


def test_yolox_as_yolox_still_detects_the_bus(arts):
    assert _top(arts["yolox"])[:4] == BUS_YOLOX


# -- YOLOv8 under yolo: exactly as before ---------------------------------------------------------

@pytest.mark.parametrize("labelled", [False, True])
def test_yolov8_as_yolo_imports_as_before(arts, labelled):
    out = arts["tmp"] / f"yolov8_{labelled}"
    man = _import(_yolov8(), out, family="yolo", **({"labels": _labels()} if labelled else {}))
    post = {k: v for k, v in man["postprocess"].items() if k != "labels"}
    assert post == {"score_threshold": 0.25, "iou_threshold": 0.45, "max_detections": 100, "family": "yolo",
                    "output": "output0", "layout": "channels_first", "objectness": False, "box_units": "pixels",
                    "class_activation": "none", "classes": 80}
    person, bus = ("person", "bus") if labelled else ("0", "5")
    assert _top(out)[:4] == [(person, 0.9), (person, 0.89), (person, 0.89), (bus, 0.81)]


def test_yolov8_guessed_family_imports_as_before(tmp_path):
    man = _import(_yolov8(), tmp_path / "a")
    assert man["postprocess"]["family"] == "yolo" and man["postprocess"]["classes"] == 80


def test_yolov8_with_objectness_is_refused(tmp_path):
    msg = _refused(_yolov8(), tmp_path / "a", family="yolo", postprocess={"objectness": True})
    assert "no objectness column" in msg


# -- the converse: boxes decoded in the graph read as yolox -----------------------------------------

def test_channels_last_yolov8_as_yolox_is_refused_naming_yolo(arts, tmp_path):
    msg = _refused(arts["yolov8_last"], tmp_path / "a", family="yolox")
    assert "looks like a YOLOv8 head" in msg and "84 = 4 + 80" in msg and "use --family yolo" in msg


def test_channels_last_yolov8_as_yolo_decodes(arts, tmp_path):
    _import(arts["yolov8_last"], tmp_path / "a", family="yolo", labels=_labels())
    top = _top(tmp_path / "a")
    assert {name for name, _ in top[:4]} == {"person", "bus"} and top[0][1] >= 0.85


def test_yolox_decoded_in_graph_as_yolox_is_refused(arts, tmp_path):
    msg = _refused(arts["yolox_decoded"], tmp_path / "a", family="yolox")
    assert "decoded already" in msg and "--family yolo --postprocess '{\"objectness\": true}'" in msg


def test_yolox_decoded_in_graph_as_yolo_needs_objectness_then_decodes_as_yolox_does(arts, tmp_path):
    msg = _refused(arts["yolox_decoded"], tmp_path / "a", family="yolo", labels=_labels())
    assert "objectness column" in msg and "\"objectness\": true" in msg
    _import(arts["yolox_decoded"], tmp_path / "b", family="yolo", labels=_labels(), postprocess={"objectness": True},
            channel_order="BGR", scale="1", pad_position="top-left")
    assert _top(tmp_path / "b") == _top(arts["yolox"])
