"""``edge-infer score`` hardening: the output path is never anything but a regular file that is not
the input; every output line is strict UTF-8 JSON whatever the id holds; pipes, BOMs, blank JSONL
lines and quoted multi-line CSV fields are read as the README says."""

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from edge_runtime import score_lines
from edge_runtime.errors import InputError
from edge_runtime.score_inputs import Record, count_records, read_records
from output_cases import fifo_output, input_as_output, no_constant, run_cli, strict_lines, text_input
from factories import png_bytes


# -- 1. --force / --resume never delete or write anything but a regular file that is not the input -----

@pytest.mark.parametrize("via", ["fifo", "link-to-fifo"])
def test_force_refuses_an_output_that_is_not_a_regular_file(text_art, tmp_path, via):
    src = text_input(tmp_path)
    fifo, out = fifo_output(tmp_path, via)
    res = run_cli("score", text_art, src, "-o", out, "--force", "--quiet")
    assert res.exit_code == 2 and "input_invalid" in res.output and "not a regular file" in res.output, res.output
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and os.path.lexists(out)       # nothing deleted
    assert out.is_symlink() == (via == "link-to-fifo")
    assert not Path(f"{out}.job.json").exists()                                 # no job record beside it


def test_a_dangling_link_as_output_is_refused_not_followed(text_art, tmp_path):
    src = text_input(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    target = tmp_path / "elsewhere" / "created.jsonl"
    out = tmp_path / "out.jsonl"
    out.symlink_to(target)
    res = run_cli("score", text_art, src, "-o", out, "--quiet")
    assert res.exit_code == 2 and "a link to nothing" in res.output, res.output
    assert not target.exists() and out.is_symlink()


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink"])
@pytest.mark.parametrize("flag", ["--force", "--resume"])
def test_the_input_itself_is_never_the_output(text_art, tmp_path, how, flag):
    src = text_input(tmp_path)
    before = src.read_bytes()
    out = input_as_output(src, tmp_path, how)
    res = run_cli("score", text_art, src, "-o", out, flag, "--quiet")
    assert res.exit_code == 2 and "is the input" in res.output and "input_invalid" in res.output, res.output
    assert src.read_bytes() == before and os.path.lexists(out)
    assert not Path(f"{out}.job.json").exists()


def test_a_job_record_path_that_is_a_folder_is_refused(text_art, tmp_path):
    src = text_input(tmp_path)
    out = tmp_path / "out.jsonl"
    assert run_cli("score", text_art, src, "-o", out, "--quiet").exit_code == 0
    job = Path(f"{out}.job.json")
    job.unlink()
    job.mkdir()
    res = run_cli("score", text_art, src, "-o", out, "--force", "--quiet")
    assert res.exit_code == 2 and "job record" in res.output and "a folder" in res.output, res.output
    assert job.is_dir() and len(strict_lines(out)) == 3       # the old output is left as it was


# -- 6. a bad -o is the caller's: a typed input error naming the path, exit 2 -----------------------------

def test_an_existing_folder_as_output_is_a_typed_input_error(text_art, tmp_path):
    src = text_input(tmp_path)
    folder = tmp_path / "somedir"
    folder.mkdir()
    (folder / "keep.txt").write_text("kept")
    for flags in (["--force"], []):
        res = run_cli("score", text_art, src, "-o", folder, *flags, "--quiet")
        assert res.exit_code == 2 and f"{folder} is a folder" in res.output, res.output
        assert "IsADirectoryError" not in res.output
    assert (folder / "keep.txt").read_text() == "kept"


def test_an_output_under_a_file_is_a_typed_input_error(text_art, tmp_path):
    src = text_input(tmp_path)
    blocker = tmp_path / "plain.txt"
    blocker.write_text("a file, not a folder")
    out = blocker / "x.jsonl"
    res = run_cli("score", text_art, src, "-o", out, "--quiet")
    assert res.exit_code == 2 and "input_invalid" in res.output and f"cannot write the output {out}" in res.output, \
        res.output
    assert blocker.read_text() == "a file, not a folder"


# -- 2. an id with a lone surrogate or an undecodable byte: the line is valid UTF-8 JSON, still scored ----

def test_lone_surrogate_ids_are_escaped_and_every_record_is_scored(text_art, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "ok1", "text": "good"}\n{"id": "\\ud800", "text": "bad"}\n'
                   '{"id": "x\\udcff", "text": "great"}\n{"id": "ok2", "text": "awful"}\n')
    out = tmp_path / "out.jsonl"
    res = run_cli("score", text_art, src, "-o", out, "--batch-size", "2", "--quiet")
    assert res.exit_code == 0, res.output
    got = strict_lines(out)
    assert [g["id"] for g in got] == ["ok1", "\ud800", "x\udcff", "ok2"] and all(g["ok"] for g in got)
    assert b"\\ud800" in out.read_bytes()                   # written as its JSON escape
    res = run_cli("score", text_art, src, "-o", out, "--resume", "--quiet")    # and it reads back for a resume
    assert res.exit_code == 0 and len(strict_lines(out)) == 4, res.output


def test_an_undecodable_csv_id_cell_keeps_the_line_valid_utf8(text_art, tmp_path):
    src = tmp_path / "in.csv"
    src.write_bytes(b"id,text\nr\xe9,good\nr2,bad\n")
    out = tmp_path / "out.jsonl"
    assert run_cli("score", text_art, src, "-o", out, "--quiet").exit_code == 0
    got = strict_lines(out)
    assert [(g["id"], g["ok"]) for g in got] == [("r\udce9", True), ("r2", True)]
    assert got[0]["id"].encode("utf-8", "surrogateescape") == b"r\xe9"          # the byte is recoverable


