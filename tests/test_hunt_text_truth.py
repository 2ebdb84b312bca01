"""Text tasks against a hand-written reference: what a manifest's postprocess says is read as it is
meant, or refused at load (never a class silently dropped, probabilities softmaxed twice, or every
call failing as the device's ``inference_failed``).

The tokenization, padding, truncation, pooling and batch paths were checked against ``tokenizers`` +
raw onnxruntime on the real all-MiniLM-L6-v2 (fp32 and int8 files): no defect there, so no test here.
"""

import pytest

import edge_runtime as er
from factories import make_artifact, rewrite_manifest


def _edited(tmp_path, task, mutate, **kw):
    art = make_artifact(tmp_path / "art", task, **kw)
    rewrite_manifest(art, mutate)       # resealed: a deliberate edit, which load must still judge
    return art


def _refused(art, *words):
    with pytest.raises(er.ArtifactError) as ei:
        er.load(art, device="fake").close()
    assert ei.value.code == "manifest_field_invalid"
    for w in words:
        assert w in str(ei.value)


@pytest.mark.parametrize("task", ["text-classification", "image-classification"])
@pytest.mark.parametrize("top_k", [-1, "2", 1.5, True])
def test_a_top_k_that_is_not_a_count_is_refused_at_load(tmp_path, top_k, task):
    # -1 ranked every class but the last (order[:-1]); "2" and 1.5 failed every call as inference_failed
    art = _edited(tmp_path, task, lambda m: m["postprocess"].update(top_k=top_k), labels=("a", "b", "c"))
    _refused(art, "top_k")


@pytest.mark.parametrize("top_k, ranked", [(None, 3), (0, 3), (1, 1), (2, 2), (5, 3)])
def test_a_top_k_count_still_ranks_that_many(tmp_path, top_k, ranked):
    art = _edited(tmp_path, "text-classification", lambda m: m["postprocess"].update(top_k=top_k),
                  labels=("a", "b", "c"))
    with er.load(art, device="fake") as rt:
        res = rt.infer("good movie")
    assert len(res.top_k) == len(res.scores) == ranked
    if ranked == 3:
        assert abs(sum(res.scores.values()) - 1.0) < 1e-6
    # and a count that is not one: refused (this test fails on the old code through it)
    bad = _edited(tmp_path / "bad", "text-classification", lambda m: m["postprocess"].update(top_k=-ranked),
                  labels=("a", "b", "c"))
    _refused(bad, "top_k")


@pytest.mark.parametrize("task", ["text-classification", "image-classification"])
@pytest.mark.parametrize("softmax", ["false", 0, None])
def test_a_softmax_flag_that_is_not_a_bool_is_refused_at_load(tmp_path, softmax, task):
    # "false" is a true string: logits were softmaxed (and probabilities softmaxed again);
    # 0 and null skipped the softmax: raw logits served as "scores"
    art = _edited(tmp_path, task, lambda m: m["postprocess"].update(softmax=softmax))
    _refused(art, "softmax")


def test_an_embedding_output_the_model_lacks_is_refused_at_load(tmp_path):
    # it loaded (the warm-up failure only logged) and every call failed as inference_failed
    art = _edited(tmp_path, "text-embedding", lambda m: m["postprocess"].update(output="pooled"))
    _refused(art, "no output 'pooled'")

