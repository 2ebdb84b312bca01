"""Hunt: ``infer_batch``'s grouped path (``batch_path.run_grouped``) and the metrics' exposition.

The fake backend has no ``run_many``; ``_batched_fake`` gives its sessions one (OpenVINO's contract:
one output dict or exception per feed, in order; feeds not started within ``timeout_s`` come back
as ``TimeoutError``), optionally broken the way a third-party ``BatchSession`` could be."""

from __future__ import annotations

import threading
import time
import types

import pytest

import edge_runtime as er
from edge_runtime.metrics import prometheus_text

ITEMS = ["good", "good movie " * 20, None, 12, "x" * 20_000, "good", "", "bad awful", "good movie " * 3, "good",
         "good movie " * 5]


def _batched_fake(rt, mangle=None):
    """``rt``'s fake sessions with a ``run_many``; ``mangle(bucket, results)`` alters what it returns."""
    for k, sess in enumerate(rt._sessions):
        def run_many(self, feeds_list, timeout_s=None, k=k):
            t_end = None if timeout_s is None else time.perf_counter() + timeout_s
            out: list = []
            for feeds in feeds_list:
                if t_end is not None and time.perf_counter() > t_end:
                    out.append(TimeoutError("not started before the deadline"))
                    continue
                try:
                    out.append(self.run(feeds))
                except Exception as exc:
                    out.append(exc)
            return out if mangle is None else mangle(k, out)
        sess.run_many = types.MethodType(run_many, sess)
    rt._batched = True
    return rt


def _same(a, b) -> bool:
    if isinstance(a, Exception) or isinstance(b, Exception):
        return type(a) is type(b) and a.code == b.code
    da, db = a.to_dict(), b.to_dict()
    for k in ("latency_ms", "trace_id"):
        da.pop(k), db.pop(k)
    return da == db


def _codes(rt) -> dict:
    return {e["code"]: e["count"] for e in rt.metrics()["errors"]}


def _ok_count(rt) -> int:
    return sum(h["count"] for h in rt.metrics()["latency_seconds"].values())


@pytest.mark.parametrize("mangle", [
    pytest.param(lambda k, out: out[:-1] if k == 1 else out, id="one-result-short"),
    pytest.param(lambda k, out: out + out[:1] if k == 1 else out, id="one-result-too-many"),
    pytest.param(lambda k, out: None if k == 1 else out, id="not-a-list"),
])
def test_grouped_run_many_answering_another_count_fails_that_group_typed(make_artifact, mangle):
    """Before: a ``run_many`` answering one result short left that item ``None`` and ``infer_batch``
    raised AttributeError (no result for any item, nothing counted); one answering ``None`` raised
    TypeError; one answering a result too many was paired by position, results returned as if right.
    Now each item of that bucket group is ``inference_failed``; the other group's are answered, the
    same as the one-by-one path's, and each item is counted once."""
    art = make_artifact("text-classification")
    ref = er.load(art, device="fake")
    rt = _batched_fake(er.load(art, device="fake"), mangle)
    want = ref.infer_batch(ITEMS)
    got = rt.infer_batch(ITEMS)
    assert len(got) == len(ITEMS)
    for w, g in zip(want, got):
        if not isinstance(w, er.EdgeRuntimeError) and w.bucket == "seq16":      # the broken group (bucket 1)
            assert isinstance(g, er.InferenceRuntimeError) and g.code == "inference_failed", g
            assert "run_many returned" in str(g)
        else:
            assert _same(w, g), (w, g)
    broken = sum(isinstance(g, er.InferenceRuntimeError) for g in got)
    assert broken == 2
    assert _ok_count(rt) == _ok_count(ref) - broken
    assert _codes(rt) == {**_codes(ref), "inference_failed": broken}
    ref.close()
    rt.close()


