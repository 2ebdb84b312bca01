"""Does ``convert`` calibrate, measure parity and record probe references on exactly the tensors
the runtime feeds? (the 2026-12-07 calibration-tensor hunt)

Each test converts a small model with spies on what the toolchain is handed (ONNX Runtime's
calibration reader, NNCF's dataset), on the fp32 reference sessions (the probe references and
the parity reference) and on the candidate sessions parity runs, then compares every recorded
tensor bit for bit with ``er.load(art).task.prepare(raw, rt.limits).feeds`` of the same raw
sample: an image calibration folder with an RGB JPEG (a mode conversion to the model's
grayscale) and non-square images (the resize path); texts of every length over two buckets with
token type ids (the bucket, the padding, the mask); a letterboxed detector (the pad value).

The defect found: convert prepared every sample under the default limits, not the artifact's
(``ConvertRequest.limits``, which the manifest records and the runtime applies). Samples the
artifact refuses (an image over its ``max_image_pixels``, a text over its ``max_text_chars``) were
calibrated on, measured for parity and written into the probe set, which ``verify`` then refused
(``ArtifactError``); a detector's probe references were cut at the default ``max_detections``,
the runtime's answers at the artifact's (verify read F1 0.75 for identical models); and a limit
the runtime refuses (``max_text_chars: 0``) gave an artifact that cannot load, with exit 0.
"""

from __future__ import annotations

import contextlib
import shutil

import numpy as np
import pytest

import edge_runtime as er
from edge_runtime import error_codes as ec
from edge_runtime.converters.zoo import ZOO, convert_request
from edge_runtime.errors import InputError
from factories import WORDS, tiny_tokenizer_json

pytest.importorskip("onnxruntime")


class _Rec:
    """A session that records the feeds it is run with."""

    def __init__(self, session, log: list):
        self._s, self._log = session, log

    def run(self, feeds):
        self._log.append({k: np.array(v) for k, v in feeds.items()})
        return self._s.run(feeds)

    def __getattr__(self, name):
        return getattr(self._s, name)


class _Spy:
    """What one convert handed the toolchains and ran the fp32 and candidate sessions on."""

    def __init__(self, monkeypatch):
        from edge_runtime.converters import onnx_quant, parity, pipeline

        self.calib: list[list[dict]] = []       # per toolchain call: the calibration feeds
        self.samples = None                      # split_samples' Samples
        self.probe_runs: list[dict] = []         # the fp32 runs of write_probe
        self.parity: list[tuple[list, list, list]] = []   # (held-out raws, fp32 feeds, candidate feeds)
        ref_log: list[dict] = []
        real_reader, real_split = onnx_quant._Reader.__init__, pipeline.split_samples
        real_sessions, real_probe, real_measure = pipeline.reference_sessions, pipeline.write_probe, parity.measure

        def reader(this, feeds):
            self.calib.append([{k: np.array(v) for k, v in f.items()} for f in feeds])
            real_reader(this, feeds)

        def split(*a, **k):
            self.samples = real_split(*a, **k)
            return self.samples

        @contextlib.contextmanager
        def sessions(job):
            with real_sessions(job) as got:
                yield [_Rec(s, ref_log) for s in got]

        def probe(job, ref, progress):
            n = len(ref_log)
            out = real_probe(job, ref, progress)
            self.probe_runs = ref_log[n:]
            return out

        def measure(task_ref, sessions_ref, task_cand, sessions_cand, held, *a, **k):
            n, cand = len(ref_log), []
            out = real_measure(task_ref, sessions_ref, task_cand, [_Rec(s, cand) for s in sessions_cand], held,
                               *a, **k)
            self.parity.append((list(held), ref_log[n:], cand))
            return out

        monkeypatch.setattr(onnx_quant._Reader, "__init__", reader)
        monkeypatch.setattr(pipeline, "split_samples", split)
        monkeypatch.setattr(pipeline, "reference_sessions", sessions)
        monkeypatch.setattr(pipeline, "write_probe", probe)
        monkeypatch.setattr(parity, "measure", measure)

    def spy_nncf(self, monkeypatch):
        nncf = pytest.importorskip("nncf")
        calib = self.calib

        class Dataset(nncf.Dataset):       # a class: NNCF's annotations use the name in `X | None`
            def __init__(self, items, *a, **k):
                items = list(items)
                calib.append([{n: np.array(v) for n, v in f.items()} for f in items])
                super().__init__(items, *a, **k)

        monkeypatch.setattr(nncf, "Dataset", Dataset)


