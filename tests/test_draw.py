"""Vision results drawn onto their image (``edge_runtime.draw``), checked as a person sees them:
the pixels of the picture, the CLI's ``--draw`` file, its tables, and ``score`` over an image folder."""

import json
import subprocess
import sys

import numpy as np
import pytest

from edge_runtime.draw import (PALETTE, class_color, draw, keypoint_color, save, skeleton, summarize)
from factories import png_bytes

GREY = 128


def plain(w=200, h=160, value=GREY):
    return np.full((h, w, 3), value, dtype=np.uint8)


def px(img):
    return np.asarray(img).astype(int)


def is_color(a, color):
    return (a == np.array(color)).all(axis=-1)


def det(box, class_id=3, label="car", score=0.92):
    return {"label": label, "class_id": class_id, "score": score, "box": box}


# -- detections -----------------------------------------------------------------------------

def test_box_edges_have_the_class_colour_and_the_inside_is_unchanged():
    x1, y1, x2, y2 = 40, 50, 150, 130
    out = px(draw(plain(), {"prediction": "car", "scores": {}, "detections": [det([x1, y1, x2, y2])]}))
    color = class_color(3)
    assert out.shape == (160, 200, 3)
    mid_y, mid_x = (y1 + y2) // 2, (x1 + x2) // 2
    assert is_color(out[mid_y, x1], color) and is_color(out[mid_y, x2 - 1], color)     # left, right edges
    assert is_color(out[y1, mid_x], color) and is_color(out[y2 - 1, mid_x], color)     # top, bottom edges
    assert (out[y1 + 3:y2 - 3, x1 + 3:x2 - 3] == GREY).all()                              # inside: untouched
    # the label tag sits right above the box, filled with the class colour
    tag = out[:y1, x1:]
    assert is_color(tag, color).sum() > 50
    # every other pixel changed is on the box's edges or in the tag above it
    changed = (out != GREY).any(axis=-1)
    edge_band = np.zeros_like(changed)
    edge_band[y1:y2, x1:x2] = True
    edge_band[y1 + 3:y2 - 3, x1 + 3:x2 - 3] = False
    in_tag = np.zeros_like(changed)
    in_tag[y1 - 30:y1, x1:x1 + 120] = True
    assert not (changed & ~edge_band & ~in_tag).any()


def test_tag_of_a_box_at_the_top_edge_stays_inside_the_image():
    out = px(draw(plain(), {"prediction": None, "scores": {}, "detections": [det([10, 0, 120, 90], class_id=5)]}))
    color = class_color(5)
    assert is_color(out[45, 10], color)                               # the box's left edge
    assert is_color(out[3:15, 15:40], color).sum() > 20              # the tag: inside the box, at its top
    assert (out[30:80, 20:110] == GREY).all()                         # below the tag the inside is unchanged


def test_colours_are_per_class_and_deterministic():
    result = {"prediction": None, "scores": {},
              "detections": [det([10, 40, 60, 100], class_id=0, label="person"),
                             det([100, 40, 190, 100], class_id=7, label="truck", score=0.5)]}
    a, b = px(draw(plain(), result)), px(draw(plain(), result))
    assert (a == b).all()
    assert class_color(0) == PALETTE[0] and class_color(7) == PALETTE[7] and class_color(27) == PALETTE[7]
    assert is_color(a[70, 10], PALETTE[0]) and is_color(a[70, 100], PALETTE[7])


