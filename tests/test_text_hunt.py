"""Text tasks through the user's paths (convert, ``er.load(ART).infer``): answers checked against the
source model run by hand (onnxruntime on the float ONNX)."""

import json

import numpy as np
import pytest

import edge_runtime as er
from factories import WORDS, convert_tiny_text, make_artifact


def _tiny_text_onnx(path, classes: int, softmax: bool):
    """A float text classifier over the factories' tiny tokenizer: masked sum of token embeddings,
    one MatMul to ``classes`` logits, then (``softmax``) a Softmax, as some exports end."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto as T, helper as h, numpy_helper as nh

    rng = np.random.default_rng(0)
    vocab = 4 + len(WORDS)
    nodes = [h.make_node("Gather", ["emb", "input_ids"], ["e"], axis=0),
             h.make_node("Cast", ["attention_mask"], ["mf"], to=T.FLOAT),
             h.make_node("Unsqueeze", ["mf", "ax"], ["m3"]),
             h.make_node("Mul", ["e", "m3"], ["em"]),
             h.make_node("ReduceSum", ["em", "one"], ["s"], keepdims=0),
             h.make_node("MatMul", ["s", "W"], ["z" if softmax else "logits"])]
    if softmax:
        nodes.append(h.make_node("Softmax", ["z"], ["logits"], axis=-1))
    graph = h.make_graph(
        nodes, "tiny-text",
        [h.make_tensor_value_info("input_ids", T.INT64, ["b", "s"]),
         h.make_tensor_value_info("attention_mask", T.INT64, ["b", "s"])],
        [h.make_tensor_value_info("logits", T.FLOAT, ["b", classes])],
        [nh.from_array(rng.normal(size=(vocab, 8)).astype(np.float32), "emb"),
         nh.from_array(rng.normal(size=(8, classes)).astype(np.float32), "W"),
         nh.from_array(np.array([2], np.int64), "ax"), nh.from_array(np.array([1], np.int64), "one")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _convert_tiny(tmp_path, classes: int, softmax: bool):
    pytest.importorskip("onnxruntime")
    src = _tiny_text_onnx(tmp_path / "model.onnx", classes, softmax)
    return src, convert_tiny_text(src, "text-classification")


def _fp32_probs(src, rt, text):
    import onnxruntime as ort

    p = rt.task.prepare(text, rt.limits)
    feeds = {k: v for k, v in p.feeds.items() if k in ("input_ids", "attention_mask")}
    return ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)[0][0]


def test_a_classifier_exported_with_its_softmax_is_not_softmaxed_again(tmp_path):
    # the float model's own probabilities were put through a second softmax: 0.986 came out as 0.725
    src, art = _convert_tiny(tmp_path, classes=2, softmax=True)
    assert json.loads((art / "manifest.json").read_text())["postprocess"]["softmax"] is False
    with er.load(art, warmup=False) as rt:
        for text in ("good movie", "awful awful", "the market crashes"):
            ref = _fp32_probs(src, rt, text)
            res = rt.infer(text)
            got = np.array([res.scores[label] for label in rt.task.labels])
            assert np.abs(got - ref).max() < 0.05, (text, got, ref)
            assert abs(float(got.sum()) - 1.0) < 1e-3


def test_logits_are_still_softmaxed(tmp_path):
    src, art = _convert_tiny(tmp_path, classes=3, softmax=False)
    assert json.loads((art / "manifest.json").read_text())["postprocess"]["softmax"] is True
    with er.load(art, warmup=False) as rt:
        logits = _fp32_probs(src, rt, "good movie").astype(np.float64)
        ref = np.exp(logits - logits.max())
        ref /= ref.sum()
        res = rt.infer("good movie")
        assert np.abs(np.array([res.scores[label] for label in rt.task.labels]) - ref).max() < 0.05


def test_a_single_logit_model_is_not_a_text_classifier(tmp_path):
    # softmax over one value is 1.0 for every input: every text answered "0" with score 1.0, exit 0
    # (and parity "1.0"); now the convert refuses it, naming the shape
    with pytest.raises(er.InputError) as ei:
        _convert_tiny(tmp_path, classes=1, softmax=False)
    assert ei.value.code == "artifact_task_mismatch" and "[1, 1]" in str(ei.value)
    assert not (tmp_path / "art").exists()


def test_an_artifact_with_one_class_is_refused_at_load(tmp_path):
    art = make_artifact(tmp_path / "a", "text-classification", labels=("positive",))
    with pytest.raises(er.ArtifactError) as ei:
        er.load(art, device="fake", warmup=False)
    assert ei.value.code == "artifact_task_mismatch"


def test_the_request_limit_counts_a_text_given_as_a_dict(tmp_path):
    # {"text": ...} (what text_of and --input JSON take) was counted 0 bytes: a text the request limit
    # refuses as a string was answered in that form, one by one and in a batch
    art = make_artifact(tmp_path / "a", "text-classification", limits={"max_request_bytes": 4096})
    text = "good " * 1000
    with er.load(art, device="fake", warmup=False) as rt:
        for raw in (text, {"text": text}, {"text": text.encode()}):
            with pytest.raises(er.InputError) as ei:
                rt.infer(raw)
            assert ei.value.code == "input_too_large", raw
        with pytest.raises(er.InputError) as ei:
            rt.infer_batch([{"text": "good " * 400}] * 3)
        assert ei.value.code == "input_too_large"
        assert rt.infer({"text": "good movie"}).prediction == rt.infer("good movie").prediction


@pytest.mark.parametrize("stdin", ["none", "closed"])
def test_text_from_a_missing_stdin_is_a_typed_error(monkeypatch, stdin):
    # `edge-infer infer ART --text - <&-` crashed: "error: AttributeError: 'NoneType' object has no
    # attribute 'buffer'", exit 1 (a closed stream: an untyped ValueError)
    import io
    import sys

    from edge_runtime.cli_inputs import _read_text
    from edge_runtime.limits import Limits

    if stdin == "none":
        monkeypatch.setattr(sys, "stdin", None)
    else:
        stream = io.TextIOWrapper(io.BytesIO(b"text"))
        stream.close()
        monkeypatch.setattr(sys, "stdin", stream)
    with pytest.raises(er.InputError) as ei:
        _read_text("-", Limits())
    assert ei.value.code == "input_file_unreadable" and "stdin" in str(ei.value)