def _same(got: list[dict], want: list[dict], what: str) -> None:
    """Bit for bit: the same feed names, dtypes, shapes and values, sample by sample."""
    assert len(got) == len(want), f"{what}: {len(got)} tensors recorded, the runtime prepares {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        assert sorted(g) == sorted(w), f"{what} {k}: feeds {sorted(g)} != the runtime's {sorted(w)}"
        for name in w:
            assert g[name].dtype == w[name].dtype and g[name].shape == w[name].shape, (what, k, name)
            assert np.array_equal(g[name], w[name]), f"{what} {k}: {name} differs from the runtime's tensor"


def _runtime_feeds(rt, raws) -> list[dict]:
    """The runtime's tensors for ``raws`` (an InputError: a sample this artifact refuses)."""
    return [rt.task.prepare(raw, rt.limits).feeds for raw in raws]


def _check_every_tensor(spy: _Spy, art, calib_sets: int = 1, routed: bool = False) -> None:
    """Calibration, parity (both sides) and the probe references: the runtime's tensors, and
    the probe set read back from the artifact is what the references were computed on."""
    from edge_runtime.probe import read

    rt = er.load(art)
    try:
        calib = spy.samples.calib
        assert len(spy.calib) == calib_sets
        for bucket, feeds in enumerate(spy.calib):
            if routed:      # per bucket: the samples the runtime routes to it (the others are padded or cut)
                idx = [i for i, raw in enumerate(calib) if rt.task.prepare(raw, rt.limits).bucket == bucket]
                assert idx, f"no calibration sample reaches bucket {bucket}"
                _same([feeds[i] for i in idx], _runtime_feeds(rt, [calib[i] for i in idx]), f"calibration b{bucket}")
            else:
                _same(feeds, _runtime_feeds(rt, calib), "calibration")
        assert spy.parity
        for held, ref, cand in spy.parity:
            want = _runtime_feeds(rt, held)
            _same(ref, want, "parity fp32 reference")
            _same(cand, want, "parity candidate")
        probe = read(rt.artifact)
        assert probe.inputs
        _same(spy.probe_runs, _runtime_feeds(rt, probe.inputs), "probe references")
    finally:
        rt.close()
    return None


def _verify(art) -> dict:
    from edge_runtime.verify import verify_artifact

    return verify_artifact(art)


# -- image classification: digits, grayscale 8x8 ---------------------------------------------------

