"""How the text tasks tokenize: the artifact's tokenizer's own settings, buckets the special tokens
fill, the pad id. Each test names the wrong answer (exit 0) or the misleading error it replaces."""

import json

import numpy as np
import pytest

import edge_runtime as er
from edge_runtime.artifact import ArtifactWriter
from edge_runtime.limits import DEFAULT_LIMITS
from edge_runtime.manifest import FORMAT, FORMAT_VERSION
from factories import WORDS, _variant

LONG = "good bad great awful stock market crashes rises the a"      # 10 words: 12 tokens with [CLS] [SEP]


def _tokenizer(*, style="bert", post=True, direction=None, stride=0, strategy=None, padding=False) -> str:
    """A word-level tokenizer.json over ``WORDS``: "bert" ([PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3),
    "roberta" (<s> 0, <pad> 1, </s> 2, <unk> 3) or "nopad" ([CLS] 0, [SEP] 1, [UNK] 2: no pad
    token); ``post``: the [CLS] $A [SEP] template; ``direction``/``stride``/``strategy``: the file's
    own truncation; ``padding``: its own padding setting."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    specials = {"bert": ["[PAD]", "[UNK]", "[CLS]", "[SEP]"], "roberta": ["<s>", "<pad>", "</s>", "<unk>"],
                "nopad": ["[CLS]", "[SEP]", "[UNK]"]}[style]
    vocab = {t: i for i, t in enumerate(specials)}
    for w in WORDS:
        vocab[w] = len(vocab)
    unk = next(t for t in specials if "unk" in t.lower())
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if post:
        cls, sep = ("<s>", "</s>") if style == "roberta" else ("[CLS]", "[SEP]")
        tok.post_processor = processors.TemplateProcessing(single=f"{cls} $A {sep}",
                                                           special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])])
    if direction or stride or strategy:
        tok.enable_truncation(max_length=512, stride=stride, strategy=strategy or "longest_first",
                              direction=direction or "right")
    if padding:
        pad = "<pad>" if style == "roberta" else "[PAD]"
        tok.enable_padding(pad_id=vocab[pad], pad_token=pad)
    return tok.to_str()


def _artifact(root, tokenizer: str, buckets=(8,), *, task="text-embedding", mask=True, pad_id=0):
    """A fake-backend artifact of ``task`` over ``tokenizer`` (its ``input_ids`` and, with ``mask``,
    ``attention_mask`` inputs), one bucket of each length in ``buckets``."""
    w = ArtifactWriter(root)
    w.add_file("tokenizer.json", data=tokenizer.encode())
    specs = []
    for L in buckets:
        ins = [{"name": "input_ids", "dtype": "int64", "shape": [1, L]}]
        if mask:
            ins.append({"name": "attention_mask", "dtype": "int64", "shape": [1, L]})
        if task == "text-classification":
            outs = [{"name": "logits", "dtype": "float32", "shape": [1, 2]}]
        else:
            outs = [{"name": "last_hidden_state", "dtype": "float32", "shape": [1, L, 8]}]
        specs.append({"name": f"seq{L}", "inputs": ins, "outputs": outs})
    if task == "text-classification":
        w.add_file("labels.txt", data=b"negative\npositive\n")
        post = {"output": "logits", "softmax": True, "labels": "labels.txt"}
    else:
        post = {"output": "last_hidden_state", "pooling": "mean", "normalize": True}
    variant = _variant(w, root, specs)
    w.write_manifest({"format": FORMAT, "format_version": FORMAT_VERSION,
                      "model": {"name": f"tiny-{task}", "version": "1"}, "task": task, "files": {},
                      "preprocess": {"kind": "text", "tokenizer": "tokenizer.json", "max_length": max(buckets),
                                     "pad_id": pad_id},
                      "postprocess": post, "limits": {}, "variants": [variant]})
    return root


def _ids(rt, text):
    return rt.task.prepare(text, rt.limits).feeds["input_ids"][0].tolist()


# -- 1. the tokenizer's own truncation side ------------------------------------------------------

@pytest.mark.parametrize("stride", [0, 2])
def test_a_left_truncating_tokenizer_keeps_the_end_of_the_text(tmp_path, stride):
    # tokenizer.json says "direction": "Left" (the model keeps a text's last tokens): enable_truncation
    # (max_length=8) reset it to the right, and a 10-word text was answered on its first six words
    # ([2, 4, 5, 6, 7, 8, 9, 3]: "good bad great awful stock market"), exit 0
    art = _artifact(tmp_path / "a", _tokenizer(direction="left", stride=stride))
    tail = " ".join(LONG.split()[-6:])                        # what a left-truncating tokenizer keeps
    with er.load(art, device="fake", warmup=False) as rt:
        assert _ids(rt, LONG) == [2] + [4 + WORDS.index(w) for w in tail.split()] + [3]
        assert _ids(rt, LONG) == _ids(rt, tail)
        res, ref = rt.infer(LONG), rt.infer(tail)
        assert np.array_equal(res.embedding, ref.embedding)
        # the reporting: cut, and the whole text's 12 tokens counted once (a stride's overlap is not)
        assert res.truncated is True and res.input_length == 12
        assert ref.truncated is False and ref.input_length == 8
        batch = rt.infer_batch([LONG, tail, "good movie"])
        assert np.array_equal(batch[0].embedding, ref.embedding)
        assert [r.truncated for r in batch] == [True, False, False]
        assert [r.input_length for r in batch] == [12, 8, 4]


def test_a_right_truncating_tokenizer_still_keeps_the_start(tmp_path):
    art = _artifact(tmp_path / "a", _tokenizer(direction="right"))
    with er.load(art, device="fake", warmup=False) as rt:
        assert _ids(rt, LONG) == [2, 4, 5, 6, 7, 8, 9, 3]
        res = rt.infer(LONG)
        assert res.truncated is True and res.input_length == 12


def test_an_only_second_strategy_does_not_fail_every_text(tmp_path):
    # "only_second" truncates a pair's second text: kept for a single text it failed every encode
    # ("Truncation error: Second sequence not provided"); for one text the strategy cuts the same tokens
    art = _artifact(tmp_path / "a", _tokenizer(direction="left", strategy="only_second"))
    with er.load(art, device="fake", warmup=False) as rt:
        assert _ids(rt, LONG) == [2] + [4 + WORDS.index(w) for w in LONG.split()[-6:]] + [3]
        assert rt.infer("good movie").input_length == 4


# -- 2. a bucket the special tokens fill ----------------------------------------------------------

@pytest.mark.parametrize("buckets", [(1, 2), (2,), (1,)])
def test_a_bucket_too_short_for_any_text_is_refused_at_load(tmp_path, buckets):
    # [1, 2]: the tokenizer truncated every text to [CLS] [SEP] and answered "good" with "input_empty:
    # text has no tokens"; [1]: shorter than the special tokens, the tokenizer did not truncate at all
    # and a 12-token encoding went into a 1-token array (an untyped numpy ValueError)
    art = _artifact(tmp_path / "a", _tokenizer(), buckets)
    with pytest.raises(er.ArtifactError) as ei:
        er.load(art, device="fake", warmup=False)
    assert ei.value.code == "manifest_field_invalid"
    assert f"holds {max(buckets)} tokens" in str(ei.value) and "adds 2 special tokens" in str(ei.value)


def test_the_shortest_bucket_that_holds_a_token_answers(tmp_path):
    art = _artifact(tmp_path / "a", _tokenizer(), (3,), task="text-classification")
    with er.load(art, device="fake", warmup=False) as rt:
        res = rt.infer("good")
        assert res.truncated is False and res.input_length == 3
        res = rt.infer("good bad")
        assert res.truncated is True and res.input_length == 4
        assert res.prediction == rt.infer("good").prediction      # the same [CLS] good [SEP]


def test_short_buckets_are_fine_without_special_tokens(tmp_path):
    art = _artifact(tmp_path / "a", _tokenizer(post=False), (1, 2))
    with er.load(art, device="fake", warmup=False) as rt:
        p = rt.task.prepare("good", rt.limits)
        assert p.bucket == 0 and p.feeds["input_ids"].tolist() == [[4]]
        res = rt.infer("good bad great")
        assert res.bucket == "seq2" and res.truncated is True and res.input_length == 3


# -- 3. the pad id --------------------------------------------------------------------------------

def test_mean_pooling_without_a_mask_input_keeps_a_token_whose_id_is_the_pad_id(tmp_path):
    # a model without an attention_mask input: the pooling mask was ids != pad_id, and the [CLS]
    # token of a vocabulary without a pad token (id 0, the manifest's pad id) was left out of
    # the mean: a wrong embedding, exit 0
    art = _artifact(tmp_path / "a", _tokenizer(style="nopad"), (8,), mask=False)
    with er.load(art, device="fake", warmup=False) as rt:
        p = rt.task.prepare("good movie", rt.limits)
        assert p.feeds["input_ids"][0, :4].tolist() == [0, 3, 3 + WORDS.index("movie"), 1]
        hidden = np.random.default_rng(0).normal(size=(1, 8, 8)).astype(np.float32)
        got = rt.task.finish({"last_hidden_state": hidden}, p).embedding
        ref = hidden[0, :4].mean(axis=0)
        ref /= np.linalg.norm(ref)
        assert np.allclose(got, ref, atol=1e-6), (got, ref)


def test_a_pad_id_that_is_not_the_tokenizers_is_refused_without_a_mask_input(tmp_path):
    # <pad> is 1, <s> is 0: a model without a mask input was fed "<s> good movie </s> <s> <s> <s> <s>"
    # (the manifest's pad id 0) and read the padding as text, exit 0
    art = _artifact(tmp_path / "a", _tokenizer(style="roberta"), (8,), mask=False, pad_id=0)
    with pytest.raises(er.ArtifactError) as ei:
        er.load(art, device="fake", warmup=False)
    assert ei.value.code == "manifest_field_invalid" and "'<pad>' is 1" in str(ei.value)
    art = _artifact(tmp_path / "b", _tokenizer(style="roberta"), (8,), mask=False, pad_id=1)
    with er.load(art, device="fake", warmup=False) as rt:
        assert _ids(rt, "good movie") == [0, 4, 3 + len(WORDS), 2, 1, 1, 1, 1]
    # with a mask input the padding is masked: the artifacts converted with pad id 0 still load
    art = _artifact(tmp_path / "c", _tokenizer(style="roberta"), (8,), mask=True, pad_id=0)
    with er.load(art, device="fake", warmup=False) as rt:
        assert rt.infer("good movie").input_length == 4


@pytest.mark.parametrize("style, padding, pad_id", [("roberta", False, 1), ("roberta", True, 1),
                                                    ("bert", True, 0), ("bert", False, 0), ("nopad", False, 0)])
def test_convert_writes_the_tokenizers_own_pad_id(tmp_path, style, padding, pad_id):
    # text_preprocess wrote "pad_id": 0 for every tokenizer (a RoBERTa-style <pad> is 1)
    from edge_runtime.models.text import TextTask

    src = tmp_path / "tokenizer.json"
    src.write_text(_tokenizer(style=style, padding=padding))

    class Request:
        tokenizer = src
        buckets = [8, 16]

    pre = TextTask.text_preprocess(Request(), ArtifactWriter(tmp_path / "art"))
    assert pre["pad_id"] == pad_id and pre["max_length"] == 16
    assert json.loads((tmp_path / "art" / pre["tokenizer"]).read_text()) == json.loads(src.read_text())


def test_prepare_reports_the_real_token_count_to_finish():
    # the count mask_of reads for a model without a mask input (not ids != pad_id)
    from edge_runtime.models.text_embedding import TextEmbedding

    tok = _tokenizer(style="nopad")
    specs = [{"name": "seq8", "inputs": [{"name": "input_ids", "dtype": "int64", "shape": [1, 8]}],
              "outputs": [{"name": "last_hidden_state", "dtype": "float32", "shape": [1, 8, 8]}]}]
    manifest = {"preprocess": {"kind": "text", "tokenizer": "tokenizer.json", "max_length": 8, "pad_id": 0},
                "postprocess": {"output": "last_hidden_state", "pooling": "mean", "normalize": True}}
    task = TextEmbedding(manifest, lambda rel: tok.encode(), specs)
    p = task.prepare("good movie", DEFAULT_LIMITS)
    assert task.mask_of(p).tolist() == [[1, 1, 1, 1, 0, 0, 0, 0]]
    p = task.prepare(LONG, DEFAULT_LIMITS)
    assert task.mask_of(p).tolist() == [[1] * 8] and p.truncated and p.length == 12


# -- 4. the model's inputs -------------------------------------------------------------------------

def _classifier(root, inputs: dict, tokenizer: str | None = None, length: int = 8):
    """A fake-backend text classifier whose bucket has ``inputs`` ({name: dtype}), [1, length] each."""
    w = ArtifactWriter(root)
    w.add_file("tokenizer.json", data=(tokenizer or _tokenizer()).encode())
    w.add_file("labels.txt", data=b"negative\npositive\n")
    specs = [{"name": f"seq{length}", "inputs": [{"name": n, "dtype": d, "shape": [1, length]} for n, d in inputs.items()],
              "outputs": [{"name": "logits", "dtype": "float32", "shape": [1, 2]}]}]
    w.write_manifest({"format": FORMAT, "format_version": FORMAT_VERSION,
                      "model": {"name": "tiny", "version": "1"}, "task": "text-classification", "files": {},
                      "preprocess": {"kind": "text", "tokenizer": "tokenizer.json", "max_length": length, "pad_id": 0},
                      "postprocess": {"output": "logits", "softmax": True, "labels": "labels.txt"},
                      "limits": {}, "variants": [_variant(w, root, specs)]})
    return root


@pytest.mark.parametrize("names", [("input_ids", "input_mask", "segment_ids"),
                                   ("input_word_ids", "input_mask", "input_type_ids")])
def test_tf_bert_input_names_are_filled(tmp_path, names):
    # TF-Hub / TFLite BERT names: an input_mask the task did not fill failed every call as the device's
    # "inference_failed" (input_word_ids: "bucket has no token id input"); now each gets its role
    art = _classifier(tmp_path / "a", dict.fromkeys(names, "int32"))
    with er.load(art, device="fake", warmup=False) as rt:
        p = rt.task.prepare("good movie", rt.limits)
        assert p.feeds[names[0]].tolist() == [[2, 4, 3 + len(WORDS), 3, 0, 0, 0, 0]]
        assert p.feeds[names[1]].tolist() == [[1, 1, 1, 1, 0, 0, 0, 0]]
        assert p.feeds[names[2]].tolist() == [[0] * 8]
        assert all(a.dtype == np.int32 for a in p.feeds.values())
        assert rt.infer("good movie").input_length == 4


def test_an_input_the_text_task_does_not_fill_is_refused_at_load(tmp_path):
    # position_ids: the artifact loaded (the warm-up failure only logged) and every call failed on the
    # device ("inference_failed: feeds [...] do not match model inputs [...]")
    art = _classifier(tmp_path / "a", {"input_ids": "int64", "attention_mask": "int64", "position_ids": "int64"})
    with pytest.raises(er.ArtifactError) as ei:
        er.load(art, device="fake", warmup=False)
    assert ei.value.code == "manifest_field_invalid" and "not position_ids" in str(ei.value)


@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_a_token_id_input_that_cannot_hold_the_vocabulary_is_refused_at_load(tmp_path, dtype):
    # float16 ids: id 2049 was fed as 2048 (another token), exit 0; int8 ones overflowed at 128
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(2100)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    art = _classifier(tmp_path / "a", {"input_ids": dtype, "attention_mask": "int64"}, tok.to_str())
    with pytest.raises(er.ArtifactError) as ei:
        er.load(art, device="fake", warmup=False)
    assert ei.value.code == "manifest_field_invalid" and "cannot hold id 2101" in str(ei.value)
    art = _classifier(tmp_path / "b", {"input_ids": "float32", "attention_mask": "int64"}, tok.to_str())
    with er.load(art, device="fake", warmup=False) as rt:      # float32 holds every id below 2**24
        assert rt.task.prepare("w2047", rt.limits).feeds["input_ids"][0, 0] == 2049
