"""A detector's score activation is read from its graph: logits are never reported as scores.

An export that leaves out the head's Sigmoid (YOLOX-Nano with its objectness and class
Sigmoids cut out, as some exporters and hand-written heads give it) imported as
``--family yolox`` was accepted with ``activation`` none (exit 0): every "score" was a logit
(8.7, -3.1), the 0.25 threshold kept hundreds of boxes and ``score`` reported scores past 1.
Now the graph decides where nobody stated it (``converters.onnx_head`` shows a Conv writing
the score columns: ``activation`` sigmoid, with a warning), and a stated activation the graph
contradicts is refused at import and convert: none on logits, or sigmoid on a Sigmoid's output
(applied twice, every score in 0.5..0.73). Real models from /work/shared/data.
"""

from __future__ import annotations

import json

import pytest

import edge_runtime as er
from conftest import shared
from factories import import_detector, refused_detector_import

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

BUS_YOLOX = [("bus", 0.92), ("person", 0.85), ("person", 0.81), ("person", 0.68)]   # the data README's baseline


def _yolox():
    return shared("detection", "yolox_nano", "yolox_nano.onnx")


def _labels():
    return shared("detection", "nanodet", "coco.names")


def _bus():
    return str(shared("detection", "images", "bus.jpg"))


def _without_head_sigmoid(src, dst):
    """The model with every Sigmoid that feeds a Concat (YOLOX's objectness and class branches; its
    SiLUs feed a Mul) cut out: its head answers logits."""
    m = onnx.load(str(src))
    g = m.graph
    consumers: dict = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    cut = [n for n in g.node if n.op_type == "Sigmoid"
           and consumers.get(n.output[0]) and all(c.op_type == "Concat" for c in consumers[n.output[0]])]
    assert len(cut) == 6        # objectness and classes at three strides
    for n in cut:
        for c in consumers[n.output[0]]:
            for k, name in enumerate(c.input):
                if name == n.output[0]:
                    c.input[k] = n.input[0]
        g.node.remove(n)
    onnx.save(m, str(dst))
    return dst


@pytest.fixture(scope="module")
def logits_model(tmp_path_factory):
    return _without_head_sigmoid(_yolox(), tmp_path_factory.mktemp("logits") / "yolox_logits.onnx")


def _top(art) -> list[tuple[str, float, list]]:
    with er.load(art, limits={"max_request_bytes": 16 << 20}) as rt:
        return [(d["label"], round(d["score"], 3), [round(v, 1) for v in d["box"]]) for d in rt.infer(_bus()).detections]


def test_logits_head_gets_its_sigmoid_from_the_graph_and_answers_the_baseline(logits_model, tmp_path):
    report = import_detector(logits_model, tmp_path / "a", family="yolox", labels=_labels())
    assert any("activation 'sigmoid'" in w and "logits" in w for w in report["model"]["source"]["warnings"]), report
    post = json.loads((tmp_path / "a" / "manifest.json").read_text())["postprocess"]
    assert post["activation"] == "sigmoid"
    got = _top(tmp_path / "a")
    assert [(label, round(score, 2)) for label, score, _ in got[:4]] == BUS_YOLOX
    import_detector(_yolox(), tmp_path / "x", family="yolox", labels=_labels())
    assert got == _top(tmp_path / "x")      # the same answer as the export with its Sigmoids


def test_logits_head_stated_as_no_activation_is_refused(logits_model, tmp_path):
    msg = refused_detector_import(logits_model, tmp_path / "a", family="yolox", labels=_labels(),
                                  postprocess={"activation": "none"})
    assert "logits" in msg and '"activation": "sigmoid"' in msg
    assert not (tmp_path / "a" / "manifest.json").exists()


def test_sigmoid_stated_on_a_head_that_has_one_is_refused(tmp_path):
    msg = refused_detector_import(_yolox(), tmp_path / "a", family="yolox", labels=_labels(),
                                  postprocess={"activation": "sigmoid"})
    assert "twice" in msg and "drop activation" in msg


def test_yolov8_class_activation_sigmoid_on_its_sigmoid_is_refused(tmp_path):
    model = shared("detection", "yolov8n_onnx_dynamic", "yolov8n_int8.onnx")
    msg = refused_detector_import(model, tmp_path / "a", family="yolo", labels=_labels(),
                                  postprocess={"class_activation": "sigmoid"})
    assert "twice" in msg and "class_activation" in msg


def test_nanodet_activation_sigmoid_on_its_sigmoid_is_refused(tmp_path):
    model = shared("detection", "nanodet", "nanodet_m.onnx")
    msg = refused_detector_import(model, tmp_path / "a", family="gfl", labels=_labels(),
                                  postprocess={"activation": "sigmoid"})
    assert "twice" in msg


def test_real_heads_import_as_before(tmp_path):
    """The shipped detectors' graphs show their Sigmoid: nothing is added or refused."""
    report = import_detector(_yolox(), tmp_path / "x", family="yolox", labels=_labels())
    assert not any("activation" in w for w in report["model"]["source"]["warnings"])
    post = json.loads((tmp_path / "x" / "manifest.json").read_text())["postprocess"]
    assert post["activation"] == "none"


def test_convert_refuses_a_logits_head_read_with_no_activation(logits_model):
    from converters.onnx_head import check_source_head
    from edge_runtime.errors import InputError

    post = {"family": "yolox", "output": "output", "strides": [8, 16, 32], "activation": "none", "classes": 80}
    with pytest.raises(InputError) as err:
        check_source_head(logits_model, post)
    assert err.value.code == "convert_family_mismatch" and "logits" in str(err.value)
    check_source_head(logits_model, {**post, "activation": "sigmoid"})      # the right reading passes
    with pytest.raises(InputError, match="twice"):
        check_source_head(_yolox(), {**post, "activation": "sigmoid"})


def test_an_artifact_reading_logits_as_scores_is_refused_at_the_call(logits_model, tmp_path):
    """Where import could not read the graph (or an artifact from before this check), the call refuses
    scores past 1 instead of reporting them (bus.jpg: 10.3)."""
    from factories import rewrite_manifest

    import_detector(logits_model, tmp_path / "a", family="yolox", labels=_labels())
    rewrite_manifest(tmp_path / "a", lambda m: m["postprocess"].update(activation="none"))
    with er.load(tmp_path / "a", limits={"max_request_bytes": 16 << 20}, warmup=False) as rt:
        with pytest.raises(er.ArtifactError) as err:
            rt.infer(_bus())
    assert err.value.code == "artifact_task_mismatch" and "logits" in str(err.value)
    assert "10.3" in str(err.value)
