"""The contracts the per-call fast paths (issue #20) must keep: same answers, unique trace ids."""

from __future__ import annotations

import io
import multiprocessing as mp
import re
import threading
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.limits import DEFAULT_LIMITS
from edge_runtime.models.base import rank_classes, softmax, top_indices
from edge_runtime.models.image import TensorPlan, _pixels, decode, decode_pixels, input_plan, normalisation
from edge_runtime.result import InferenceResult, new_trace_id

HEX32 = re.compile(r"[0-9a-f]{32}")
ROOT = Path(__file__).resolve().parents[1]


# -- trace ids -------------------------------------------------------------------------------
def test_trace_ids_are_32_hex_and_unique_across_threads():
    seen: list[list[str]] = [[] for _ in range(8)]

    def work(k):
        seen[k].extend(new_trace_id() for _ in range(5000))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [i for s in seen for i in s]
    assert len(set(ids)) == len(ids) == 40000
    assert all(HEX32.fullmatch(i) for i in ids)


def _child_ids(q):
    from edge_runtime.result import new_trace_id as make

    q.put([make() for _ in range(100)])


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_trace_ids_are_unique_across_processes(method):
    if method not in mp.get_all_start_methods():
        pytest.skip(f"no {method} here")
    ctx = mp.get_context(method)
    mine = [new_trace_id() for _ in range(100)]      # the parent has used its counter: a forked
    q = ctx.Queue()                                   # child must not repeat what follows
    procs = [ctx.Process(target=_child_ids, args=(q,)) for _ in range(3)]
    for p in procs:
        p.start()
    got = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
    after = [new_trace_id() for _ in range(100)]
    ids = mine + after + [i for g in got for i in g]
    assert len(set(ids)) == len(ids)
    prefixes = {i[:16] for g in got for i in g[:1]} | {mine[0][:16]}
    assert len(prefixes) == 4                         # each process its own random prefix


def test_result_fast_constructor_equals_the_dataclass():
    from edge_runtime.models.base import Scores

    scores = Scores({"a": 0.75, "b": 0.25}, class_id=3, top_k=[{"index": 3, "label": "a", "score": 0.75}])
    fields = dict(prediction="a", scores=scores, embedding=None, latency_ms=1.5, device="x:cpu", target="t",
                  model="m", version="1", trace_id="0" * 32, bucket="static", truncated=False, input_length=64,
                  outputs=None, class_id=None, top_k=None, raw_outputs=None, detections=None, keypoints=None)
    slow = InferenceResult(**fields)
    fast = InferenceResult._make(dict(fields))
    assert fast == slow and repr(fast) == repr(slow) and fast.to_dict() == slow.to_dict()
    assert fast.class_id == 3 and fast.top_k == scores.top_k
    with pytest.raises(AttributeError):
        fast.prediction = "b"                         # still frozen


# -- ranking ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [3, 10, 64, 65, 1001])
def test_top_indices_is_the_stable_argsort(n):
    rng = np.random.default_rng(n)
    for trial in range(200):
        v = (rng.integers(-4, 4, n) if trial % 2 else rng.standard_normal(n)).astype(np.float32)
        if trial % 5 == 0:
            v[rng.integers(0, n, 2)] = np.nan
        if trial % 7 == 0:
            v[rng.integers(0, n, 2)] = -np.inf
        for k in (None, 1, 5, 8, 9, 40, n, n + 5):
            want = np.argsort(-v, kind="stable")
            assert top_indices(v, k) == (want[:k] if k else want).tolist(), (n, k, trial)


def test_rank_classes_scores_are_python_floats_of_the_probabilities():
    p = softmax(np.array([1.0, 3.0, 3.0, -2.0, 0.5], np.float32))
    label, cid, scores, top = rank_classes(p, list("abcde"), 3)
    assert (label, cid) == ("b", 1) and [t["index"] for t in top] == [1, 2, 0]
    assert all(type(t["score"]) is float and t["score"] == float(p[t["index"]]) for t in top)
    assert list(scores) == ["b", "c", "a"]


