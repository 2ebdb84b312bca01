"""Hostile inputs, property-based: every input to ``infer()``/``infer_batch()`` of every
task ends in a result or a typed ``InputError``: no other exception, no hang.

The fast subset runs by default; the ``slow`` variants push >= 10,000 cases in
all (CI runs them too). The fake backend is used so that the cases exercise
the runtime and task code, which is where input handling lives; it also
counts device calls, so "rejected before any device work" is checked.
"""

import io
import struct
import time
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import edge_runtime as er
from fake_backend import FakeSession
from factories import png_bytes

TASKS = ("text-classification", "text-embedding", "image-classification", "tensors")
FAST, LONG = 60, 650          # per (task, strategy): 4 tasks x 4 strategies x 650 > 10,000


DEVICE_CALLS = [0]      # FakeSession.run calls while the fuzz runs


@pytest.fixture(scope="module")
def runtimes(tmp_path_factory):
    from factories import make_artifact

    real = FakeSession.run

    def counted(self, *a, **k):
        DEVICE_CALLS[0] += 1
        return real(self, *a, **k)

    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FakeSession, "run", counted)
        for task in TASKS:
            art = make_artifact(tmp_path_factory.mktemp(task.replace("-", "_")), task)
            out[task] = er.load(art, device="fake", limits={"max_text_chars": 2000, "max_request_bytes": 1 << 20})
        yield out
    for rt in out.values():
        rt.close()


def peak_rss_mb() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:")) / 1024


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def bomb_png(w: int, h: int) -> bytes:
    """A tiny PNG that declares w x h pixels (a decompression bomb's header)."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 1024, 9)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")


GOOD_PNG = png_bytes(np.eye(8, dtype=np.uint8) * 200)

json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30)

texts = st.one_of(
    st.text(max_size=300),
    st.text(alphabet=st.characters(blacklist_categories=()), max_size=100),     # any code point, surrogates too
    st.builds(lambda c, n: c * n, st.sampled_from(["a", "é", "🙂", "\u0000", "\ufeff", " ", "\u202e"]),
              st.integers(0, 5000)),
    st.binary(max_size=200),
)
images = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda n: GOOD_PNG[:n], st.integers(0, len(GOOD_PNG))),                          # truncated
    st.builds(lambda i, b: GOOD_PNG[:i] + bytes([b]) + GOOD_PNG[i + 1:], st.integers(0, len(GOOD_PNG) - 1),
              st.integers(0, 255)),                                                            # one byte flipped
    st.builds(bomb_png, st.integers(1, 200_000), st.integers(1, 200_000)),
    st.builds(lambda b: b"\x89PNG\r\n\x1a\n" + b, st.binary(max_size=100)),
    st.builds(lambda b: b"\xff\xd8\xff" + b, st.binary(max_size=100)),                          # JPEG magic
    st.builds(lambda b: b"BM" + b, st.binary(max_size=100)),                                    # BMP magic
)
arrays = hnp.arrays(dtype=st.sampled_from([np.uint8, np.int8, np.int32, np.int64, np.float16, np.float32, np.float64,
                                           np.bool_, np.complex64]),
                    shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=9))
anything = st.one_of(json_like, texts, images, arrays,
                     st.dictionaries(st.sampled_from(["x", "k", "text", "y"]), arrays | json_like, max_size=3))


def check(rt, raw):
    t0 = time.perf_counter()
    calls = DEVICE_CALLS[0]
    try:
        res = rt.infer(raw, deadline_ms=2000)
    except er.InputError as exc:
        assert exc.code and exc.message
        assert DEVICE_CALLS[0] == calls, f"{exc.code} raised after device work"   # rejected before the device
        res = None
    except Exception as exc:                       # noqa: BLE001 - anything else is the defect
        pytest.fail(f"{rt.artifact.task}: {type(exc).__name__}: {exc} for {raw!r:.200}")
    assert time.perf_counter() - t0 < 2.5
    if res is not None:
        assert res.device == "fake:cpu" and res.trace_id
    return res


def check_batch(rt, items):
    try:
        out = rt.infer_batch(items, deadline_ms=2000)
    except er.InputError:
        return
    assert len(out) == len(items)
    for r in out:
        assert isinstance(r, (er.InferenceResult, er.InputError)), repr(r)


def _cases(n):
    return settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("strategy", ["texts", "images", "arrays", "anything"])
def test_hostile_inputs_fast(runtimes, task, strategy):
    strat = {"texts": texts, "images": images, "arrays": arrays, "anything": anything}[strategy]

    @_cases(FAST)
    @given(strat)
    def run(raw):
        check(runtimes[task], raw)

    run()


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("strategy", ["texts", "images", "arrays", "anything"])
def test_hostile_inputs_long(runtimes, task, strategy):
    strat = {"texts": texts, "images": images, "arrays": arrays, "anything": anything}[strategy]

    seen = []

    @settings(max_examples=LONG, deadline=None, suppress_health_check=list(HealthCheck))
    @given(strat)
    def run(raw):
        seen.append(1)
        check(runtimes[task], raw)

    before = peak_rss_mb()
    run()
    assert len(seen) >= LONG        # 16 of these: >= 10,400 cases in all
    assert peak_rss_mb() - before < 256, "a hostile input drove the process's peak memory up"


@pytest.mark.parametrize("task", TASKS)
def test_hostile_batches(runtimes, task):
    @_cases(FAST)
    @given(st.lists(anything, max_size=12) | anything)
    def run(items):
        check_batch(runtimes[task], items)

    run()


def test_decompression_bomb_is_refused_before_decoding(runtimes, monkeypatch):
    rt = runtimes["image-classification"]
    calls = []
    real = FakeSession.run
    monkeypatch.setattr(FakeSession, "run", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    import tracemalloc

    tracemalloc.start()
    for w, h in ((100_000, 100_000), ((1 << 31) - 1, 1), (50_000, 1_000)):
        with pytest.raises(er.InputError) as ei:
            rt.infer(bomb_png(w, h))
        assert ei.value.code == "input_too_many_pixels"
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 20 << 20 and not calls        # bounded memory, no device work


def test_deep_and_huge_json_is_refused(runtimes):
    rt = runtimes["tensors"]
    deep = current = []
    for _ in range(100_000):
        nxt = []
        current.append(nxt)
        current = nxt
    with pytest.raises(er.InputError):
        rt.infer({"x": deep})
    with pytest.raises(er.InputError):
        rt.infer({"x": list(range(2_000_000))})
    buf = io.BytesIO()
    np.save(buf, np.zeros(3))
    with pytest.raises(er.InputError):
        rt.infer(buf.getvalue())
