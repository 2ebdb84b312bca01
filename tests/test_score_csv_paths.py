"""``score``'s relative image paths: a CSV/TSV column named ``image``, ``path`` or ``file`` is taken
from the CSV's folder, as a JSONL field of those names is from the JSONL's (absolute paths as they
are, ``""`` left empty, any other column from the working directory); a piped input has no folder,
its paths are the working directory's. ``--resume`` and the input fingerprint do not change."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.score_inputs import input_fingerprint, read_records
from factories import png_bytes
from output_cases import run_cli, strict_lines

IMAGE = png_bytes(np.arange(64, dtype=np.uint8).reshape(8, 8))


@pytest.fixture
def layout(tmp_path, monkeypatch):
    """data/ holds the images and the inputs; the working directory is elsewhere/."""
    data = tmp_path / "data"
    (data / "imgs").mkdir(parents=True)
    (data / "imgs" / "a.png").write_bytes(IMAGE)
    (data / "b.png").write_bytes(IMAGE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "cwd.png").write_bytes(IMAGE)
    monkeypatch.chdir(elsewhere)
    return data, elsewhere


@pytest.mark.parametrize("suffix, sep", [(".csv", ","), (".tsv", "\t")])
@pytest.mark.parametrize("column", ["image", "path", "file"])
def test_relative_csv_image_paths_are_taken_from_the_csv_folder(image_art, layout, suffix, sep, column):
    data, elsewhere = layout
    src = data / f"in{suffix}"
    rows = [("r1", "imgs/a.png"), ("r2", "b.png"), ("r3", str(data / "b.png")), ("r4", ""), ("r5", "cwd.png")]
    src.write_text(f"id{sep}{column}\n" + "".join(f"{i}{sep}{p}\n" for i, p in rows))
    out = elsewhere / "out.jsonl"
    res = run_cli("score", image_art, src, "-o", out, "--quiet", "--field", column)
    assert res.exit_code == 0, res.output
    got = {g["id"]: (g["ok"], (g.get("error") or {}).get("code")) for g in strict_lines(out)}
    assert got == {"r1": (True, None), "r2": (True, None), "r3": (True, None),          # the CSV's folder, absolute
                   "r4": (False, "input_empty"),                                       # "" stays empty
                   "r5": (False, "input_file_unreadable")}                             # not the working directory's
    values = [r.value for r in read_records(src, field=column)]
    assert values == [str(data / "imgs/a.png"), str(data / "b.png"), str(data / "b.png"), "", str(data / "cwd.png")]


def test_csv_and_jsonl_resolve_the_same_rows_alike(image_art, layout):
    data, elsewhere = layout
    (data / "in.csv").write_text("id,image\nr1,imgs/a.png\nr2,../elsewhere/cwd.png\n")
    (data / "in.jsonl").write_text('{"id": "r1", "image": "imgs/a.png"}\n{"id": "r2", "image": "../elsewhere/cwd.png"}\n')
    for name in ("in.csv", "in.jsonl"):
        out = elsewhere / f"{name}.out.jsonl"
        assert run_cli("score", image_art, data / name, "-o", out, "--quiet").exit_code == 0
        assert [(g["id"], g["ok"]) for g in strict_lines(out)] == [("r1", True), ("r2", True)], name
    assert ([r.value for r in read_records(data / "in.csv", field="image")]
            == [r.value for r in read_records(data / "in.jsonl", field="image")])


def test_a_column_of_another_name_is_taken_from_the_working_directory(image_art, layout):
    data, elsewhere = layout
    src = data / "in.csv"
    src.write_text("id,img\nr1,cwd.png\nr2,b.png\n")
    out = elsewhere / "out.jsonl"
    run_cli("score", image_art, src, "-o", out, "--quiet", "--field", "img")
    assert [(g["id"], g["ok"]) for g in strict_lines(out)] == [("r1", True), ("r2", False)]
    assert [r.value for r in read_records(src, field="img")] == ["cwd.png", "b.png"]


def test_a_text_column_is_never_joined_to_a_folder(tmp_path):
    src = tmp_path / "in.csv"
    src.write_text("id,text\na,good movie\n")
    assert [r.value for r in read_records(src, field="text")] == ["good movie"]


def _pipe_records(body: bytes, fmt: str, field: str):
    """The values ``read_records`` yields for ``body`` read through a pipe (``/dev/fd/N``, as ``<(...)``)."""
    r, w = os.pipe()
    t = threading.Thread(target=lambda: (os.write(w, body), os.close(w)), daemon=True)
    t.start()
    try:
        return [rec.value for rec in read_records(Path(f"/dev/fd/{r}"), fmt, field=field)]
    finally:
        t.join(10)
        os.close(r)


@pytest.mark.parametrize("fmt, body", [("jsonl", b'{"image": "b.png"}\n{"image": "/abs/x.png"}\n'),
                                       ("csv", b"image\nb.png\n/abs/x.png\n")])
def test_a_piped_input_has_no_folder_its_paths_are_the_working_directorys(fmt, body):
    assert _pipe_records(body, fmt, "image") == ["b.png", "/abs/x.png"]          # never /dev/fd/b.png


def test_a_descriptor_of_a_regular_file_resolves_from_that_files_folder(tmp_path):
    """``/dev/stdin < data/in.csv``: the paths are data/'s, not /dev's."""
    src = tmp_path / "in.csv"
    src.write_text("image\nb.png\n")
    fd = os.open(src, os.O_RDONLY)
    try:
        assert [r.value for r in read_records(Path(f"/dev/fd/{fd}"), "csv", field="image")] == [str(tmp_path / "b.png")]
    finally:
        os.close(fd)


def test_resume_and_the_fingerprint_are_unchanged(image_art, layout, monkeypatch):
    data, elsewhere = layout
    src = data / "in.csv"
    src.write_text("id,image\n" + "".join(f"r{i},{'imgs/a.png' if i % 2 else 'b.png'}\n" for i in range(10)))
    fp = input_fingerprint(src)
    assert fp["kind"] == "file" and fp["bytes"] == src.stat().st_size and fp["format"] == "csv"
    out = elsewhere / "out.jsonl"
    assert run_cli("score", image_art, src, "-o", out, "--quiet", "--batch-size", "4").exit_code == 0
    full = strict_lines(out)
    assert all(g["ok"] for g in full) and len(full) == 10
    job = json.loads(Path(f"{out}.job.json").read_text())
    assert job["input"]["sha256"] == fp["sha256"] and job["input"]["field"] == "image"
    text = out.read_text().splitlines(keepends=True)
    out.write_text("".join(text[:4]))                                    # a run cut after 4 lines
    monkeypatch.chdir(data)                                              # resumed from another directory
    assert input_fingerprint(src) == fp
    res = run_cli("score", image_art, src, "-o", out, "--quiet", "--resume", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["resumed_from"] == 4
    again = strict_lines(out)
    assert [(g["id"], g["ok"]) for g in again] == [(g["id"], g["ok"]) for g in full]