# -- pixels to tensor ------------------------------------------------------------------------
def _slow_float(x, pre, spec):
    scale, mean, std = normalisation(pre, spec)
    x = x.astype(np.float32) * np.float32(scale)
    return (x - mean.astype(np.float32)) / std.astype(np.float32)


@pytest.mark.parametrize("mean,std,c", [([0.5], [0.5], 1), ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225], 3),
                                        ([0.0], [1.0], 3), ([127.5], [127.5], 3)])
def test_float_table_is_bit_identical_to_the_formula(mean, std, c):
    pre = {"size": [4, 4], "scale": 1 / 255 if mean[0] < 1 else 1.0, "mean": mean, "std": std, "layout": "NHWC"}
    spec = {"name": "x", "dtype": "float32", "shape": [1, 4, 4, c]}
    x = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(c, axis=2)
    got = TensorPlan(pre, spec, c)(x)[0]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, _slow_float(x, pre, spec))


def _fancy_index_plan(plan: TensorPlan, x: np.ndarray) -> np.ndarray:
    """The table lookup as it was written before ``take``: one fancy index, then a transpose copy."""
    table = plan.ftable if plan.kind == "float" else plan.table
    idx = x if x.dtype == np.uint8 else x.astype(np.uint8)
    out = table[0][idx] if table.shape[0] == 1 else table[np.arange(idx.shape[2])[None, None, :] % table.shape[0], idx]
    if plan.nchw:
        out = np.ascontiguousarray(out.transpose(2, 0, 1))
    out = out[None]
    return out if out.dtype == plan.dtype else out.astype(plan.dtype)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("c", [1, 3])
@pytest.mark.parametrize("dtype, q, mean", [
    ("float32", None, [0.5]), ("float32", None, [0.485, 0.456, 0.406]),
    ("int8", {"scale": 0.0187, "zero_point": -14}, [0.485, 0.456, 0.406]),     # a per-channel table
    ("int8", {"scale": 0.0078, "zero_point": -1}, [0.5]), ("uint8", {"scale": 0.02, "zero_point": 3}, [0.5])])
def test_table_lookup_by_take_equals_the_fancy_index(layout, c, dtype, q, mean):
    """TensorPlan looks pixels up with ``take`` per channel plane, straight into the layout: the
    same bytes, dtype, shape and contiguity as the fancy index it replaced, on every table kind."""
    if c == 1 and len(mean) == 3:
        mean = mean[:1]
    std = [0.229, 0.224, 0.225][:len(mean)] if len(mean) == 3 else [0.5]
    pre = {"size": [13, 9], "scale": 1 / 255, "mean": mean, "std": std, "layout": layout}
    shape = [1, c, 13, 9] if layout == "NCHW" else [1, 13, 9, c]
    spec = {"name": "x", "dtype": dtype, "shape": shape, **({"quantization": q} if q else {})}
    plan = TensorPlan(pre, spec, c, input_plan(pre, spec, c))
    assert plan.kind in ("float", "lut")
    rng = np.random.default_rng(c * 7 + len(mean))
    for x in (rng.integers(0, 256, (13, 9, c), dtype=np.uint8), np.arange(256 * c, dtype=np.uint8).reshape(16, 16, c)):
        got, want = plan(x), _fancy_index_plan(plan, x)
        assert got.dtype == want.dtype and got.shape == want.shape and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)


