"""Hostile inputs for the vision tasks (object-detection, pose-estimation, semantic-segmentation), as
``test_fuzz.py`` (whose strategies are reused) does for the others. Every case ends within a time bound (an
interval timer fails a hang) in a well-formed result (boxes finite inside the image, scores 0..1 and over the
call's threshold, at most ``max_detections``; keypoints finite inside the image; a mask of the image's size)
or an ``InputError`` raised before any device call, the task's own refusal, not the runtime's net for a task
bug ("input could not be prepared: ValueError"). Fast by default; the ``slow`` run pushes 3,600 cases."""

import io
import os
import signal
import struct
import time
import zlib
from collections import Counter
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from PIL import Image

import edge_runtime as er
from edge_runtime import error_codes as ec
from fake_backend import FakeSession, write_fake_model
from factories import make_artifact, png_bytes
from test_fuzz import anything, arrays, bomb_png, images, json_like, png_chunk, texts

TASKS = ("object-detection", "pose-estimation", "semantic-segmentation")
STRATEGIES = ("bytes", "arrays", "wrong", "anything")
FAST, LONG = 60, 200         # per (task, strategy): 3 x 6 x 60 = 1,080 cases by default, 3 x 6 x 200 = 3,600 slow
BOUND_S = 2.5                # per case, as test_fuzz.py
DEVICE_CALLS = [0]
pytestmark = pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")


# -- fake models whose outputs mean something: boxes over the input, keypoints 0..1, scores 0..1 -------
def _detector(path, bucket, seed=0):
    """yolo [1, 7, 12] channels first (cx, cy, w, h, 3 class scores per anchor): boxes across the
    16 x 16 input, some past its edges, and scores 0.05..0.95 that move with the pixels."""
    write_fake_model(path, bucket, seed=seed)
    rng = np.random.default_rng(seed)
    with np.load(path) as d:
        w, b = d["W__output0"].reshape(-1, 7, 12), d["b__output0"].reshape(7, 12)
    w = w * np.array([4, 4, 2, 2, 0.002, 0.002, 0.002], dtype=np.float32)[None, :, None]
    b[:2] = rng.uniform(-2, 18, (2, 12))
    b[2:4] = rng.uniform(1, 12, (2, 12))
    b[4:] = rng.uniform(0.05, 0.95, (3, 12))
    np.savez(path, W__output0=w.reshape(-1, 84).astype(np.float32), b__output0=b.ravel().astype(np.float32))


def _pose(path, bucket, seed=0):
    """17 keypoints, y and x about 0.2..0.8 of the input moved a little by the pixels, scores 0.1..0.95."""
    write_fake_model(path, bucket, seed=seed)
    with np.load(path) as d:
        w, b = d["W__keypoints"].reshape(-1, 17, 3), d["b__keypoints"].reshape(17, 3)
    w = w * np.array([0.001, 0.001, 0.0], dtype=np.float32)
    b[:, :2] = np.random.default_rng(seed).uniform(0.2, 0.8, (17, 2))
    b[:, 2] = np.linspace(0.1, 0.95, 17)
    np.savez(path, W__keypoints=w.reshape(-1, 51).astype(np.float32), b__keypoints=b.ravel().astype(np.float32))


MODELS = {"object-detection": _detector, "pose-estimation": _pose, "semantic-segmentation": write_fake_model}


@pytest.fixture(scope="module")
def runtimes(tmp_path_factory):
    real = FakeSession.run

    def counted(self, *a, **k):
        DEVICE_CALLS[0] += 1
        return real(self, *a, **k)

    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FakeSession, "run", counted)
        for task in TASKS:
            art = make_artifact(tmp_path_factory.mktemp(task.replace("-", "_")), task, write_model=MODELS[task])
            out[task] = er.load(art, device="fake", limits={"max_request_bytes": 1 << 20})
        yield out
    for rt in out.values():
        rt.close()