def test_grouped_run_many_item_that_is_not_outputs_is_typed(make_artifact):
    """Before: an item's entry that was neither an exception nor outputs (``None``) reached the output
    check and ``infer_batch`` raised AttributeError for the whole batch. Now that item alone is
    ``inference_failed``; the others are answered in order."""
    art = make_artifact("text-classification")

    def one_none(k, out):
        out[1] = None
        return out
    rt = _batched_fake(er.load(art, device="fake"), one_none)
    got = rt.infer_batch(["good", "bad awful", "good movie"])
    assert [type(g).__name__ for g in got] == ["InferenceResult", "InferenceRuntimeError", "InferenceResult"]
    assert got[1].code == "inference_failed" and "NoneType" in str(got[1])
    assert _codes(rt) == {"inference_failed": 1} and _ok_count(rt) == 2
    rt.close()


def test_grouped_prepare_batch_answering_short_is_typed(make_artifact):
    """Before: a task whose ``prepare_batch`` answered for fewer inputs than it was given (a plugin
    task's bug) left those items ``None`` and ``infer_batch`` raised AttributeError. Now each such
    item is an ``InputError`` (``input_invalid``, as a task bug in ``prepare`` is); the rest run."""
    rt = _batched_fake(er.load(make_artifact("text-classification"), device="fake"))
    real = rt.task.prepare_batch
    rt.task.prepare_batch = lambda raws, lim: real(raws, lim)[:-1]
    got = rt.infer_batch(["good", "bad awful", "good movie"])
    assert [type(g).__name__ for g in got] == ["InferenceResult", "InferenceResult", "InputError"]
    assert got[2].code == "input_invalid"
    assert _codes(rt) == {"input_invalid": 1} and _ok_count(rt) == 2
    rt.close()


def _series(text: str) -> list[tuple[str, tuple]]:
    parser = pytest.importorskip("prometheus_client.parser")
    return [(s.name, tuple(sorted(s.labels.items())), s.value)
            for f in parser.text_string_to_metric_families(text) for s in f.samples]


def test_two_runtimes_of_one_model_make_one_series_each_with_exact_totals(make_artifact):
    """Before: ``prometheus_text`` of two runtimes of one model and version (``PrometheusCollector(rt_a,
    rt_b)``) wrote each series twice, one value per runtime: Prometheus keeps one and drops the other
    (here 4 threads x 500 calls on each; a scrape read half). Now each series is written once, the
    runtimes' figures added up: counts exact, buckets cumulative, +Inf equal to _count, _sum present.
    On two devices the info and latency series stay apart (their ``device`` label)."""
    art = make_artifact("text-classification")
    rts = [er.load(art, device="fake"), er.load(art, device="fake")]
    calls, errs = 500, 50

    def work(k: int) -> None:
        rt = rts[k % 2]
        for i in range(calls):
            if i % 10 == 0:
                with pytest.raises(er.InputError):
                    rt.infer(None)
            else:
                rt.infer("good movie" if k < 2 else "good movie " * 5)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snaps = [rt.metrics() for rt in rts]
    for s in snaps:         # each runtime exact: 2 threads x 450 calls, one per bucket; 2 x 50 errors
        assert {b: h["count"] for b, h in s["latency_seconds"].items()} == {"seq8": 450, "seq16": 450}
        assert s["errors"] == [{"type": "InputError", "code": "input_wrong_type", "count": 2 * errs}]

    series = _series(prometheus_text(snaps))
    keys = [(n, labels) for n, labels, _ in series]
    assert len(keys) == len(set(keys)), "a series written twice"
    value = {(n, labels): v for n, labels, v in series}
    errors = [v for (n, _), v in value.items() if n == "edge_runtime_errors_total"]
    assert errors == [4 * errs]
    counts = {dict(labels)["bucket"]: v for (n, labels), v in value.items()
              if n == "edge_runtime_inference_latency_seconds_count"}
    assert counts == {"seq8": 900, "seq16": 900}
    for name in ("edge_runtime_inference_latency_seconds", "edge_runtime_input_length"):
        count_rows = [(labels, v) for (n, labels), v in value.items() if n == f"{name}_count"]
        for labels, count in count_rows:
            buckets = [v for (n, lab), v in value.items()
                       if n == f"{name}_bucket" and tuple(x for x in lab if x[0] != "le") == labels]
            assert buckets == sorted(buckets) and buckets[-1] == count      # cumulative; +Inf is last
            assert (f"{name}_sum", labels) in value
    assert sum(v for (n, _), v in value.items() if n == "edge_runtime_input_length_count") == 1800

    # the same model on two devices: info and latency apart, the per-model families added up
    snaps[1]["labels"]["device"] = "other:npu"
    series = _series(prometheus_text(snaps))
    keys = [(n, labels) for n, labels, _ in series]
    assert len(keys) == len(set(keys)), "a series written twice"
    assert sum(n == "edge_runtime_info" for n, _ in keys) == 2
    assert sum(n == "edge_runtime_inference_latency_seconds_count" for n, _ in keys) == 4
    assert [v for n, _, v in series if n == "edge_runtime_errors_total"] == [4 * errs]
    assert [v for n, _, v in series if n == "edge_runtime_truncated_total"] == [0]
    for rt in rts:
        rt.close()


