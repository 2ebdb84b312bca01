"""``edge-infer import`` defects that gave a wrong answer (or a broken artifact) with exit 0.

- a labels file in Coral's model-zoo ``ID NAME`` form (ids skipped where the model has no
  class) was read line by line: on SSD (whose class count no shape shows) every label after
  the first skipped id named the next class, and each kept its id ("17  dog" for class 16);
- a DeepLab labels file missing its background line was accepted (the class map's shape
  does not show the class count): the bird read as "boat", the background as "aeroplane";
- an ONNX model's 8-bit outputs and inputs carried no quantization: a ``QuantizeLinear``
  output's integers were softmaxed as they were (scores wrong), a ``DequantizeLinear``
  input refused any normalisation that did not fit 0..255 unscaled;
- an ONNX model keeping a ``Constant`` node's tensor in an external data file was imported
  (only initializers were checked) into an artifact that cannot load.
"""

from __future__ import annotations

import numpy as np
import pytest

import edge_runtime as er
from conftest import need_litert, shared
from edge_runtime.converters.import_common import import_model
from edge_runtime.errors import ArtifactError, InputError


def _softmax(x):
    e = np.exp(np.asarray(x, np.float64) - np.max(x))
    return e / e.sum()


# -- labels ---------------------------------------------------------------------------------

def test_model_zoo_labels_with_ids_and_gaps_are_read_by_id(tmp_path):
    need_litert()
    d = shared("detection", "ssd_mobilenet_v1")
    lines = (d / "labelmap.txt").read_text().splitlines()
    zoo = tmp_path / "coco_labels.txt"       # Coral's form: "0  person", ..., "12  stop sign", unused ids left out
    zoo.write_text("".join(f"{i}  {n.strip()}\n" for i, n in enumerate(lines) if n.strip() != "???"))
    man = import_model(d / "ssd_mobilenet_v1_1_metadata_1.tflite", tmp_path / "a", task="object-detection",
                       labels=zoo)
    names = (tmp_path / "a" / "labels.txt").read_text().splitlines()
    assert names[:3] == ["person", "bicycle", "car"]
    assert names[11] == "11" and names[12] == "stop sign" and names[16] == "cat" and len(names) == 90
    assert any("read by id" in w for w in man["model"]["source"]["warnings"])


def test_plain_labels_are_still_read_in_order(tmp_path):
    from edge_runtime.converters.import_common import read_labels

    f = tmp_path / "l.txt"
    f.write_text("7 Up\ncat\n")                     # not every line is "ID NAME": lines in order
    assert read_labels(f, 0, {}, []) == ["7 Up", "cat"]
    f.write_text("0: background\n1: cat\n3: dog\n")
    warnings: list = []
    assert read_labels(f, 0, {}, warnings) == ["background", "cat", "2", "dog"] and warnings
    with pytest.raises(InputError) as ei:                 # ids are absolute: an offset would move them
        read_labels(f, 1, {}, [])
    assert ei.value.code == "import_labels_mismatch"
    f.write_bytes("\ufeffbackground\ncat\n".encode("utf-8"))   # a BOM (Notepad's UTF-8) is not a label's
    assert read_labels(f, 0, {}, []) == ["background", "cat"]


def test_a_segmentation_labels_file_missing_background_is_refused(tmp_path):
    need_litert()
    coral = shared("coral")
    voc = (coral / "pascal_voc_segmentation_labels.txt").read_text().splitlines()[:21]
    short = tmp_path / "voc20.txt"
    short.write_text("\n".join(voc[1:]) + "\n")      # no "background": every class one off
    with pytest.raises(InputError) as ei:
        import_model(coral / "deeplabv3_mnv2_dm05_pascal_quant.tflite", tmp_path / "a",
                     task="semantic-segmentation", labels=short)
    assert ei.value.code == "import_labels_mismatch" and "21 classes" in str(ei.value)
    # the shipped file (21 names, then a blank line and two lines of prose) still imports, warned
    man = import_model(coral / "deeplabv3_mnv2_dm05_pascal_quant.tflite", tmp_path / "b",
                       task="semantic-segmentation", labels=coral / "pascal_voc_segmentation_labels.txt")
    assert any("name no class" in w for w in man["model"]["source"]["warnings"])


# -- ONNX 8-bit I/O ------------------------------------------------------------------------

