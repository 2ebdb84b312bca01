"""Wrong answers hunted in the serve and Ray paths of the vision tasks, on the real models (2026-12 hunt).

Ray (``score --engine ray``) on a detector: a relative image path went to the actors as it was, and an actor
opens it from ITS working directory (where its node's raylet was started), not the driver's, where local
``score`` opens it. On a cluster started elsewhere, or on another node, the actor scored another file of
that name, exit 0 (YOLOv8n: zidane's people for bus.jpg), or none. Now the driver makes every relative image
path absolute (``ray_io.absolute_paths``), as it already did the artifact's path.

(Serve: EXIF-rotated JPEGs, RGBA/grayscale/16-bit PNGs, UINT8 [H,W]/[H,W,1]/[H,W,4]/[N,H,W,C], per-request
detection options on several items and bad option values were compared with in-process ``rt.infer`` on
YOLOv8n, SSD MobileNet, MoveNet and DeepLabV3: all equal, no test here.)
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from conftest import need_litert, shared

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# -- the records the driver hands to Ray (no Ray started) ---------------------------------------------
def test_an_image_tasks_relative_paths_go_to_the_actors_absolute(tmp_path, monkeypatch):
    from edge_runtime.score_ray import _records

    data, work = tmp_path / "data", tmp_path / "work"
    data.mkdir()
    work.mkdir()
    monkeypatch.chdir(work)
    # --field img (not image/path/file): relative to the working directory, as local score takes it
    jl = _jsonl(data / "in.jsonl", [{"id": "a", "img": "imgs/x.jpg"}, {"id": "b", "img": "/abs/y.jpg"},
                                    {"id": "c", "img": ""}])
    got = [r.value for r in _records(jl, None, "img", None, 1 << 20, images=True)]
    assert got == [str(work / "imgs" / "x.jpg"), "/abs/y.jpg", ""]
    # the image field: joined to the file's folder by the reader; a relative input path made absolute too
    _jsonl(data / "rel.jsonl", [{"id": "a", "image": "imgs/x.jpg"}])
    got = [r.value for r in _records(Path("../data/rel.jsonl"), None, "image", None, 1 << 20, images=True)]
    assert got == [os.path.join(str(work), "../data", "imgs/x.jpg")]
    pq.write_table(pa.table({"id": ["a", "b"], "image": ["imgs/x.jpg", None]}), data / "in.parquet")
    recs = list(_records(data / "in.parquet", None, "image", None, 1 << 20, images=True))
    assert recs[0].value == str(work / "imgs" / "x.jpg") and recs[1].error is not None
    # a text task's values are texts, never paths
    _jsonl(data / "t.jsonl", [{"id": "a", "text": "imgs/x.jpg"}])
    assert [r.value for r in _records(data / "t.jsonl", None, "text", None, 1 << 20)] == ["imgs/x.jpg"]


# -- end to end: a Ray whose workers start in another folder than the driver's --------------------------
@pytest.mark.slow
def test_ray_scores_the_files_local_score_scores_whatever_the_actors_folder(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    need_litert()
    from edge_runtime.converters.tflite_import import import_tflite
    from edge_runtime.runtime import load
    from edge_runtime.score import score
    from edge_runtime.score_inputs import read_records
    from edge_runtime.score_ray import score_ray

    text = shared("detection", "yolov8n_tflite", "metadata.yaml").read_text()
    names = dict((int(k), v.strip()) for k, v in re.findall(r"^\s+(\d+):\s*(.+)$", text, flags=re.M))
    (tmp_path / "coco80.txt").write_text("\n".join(names[i] for i in range(80)) + "\n")
    art = tmp_path / "det"
    import_tflite(shared("detection", "yolov8n_tflite", "yolov8n_full_integer_quant.tflite"), art,
                  task="object-detection", labels=tmp_path / "coco80.txt", scale="1/255")
    driver, elsewhere = tmp_path / "driver", tmp_path / "elsewhere"
    for folder, photo in ((driver, "bus.jpg"), (elsewhere, "zidane.jpg")):   # one name, two photos
        (folder / "imgs").mkdir(parents=True)
        (folder / "imgs" / "x.jpg").write_bytes(shared("detection", "images", photo).read_bytes())
    inputs = _jsonl(tmp_path / "in.jsonl", [{"id": "a", "img": "imgs/x.jpg"}])
    pq.write_table(pa.table({"id": ["a"], "image": ["imgs/x.jpg"]}), tmp_path / "in.parquet")

    monkeypatch.chdir(elsewhere)            # the raylet, so every worker, starts here (a `ray start` elsewhere)
    ray.init(address="local", num_cpus=2, object_store_memory=100_000_000, include_dashboard=False,
             logging_level="WARNING", log_to_driver=False)
    try:
        monkeypatch.chdir(driver)
        with load(art) as rt:
            score(rt, read_records(inputs, field="img"), tmp_path / "local.jsonl")
        local = json.loads((tmp_path / "local.jsonl").read_text())["result"]["detections"]
        assert {d["label"] for d in local} >= {"bus", "person"}             # bus.jpg, the driver's file
        for src, out in ((inputs, "ray.jsonl"), (tmp_path / "in.parquet", "ray-pq.jsonl")):
            score_ray(art, src, tmp_path / out, field="img" if src == inputs else "image",
                      batch_size=1, actors=1)
            line = json.loads((tmp_path / out).read_text())
            assert line["ok"], line
            # was zidane.jpg's people and tie (the actor's folder), with exit 0
            assert line["result"]["detections"] == local, (src.name, line["result"]["detections"])
    finally:
        ray.shutdown()