@pytest.mark.parametrize("writer", ["orjson", "json"])
@pytest.mark.parametrize("rid", ["\ud800", "a\udcff", "caf\u00e9\\\ud800"])
def test_dump_is_strict_utf8_json_with_either_writer(monkeypatch, writer, rid):
    if writer == "json":
        monkeypatch.setattr(score_lines, "_orjson", None)
    line, text = score_lines._dump(Record(0, rid, line=1), InputError("x"))
    assert json.loads(text.encode("utf-8"))["id"] == rid and line["id"] == rid


# -- 3. a NaN / infinite id is the caller's data: a string id, the result is not a model failure ----------

def test_nan_and_infinite_ids_are_strings_and_the_result_stays_ok(image_art, tmp_path):
    (tmp_path / "a.png").write_bytes(png_bytes(np.eye(8, dtype=np.uint8) * 200))
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": NaN, "image": "a.png"}\n{"id": Infinity, "image": "a.png"}\n'
                   '{"id": -Infinity, "image": "a.png"}\n{"id": 1e999, "image": "a.png"}\n')
    out = tmp_path / "out.jsonl"
    res = run_cli("score", image_art, src, "-o", out, "--json", "--quiet")
    assert res.exit_code == 0, res.output
    got = strict_lines(out)
    assert [g["id"] for g in got] == ["NaN", "Infinity", "-Infinity", "Infinity"]
    assert all(g["ok"] for g in got)
    summary = json.loads(res.output)
    assert summary["failed"] == 0 and "result_nonfinite" not in summary["errors"]


@pytest.mark.parametrize("rid", [float("nan"), float("-inf"), np.float64("nan")])
def test_a_nonfinite_id_given_to_score_directly_is_no_result_failure(rid):
    line, text = score_lines._dump(Record(0, rid, line=1), InputError("x", code="input_empty"))
    assert line["error"]["code"] == "input_empty" and isinstance(line["id"], str)
    assert json.loads(text, parse_constant=no_constant)["id"] == line["id"]


# -- 4. a pipe is read once, by the reader --------------------------------------------------------------

def test_scoring_from_a_pipe_scores_every_record(text_art, tmp_path):
    out = tmp_path / "out.jsonl"
    res = subprocess.run([sys.executable, "-m", "edge_runtime", "score", str(text_art), "/dev/stdin", "-o", str(out)],
                         input="good\nbad\nawful\n", capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert [(g["id"], g["ok"]) for g in strict_lines(out)] == [(1, True), (2, True), (3, True)]
    assert "progress done=3 total=-" in res.stderr          # progress without a total


def test_count_records_never_opens_a_fifo(tmp_path):
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)
    got = []
    t = threading.Thread(target=lambda: got.append((count_records(fifo), count_records(fifo, "jsonl"))), daemon=True)
    t.start()
    t.join(10)
    while t.is_alive():         # it opened the FIFO (blocked: nobody writes): a writer that writes nothing
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        t.join(0.1)
    assert got == [(None, None)]


# -- 5. a UTF-8 byte order mark (Excel's CSV) is dropped ------------------------------------------------

def test_a_csv_with_a_byte_order_mark_matches_its_columns(text_art, tmp_path):
    src = tmp_path / "in.csv"
    src.write_bytes("\ufefftext,id\ngood,a\nbad,b\n".encode("utf-8"))
    out = tmp_path / "out.jsonl"
    res = run_cli("score", text_art, src, "-o", out, "--quiet")
    assert res.exit_code == 0, res.output
    assert [(g["id"], g["ok"]) for g in strict_lines(out)] == [("a", True), ("b", True)]
    src.write_bytes("\ufeffid,text\ngood2,x\n".encode("utf-8"))
    assert [r.id for r in read_records(src, field="text")] == ["good2"]


@pytest.mark.parametrize("fmt, body, want", [
    ("text", "good\nbad\n", "good"),
    ("jsonl", '{"id": "a", "text": "good"}\n', "good"),
])
def test_a_byte_order_mark_is_not_part_of_the_first_record(tmp_path, fmt, body, want):
    src = tmp_path / f"in.{fmt}"
    src.write_bytes(b"\xef\xbb\xbf" + body.encode("utf-8"))
    first = next(iter(read_records(src, fmt)))
    assert first.error is None and first.value == want


# -- 7. blank JSONL lines, multi-line CSV records, an empty image path --------------------------------

def test_blank_jsonl_lines_are_no_records(text_art, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "text": "good"}\n\n   \r\n{"id": "b", "text": "bad"}\n\n')
    out = tmp_path / "out.jsonl"
    assert run_cli("score", text_art, src, "-o", out, "--quiet").exit_code == 0
    got = strict_lines(out)
    assert [(g["index"], g["id"], g["line"], g["ok"]) for g in got] == [(0, "a", 1, True), (1, "b", 4, True)]
    assert count_records(src) == 2


def test_count_records_counts_csv_records_not_lines(text_art, tmp_path):
    src = tmp_path / "in.csv"
    src.write_bytes(b'\xef\xbb\xbfid,text\nr1,"multi\nline\nreview"\nr2,good\nr3,"two\nlines"\n')
    assert count_records(src) == 3 == len(list(read_records(src, field="text")))
    res = subprocess.run([sys.executable, "-m", "edge_runtime", "score", str(text_art), str(src), "-o",
                          str(tmp_path / "o.jsonl")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "progress done=3 total=3" in res.stderr


def test_an_empty_image_path_is_input_empty(image_art, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "e", "image": ""}\n')
    out = tmp_path / "out.jsonl"
    run_cli("score", image_art, src, "-o", out, "--quiet")
    got = strict_lines(out)
    assert got[0]["ok"] is False and got[0]["error"]["code"] == "input_empty", got