# regular files whose stat says 0 bytes and whose reads never end (pagemap: 8 bytes a page of the address
# space) or fail (mem at offset 0: EIO)
PROC_FILES = ("/proc/self/pagemap", "/proc/self/mem")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Paths of every kind: missing, a folder, empty, garbage, a real PNG, a symlink loop, devices, a FIFO."""
    d = tmp_path_factory.mktemp("paths")
    (d / "empty.png").write_bytes(b"")
    (d / "garbage.jpg").write_bytes(b"\xff\xd8\xff" + bytes(range(256)) * 4)
    (d / "ok.png").write_bytes(png_bytes(np.full((9, 13, 3), 77, np.uint8)))
    (d / "bomb.png").write_bytes(bomb_png(100_000, 100_000))
    os.symlink(d / "loop", d / "loop")
    os.mkfifo(d / "fifo")            # opened, it would block forever: refused by its stat
    procs = [p for p in PROC_FILES if os.path.exists(p)]
    return [str(d / n) for n in ("missing.png", "", "empty.png", "garbage.jpg", "ok.png", "bomb.png", "loop",
                                 "fifo")] + [str(d), "/dev/null", "/dev/zero", "x" * 5000, "a\x00b", "\ud800"] + procs


# -- strategies ---------------------------------------------------------------------------------------
def _pil_bytes(arr, fmt, mode=None, **kw):
    buf, img = io.BytesIO(), Image.fromarray(arr)
    (img.convert(mode) if mode else img).save(buf, format=fmt, **kw)
    return buf.getvalue()


def _exif(orient):
    ex = Image.Exif()
    ex[0x0112] = orient
    return ex.tobytes()


def _mangle(data, cut, at, byte):
    data = data[:max(1, cut)] if cut else data
    at %= len(data)
    return data[:at] + bytes([byte]) + data[at + 1:]


def _png(ihdr: bytes, idat: bytes, crc_ok=True, extra=b""):
    chunk = png_chunk(b"IHDR", ihdr)
    if not crc_ok:
        chunk = chunk[:-4] + b"\0\0\0\0"
    return b"\x89PNG\r\n\x1a\n" + chunk + extra + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")


def _jpeg_sof(w, h):
    """A JPEG's start and a baseline SOF declaring w x h, then nothing: a JPEG bomb's header."""
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, h, w, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    return b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00" + sof + b"\xff\xd9"


def _png_raw(w, h, depth, color, seed, plte):
    """A well-formed PNG of any bit depth / colour type (valid or not), its rows random, a PLTE or none."""
    bits = depth * {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(color, 1)
    rows = np.random.default_rng(seed).integers(0, 256, (h, 1 + (w * bits + 7) // 8), dtype=np.uint8)
    rows[:, 0] %= 5                                                          # the filter types
    extra = png_chunk(b"PLTE", bytes(i % 256 for i in range(3 * plte))) if plte else b""
    return _png(struct.pack(">IIBBBBB", w, h, depth, color, 0, 0, 0), zlib.compress(rows.tobytes()), extra=extra)


def _bmp(w, h, bpp, raw, compression=0):
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, bpp, compression, len(raw), 2835, 2835, 0, 0)
    return struct.pack("<2sIHHI", b"BM", 54 + len(raw), 0, 0, 54) + info + raw


sizes = st.tuples(st.integers(1, 40), st.integers(1, 40))
pixels = st.builds(lambda hw, seed: np.random.default_rng(seed).integers(0, 256, (*hw, 3), dtype=np.uint8),
                   sizes, st.integers(0, 1 << 16))
real_images = st.one_of(
    st.builds(lambda a, m: _pil_bytes(a, "PNG", m), pixels, st.sampled_from(["RGB", "L", "RGBA", "P", "LA", "I;16",
                                                                              "1"])),
    st.builds(lambda a, q: _pil_bytes(a, "JPEG", None, quality=q), pixels, st.integers(1, 95)),
    st.builds(lambda a: _pil_bytes(a, "JPEG", "CMYK"), pixels),
    st.builds(lambda a: _pil_bytes(a, "BMP"), pixels),
    st.builds(lambda a: _pil_bytes(a, "JPEG", None, progressive=True), pixels),
    st.builds(lambda a: _pil_bytes(a, "PNG", save_all=True, append_images=[Image.fromarray(a[::-1])]), pixels),
    st.builds(_png_raw, st.integers(1, 30), st.integers(1, 30), st.sampled_from([1, 2, 4, 8, 16]),
              st.sampled_from([0, 2, 3, 4, 6]), st.integers(0, 1 << 16), st.sampled_from([0, 2, 256])),
    st.builds(lambda a, o: _pil_bytes(a, "PNG", None, exif=_exif(o)), pixels, st.integers(0, 9)),
    st.builds(lambda a, o: _pil_bytes(a, "JPEG", None, exif=_exif(o)), pixels, st.integers(0, 9)),
)


hostile_bytes = st.one_of(
    images,                                                                 # test_fuzz.py's
    real_images,
    st.builds(_mangle, real_images, st.integers(0, 4000), st.integers(0, 1 << 20), st.integers(0, 255)),
    st.builds(lambda w, h, depth, color, idat, ok: _png(struct.pack(">IIBBBBB", w, h, depth, color, 0, 0, 0), idat, ok),
              st.integers(0, 70_000), st.integers(0, 70_000), st.sampled_from([0, 1, 2, 4, 8, 16, 3, 255]),
              st.sampled_from([0, 2, 3, 4, 6, 1, 7]), st.binary(max_size=60) | st.just(zlib.compress(b"\0" * 9000)),
              st.booleans()),
    st.builds(lambda n, body: _png(struct.pack(">IIBBBBB", 4, 4, 8, 2, 0, 0, 0), zlib.compress(b"\0" * 52),
                                   extra=struct.pack(">I", n) + b"tEXt" + body), st.sampled_from([0, 5, 1 << 31,
                                                                                                 0xFFFFFFFF]),
              st.binary(max_size=30)),                                     # a chunk claiming 4 GiB
    st.builds(_jpeg_sof, st.integers(0, 65535), st.integers(0, 65535)),
    st.builds(_bmp, st.integers(-70_000, 70_000), st.integers(-70_000, 70_000),
              st.sampled_from([0, 1, 4, 8, 16, 24, 32, 7, 64]), st.binary(max_size=80), st.integers(0, 6)),
)

DTYPES = [np.uint8, ">u2", np.int8, np.float32, np.float64, np.bool_, np.complex64, "<U1", np.object_]
image_arrays = st.one_of(
    arrays,                                                                 # test_fuzz.py's: every dtype, 0-4 dims
    st.builds(lambda a: a[::-1, ::2], pixels),                              # negative and doubled strides
    st.builds(np.asfortranarray, pixels),
    st.builds(lambda a: np.ascontiguousarray(a[:, :, :1]).repeat(4, 2), pixels),      # RGBA
    st.builds(lambda a: a[:, :, :2], pixels),                               # two channels
    st.builds(lambda hw, c: np.broadcast_to(np.uint8(9), (*hw, c) if c else hw),      # huge claimed, no memory
              st.tuples(st.integers(0, 1 << 40), st.integers(0, 1 << 20)) | st.tuples(st.integers(1, 3),
                                                                                     st.integers(1, 3000)),
              st.sampled_from([0, 1, 3, 4, 5])),
    st.builds(lambda shape, dt: np.zeros(shape, dtype=dt), st.tuples(st.integers(0, 6), st.integers(0, 6),
                                                                     st.integers(0, 4)), st.sampled_from(DTYPES)),
    st.builds(lambda a, v: np.where(a > 128, v, 0.5).astype(np.float32), pixels, st.sampled_from([np.nan, np.inf])),
    st.builds(lambda a: np.ma.masked_array(a, mask=a > 200), pixels),       # ndarray subclasses
    st.builds(lambda a: np.asmatrix(a[:, :, 0]), pixels),
    st.builds(lambda a: a.astype(">u2"), pixels),
    st.builds(lambda a: a.view([("r", "u1"), ("g", "u1"), ("b", "u1")]), pixels),
    st.builds(lambda a: a[:, :, :1], pixels),                               # H x W x 1
)
wrong = st.one_of(json_like, texts, st.sampled_from([None, 0, 1.5, float("nan"), True, object(), {1, 2}, (), b"",
                                                     bytearray(b"\x89PNG"), memoryview(b"BM"), np.uint8(3),
                                                     np.float32("nan"), Decimal(1), range(3), type]))

OPTION_KEYS = ("score_threshold", "iou_threshold", "max_detections")
option_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.floats(0, 1), st.integers(-(1 << 70), 1 << 70),
    st.integers(0, 400), st.booleans(), st.none(), st.text(max_size=5), st.sampled_from(["0.5", "nan", "3"]),
    st.builds(np.float32, st.floats(width=32)), st.builds(np.int64, st.integers(-(1 << 63), (1 << 63) - 1)),
    st.sampled_from([np.bool_(True), np.float16(0.5), np.float64("nan"), np.uint8(200), Fraction(1, 3),
                     Decimal("0.5"), 0.5 + 0j, [0.5], {"v": 1}, np.array(0.5)]))
valid_options = st.fixed_dictionaries({}, optional={
    "score_threshold": st.floats(0, 1), "iou_threshold": st.floats(0, 1, exclude_min=True),
    "max_detections": st.integers(1, 300)})
options = st.one_of(
    valid_options,
    st.dictionaries(st.sampled_from(OPTION_KEYS + ("Score_threshold", "", "nms", "max_det", "labels")), option_values,
                    max_size=4),
    st.dictionaries(st.sampled_from(OPTION_KEYS), option_values, min_size=1, max_size=3),
    json_like)


# -- the property -------------------------------------------------------------------------------------
class Hang(BaseException):
    """A case ran past its bound (BaseException: no ``except Exception`` in the runtime swallows it)."""

    @classmethod
    def alarm(cls, signum, frame):
        raise cls()


def _image_size(raw):
    """(width, height) of an input the runtime accepted, as a viewer shows it (EXIF orientation)."""
    if isinstance(raw, np.ndarray):
        return raw.shape[1], raw.shape[0]
    if isinstance(raw, (str, os.PathLike)):
        with open(os.fspath(raw), "rb") as fh:
            raw = fh.read()
    img = Image.open(io.BytesIO(bytes(raw)))
    w, h = img.size
    try:
        turn = img.getexif().get(0x0112) in (5, 6, 7, 8)
    except Exception:                   # noqa: BLE001 - as the decoder: an unreadable EXIF is no turn
        turn = False
    return (h, w) if turn else (w, h)


def check_result(task, raw, res, opts=None):
    assert res.device == "fake:cpu" and res.trace_id
    w, h = _image_size(raw)
    if task == "object-detection":
        th = {"score_threshold": 0.25, "max_detections": 20, **(opts or {})}
        dets = res.detections
        assert isinstance(dets, list) and len(dets) <= th["max_detections"]
        for d in dets:
            x1, y1, x2, y2 = d["box"]
            assert all(np.isfinite(d["box"])) and 0 <= x1 < x2 <= w and 0 <= y1 < y2 <= h, (d, w, h)
            assert isinstance(d["label"], str) and d["label"] in ("cat", "dog", "bird"), d
            assert 0 <= d["score"] <= 1 and d["score"] >= th["score_threshold"] - 1e-6, (d, th)
        assert [d["score"] for d in dets] == sorted((d["score"] for d in dets), reverse=True)
        assert res.prediction == (dets[0]["label"] if dets else None)
    elif task == "pose-estimation":
        assert len(res.keypoints) == 17
        for k in res.keypoints:
            assert np.isfinite([k["x"], k["y"], k["score"]]).all() and 0 <= k["x"] <= w and 0 <= k["y"] <= h, k
            assert 0 <= k["score"] <= 1 and isinstance(k["name"], str)
        assert list(res.outputs["image_size"]) == [h, w]
    else:
        mask = res.outputs["mask"]
        assert mask.shape == (h, w) and mask.dtype == np.uint8 and int(mask.max()) < 3
        assert abs(sum(res.scores.values()) - 1) < 1e-6 and res.prediction in ("background", "cat", "dog")


def refusal_ok(exc, calls_before, what):
    assert isinstance(exc, er.InputError), f"{what}: {type(exc).__name__}: {exc}"
    assert exc.code and exc.message and ec.CODES[exc.code].layer == "input", (what, exc.code)
    # the runtime's net for a task bug ("input could not be prepared: ValueError ..."): a typed crash
    assert exc.__cause__ is None or isinstance(exc.__cause__, er.EdgeRuntimeError), \
        f"{what}: untyped {type(exc.__cause__).__name__} in the task: {exc}"
    assert DEVICE_CALLS[0] == calls_before, f"{what}: {exc.code} raised after device work"


def bounded(fn):
    old = signal.signal(signal.SIGALRM, Hang.alarm)
    signal.setitimer(signal.ITIMER_REAL, 4 * BOUND_S)
    t0 = time.perf_counter()
    try:
        return fn()
    except Hang:
        pytest.fail(f"a case ran past {4 * BOUND_S} s (a hang)")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        assert time.perf_counter() - t0 < BOUND_S, "a case ran past its bound"


def _judge(task, raw, r, opts, calls, what, tally):
    if isinstance(r, er.InferenceResult):
        check_result(task, raw, r, opts if isinstance(opts, dict) else None)
        tally.update(result=1, detections=bool(r.detections))
    else:
        refusal_ok(r, calls, what)
        tally[r.code] += 1


def check(rt, raw, opts=None, tally=None):
    task, calls, what = rt.artifact.task, DEVICE_CALLS[0], f"{rt.artifact.task}: {raw!r:.200} options={opts!r:.100}"
    try:
        res = bounded(lambda: rt.infer(raw, deadline_ms=2000, options=opts))
        assert DEVICE_CALLS[0] == calls + 1, what
    except Exception as exc:                                  # noqa: BLE001 - judged by refusal_ok
        res = exc
    _judge(task, raw, res, opts, calls, what, Counter() if tally is None else tally)
    return None if isinstance(res, Exception) else res


def check_batch(rt, items, opts, tally):
    task, calls, what = rt.artifact.task, DEVICE_CALLS[0], f"{rt.artifact.task} batch: {items!r:.200} {opts!r:.100}"
    try:
        out = bounded(lambda: rt.infer_batch(items, deadline_ms=2000, options=opts))
    except Exception as exc:                                  # noqa: BLE001 - judged by refusal_ok
        return _judge(task, items, exc, opts, calls, what, tally)
    assert isinstance(items, (list, tuple, np.ndarray)) and len(out) == len(items), what
    for raw, r in zip(items, out):
        _judge(task, raw, r, opts, DEVICE_CALLS[0], f"{what} item {raw!r:.100}", tally)
    assert DEVICE_CALLS[0] - calls == sum(isinstance(r, er.InferenceResult) for r in out), what


def _cases(n, fixed_seed):
    """``n`` cases; ``fixed_seed`` (the fast run): the same cases every run, each (task, strategy) its own."""
    def wrap(fn):
        fn = settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck),
                      database=None if fixed_seed is not None else settings.default.database)(fn)
        return fn if fixed_seed is None else seed(fixed_seed)(fn)
    return wrap


def _run_all(runtimes, files, task, strategy, n, fixed=True) -> Counter:
    """Run ``n`` cases (``fixed``: seeded by task and strategy); the tally of their outcomes ("cases",
    "result", "detections", refusal codes)."""
    tally: Counter = Counter()
    case_seed = zlib.crc32(f"{task}/{strategy}".encode()) if fixed else None
    item = st.one_of(real_images, pixels, hostile_bytes, image_arrays, wrong, st.sampled_from(files))
    stacked = st.builds(lambda a, k: np.stack([a] * k), pixels, st.integers(1, 3))     # an N x H x W x 3 batch
    raws = {"bytes": hostile_bytes, "arrays": image_arrays, "wrong": wrong | st.sampled_from(files),
            "anything": anything, "options": real_images | pixels, "batches": st.one_of(
                st.lists(item, max_size=8), st.tuples(st.lists(item, max_size=7), pixels).map(lambda t: [*t[0], t[1]]),
                stacked, anything)}[strategy]     # the second: a batch holding one input that must succeed
    opts = {"options": options, "batches": st.one_of(st.none(), st.none(), st.none(), options)}.get(strategy, st.none())

    @_cases(n, case_seed)
    @given(raws, opts)
    def run(raw, opt):
        tally["cases"] += 1
        if strategy == "batches":
            check_batch(runtimes[task], raw, opt if task == "object-detection" else None, tally)
        else:
            check(runtimes[task], raw, opt, tally)
    run()
    return tally


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("strategy", STRATEGIES + ("batches", "options"))
def test_hostile_vision_inputs_fast(runtimes, files, task, strategy):
    tally = _run_all(runtimes, files, task, strategy, FAST)
    assert tally["cases"] >= FAST
    if strategy in ("bytes", "arrays", "options", "batches"):       # the cases reach the device and finish too
        assert tally["result"] >= 3 and (task != "object-detection" or tally["detections"]), dict(tally)


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("strategy", STRATEGIES + ("batches", "options"))
def test_hostile_vision_inputs_long(runtimes, files, task, strategy):
    from test_fuzz import peak_rss_mb

    before = peak_rss_mb()
    assert _run_all(runtimes, files, task, strategy, LONG, fixed=False)["cases"] >= LONG    # 18 x 200 = 3,600
    assert peak_rss_mb() - before < 256, "a hostile input drove the process's peak memory up"


# -- regressions --------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", TASKS)
def test_every_path_is_refused_or_read(runtimes, files, task):
    for path in files:
        check(runtimes[task], path)


def _refused(rt, raw, code):
    calls = DEVICE_CALLS[0]
    with pytest.raises(er.InputError) as ei:
        bounded(lambda: rt.infer(raw))
    refusal_ok(ei.value, calls, repr(raw))
    assert ei.value.code == code, ei.value


def test_impossible_path_names_are_unreadable_files(runtimes):
    """A NUL byte or a lone surrogate in a path: was the runtime's net ("input could not be prepared:
    ValueError: embedded null byte", input_invalid)."""
    import pathlib

    for raw in ("a\x00b.png", "\ud800.png", pathlib.Path("x\x00")):
        _refused(runtimes["object-detection"], raw, ec.INPUT_FILE_UNREADABLE)


