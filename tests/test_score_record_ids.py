"""``edge-infer score`` loses no record and no id: every input record gets exactly one output line, in
order, with its own id (or ``null`` and its line) and a typed error where it failed, whatever the
input does wrong: an over-long CSV/TSV row or JSONL line, a quoted CSV field spanning lines or never
closing, CRLF, a BOM, NUL bytes, undecodable bytes, empty and duplicate ids, a last line without its
newline, an image folder with a dangling link, a link loop or a folder it cannot list. The summary's
counts add up and the progress total (``count_records``) is the number of lines."""

import json
import os

import pytest

from conftest import ZOO
from edge_runtime.score_inputs import count_records, read_records
from output_cases import run_cli, strict_lines

REQUEST_BYTES = 1000
CAP = 4 * REQUEST_BYTES + 65536         # the CLI's line cap for this artifact
LONG = "x" * (CAP + 5000)               # a value no line of this artifact may hold


@pytest.fixture
def small_text_art(make_artifact):
    """The text classifier of conftest with a small request limit, so an over-long line is small."""
    return make_artifact("text-classification", limits={"max_request_bytes": REQUEST_BYTES})


def score(art, src, tmp_path, *flags):
    out = tmp_path / "out.jsonl"
    res = run_cli("score", art, src, "-o", out, "--quiet", "--json", "--force", *flags)
    assert res.exit_code in (0, 2), res.output
    lines = strict_lines(out)
    summary = json.loads(res.output[res.output.index("{"):])
    assert summary["total"] == len(lines) == summary["ok"] + summary["rejected"] + summary["failed"]
    assert sum(summary["errors"].values()) == summary["rejected"] + summary["failed"]
    assert [g["index"] for g in lines] == list(range(len(lines)))
    assert count_records(src) == len(lines)                 # the progress total
    return [(g["id"], g["line"], g["ok"] or g["error"]["code"]) for g in lines]


@pytest.mark.parametrize("suffix,sep", [(".csv", ","), (".tsv", "\t")])
@pytest.mark.parametrize("order", ["id-first", "id-last"])
def test_an_over_long_row_keeps_its_id(small_text_art, tmp_path, suffix, sep, order):
    def row(rid, text):
        return sep.join([rid, text] if order == "id-first" else [text, rid])

    src = tmp_path / f"in{suffix}"
    src.write_text("\n".join([row("id", "text"), row("r1", "ok"), row("r2", LONG), row("r3", "fine")]) + "\n")
    assert score(small_text_art, src, tmp_path) == [("r1", 2, True), ("r2", 3, "input_too_large"), ("r3", 4, True)]


def test_an_over_long_quoted_field_over_lines_is_one_record(small_text_art, tmp_path):
    src = tmp_path / "in.csv"
    src.write_text('id,text\nr1,ok\nr2,"' + "\n".join([LONG[:30000]] * 4) + '"\nr3,fine\n')
    assert score(small_text_art, src, tmp_path) == [("r1", 2, True), ("r2", 3, "input_too_large"), ("r3", 7, True)]


@pytest.mark.parametrize("size", ["short", "over-long"])
def test_a_quoted_field_that_never_closes_loses_no_later_record(small_text_art, tmp_path, size):
    src = tmp_path / "in.csv"
    tail = "" if size == "short" else LONG
    src.write_text(f'id,text\nr1,"oops{tail}\nr2,fine\nr3,good')
    assert score(small_text_art, src, tmp_path) == [("r1", 2, "input_bad_csv"), ("r2", 3, True), ("r3", 4, True)]


