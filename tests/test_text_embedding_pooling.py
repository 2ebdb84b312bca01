"""A text embedder's pooling is the source model's, stated at convert and checked at load.

Convert always wrote mean pooling + L2 normalisation: a CLS-pooled model (BGE) or a
dot-product model (not normalised) converted with exit 0 into vectors that are not the
model's embeddings, and parity could not tell (the fp32 reference is pooled the same way).
An unknown pooling in a manifest was read as "none": [1, seq, dim] flattened into one
seq*dim vector. Both are now stated or refused.
"""

import json

import numpy as np
import pytest

import edge_runtime as er
from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError, InputError
from factories import WORDS, convert_tiny_text, make_artifact


def _tiny_hidden_onnx(path):
    """A float encoder over the factories' tiny tokenizer: each token's state is its embedding
    row times a matrix plus a position-independent bias, [b, s, 8]."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto as T, helper as h, numpy_helper as nh

    rng = np.random.default_rng(1)
    vocab = 4 + len(WORDS)
    nodes = [h.make_node("Gather", ["emb", "input_ids"], ["e"], axis=0),
             h.make_node("MatMul", ["e", "W"], ["m"]),
             h.make_node("Add", ["m", "b"], ["last_hidden_state"])]
    graph = h.make_graph(
        nodes, "tiny-encoder",
        [h.make_tensor_value_info("input_ids", T.INT64, ["b", "s"]),
         h.make_tensor_value_info("attention_mask", T.INT64, ["b", "s"])],
        [h.make_tensor_value_info("last_hidden_state", T.FLOAT, ["b", "s", 8])],
        [nh.from_array(rng.normal(size=(vocab, 8)).astype(np.float32), "emb"),
         nh.from_array(rng.normal(size=(8, 8)).astype(np.float32), "W"),
         nh.from_array(rng.normal(size=(8,)).astype(np.float32) * 3, "b")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _convert(tmp_path, postprocess):
    pytest.importorskip("onnxruntime")
    src = _tiny_hidden_onnx(tmp_path / "model.onnx")
    return src, convert_tiny_text(src, "text-embedding", postprocess=postprocess)


def test_cls_pooling_without_normalisation_is_the_models_first_token_state(tmp_path):
    import onnxruntime as ort

    src, art = _convert(tmp_path, {"pooling": "cls", "normalize": False})
    post = json.loads((art / "manifest.json").read_text())["postprocess"]
    assert post["pooling"] == "cls" and post["normalize"] is False
    sess = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    with er.load(art, warmup=False) as rt:
        for text in ("good movie", "awful awful", "the market crashes"):
            p = rt.task.prepare(text, rt.limits)
            feeds = {k: v for k, v in p.feeds.items() if k in ("input_ids", "attention_mask")}
            ref = sess.run(None, feeds)[0][0, 0]                 # the [CLS] token's state, as it is
            got = rt.infer(text).embedding
            assert got.shape == (8,)
            assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max(), (text, got, ref)
            assert abs(float(np.linalg.norm(got)) - 1.0) > 0.1   # not normalised (a mean-pooled unit vector was)


def test_the_default_stays_mean_pooling_normalised(tmp_path):
    _, art = _convert(tmp_path, None)
    post = json.loads((art / "manifest.json").read_text())["postprocess"]
    assert post["pooling"] == "mean" and post["normalize"] is True


@pytest.mark.parametrize("post, words", [({"pooling": "max"}, "pooling 'max'"),
                                         ({"normalize": "yes"}, "normalize must be"),
                                         ({"pooling": "none"}, "flatten"),
                                         ({"pool": "cls"}, "not pool")])
def test_a_wrong_pooling_is_refused_at_convert(tmp_path, post, words):
    with pytest.raises(InputError) as ei:
        _convert(tmp_path, post)
    assert ei.value.code == ec.CONVERT_REQUEST_INVALID and words in str(ei.value)


def test_an_unknown_pooling_in_a_manifest_is_refused_at_load(tmp_path):
    from edge_runtime.models import get_task

    art = make_artifact(tmp_path / "a", "text-embedding")
    manifest = json.loads((art / "manifest.json").read_text())
    buckets = manifest["variants"][0]["buckets"]
    task = get_task("text-embedding")
    read = lambda name: (art / name).read_bytes()                 # noqa: E731
    task(manifest, read, buckets)                                 # as written: loads
    for pooling in ("max", "none"):      # "max" was read as "none"; "none" flattened [1, seq, 8] to seq*8 values
        bad = {**manifest, "postprocess": {**manifest["postprocess"], "pooling": pooling}}
        with pytest.raises(ArtifactError) as ei:
            task(bad, read, buckets)
        assert ei.value.code == ec.MANIFEST_FIELD_INVALID