def _save(tmp_path, name, nodes, ins, outs, inits=()):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    h = onnx.helper
    model = h.make_model(h.make_graph(nodes, "g", ins, outs, initializer=list(inits)),
                         opset_imports=[h.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def _image():
    img = np.zeros((8, 8, 3), np.uint8)
    img[..., 0], img[..., 1] = 200, 50
    return img


def test_an_onnx_quantizelinear_output_is_dequantized(tmp_path):
    onnx = pytest.importorskip("onnx")
    h, T = onnx.helper, onnx.TensorProto
    path = _save(tmp_path, "q_out.onnx",
                 [h.make_node("GlobalAveragePool", ["a"], ["p"]), h.make_node("Flatten", ["p"], ["f"]),
                  h.make_node("QuantizeLinear", ["f", "sc", "zp"], ["y"])],
                 [h.make_tensor_value_info("a", T.FLOAT, [1, 3, 8, 8])], [h.make_tensor_value_info("y", T.INT8, [1, 3])],
                 [h.make_tensor("sc", T.FLOAT, [], [0.5]), h.make_tensor("zp", T.INT8, [], [-100])])
    man = import_model(path, tmp_path / "a")
    assert man["variants"][0]["buckets"][0]["outputs"][0]["quantization"] == {"scale": 0.5, "zero_point": -100}
    x = np.array([200, 50, 0]) / 127.5 - 1                              # the [-1, 1] default, per channel
    want = _softmax((np.clip(np.round(x / 0.5) - 100, -128, 127) + 100) * 0.5)
    with er.load(tmp_path / "a") as rt:
        got = rt.infer(_image()).scores
    assert [got[k] for k in ("0", "1", "2")] == pytest.approx(want, abs=1e-5)   # before: 0.84/0.11/0.04


def test_an_onnx_dequantizelinear_input_takes_its_quantization(tmp_path):
    onnx = pytest.importorskip("onnx")
    h, T = onnx.helper, onnx.TensorProto
    path = _save(tmp_path, "dq_in.onnx",
                 [h.make_node("DequantizeLinear", ["a", "sc", "zp"], ["x"]),
                  h.make_node("GlobalAveragePool", ["x"], ["p"]), h.make_node("Flatten", ["p"], ["y"])],
                 [h.make_tensor_value_info("a", T.UINT8, [1, 3, 8, 8])], [h.make_tensor_value_info("y", T.FLOAT, [1, 3])],
                 [h.make_tensor("sc", T.FLOAT, [], [0.0188]), h.make_tensor("zp", T.UINT8, [], [113])])
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    man = import_model(path, tmp_path / "a", scale="1/255", mean="0.485,0.456,0.406", std="0.229,0.224,0.225")
    q = man["variants"][0]["buckets"][0]["inputs"][0]["quantization"]
    assert q["scale"] == pytest.approx(0.0188) and q["zero_point"] == 113          # before: none, so refused
    x = (np.array([200, 50, 0]) / 255 - mean) / std
    want = _softmax((np.clip(np.round(x / 0.0188) + 113, 0, 255) - 113) * 0.0188)
    with er.load(tmp_path / "a") as rt:
        got = rt.infer(_image()).scores
    assert [got[k] for k in ("0", "1", "2")] == pytest.approx(want, abs=1e-4)


def test_an_onnx_constant_in_external_data_is_refused(tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    h, T = onnx.helper, onnx.TensorProto
    w = onnx.numpy_helper.from_array(np.eye(3, dtype=np.float32), "w")
    model = h.make_model(h.make_graph(
        [h.make_node("Constant", [], ["wc"], value=w), h.make_node("GlobalAveragePool", ["a"], ["p"]),
         h.make_node("Flatten", ["p"], ["f"]), h.make_node("MatMul", ["f", "wc"], ["y"])], "g",
        [h.make_tensor_value_info("a", T.FLOAT, [1, 3, 8, 8])], [h.make_tensor_value_info("y", T.FLOAT, [1, 3])]),
        opset_imports=[h.make_opsetid("", 13)])
    model.ir_version = 8
    (tmp_path / "src").mkdir()
    onnx.save(model, str(tmp_path / "src" / "m.onnx"), save_as_external_data=True, location="m.data",
              size_threshold=0, convert_attribute=True)
    with pytest.raises(ArtifactError) as ei:
        import_model(tmp_path / "src" / "m.onnx", tmp_path / "a")
    assert ei.value.code == "import_onnx_invalid" and "external data" in str(ei.value)


def test_an_onnx_classifier_ending_in_softmax_is_not_softmaxed_again(tmp_path):
    onnx = pytest.importorskip("onnx")
    h, T = onnx.helper, onnx.TensorProto
    path = _save(tmp_path, "sm.onnx",
                 [h.make_node("GlobalAveragePool", ["a"], ["p"]), h.make_node("Flatten", ["p"], ["f"]),
                  h.make_node("Mul", ["f", "k"], ["g"]), h.make_node("Softmax", ["g"], ["s"], axis=1),
                  h.make_node("Identity", ["s"], ["y"])],
                 [h.make_tensor_value_info("a", T.FLOAT, [1, 3, 8, 8])], [h.make_tensor_value_info("y", T.FLOAT, [1, 3])],
                 [h.make_tensor("k", T.FLOAT, [], [4.0])])
    man = import_model(path, tmp_path / "a")
    assert man["postprocess"]["softmax"] is False
    want = _softmax((np.array([200, 50, 0]) / 127.5 - 1) * 4)
    with er.load(tmp_path / "a") as rt:
        got = rt.infer(_image()).scores
    assert [got[k] for k in ("0", "1", "2")] == pytest.approx(want, abs=1e-5)   # before: 0.57/0.21/0.21
