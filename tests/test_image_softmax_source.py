"""An image classifier exported with its Softmax is converted to probabilities once, not twice.

convert wrote ``softmax: true`` for every image classifier, so a source whose graph ends in
a Softmax (many exports do) had its probabilities put through a second softmax: ten digit
probabilities of ~0.99 / ~0.001 came back flattened to ~0.23 / ~0.085, the label unchanged
(top-1 parity cannot see it), exit 0. Import already read the graph; convert now does too.
"""

import json
from pathlib import Path

import numpy as np
import pytest

import edge_runtime as er

ZOO = Path(__file__).resolve().parents[1] / "models" / "zoo" / "digits-cnn"


def _with_softmax(path: Path) -> Path:
    onnx = pytest.importorskip("onnx")
    from onnx import helper as h

    model = onnx.load(str(ZOO / "model.onnx"))
    g = model.graph
    out = g.output[0].name                     # "logits": the Gemm now writes "z", a Softmax "logits"
    for node in g.node:
        node.output[:] = ["z" if o == out else o for o in node.output]
    g.node.append(h.make_node("Softmax", ["z"], [out], axis=-1))
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    pytest.importorskip("onnxruntime")
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.request import ConvertRequest

    tmp = tmp_path_factory.mktemp("softmax-src")
    src = _with_softmax(tmp / "model.onnx")
    out = tmp / "art"
    convert(ConvertRequest(source=src, out=out, task="image-classification", targets=["onnx-int8"],
                           calibration=ZOO / "calibration", parity_data=ZOO / "held_out",
                           labels=ZOO / "labels.txt", preprocess=json.loads((ZOO / "preprocess.json").read_text()),
                           probe_samples=0))
    return src, out


def test_the_manifest_says_the_source_gives_probabilities(converted):
    _, art = converted
    assert json.loads((art / "manifest.json").read_text())["postprocess"]["softmax"] is False


def test_scores_are_the_source_models_probabilities(converted):
    import onnxruntime as ort

    src, art = converted
    sess = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    images = sorted((ZOO / "held_out").rglob("*.png"))[:12]
    with er.load(art, device="onnxruntime", warmup=False) as rt:
        name = rt.variant.buckets[0].inputs[0]["name"]
        for p in images:
            feeds = rt.task.prepare(str(p), rt.limits).feeds
            ref = sess.run(None, {name: np.asarray(feeds[name], dtype=np.float32)})[0].reshape(-1)
            res = rt.infer(str(p))
            top = int(np.argmax(ref))
            assert res.class_id == top
            # int8 error is a few hundredths; a second softmax put a 0.99 top score near 0.23
            assert abs(res.scores[rt.task.labels[top]] - float(ref[top])) < 0.05, (p.name, res.scores, ref)