def test_prometheus_text_of_a_generator_keeps_every_family(make_artifact):
    """Before: a generator of snapshots (``prometheus_text(rt.metrics() for rt in rts)``) was used up by
    the first family: the text held the info line and every other family empty, with no error.
    Now it is the same text as for the list."""
    rt = er.load(make_artifact("text-classification"), device="fake")
    rt.infer("good")
    with pytest.raises(er.InputError):
        rt.infer(None)
    snaps = [rt.metrics()]
    assert prometheus_text(s for s in snaps) == prometheus_text(snaps)
    assert "edge_runtime_errors_total{" in prometheus_text(iter(snaps))
    rt.close()


def _failing_sessions(rt, result):
    """``rt``'s sessions answer ``result()`` (raise it when it is an exception) instead of running."""
    for sess in rt._sessions:
        def run(self, feeds, cancel=None):
            r = result()
            if isinstance(r, BaseException):
                raise r
            return r
        sess.run = types.MethodType(run, sess)
    return rt


@pytest.mark.parametrize("result", [lambda: None, lambda: [1, 2], lambda: "outputs"], ids=["None", "list", "str"])
def test_a_session_answering_no_outputs_by_name_is_a_typed_counted_failure(make_artifact, result):
    """Before: a (plugin) session whose ``run`` returned a non-dict raised an untyped AttributeError
    from the non-finite guard, out of ``infer`` and ``infer_batch``, uncounted. Now
    ``inference_failed``, counted, and that item's error in a batch."""
    rt = _failing_sessions(er.load(make_artifact("text-classification"), device="fake"), result)
    with pytest.raises(er.InferenceRuntimeError) as e:
        rt.infer("good")
    assert e.value.code == "inference_failed" and "not outputs by name" in str(e.value)
    got = rt.infer_batch(["good", "bad"])
    assert all(isinstance(g, er.InferenceRuntimeError) and g.code == "inference_failed" for g in got)
    assert _codes(rt) == {"inference_failed": 3}


@pytest.mark.parametrize("batched", [False, True], ids=["one-by-one", "grouped"])
def test_an_input_failing_on_the_device_still_counts_its_length(make_artifact, batched):
    """``input_length`` is the drift signal: before, an input prepared and then failed on the device
    (a timeout, a crash) was left out of it (``RuntimeMetrics.length`` was never called), so long
    inputs that time out never showed. Now each prepared input is counted once, ok or failed."""
    rt = er.load(make_artifact("text-classification"), device="fake")
    _failing_sessions(rt, lambda: RuntimeError("device fell over"))
    if batched:
        _batched_fake(rt)
    before = rt.metrics()["input_length"]["count"]
    with pytest.raises(er.InferenceRuntimeError):
        rt.infer("good movie")
    got = rt.infer_batch(["good", "good movie " * 5, None])      # None: refused before prepare, no length
    assert [type(g) for g in got] == [er.InferenceRuntimeError, er.InferenceRuntimeError, er.InputError]
    assert rt.metrics()["input_length"]["count"] - before == 3