def _digits_data(tmp_path):
    """The zoo's calibration plus an RGB JPEG, non-square images and two over 1000 pixels;
    40 held-out digits and two over 1000 pixels, sorted first (spread puts them in the probe set)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    cal = tmp_path / "cal"
    shutil.copytree(ZOO / "digits-cnn" / "calibration", cal)
    Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "RGB").save(cal / "rgb.jpg", quality=90)
    Image.fromarray(rng.integers(0, 256, (20, 12), dtype=np.uint8), "L").save(cal / "tall.png")
    Image.fromarray(rng.integers(0, 256, (17, 30, 3), dtype=np.uint8), "RGB").save(cal / "wide_rgb.jpg")
    for i in range(2):
        Image.fromarray(rng.integers(0, 256, (40, 40), dtype=np.uint8), "L").save(cal / f"big{i}.png")
    held = tmp_path / "held"
    held.mkdir()
    for i, f in enumerate(sorted((ZOO / "digits-cnn" / "held_out").rglob("*.png"))[::9][:40]):
        shutil.copy(f, held / f"d{i:03d}.png")
    for i in range(2):
        Image.fromarray(rng.integers(0, 256, (36, 36), dtype=np.uint8), "L").save(held / f"a_big{i}.png")
    return cal, held


@pytest.mark.parametrize("targets", [["onnx-int8"], ["onnx-int8", "openvino"]], ids=["onnx-int8", "openvino"])
def test_image_calibration_parity_and_probe_are_the_runtimes_tensors(tmp_path, monkeypatch, targets):
    # before: the 1600-pixel images, over the artifact's max_image_pixels 1000, were calibrated on,
    # measured and put in the probe set (convert exit 0); the runtime refuses each of them, and
    # verify refused the artifact ("probe sample 0 of 16 is refused ... over the limit of 1000")
    from edge_runtime.converters import pipeline

    spy = _Spy(monkeypatch)
    if "openvino" in targets:
        spy.spy_nncf(monkeypatch)
    cal, held = _digits_data(tmp_path)
    art = tmp_path / "art"
    lines: list[str] = []
    man = pipeline.convert(convert_request("digits-cnn", "image-classification", art, calibration=cal,
                                           parity_data=held, targets=targets, probe_samples=16,
                                           limits={"max_image_pixels": 1000}), lines.append)
    assert man["limits"] == {"max_image_pixels": 1000}
    assert len(spy.samples.calib) == 203 and len(spy.samples.held) == 40      # the big ones left out, said
    assert any("2 of the 205 --calibration samples cannot be prepared" in x and "over the limit of 1000" in x
               for x in lines), lines
    assert "2 the model cannot take" in man["variants"][0]["quantization"]["calibration"]["left_out"]
    _check_every_tensor(spy, art, calib_sets=len(targets))
    assert _verify(art)["verdict"] == "pass"


# -- text classification: two buckets, token type ids ----------------------------------------------

def _tiny_text_onnx(path):
    """Token + type embeddings, masked sum, one MatMul to 3 logits, over the factories' vocabulary."""
    import onnx
    from onnx import TensorProto as T, helper as h, numpy_helper as nh

    rng = np.random.default_rng(0)
    nodes = [h.make_node("Gather", ["emb", "input_ids"], ["e0"], axis=0),
             h.make_node("Gather", ["temb", "token_type_ids"], ["te"], axis=0),
             h.make_node("Add", ["e0", "te"], ["e"]),
             h.make_node("Cast", ["attention_mask"], ["mf"], to=T.FLOAT),
             h.make_node("Unsqueeze", ["mf", "ax"], ["m3"]),
             h.make_node("Mul", ["e", "m3"], ["em"]),
             h.make_node("ReduceSum", ["em", "one"], ["s"], keepdims=0),
             h.make_node("MatMul", ["s", "W"], ["logits"])]
    ins = [h.make_tensor_value_info(n, T.INT64, ["b", "s"]) for n in ("input_ids", "attention_mask", "token_type_ids")]
    graph = h.make_graph(nodes, "tiny-text", ins, [h.make_tensor_value_info("logits", T.FLOAT, ["b", 3])],
                         [nh.from_array(rng.normal(size=(4 + len(WORDS), 8)).astype(np.float32), "emb"),
                          nh.from_array(rng.normal(size=(2, 8)).astype(np.float32), "temb"),
                          nh.from_array(rng.normal(size=(8, 3)).astype(np.float32), "W"),
                          nh.from_array(np.array([2], np.int64), "ax"), nh.from_array(np.array([1], np.int64), "one")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_text_calibration_parity_and_probe_are_the_runtimes_tensors(tmp_path, monkeypatch):
    # before: texts over the artifact's max_text_chars (48) were calibrated on in both buckets,
    # measured and put in the probe set; the runtime refuses them, and verify refused the artifact
    from edge_runtime.converters import pipeline
    from edge_runtime.converters.request import ConvertRequest

    spy = _Spy(monkeypatch)
    rng = np.random.default_rng(1)
    (tmp_path / "tokenizer.json").write_text(tiny_tokenizer_json())
    texts = [" ".join(rng.choice(WORDS, n)) for n in range(1, 12) for _ in range(16)]
    assert sum(len(t) > 48 for t in texts) > 20
    (tmp_path / "cal.txt").write_text("\n".join(texts) + "\n")
    art = tmp_path / "art"
    lines: list[str] = []
    man = pipeline.convert(ConvertRequest(
        source=_tiny_text_onnx(tmp_path / "model.onnx"), out=art, task="text-classification", targets=["onnx-int8"],
        calibration=tmp_path / "cal.txt", tokenizer=tmp_path / "tokenizer.json", buckets=[4, 8],
        recipe_overrides={"exclude_gelu_matmuls": False}, probe_samples=16, min_parity=0.5,
        limits={"max_text_chars": 48}), lines.append)
    assert all(len(t) <= 48 for t in spy.samples.calib + spy.samples.held)
    assert any("cannot be prepared" in x and "over the limit of 48" in x for x in lines), lines
    assert man["probe"]["buckets"]["seq4"] >= 4 and man["probe"]["buckets"]["seq8"] >= 4
    _check_every_tensor(spy, art, calib_sets=2, routed=True)
    assert _verify(art)["verdict"] == "pass"


# -- object detection: a letterboxed tiny YOLO with fixed boxes ------------------------------------

def _tiny_yolo(path):
    """float [1, 3, 32, 32] -> [1, 6, 64] (cx, cy, w, h, 2 class scores): five fixed, disjoint boxes
    of class 0 scored .95, .80, .65, .50, .35 (15 points apart, over int8's step), a small image term."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    fixed = np.zeros((1, 6, 64), np.float32)
    for k, score in enumerate((0.95, 0.8, 0.65, 0.5, 0.35)):
        fixed[0, :5, k * 12] = (4 + 6 * k, 4 + 6 * k, 4, 4, score)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["images", "w"], ["c"], strides=[4, 4]),
         helper.make_node("Reshape", ["c", "shape"], ["r"]),
         helper.make_node("Mul", ["r", "eps"], ["small"]),
         helper.make_node("Add", ["small", "fixed"], ["output0"])], "tiny_yolo",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 6, 64])],
        [numpy_helper.from_array(rng.uniform(0, 1, (6, 3, 1, 1)).astype(np.float32), "w"),
         numpy_helper.from_array(np.array([1, 6, 64], np.int64), "shape"),
         numpy_helper.from_array(np.array(0.001, np.float32), "eps"), numpy_helper.from_array(fixed, "fixed")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def test_detector_probe_references_are_capped_as_the_runtime_caps(tmp_path, monkeypatch):
    # before: the probe references held the 5 boxes (the default limit's cap of 300), the runtime
    # answers 3 (the artifact's max_detections): verify read F1 0.75 for the same int8 model and
    # failed it (budget 0.9)
    from PIL import Image

    from edge_runtime.converters import pipeline
    from edge_runtime.converters.request import ConvertRequest
    from edge_runtime.probe import read

    spy = _Spy(monkeypatch)
    rng = np.random.default_rng(1)
    for side, n in (("calib", 20), ("parity", 8)):
        (tmp_path / side).mkdir()
        for i in range(n):      # non-square: letterboxed with the family's pad
            Image.fromarray(rng.integers(0, 256, (30 + i, 40, 3), dtype=np.uint8)).save(tmp_path / side / f"{i}.png")
    Image.fromarray(rng.integers(0, 256, (20, 20), dtype=np.uint8), "L").save(tmp_path / "calib" / "gray.png")
    (tmp_path / "labels.txt").write_text("a\nb\n")
    art = tmp_path / "art"
    man = pipeline.convert(ConvertRequest(
        source=_tiny_yolo(tmp_path / "yolo.onnx"), out=art, task="object-detection", targets=["onnx-int8"],
        calibration=tmp_path / "calib", parity_data=tmp_path / "parity", labels=tmp_path / "labels.txt",
        postprocess={"family": "yolo"}, probe_samples=8, allow_few_samples=True, min_parity=0.9,
        limits={"max_detections": 3}))
    assert man["preprocess"]["resize"] == "letterbox" and man["preprocess"]["pad"] == 114
    _check_every_tensor(spy, art)
    probe = read(er.load(art).artifact)
    assert all(len(r.detections) == 3 for r in probe.reference)
    res = _verify(art)
    assert res["verdict"] == "pass" and res["chosen"]["value"] == 1.0, res["chosen"]


# -- a limit the runtime refuses ---------------------------------------------------------------------

@pytest.mark.parametrize("limits, code", [({"max_text_chars": 0}, ec.LIMIT_INVALID),
                                          ({"max_image_pixel": 10}, ec.LIMIT_UNKNOWN)])
def test_a_limit_the_runtime_refuses_is_refused_by_convert(tmp_path, limits, code):
    # before: convert wrote the limit into the manifest (exit 0) and every load of the artifact
    # failed (ArtifactError limit_invalid / limit_unknown)
    from edge_runtime.converters import pipeline

    art = tmp_path / "art"
    with pytest.raises(InputError) as ei:
        pipeline.convert(convert_request("digits-cnn", "image-classification", art, probe_samples=0, limits=limits))
    assert ei.value.code == code, ei.value
    assert not art.exists() and not list(tmp_path.iterdir())