def test_every_csv_oddity_in_one_file(small_text_art, tmp_path):
    src = tmp_path / "in.csv"
    src.write_bytes(b"\xef\xbb\xbfid,text\r\n"           # a BOM, CRLF
                    b"r1,ok\r\n"
                    b"r\xe92,caf\xc3\xa9\r\n"             # an undecodable byte in the id
                    b"r\x003,nul\x00text\r\n"            # NUL bytes
                    b",no id\r\n"                        # an empty id
                    b"r1,again\r\n"                      # a duplicate id
                    b"\r\n"                              # a blank row: no text column
                    b'r7,"two\r\nlines"\r\n'
                    b"r8," + LONG.encode() + b"\r\n"
                    b"r9,last")                          # no newline at the end
    assert score(small_text_art, src, tmp_path) == [
        ("r1", 2, True), ("r\udce92", 3, True), ("r\x003", 4, True), (None, 5, True), ("r1", 6, True),
        (None, 7, "input_field_missing"), ("r7", 8, True), ("r8", 10, "input_too_large"), ("r9", 11, True)]


@pytest.mark.parametrize("task", ["text-classification", "text-embedding"])
def test_an_over_long_jsonl_line_keeps_its_id(make_artifact, tmp_path, task):
    art = make_artifact(task, limits={"max_request_bytes": REQUEST_BYTES})
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([
        json.dumps({"id": "a1", "text": LONG}),
        json.dumps({"text": LONG, "id": "a2"}),
        json.dumps({"text": LONG, "meta": {"id": "nested"}}),           # no id of its own
        json.dumps({"text": LONG + '", "id": "fake'}),                 # an id inside the text is none
        json.dumps({"id": 5, "text": "fine"}),
    ]))
    assert score(art, src, tmp_path) == [("a1", 1, "input_too_large"), ("a2", 2, "input_too_large"),
                                         (None, 3, "input_too_large"), (None, 4, "input_too_large"), (5, 5, True)]


def test_an_undecodable_jsonl_line_keeps_its_id(small_text_art, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"id": "a1", "text": "caf\xe9"}\n{"id": "a2", "text": "fine"}\n')
    assert score(small_text_art, src, tmp_path) == [("a1", 1, "input_bad_encoding"), ("a2", 2, True)]


def test_a_missing_id_column_writes_nothing(small_text_art, tmp_path):
    src = tmp_path / "in.csv"
    src.write_text("key,text\nr1,ok\n")
    out = tmp_path / "out.jsonl"
    res = run_cli("score", small_text_art, src, "-o", out, "--id-field", "id2", "--quiet")
    assert res.exit_code == 2 and "input_field_missing" in res.output and "'id2'" in res.output, res.output
    assert not out.exists() and not (tmp_path / "out.jsonl.job.json").exists()   # a rerun needs no --force


def test_an_image_folder_with_a_dangling_link_and_a_loop(digits_artifact, tmp_path):
    src = tmp_path / "imgs"
    src.mkdir()
    held_out = sorted((ZOO / "digits-cnn" / "held_out").rglob("*.png"))[:2]
    for name, img in zip(("a.png", "z.png"), held_out):
        (src / name).write_bytes(img.read_bytes())
    (src / "loop.png").symlink_to("loop.png")
    (src / "dangling.png").symlink_to("nowhere.png")
    (src / "sub").mkdir()
    (src / "sub" / "up").symlink_to("..")                             # a folder loop: not entered
    assert score(digits_artifact, src, tmp_path) == [
        ("a.png", None, True), ("dangling.png", None, "input_file_unreadable"),
        ("loop.png", None, "input_file_unreadable"), ("z.png", None, True)]


def test_a_subfolder_that_cannot_be_listed_gets_its_line(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "1.png").write_bytes(b"x")
    (tmp_path / "b").mkdir()
    (tmp_path / "c.png").write_bytes(b"x")
    scandir = os.scandir

    def refuse(path="."):
        if os.fspath(path).endswith(os.sep + "b"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refuse)
    got = [(r.index, r.id, r.error and r.error.code) for r in read_records(tmp_path, "images")]
    assert got == [(0, "a/1.png", None), (1, "b/", "input_file_unreadable"), (2, "c.png", None)]