def _png(a: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("mode", ["L", "RGB"])
@pytest.mark.parametrize("shape", [(8, 8), (8, 8, 1), (8, 8, 3), (8, 8, 4), (13, 9), (13, 9, 3)])
def test_array_fast_path_equals_the_pil_round_trip(mode, shape):
    rng = np.random.default_rng(sum(shape))
    a = rng.integers(0, 256, shape, dtype=np.uint8)
    c = 1 if mode == "L" else 3
    for resize in ("bilinear", "nearest", "bilinear-half-pixel"):
        pre = {"size": [8, 8], "channels": c, "scale": 1 / 255, "mean": [0.5], "std": [0.5], "resize": resize,
               "layout": "NCHW"}
        for dtype, q in (("float32", None), ("int8", {"scale": 0.0078, "zero_point": -1}),
                         ("uint8", {"scale": 1 / 255, "zero_point": 0})):
            spec = {"name": "x", "dtype": dtype, "shape": [1, c, 8, 8], **({"quantization": q} if q else {})}
            plan = TensorPlan(pre, spec, c, input_plan(pre, spec, c))
            fast = plan(_pixels(decode_pixels(a, DEFAULT_LIMITS, mode), pre))
            slow = plan(_pixels(decode(a, DEFAULT_LIMITS, mode), pre))
            assert fast.dtype == slow.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(fast, slow)
    assert not np.shares_memory(plan(_pixels(decode_pixels(a, DEFAULT_LIMITS, mode), pre)), a)


def test_digits_array_path_and_image_path_agree(digits_artifact):
    import edge_runtime as er
    from edge_runtime.converters.zoo import ZOO
    from PIL import Image

    paths = sorted((ZOO / "digits-cnn" / "held_out").rglob("*.png"))[:40]
    with er.load(digits_artifact, device="onnxruntime") as rt:
        for p in paths:
            a = np.asarray(Image.open(p).convert("L"))
            r_arr, r_path, r_png = rt.infer(a), rt.infer(str(p)), rt.infer(_png(a))
            want = r_path.to_dict()
            for r in (r_arr, r_png):
                d = r.to_dict()
                assert {k: d[k] for k in ("prediction", "class_id", "scores", "top_k", "input_length")} == \
                    {k: want[k] for k in ("prediction", "class_id", "scores", "top_k", "input_length")}
                assert set(d) == set(want)


@pytest.mark.parametrize("n,k", [(10, 5), (10, None), (3, 1), (64, 8), (65, 5), (1000, 5)])
def test_classify_equals_softmax_then_rank(n, k):
    """The Python-float softmax of ``classify`` (<= 64 classes) ranks and scores exactly as
    ``rank_classes(softmax(x))``: same order, same float32-rounded values, ties included."""
    from edge_runtime.models.base import classify, score_keys

    rng = np.random.default_rng(n)
    labels = [f"c{i}" for i in range(n)]
    keys = score_keys(labels)
    vectors = [rng.normal(size=n).astype(np.float32) * s for s in (0.1, 3, 30) for _ in range(40)]
    vectors.append(np.zeros(n, np.float32))                       # every class tied
    vectors.append(np.full(n, 80.0, np.float32))                  # large equal logits
    for x in vectors:
        want = rank_classes(softmax(x), labels, k, keys)
        got = classify(x, labels, k, keys, True)
        assert got[0] == want[0] and got[1] == want[1]
        assert got[3] == want[3]                                  # indices, labels and scores, in order
        assert list(got[2].items()) == list(want[2].items())
        assert type(got[2]) is type(want[2]) and got[2].class_id == want[2].class_id
    raw = rng.normal(size=n).astype(np.float32)
    assert classify(raw, labels, k, keys, False)[3] == rank_classes(raw, labels, k, keys)[3]


def test_openvino_small_input_path_matches_a_fresh_request(ov_digits_artifact):
    """OpenVINO copies a small input into the pooled request's own tensor and calls the native infer:
    over every held-out digit (and from two threads at once) the outputs equal those of a fresh
    request run through OpenVINO's own Python API, so a stale buffer cannot answer."""
    import edge_runtime as er

    with er.load(ov_digits_artifact, device="openvino") as rt:
        sess = rt._sessions[0]
        assert sess._copy_in
        fresh = sess._compiled.create_infer_request()
        files = sorted((ROOT / "models" / "zoo" / "digits-cnn" / "held_out").rglob("*.png"))
        feeds = [rt._prepare(str(f), rt.limits).feeds for f in files]
        want = []
        for f in feeds:
            fresh.infer(f)
            want.append(fresh.get_output_tensor(0).data.copy())
        bad: list[int] = []

        def work(order):
            for i in order:
                (got,) = sess.run(feeds[i]).values()
                if not np.array_equal(got, want[i]):
                    bad.append(i)

        threads = [threading.Thread(target=work, args=(r,)) for r in (range(len(feeds)), reversed(range(len(feeds))))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not bad, bad[:10]
        assert len(feeds) >= 300


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("zp,scale", [(-128.0, 1 / 256), (3.0, 0.1), (0.0, 0.0390625), (-7.0, 0.17313)])
def test_code_table_is_bit_identical_to_numpy_dequantize(dtype, zp, scale):
    """Every 8-bit code dequantizes through the table to the very float32 that numpy's
    ``(arr.astype(np.float32) - zp) * scale`` gives, and the small-output classify path on the
    table's values ranks and scores exactly as the numpy path did."""
    from edge_runtime.models.base import classify, score_keys
    from models.classification import classify_values, code_table

    info = np.iinfo(dtype)
    codes = np.arange(info.min, info.max + 1).astype(dtype)
    table = code_table(dtype, zp, scale)
    want = (codes.astype(np.float32) - zp) * scale
    got = np.array([table[c] for c in codes.tolist()], dtype=np.float64)
    assert np.array_equal(got, want.astype(np.float64))        # exact, not close
    assert code_table(np.int16, zp, scale) is None and code_table(np.float32, zp, scale) is None
    rng = np.random.default_rng(7)
    labels = [f"c{i}" for i in range(10)]
    keys = score_keys(labels)
    for _ in range(200):
        arr = rng.integers(info.min, info.max + 1, size=(1, 10)).astype(dtype)
        numpy_path = classify(((arr.astype(np.float32) - zp) * scale).reshape(-1), labels, 5, keys, True)
        table_path = classify_values([table[c] for c in arr.ravel().tolist()], labels, 5, keys, True)
        assert table_path[:2] == numpy_path[:2] and table_path[3] == numpy_path[3]
        assert list(table_path[2].items()) == list(numpy_path[2].items())


def test_classify_values_falls_back_like_classify():
    """Past 64 classes, without softmax, or with a non-finite value, the list path gives what
    ``classify`` of the float32 array gives."""
    from edge_runtime.models.base import classify, score_keys
    from models.classification import classify_values

    rng = np.random.default_rng(3)
    for n, soft in ((100, True), (10, False), (10, True)):
        labels = [f"c{i}" for i in range(n)]
        keys = score_keys(labels)
        x = rng.normal(size=n).astype(np.float32)
        if n == 10 and soft:
            x[4] = np.inf
        want = classify(x, labels, 5, keys, soft)
        got = classify_values(x.tolist(), labels, 5, keys, soft)
        assert got[:2] == want[:2] and repr(got[3]) == repr(want[3])      # repr: NaN scores compare


def test_pool_hands_each_object_to_one_caller_and_never_stalls():
    """The pool's lock-free path under contention: 8 threads on 2 objects never hold the same
    object at once, every waiter is woken (the test ends), and no more than the limit is made."""
    import sys
    import time

    sys.path.insert(0, str(ROOT))
    from devices.pool import Pool

    made = []

    def make():
        made.append(object())
        return made[-1]

    pool = Pool(make, 2)
    held: set[int] = set()
    guard = threading.Lock()
    errors: list[str] = []

    def work():
        for i in range(3000):
            item = pool.acquire()
            with guard:
                if id(item) in held:
                    errors.append("handed out twice")
                held.add(id(item))
            if i % 7 == 0:
                time.sleep(0)           # give up the GIL while holding it: others must wait
            with guard:
                held.discard(id(item))
            pool.release(item)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a waiter was never woken"
    assert not errors and len(made) <= 2 and pool.size <= 2
