"""Calibration/eval sample loaders for each input kind."""

import json

import numpy as np
import pytest

from edge_runtime.models.image import load_image_samples
from edge_runtime.models.tensors import Tensors
from edge_runtime.models.text import load_text_samples
from factories import png_bytes


def test_text_txt_jsonl_tsv(tmp_path):
    (tmp_path / "a.txt").write_text("one\n\n two \nthree\n")
    assert load_text_samples(tmp_path / "a.txt") == ["one", " two ", "three"]
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "x"}) + "\n\n" + json.dumps({"text": "y", "id": 2}) + "\n")
    assert load_text_samples(tmp_path / "b.jsonl") == ["x", "y"]
    (tmp_path / "c.jsonl").write_text(json.dumps({"txt": "x"}) + "\n")
    with pytest.raises(ValueError, match="field 'text'"):
        load_text_samples(tmp_path / "c.jsonl")
    (tmp_path / "d.tsv").write_text("text\tlabel\ngood one\t1\nbad one\t0\n")
    assert load_text_samples(tmp_path / "d.tsv") == ["good one", "bad one"]


def test_images_folder_and_npy(tmp_path):
    imgs = np.random.default_rng(0).integers(0, 255, (3, 8, 8), dtype=np.uint8)
    for i, im in enumerate(imgs):
        (tmp_path / f"{i}.png").write_bytes(png_bytes(im))
    (tmp_path / "notes.txt").write_text("ignored")
    assert len(load_image_samples(tmp_path)) == 3
    np.save(tmp_path / "x.npy", imgs)
    out = load_image_samples(tmp_path / "x.npy")
    assert len(out) == 3 and (out[1] == imgs[1]).all()
    with pytest.raises(ValueError):
        load_image_samples(tmp_path / "empty_dir_missing")


def test_tensors_npz(tmp_path):
    np.savez(tmp_path / "t.npz", x=np.ones((4, 1, 3), np.float32), k=np.zeros((4, 1, 2), np.int32))
    out = Tensors.load_samples(tmp_path / "t.npz")
    assert len(out) == 4 and set(out[0]) == {"x", "k"} and out[0]["x"].shape == (1, 3)
