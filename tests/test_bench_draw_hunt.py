"""Figures and pictures that must not lie: ``edge-infer bench`` (the CPU named, the raw side run as
ours runs, warm on both sides, percentiles from too few calls marked, failed items not counted,
the cold-start child loading what the parent runs) and ``draw`` (a PIL image decoded as the tasks
decode a file, tags readable on a large photo, a mask of another size refused)."""

import io
import json
import time

import numpy as np
import pytest
from click.testing import CliRunner

from edge_runtime import benchmark
from edge_runtime.cli import main
from edge_runtime.draw import class_color, draw


def bench_json(*args):
    res = CliRunner().invoke(main, ["bench", *map(str, args), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output[res.output.index("{"):])


def bench_text(*args):
    res = CliRunner().invoke(main, ["bench", *map(str, args)])
    assert res.exit_code == 0, res.output
    return res.output


# -- bench ------------------------------------------------------------------------------------

def test_bench_names_the_cpu_in_json_and_text(make_artifact):
    from edge_runtime import hardware as hw

    art = make_artifact("text-classification", buckets=(8,))
    model = (hw.detect_cached().get("cpu") or {}).get("model")
    d = bench_json(art, "--calls", "2", "--repeats", "1", "--no-cold")
    assert model and model in d["cpu"] and d["host"]["cpu"] == model
    text = bench_text(art, "--calls", "2", "--repeats", "1", "--no-cold")
    assert f"CPU: {d['cpu']}" in text


class _SlowFirstRaw:
    """A raw runner whose first call is slow (session set-up), as ORT's and LiteRT's are."""

    def __init__(self, first_s=0.25):
        self.first_s, self.calls = first_s, 0

    def run(self, feeds):
        self.calls += 1
        if self.calls == 1:
            time.sleep(self.first_s)
        return []

    def run_async(self, feeds_list, concurrency=2):
        return [self.run(f) for f in feeds_list]


def test_raw_latency_excludes_the_raw_runners_first_call(make_artifact, monkeypatch):
    art = make_artifact("text-classification", buckets=(8,))
    monkeypatch.setattr(benchmark, "raw_runner", lambda *a, **k: _SlowFirstRaw())
    d = benchmark.run_bench(art, calls=3, repeats=1, cold=False)
    raw = d["warm_latency"]["seq8"]["raw_ms"]
    assert raw["p99"] < 100, raw            # the 250 ms set-up call is not a warm latency


def test_raw_runner_gets_the_threads_ours_runs_with(make_artifact, monkeypatch):
    import edge_runtime.runtime as runtime

    art = make_artifact("text-classification", buckets=(8,))
    seen = []
    monkeypatch.setattr(runtime, "fit_threads", lambda rt, backend, open_bucket: {"threads": 1, "why": "test"})
    monkeypatch.setattr(benchmark, "raw_runner", lambda backend, path, bucket, options: seen.append(options))
    d = benchmark.run_bench(art, calls=2, repeats=1, cold=False)
    assert seen and all(o.get("threads") == 1 for o in seen), seen
    assert d["threads"] == 1


def test_openvino_raw_runner_honours_the_thread_count():
    pytest.importorskip("openvino")
    from conftest import shared
    from edge_runtime.bench_raw import OvRaw

    model = shared("onnx_node", "test_relu", "model.onnx")
    raw = OvRaw(str(model), {"threads": 1})
    assert int(raw.latency.get_property("INFERENCE_NUM_THREADS")) == 1


def test_percentiles_from_too_few_calls_are_marked(make_artifact):
    art = make_artifact("text-classification", buckets=(8,))
    d = bench_json(art, "--calls", "5", "--repeats", "1", "--no-cold")
    e = d["warm_latency"]["seq8"]
    assert e["calls_per_round"] == 5 and e["few_calls_for"] == ["p95", "p99"]
    text = bench_text(art, "--calls", "5", "--repeats", "1", "--no-cold")
    assert "latency seq8 p99 (ms)*" in text and "latency seq8 p50 (ms)*" not in text
    assert "from 5 calls a round: too few" in text
    assert benchmark.few_calls_for(100) == []


def test_throughput_counts_only_the_items_done(make_artifact, monkeypatch):
    from edge_runtime.errors import InputError
    from edge_runtime.runtime_call import CallPath

    art = make_artifact("text-classification", buckets=(8,))
    real = CallPath.infer_batch

    def half_fail(self, items, **kw):
        out = real(self, items, **kw)
        return [InputError("refused", code="input_invalid") if i % 2 else r for i, r in enumerate(out)]

    monkeypatch.setattr(CallPath, "infer_batch", half_fail)
    d = bench_json(art, "--calls", "8", "--repeats", "1", "--batch-size", "4", "--no-cold")
    assert d["throughput"]["ours_async_failed"] == 4
    text = bench_text(art, "--calls", "8", "--repeats", "1", "--batch-size", "4", "--no-cold")
    assert "4 of 8 items failed" in text


def test_cold_start_child_loads_what_the_parent_runs(make_artifact):
    art = make_artifact("text-classification", buckets=(8,))
    d = benchmark.run_bench(art, calls=1, repeats=1)
    c = d["cold_start"]
    assert c["ours_device"] == d["device"] and "device_differs" not in c, c


# -- draw -------------------------------------------------------------------------------------

def _tag_height(out, x, y_box, color):
    col = np.asarray(out).astype(int)[:y_box, x + 3]
    return int((col == np.array(color)).all(axis=-1).sum())


def test_tags_stay_readable_on_a_large_photo():
    w, h = 4000, 3000
    img = np.full((h, w, 3), 128, np.uint8)
    res = {"prediction": None, "scores": {}, "detections": [{"label": "car", "class_id": 3, "score": 0.9,
                                                             "box": [800, 1200, 2400, 2600]}]}
    tag = _tag_height(draw(img, res), 800, 1200, class_color(3))
    # seen whole (scaled to 1000 pixels high) a tag must keep ~15 pixels: 45 here
    assert tag >= 45, tag


def _jpeg_with_orientation(arr, orientation):
    from PIL import Image

    buf = io.BytesIO()
    ex = Image.Exif()
    ex[0x0112] = orientation
    Image.fromarray(arr).save(buf, format="JPEG", quality=95, exif=ex.tobytes())
    return buf.getvalue()


def test_a_pil_image_is_drawn_upright_as_the_task_saw_it():
    from PIL import Image

    stored = np.zeros((60, 100, 3), np.uint8)        # stored 100 wide, 60 high: shown 60 wide, 100 high
    stored[:, :50] = 200
    raw = _jpeg_with_orientation(stored, 6)
    res = {"prediction": None, "scores": {}, "detections": [{"label": "x", "class_id": 0, "score": 0.9,
                                                             "box": [10, 10, 50, 90]}]}
    from_bytes = np.asarray(draw(raw, res))
    from_pil = np.asarray(draw(Image.open(io.BytesIO(raw)), res))
    assert from_pil.shape == from_bytes.shape == (100, 60, 3)
    assert np.abs(from_pil.astype(int) - from_bytes.astype(int)).max() <= 1


def test_a_16_bit_pil_image_is_scaled_not_clipped_to_white():
    from PIL import Image

    a = np.full((30, 40), 32896, np.uint16)           # 0.502 of full scale: 128 in 8 bits
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    img = Image.open(io.BytesIO(buf.getvalue()))
    assert img.mode.startswith("I")
    out = np.asarray(draw(img, {"prediction": None, "scores": {}, "detections": []}))
    assert (out == 128).all()


def test_a_mask_of_another_size_is_refused_not_stretched():
    mask = np.zeros((20, 30), np.uint8)
    mask[5:10, 5:10] = 1
    res = {"prediction": "cat", "scores": {"background": 0.9, "cat": 0.1},
           "outputs": {"mask": {"dtype": "uint8", "shape": [20, 30], "data": mask.tolist()}}}
    with pytest.raises(ValueError, match="not this image"):
        draw(np.zeros((40, 60, 3), np.uint8), res)