def test_a_pathlike_naming_its_file_in_bytes_is_read(runtimes, files):
    """``os.PathLike`` may return bytes (``os.fsencode``): it was refused by the net (pathlib's TypeError)."""
    class BytesPath:
        def __init__(self, p):
            self.p = p

        def __fspath__(self):
            return self.p

    ok = next(f for f in files if f.endswith("ok.png"))
    res = check(runtimes["semantic-segmentation"], BytesPath(os.fsencode(ok)))
    assert res is not None and res.outputs["mask"].shape == (9, 13)
    _refused(runtimes["pose-estimation"], BytesPath(5), ec.INPUT_WRONG_TYPE)


def test_endless_and_unreadable_regular_files_are_refused(runtimes, files, monkeypatch):
    """``/proc/self/pagemap`` is a regular file whose stat says 0 bytes and whose reads never end (the address
    space, 8 bytes a page): read whole, it was an untyped OSError (EINVAL) for the runtime's net; now at most the
    limit is read. A file whose open fails after its stat (permissions, gone) was an untyped OSError too."""
    from edge_runtime.models import image_decode

    rt = runtimes["pose-estimation"]
    if os.path.exists(PROC_FILES[0]):
        _refused(rt, PROC_FILES[0], ec.INPUT_TOO_LARGE)

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(image_decode, "open", denied, raising=False)
    _refused(rt, next(f for f in files if f.endswith("ok.png")), ec.INPUT_FILE_UNREADABLE)

