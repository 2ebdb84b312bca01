"""README "Batch scoring, benchmarks and metrics" and "Inference versions: diff and shadow", read as a
user's contract (h32): each test is a place where the program did not do what the README says."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from factories import png_bytes
from output_cases import cli_shadow


def _png(seed: int) -> bytes:
    return png_bytes(np.random.default_rng(seed).integers(0, 255, (8, 8, 3), dtype=np.uint8))


@pytest.fixture
def odd_folder(tmp_path) -> Path:
    """A <label>/<image> folder with the rows eval does not evaluate: a file deeper than
    <label>/<file>, a second name (symlink) of an image already there, a dangling symlink."""
    root = tmp_path / "data"
    (root / "3").mkdir(parents=True)
    (root / "4" / "deep").mkdir(parents=True)
    (root / "3" / "a.png").write_bytes(_png(1))
    (root / "3" / "b.png").write_bytes(_png(2))
    (root / "4" / "c.png").write_bytes(_png(3))
    (root / "4" / "deep" / "d.png").write_bytes(_png(4))
    os.symlink("../3/a.png", root / "4" / "dup.png")
    os.symlink("/nonexistent/zz.png", root / "3" / "zz.png")
    return root


def test_shadow_accuracy_is_over_the_rows_eval_evaluates(image_art, odd_folder):
    """README: "Accuracy compares class ids as `eval` does". Before, shadow took the first folder of
    any path as its label: `4/deep/d.png` was a row of class 4 (eval: `nested_folder`), the symlink
    `4/dup.png` to an image of `3/` was scored as class 4 (eval: `duplicate`) and the dangling link
    counted wrong (eval: `broken_symlink`, "not an inference error counted wrong"): 6 samples and
    another accuracy than `eval` gives on the same folder, with no word of why."""
    import edge_runtime as er
    from edge_runtime.evaluate import evaluate

    with er.load(image_art) as rt:
        ev = evaluate(rt, odd_folder)
    assert ev["samples"] == 3 and ev["skipped"]["count"] == 3
    res = cli_shadow(image_art, image_art, odd_folder, "--json")
    s = json.loads(res.stdout)
    assert s["total"] == 6                           # every image is still compared
    assert s["accuracy"]["samples"] == ev["samples"]
    assert s["accuracy"]["correct_a"] == ev["correct"]
    assert s["eval_skipped"]["count"] == 3          # said, never silently out of the accuracy
    assert "left out of the accuracy" in s["eval_skipped"]["note"]


def test_shadow_text_summary_says_which_images_eval_skips(image_art, odd_folder):
    res = cli_shadow(image_art, image_art, odd_folder)
    assert "accuracy over 3 labelled inputs" in res.output, res.output
    assert "no <label>/<image> row eval evaluates" in res.output, res.output


def test_a_plain_label_folder_is_unchanged(image_art, tmp_path):
    root = tmp_path / "flat"
    for i, label in enumerate(["1", "2", "2"]):
        (root / label).mkdir(parents=True, exist_ok=True)
        (root / label / f"{i}.png").write_bytes(_png(i))
    s = json.loads(cli_shadow(image_art, image_art, root, "--json").stdout)
    assert s["accuracy"]["samples"] == 3 and s["eval_skipped"] is None


def test_shadow_worst_list_of_embeddings_shows_no_none_answer(make_artifact, tmp_path):
    """README: the summary lists the `--worst` N items. For an embedding (no class) each side read
    "A None | B None", as if neither answered; an answered side with no class reads "ok"."""
    art = make_artifact("text-embedding")
    src = tmp_path / "in.txt"
    src.write_text("good movie\nbad movie\n")
    res = cli_shadow(art, art, src, "--worst", "2")
    assert res.exit_code == 0, res.output
    assert "A ok | B ok | cosine" in res.output, res.output
    assert "None" not in res.output, res.output


def _score(*args):
    from output_cases import run_cli

    res = run_cli("score", *map(str, args), "--quiet")
    assert "Traceback" not in res.output, res.output
    return res


def test_a_json_file_of_records_is_read_as_jsonl_not_as_text(text_art, tmp_path):
    """README: score reads JSONL records (their `--field`, their `--id-field`). `data.json` was read as
    text: each JSON line scored whole as one text, `ok`, ids the line numbers, exit 0."""
    src = tmp_path / "data.json"
    src.write_text('{"id": "r1", "text": "good movie"}\n{"id": "r2", "text": "bad movie"}\n')
    out = tmp_path / "o.jsonl"
    res = _score(text_art, src, "-o", out)
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["id"] for x in lines] == ["r1", "r2"]
    from edge_runtime.score_inputs import detect_format

    assert detect_format(src) == "jsonl"


@pytest.mark.parametrize("fmt", [None, "text", "csv", "jsonl"])
def test_a_parquet_file_is_refused_not_scored_as_text_lines(text_art, tmp_path, fmt):
    """README: score reads JSONL, CSV/TSV, text or an image folder; Parquet is `--engine ray`'s. A
    Parquet file given to the local engine was read as text: the byte runs that decoded were scored
    `ok`, the rest `input_bad_encoding`, exit 0."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    src = tmp_path / "data.parquet"
    pq.write_table(pa.table({"id": [1, 2], "text": ["good movie", "bad movie"]}), src)
    out = tmp_path / "o.jsonl"
    res = _score(text_art, src, "-o", out, *(["--format", fmt] if fmt else []))
    assert res.exit_code == 2 and "input_invalid" in res.output and "Parquet" in res.output, res.output
    assert not out.exists()
    text = tmp_path / "t.txt"          # Parquet is its magic at both ends, not a text that starts "PAR1"
    text.write_text("PAR1 is a word here\nsecond line\n")
    assert _score(text_art, text, "-o", tmp_path / "t.jsonl").exit_code == 0


def test_shadow_summary_of_a_run_with_nothing_compared_names_no_none(make_artifact, tmp_path):
    """The agreement line read "(0 of 2 compared, None)" when no input was answered by both sides."""
    a = make_artifact("text-classification")
    b = make_artifact("text-classification", limits={"max_text_chars": 2})
    src = tmp_path / "in.txt"
    src.write_text("good movie\nbad movie\n")
    res = cli_shadow(a, b, src)
    assert "compared, None)" not in res.output, res.output
    assert "no input answered by both sides" in res.output, res.output