def test_line_width_grows_with_the_image():
    def width(w, h):
        out = px(draw(plain(w, h), {"prediction": None, "scores": {},
                                    "detections": [det([w * 0.2, h * 0.2, w * 0.8, h * 0.8])]}))
        row = out[h // 2]
        return int(is_color(row[: w // 2], class_color(3)).sum())

    assert width(1600, 1200) > width(200, 150) >= 1


# -- keypoints ------------------------------------------------------------------------------

def keypoints(confident: dict[int, tuple[float, float]], n=17):
    return [{"name": f"kp{i}", "x": confident.get(i, (180.0, 150.0))[0], "y": confident.get(i, (180.0, 150.0))[1],
             "score": 0.9 if i in confident else 0.1} for i in range(n)]


def test_keypoint_dots_and_skeleton_lines_between_confident_pairs():
    a, b = next((p, q) for p, q in skeleton() if p != q)
    c = next(i for i in range(17) if i not in (a, b))
    kps = keypoints({a: (40.0, 40.0), b: (40.0, 120.0), c: (150.0, 60.0)})
    out = px(draw(plain(), {"prediction": None, "scores": {}, "keypoints": kps}))
    assert is_color(out[40, 40], keypoint_color(a)) and is_color(out[120, 40], keypoint_color(b))
    assert is_color(out[60, 150], keypoint_color(c))
    assert (out[80, 40] != GREY).any()                       # the limb between a and b
    assert (out[150, 180] == GREY).all()                     # a keypoint under the threshold: no dot
    assert (out[150 - 5:150 + 5, 100:175] == GREY).all()    # and no line to it
    # a lower threshold draws it
    low = px(draw(plain(), {"prediction": None, "scores": {}, "keypoints": kps}, keypoint_threshold=0.05))
    assert (low[150, 180] != GREY).any()


def test_keypoint_colours_face_left_right():
    assert keypoint_color(0) == keypoint_color(4) != keypoint_color(5)
    assert keypoint_color(5) == keypoint_color(15) != keypoint_color(6) == keypoint_color(16)


# -- segmentation ---------------------------------------------------------------------------

def seg_result(mask, labels=("background", "cat", "dog")):
    ids, counts = np.unique(mask, return_counts=True)
    scores = {labels[i]: n / mask.size for i, n in zip(ids.tolist(), counts.tolist())}
    return {"prediction": max(scores, key=lambda k: scores[k]), "scores": scores,
            "outputs": {"mask": {"dtype": "uint8", "shape": list(mask.shape), "data": mask.tolist()}}}


def two_tone(w=200, h=160):
    img = plain(w, h, 60)
    img[:, w // 2:] = 200
    return img


def test_mask_overlay_changes_only_the_masked_pixels():
    img = two_tone()
    mask = np.zeros((160, 200), np.uint8)
    mask[40:120, 60:160] = 2
    out = px(draw(img, seg_result(mask), legend=False))
    assert (out[mask == 0] == img[mask == 0]).all()
    want = np.rint(0.5 * img[mask == 2] + 0.5 * np.array(class_color(2)))
    assert np.abs(out[mask == 2] - want).max() <= 1


def test_mask_legend_names_the_classes_present_with_their_share():
    mask = np.zeros((160, 200), np.uint8)
    mask[80:160, 100:200] = 1
    out = px(draw(plain(), seg_result(mask)))
    assert is_color(out[:30, :100], class_color(1)).sum() > 30     # the legend's tag, top left
    changed = (out != GREY).any(axis=-1)
    changed[mask != 0] = False
    ys, xs = np.nonzero(changed)
    assert ys.max() < 40 and xs.max() < 120                       # nothing else outside the mask


def test_mask_from_an_inference_result_and_summary():
    from edge_runtime.result import InferenceResult

    mask = np.zeros((50, 60), np.uint8)
    mask[10:20, 10:30] = 1
    res = InferenceResult(prediction="background", scores={"background": 1 - 200 / 3000, "cat": 200 / 3000},
                          embedding=None, latency_ms=1.0, device="fake:cpu", target="fake", model="m", version="1",
                          trace_id="t", bucket="static", outputs={"mask": mask})
    out = px(draw(plain(60, 50), res, legend=False))
    assert (out[mask == 0] == GREY).all() and (out[mask == 1] != GREY).any(axis=-1).all()
    d = summarize(res.to_dict())
    m = d["outputs"]["mask"]
    assert "data" not in m and m["shape"] == [50, 60]
    assert [(c["class_id"], c["label"], c["pixels"]) for c in m["classes"]] == [(0, "background", 2800),
                                                                                  (1, "cat", 200)]
    with pytest.raises(ValueError, match="summary"):
        draw(plain(60, 50), d)
    other = {"prediction": "3", "scores": {"3": 0.9}, "outputs": {"y": {"dtype": "float32", "shape": [1], "data": [1]}}}
    assert summarize(other) is other


# -- files ------------------------------------------------------------------------------------

def test_save_by_suffix_and_never_half_written(tmp_path):
    from PIL import Image

    result = {"prediction": None, "scores": {}, "detections": [det([5, 5, 30, 30])]}
    draw(png_bytes(plain(40, 30)), result, tmp_path / "a.png")
    draw(plain(40, 30), result, tmp_path / "a.jpg")
    assert Image.open(tmp_path / "a.png").format == "PNG" and Image.open(tmp_path / "a.jpg").format == "JPEG"
    assert Image.open(tmp_path / "a.png").size == (40, 30)
    with pytest.raises(ValueError, match="suffix"):
        draw(plain(40, 30), result, tmp_path / "a.txt")
    with pytest.raises(OSError):
        save(draw(plain(40, 30), result), tmp_path / "missing" / "a.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jpg", "a.png"]


def test_import_does_not_load_pillow():
    code = "import sys, edge_runtime, edge_runtime.draw; assert 'PIL' not in sys.modules, 'PIL imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- the CLI ----------------------------------------------------------------------------------

def cli(*args):
    return subprocess.run([sys.executable, "-m", "edge_runtime", *map(str, args)], capture_output=True, text=True)


def task_artifact(make_artifact, task):
    """A tiny fake-backend artifact of ``task``; skipped while that task's module is missing."""
    from edge_runtime.models import get_task

    try:
        get_task(task)
    except Exception:
        pytest.skip(f"task module missing: {task}")
    if task == "object-detection":      # one real box: a box with no pixel of the image is no detection
        return make_artifact(task=task, write_model=_boxed)
    return make_artifact(task=task)


def _boxed(path, bucket, seed=0):
    """The fake detector's weights, with anchor 0 biased to a box inside the image (class dog, 0.9)."""
    from fake_backend import write_fake_model

    write_fake_model(path, bucket, seed=seed)
    a = dict(np.load(path))
    b = a["b__output0"].reshape(7, 12)
    b[:, 0] = [8, 8, 6, 4, 0, 0.9, 0]
    a["b__output0"] = b.reshape(-1)
    with open(path, "wb") as fh:
        np.savez(fh, **a)


def image_file(tmp_path, name="street.png", w=40, h=30, seed=0):
    p = tmp_path / name
    p.write_bytes(png_bytes(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)))
    return p


def test_cli_detection_table_json_and_draw(make_artifact, tmp_path):
    from PIL import Image

    art, img = task_artifact(make_artifact, "object-detection"), image_file(tmp_path)
    proc = cli("infer", art, "--image", img, "--draw", tmp_path / "out.png")
    assert proc.returncode == 0, proc.stderr
    assert Image.open(tmp_path / "out.png").size == (40, 30)
    lines = proc.stdout.splitlines()
    assert any(line.startswith("detections: ") for line in lines)
    header = next(line for line in lines if line.split()[:2] == ["label", "score"])
    assert header.split() == ["label", "score", "x1", "y1", "x2", "y2"]
    assert f"drawn: {tmp_path / 'out.png'}" in lines
    d = json.loads(cli("infer", art, "--image", img, "--json").stdout)
    rows = lines[lines.index(header) + 1:lines.index(header) + 1 + len(d["detections"])]
    for row, x in zip(rows, d["detections"]):
        assert row.split() == [x["label"], f"{x['score']:.2f}", *(str(int(round(v))) for v in x["box"])]
    assert "drawn" not in d


@pytest.mark.parametrize("target,needle", [("missing/out.png", "does not exist"), ("out.txt", "suffix"),
                                           (".", "folder")])
def test_cli_draw_refuses_a_path_it_cannot_write(make_artifact, tmp_path, target, needle):
    art, img = task_artifact(make_artifact, "object-detection"), image_file(tmp_path)
    proc = cli("infer", art, "--image", img, "--draw", tmp_path / target)
    assert proc.returncode == 2 and "input_invalid" in proc.stderr and needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["street.png", art.name])


def test_cli_draw_never_writes_over_the_input_image(make_artifact, tmp_path):
    art, img = task_artifact(make_artifact, "object-detection"), image_file(tmp_path)
    before = img.read_bytes()
    link = tmp_path / "link.png"
    link.symlink_to(img)
    for target in (img, link):
        proc = cli("infer", art, "--image", img, "--draw", target)
        assert proc.returncode == 2 and "is the input image" in proc.stderr, proc.stderr
    assert img.read_bytes() == before


def test_cli_draw_needs_an_image(make_artifact, tmp_path):
    art = make_artifact(task="tensors")
    feeds = tmp_path / "feeds.json"
    feeds.write_text(json.dumps({"x": [[1, 2, 3, 4]], "k": [[1, 2]]}))
    proc = cli("infer", art, "--input", feeds, "--draw", tmp_path / "out.png")
    assert proc.returncode == 2 and "--draw needs --image" in proc.stderr
    assert not (tmp_path / "out.png").exists()


def test_cli_pose_table_and_draw(make_artifact, tmp_path):
    from PIL import Image

    art, img = task_artifact(make_artifact, "pose-estimation"), image_file(tmp_path, w=24, h=36)
    proc = cli("infer", art, "--image", img, "--draw", tmp_path / "pose.jpg")
    assert proc.returncode == 0, proc.stderr
    assert Image.open(tmp_path / "pose.jpg").size == (24, 36)
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.split()[:1] == ["name"])
    assert header.split() == ["name", "x", "y", "score"]
    d = json.loads(cli("infer", art, "--image", img, "--json").stdout)
    assert len(d["keypoints"]) == 17
    assert lines[lines.index(header) + 1].split()[0] == d["keypoints"][0]["name"]


def test_cli_segmentation_classes_json_summary_and_draw(make_artifact, tmp_path):
    from PIL import Image

    art, img = task_artifact(make_artifact, "semantic-segmentation"), image_file(tmp_path, w=50, h=20)
    proc = cli("infer", art, "--image", img, "--draw", tmp_path / "seg.png")
    assert proc.returncode == 0, proc.stderr
    assert Image.open(tmp_path / "seg.png").size == (50, 20)
    assert "segmentation: 50x20 mask" in proc.stdout
    d = json.loads(cli("infer", art, "--image", img, "--json").stdout)
    mask = d["outputs"]["mask"]
    assert "data" not in mask and mask["shape"] == [20, 50]
    assert sum(c["pixels"] for c in mask["classes"]) == 1000
    assert {c["label"] for c in mask["classes"]} <= {"background", "cat", "dog"}
    for c in mask["classes"]:
        assert f"{100 * c['share']:.1f}%" in proc.stdout


# -- score over an image folder ------------------------------------------------------------------

@pytest.mark.parametrize("task", ["object-detection", "pose-estimation", "semantic-segmentation"])
def test_score_image_folder_records_the_vision_results(make_artifact, tmp_path, task):
    art = task_artifact(make_artifact, task)
    folder = tmp_path / "images"
    (folder / "sub").mkdir(parents=True)
    for i, name in enumerate(["a.png", "b.png", "sub/c.png"]):
        image_file(folder, name, w=20 + 5 * i, h=16 + 3 * i, seed=i)
    out = tmp_path / "scores.jsonl"
    proc = cli("score", art, folder, "-o", out, "--quiet")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["id"] for x in lines] == ["a.png", "b.png", "sub/c.png"] and all(x["ok"] for x in lines)
    for i, line in enumerate(lines):
        w, h = 20 + 5 * i, 16 + 3 * i
        r = line["result"]
        if task == "object-detection":
            for d in r["detections"]:
                assert set(d) == {"label", "class_id", "score", "box"}
                assert 0 <= d["box"][0] <= d["box"][2] <= w and 0 <= d["box"][1] <= d["box"][3] <= h
        elif task == "pose-estimation":
            assert len(r["keypoints"]) == 17
            assert all(0 <= k["x"] <= w and 0 <= k["y"] <= h for k in r["keypoints"])
        else:
            mask = r["outputs"]["mask"]
            assert "data" not in mask and mask["shape"] == [h, w]
            assert sum(c["pixels"] for c in mask["classes"]) == w * h


def test_a_classification_result_gets_its_prediction_in_a_tag():
    out = px(draw(plain(), {"prediction": "tabby", "scores": {"tabby": 0.81, "tiger": 0.1}}))
    changed = (out != GREY).any(axis=-1)
    ys, xs = np.nonzero(changed)
    assert changed.sum() > 50 and ys.min() == 0 and xs.min() == 0 and ys.max() < 40 and xs.max() < 120
