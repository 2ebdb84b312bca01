"""The batch path prepares text inputs in one tokenizer call (``TextTask.prepare_batch``,
``CallPath._prepare_batch``): the same ``Prepared`` and the same typed errors as ``prepare``
one input at a time, in order."""

import numpy as np

import edge_runtime as er
from edge_runtime.errors import EdgeRuntimeError

ITEMS = ["good", "a much longer text " * 40, "", "   ", 7, b"\xff\xfe not utf-8", b"bytes are text",
         {"text": "a dict"}, "x" * 5000, "bad " * 3, "ünïcödé ✓ 日本語", None]


def _one_by_one(rt, items, lim):
    out = []
    for x in items:
        try:
            out.append(rt._prepare(x, lim))
        except EdgeRuntimeError as exc:
            out.append(exc)
    return out


def _same(a, b):
    if isinstance(a, EdgeRuntimeError):
        assert type(a) is type(b) and a.code == b.code and str(a) == str(b), (a, b)
        return
    assert (a.bucket, a.truncated, a.length) == (b.bucket, b.truncated, b.length)
    assert list(a.feeds) == list(b.feeds)
    for k in a.feeds:
        assert a.feeds[k].dtype == b.feeds[k].dtype and np.array_equal(a.feeds[k], b.feeds[k])


def test_batch_prepare_equals_one_by_one_with_errors_in_place(make_artifact):
    with er.load(make_artifact("text-classification", limits={"max_request_bytes": 4096}), device="fake",
                 warmup=False) as rt:
        lim = rt.limits
        one = _one_by_one(rt, ITEMS, lim)
        batch = rt._prepare_batch(ITEMS, lim)
        assert len(batch) == len(ITEMS)
        for a, b in zip(one, batch):
            _same(a, b)
        kinds = [type(b).__name__ for b in batch]
        assert kinds.count("Prepared") == 6 and kinds.count("InputError") == 6, kinds
        assert batch[1].truncated and batch[8].code == "input_too_large"


def test_the_batch_is_one_tokenizer_call(make_artifact):
    with er.load(make_artifact("text-embedding"), device="fake", warmup=False) as rt:
        real = rt.task.tokenizer
        calls = []

        class Counting:
            def encode(self, text):
                calls.append("encode")
                return real.encode(text)

            def encode_batch(self, texts):
                calls.append(("encode_batch", len(texts)))
                return real.encode_batch(texts)

        rt.task.tokenizer = Counting()
        rt._prepare_batch(["one", "two", "", "three"], rt.limits)
        assert calls == [("encode_batch", 3)]


def test_a_task_whose_batch_prepare_fails_types_every_item(make_artifact):
    with er.load(make_artifact("text-classification"), device="fake", warmup=False) as rt:
        def broken(raws, limits):
            raise RuntimeError("task bug")

        rt.task.prepare_batch = broken
        out = rt._prepare_batch(["a", "b", 3], rt.limits)
        assert [e.code for e in out] == ["input_invalid"] * 3
        assert "RuntimeError: task bug" in str(out[0]) and isinstance(out[0].__cause__, RuntimeError)
