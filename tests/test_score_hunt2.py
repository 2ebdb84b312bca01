"""``edge-infer score``: inputs that used to give a wrong answer with exit 0, or lose / add records.

- a CSV/TSV row with more fields than its header (a delimiter in an unquoted text): its text was cut
  at the stray delimiter and scored ``ok``; now an ``input_bad_csv`` line;
- a CSV header naming the input (or id) column twice: the first was taken silently; now refused;
- a JSONL line with its field or id member twice: ``json`` kept the last silently; now ``input_bad_json``;
- a UTF-16 / UTF-32 input (Notepad's "Unicode"): its lines were scored as texts with a NUL between
  their letters, one record more than lines; now refused (``input_bad_encoding``) before any line;
- an output inside the artifact (``-o ART/manifest.json --force`` deleted the manifest) or an image
  in the input folder (deleted an input, or read the output as one more input): now refused;
- U+2028 / U+2029 / U+0085 in an id: written raw, so ``str.splitlines`` read one line as two.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_runtime import score_lines
from edge_runtime.errors import InputError
from edge_runtime.score_inputs import Record, count_records, read_records
from factories import png_bytes
from output_cases import run_cli, strict_lines


def scored(art, src, out, *flags):
    res = run_cli("score", art, src, "-o", out, "--quiet", *flags)
    return res, (strict_lines(out) if Path(out).exists() else None)


# -- 1. a CSV/TSV row with more fields than the header ----------------------------------------------------

@pytest.mark.parametrize("suffix,sep", [(".csv", ","), (".tsv", "\t")])
def test_a_stray_delimiter_in_an_unquoted_text_is_a_bad_row_not_a_cut_text(text_art, tmp_path, suffix, sep):
    src = tmp_path / f"in{suffix}"
    src.write_text(f"id{sep}text\nr1{sep}hello{sep} world\nr2{sep}fine\nr3{sep}\"quoted{sep} ok\"\n")
    res, got = scored(text_art, src, tmp_path / "out.jsonl")
    assert res.exit_code == 0, res.output
    assert [(g["id"], g["line"], g["ok"] or g["error"]["code"]) for g in got] == [
        ("r1", 2, "input_bad_csv"), ("r2", 3, True), ("r3", 4, True)]
    assert "3 fields, the header 2" in got[0]["error"]["message"]
    assert count_records(src) == 3


def test_a_single_column_csv_with_a_comma_in_a_text_is_not_scored_cut(text_art, tmp_path):
    src = tmp_path / "in.csv"
    src.write_text("text\nWell, it was fine\n")
    res, got = scored(text_art, src, tmp_path / "out.jsonl")
    assert res.exit_code == 2 and "score_nothing_succeeded" in res.output, res.output
    assert [(g["id"], g["ok"], g["error"]["code"]) for g in got] == [(None, False, "input_bad_csv")]
    short = tmp_path / "short.csv"                          # fewer fields than the header: read as before
    short.write_text("id,text,label\nr1,good\nr2\n\nr4,bad,neg\nr5,bad,neg,x\n")
    got = [(r.id, r.value, r.error and r.error.code) for r in read_records(short, field="text")]
    assert got == [("r1", "good", None), ("r2", None, "input_field_missing"), (None, None, "input_field_missing"),
                   ("r4", "bad", None), ("r5", None, "input_bad_csv")]


def test_a_shifted_row_gets_no_id_unless_the_id_is_its_first_cell(text_art, tmp_path):
    src = tmp_path / "in.csv"
    src.write_text("text,id\nhello, world,7\nfine,8\n")
    rec = list(read_records(src, field="text"))
    assert (rec[0].id, rec[0].error.code) == (None, "input_bad_csv")        # " world" is no id
    assert (rec[1].id, rec[1].value, rec[1].error) == ("8", "fine", None)


# -- 2. a header naming the input or the id column twice ----------------------------------------------------

@pytest.mark.parametrize("header,flags,what", [
    ("id,text,text", [], "column 'text' 2 times (columns 2, 3)"),
    ("id,text,id", [], "id column 'id' 2 times (columns 1, 3)"),
    ("key,review,key", ["--field", "review", "--id-field", "key"], "id column 'key' 2 times"),
])
def test_a_header_naming_a_column_twice_is_refused_before_any_line(text_art, tmp_path, header, flags, what):
    src = tmp_path / "in.csv"
    src.write_text(f"{header}\nr1,good,bad\n")
    out = tmp_path / "out.jsonl"
    res = run_cli("score", text_art, src, "-o", out, "--quiet", *flags)
    assert res.exit_code == 2 and "input_bad_csv" in res.output and what in res.output, res.output
    assert not out.exists()
    src.write_text("id,text,note,note,,\nr1,good,a,b,,\n")      # a column named twice that nobody reads: fine
    assert [(r.id, r.value) for r in read_records(src, field="text")] == [("r1", "good")]


# -- 3. a JSONL member twice ----------------------------------------------------------------------------

def test_a_jsonl_field_or_id_twice_is_bad_json(text_art, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"id": 1, "text": "good", "text": "awful"}\n'
                    b'{"id": 1, "id": 2, "text": "fine"}\n'
                    b'{"id": 3, "t\\u0065xt": "good", "text": "awful"}\n'       # the same key, escaped
                    b'{"id": 4, "text": "say \\"text\\" and \\"text\\""}\n'     # the key's text in a value
                    b'{"id": 5, "meta": {"text": 1, "id": 9}, "text": "ok"}\n'  # a nested object's keys
                    b'{"id": 6, "extra": 1, "extra": 2, "text": "ok"}\n')       # a member nobody reads
    res, got = scored(text_art, src, tmp_path / "out.jsonl")
    assert res.exit_code == 0, res.output
    assert [(g["id"], g["ok"] or g["error"]["code"]) for g in got] == [
        (1, "input_bad_json"), (None, "input_bad_json"), (3, "input_bad_json"), (4, True), (5, True), (6, True)]
    assert "'text' more than once" in got[0]["error"]["message"]
    assert "'id' more than once" in got[1]["error"]["message"]


# -- 4. UTF-16 / UTF-32 input ------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix,body", [
    (".txt", "good movie\nbad movie\n"),
    (".jsonl", '{"id": 1, "text": "good"}\n{"id": 2, "text": "bad"}\n'),
    (".csv", "id,text\n1,good\n2,bad\n"),
    (".tsv", "id\ttext\n1\tgood\n2\tbad\n"),
])
@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
def test_a_utf16_or_utf32_input_is_refused_before_any_line(text_art, tmp_path, suffix, body, encoding):
    src = tmp_path / f"in{suffix}"
    bom = {"utf-16-be": b"\xfe\xff"}.get(encoding, b"")
    src.write_bytes(bom + body.encode(encoding))
    out = tmp_path / "out.jsonl"
    res = run_cli("score", text_art, src, "-o", out, "--quiet")
    assert res.exit_code == 2 and "input_bad_encoding" in res.output and "byte order mark" in res.output, res.output
    assert not out.exists() and not Path(f"{out}.job.json").exists()


def test_a_utf16_pipe_is_refused(text_art, tmp_path):
    out = tmp_path / "out.jsonl"
    res = subprocess.run([sys.executable, "-m", "edge_runtime", "score", str(text_art), "/dev/stdin", "-o", str(out),
                          "--quiet"], input="good\nbad\n".encode("utf-16"), capture_output=True, timeout=120)
    assert res.returncode == 2 and b"input_bad_encoding" in res.stderr, res.stderr
    assert not out.exists() or strict_lines(out) == []
    src = tmp_path / "in.txt"                                   # a UTF-8 one is still dropped
    src.write_bytes(b"\xef\xbb\xbfgood\n")
    assert [(r.id, r.value) for r in read_records(src)] == [(1, "good")]


# -- 5. the output is never inside the artifact, nor an image of the input folder ----------------------

def _png(seed: int) -> bytes:
    return png_bytes(np.random.default_rng(seed).integers(0, 255, (8, 8), dtype=np.uint8))


def _tree(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name,flags", [("manifest.json", ["--force"]), ("scores.jsonl", []),
                                        ("sub/scores.jsonl", []), ("via-link", [])])
def test_an_output_inside_the_artifact_is_refused(text_art, tmp_path, name, flags):
    src = tmp_path / "in.txt"
    src.write_text("good\nbad\n")
    before = _tree(text_art)
    out = text_art / name
    if name == "via-link":
        (tmp_path / "artlink").symlink_to(text_art)
        out = tmp_path / "artlink" / "scores.jsonl"
    res = run_cli("score", text_art, src, "-o", out, "--quiet", *flags)
    assert res.exit_code == 2 and "input_invalid" in res.output and "inside the artifact" in res.output, res.output
    assert _tree(text_art) == before                         # nothing deleted, nothing added
    assert run_cli("score", text_art, src, "-o", tmp_path / "ok.jsonl", "--quiet").exit_code == 0


@pytest.mark.parametrize("name,flags", [("a.png", ["--force"]), ("new.PNG", []), ("sub/x.jpg", [])])
def test_an_output_that_is_an_image_of_the_input_folder_is_refused(image_art, tmp_path, name, flags):
    imgs = tmp_path / "imgs"
    (imgs / "sub").mkdir(parents=True)
    (imgs / "a.png").write_bytes(_png(1))
    (imgs / "sub" / "b.png").write_bytes(_png(2))
    before = _tree(imgs)
    res = run_cli("score", image_art, imgs, "-o", imgs / name, "--quiet", *flags)
    assert res.exit_code == 2 and "an image in the input folder" in res.output, res.output
    assert _tree(imgs) == before
    res, got = scored(image_art, imgs, imgs / "scores.jsonl")     # a JSONL output there is no image: fine
    assert res.exit_code == 0 and [g["id"] for g in got] == ["a.png", "sub/b.png"], res.output


# -- 6. a line separator inside a string does not split an output line ---------------------------------

@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\x85"])
def test_unicode_line_separators_are_escaped(text_art, tmp_path, sep):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": f"a{sep}b", "text": f"x{sep}y"}, ensure_ascii=False) + "\n"
                   + json.dumps({"id": 2, "text": "z"}) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    res = run_cli("score", text_art, src, "-o", out, "--quiet")
    assert res.exit_code == 0, res.output
    text = out.read_text(encoding="utf-8")
    assert sep not in text and len(text.splitlines()) == 2
    assert [g["id"] for g in strict_lines(out)] == [f"a{sep}b", 2]


@pytest.mark.parametrize("writer", ["orjson", "json"])
def test_dump_escapes_line_separators_with_either_writer(monkeypatch, writer):
    if writer == "json":
        monkeypatch.setattr(score_lines, "_orjson", None)
    line, text = score_lines._dump(Record(0, "a\u2028b\x85", line=1), InputError("m\u2029", code="input_empty"))
    assert not any(c in text for c in "\u2028\u2029\x85") and json.loads(text) == line


def test_a_resumed_output_with_an_escaped_separator_goes_on(text_art, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}\u2028", "text": "good"}, ensure_ascii=False) + "\n"
                           for i in range(5)), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    assert run_cli("score", text_art, src, "-o", out, "--quiet").exit_code == 0
    data = out.read_bytes()
    cut = data.index(b"\n", data.index(b"\n") + 1) + 20          # two lines and a partial third
    out.write_bytes(data[:cut])
    res = run_cli("score", text_art, src, "-o", out, "--quiet", "--resume", "--json")
    assert res.exit_code == 0, res.output
    assert [g["id"] for g in strict_lines(out)] == [f"r{i}\u2028" for i in range(5)]
    summary = json.loads(res.output[res.output.index("{"):])
    assert (summary["total"], summary["resumed_from"], summary["scored"]) == (5, 2, 3)


# -- 7. -o - appended to the input itself ------------------------------------------------------------------

@pytest.mark.parametrize("how", ["path", "stdin"])
def test_stdout_appended_to_the_input_is_refused_not_a_run_without_end(text_art, tmp_path, how):
    src = tmp_path / "in.txt"
    src.write_text("good\nbad\nawful\n")
    arg = str(src) if how == "path" else "/dev/stdin"
    with open(src, "ab") as out, open(src, "rb") as inp:
        res = subprocess.run([sys.executable, "-m", "edge_runtime", "score", str(text_art), arg, "-o", "-", "--quiet"],
                             stdin=inp, stdout=out, stderr=subprocess.PIPE, timeout=60)
    assert res.returncode == 2 and b"input_invalid" in res.stderr and b"stdout is the input" in res.stderr, res.stderr
    assert src.read_text() == "good\nbad\nawful\n"
    with open(tmp_path / "o.jsonl", "wb") as out, open(src, "rb") as inp:       # stdout to another file: fine
        res = subprocess.run([sys.executable, "-m", "edge_runtime", "score", str(text_art), arg, "-o", "-", "--quiet"],
                             stdin=inp, stdout=out, stderr=subprocess.PIPE, timeout=60)
    assert res.returncode == 0, res.stderr
    assert [g["id"] for g in strict_lines(tmp_path / "o.jsonl")] == [1, 2, 3]


def test_stdout_appended_to_a_file_of_the_artifact_is_refused(text_art, tmp_path):
    """``score ART IN -o - >> ART/manifest.json`` wrote the result lines into the sealed artifact it ran."""
    src = tmp_path / "in.txt"
    src.write_text("good\n")
    target = text_art / "labels.txt"
    before = target.read_bytes()
    with open(target, "ab") as out:
        res = subprocess.run([sys.executable, "-m", "edge_runtime", "score", str(text_art), str(src), "-o", "-",
                              "--quiet"], stdout=out, stderr=subprocess.PIPE, timeout=60)
    assert res.returncode == 2 and b"input_invalid" in res.stderr and b"a file of the artifact" in res.stderr, \
        res.stderr
    assert target.read_bytes() == before


# -- 8. --field / --id-field where the input has no fields ---------------------------------------------------

@pytest.mark.parametrize("flags", [["--field", "review"], ["--id-field", "id"]])
def test_a_field_option_on_a_text_input_is_refused_not_ignored(text_art, tmp_path, flags):
    src = tmp_path / "data.txt"
    src.write_text("id,review\n1,great movie\n2,awful\n")        # a CSV under a .txt name
    out = tmp_path / "out.jsonl"
    res = run_cli("score", text_art, src, "-o", out, "--quiet", *flags)
    assert res.exit_code == 2 and "input_invalid" in res.output and "--format jsonl or csv" in res.output, res.output
    assert not out.exists()
    res, got = scored(text_art, src, out, "--format", "csv", "--field", "review", *flags)
    assert res.exit_code == 0 and [g["id"] for g in got] == ["1", "2"], res.output   # as CSV: two rows, no header


def test_a_field_option_on_an_image_folder_is_refused(image_art, tmp_path):
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    (imgs / "a.png").write_bytes(_png(1))
    res = run_cli("score", image_art, imgs, "-o", tmp_path / "out.jsonl", "--quiet", "--field", "image")
    assert res.exit_code == 2 and "read as images" in res.output, res.output


def test_a_field_option_on_a_text_input_is_refused_with_the_ray_engine_too(text_art, tmp_path):
    src = tmp_path / "data.txt"
    src.write_text("id,review\n1,great movie\n")
    res = run_cli("score", text_art, src, "-o", tmp_path / "out.jsonl", "--quiet", "--engine", "ray",
                  "--field", "review")
    assert res.exit_code == 2 and "read as text" in res.output, res.output       # before Ray starts


def test_an_output_under_dev_or_proc_is_refused_before_anything_is_touched(tmp_path):
    """``-o /dev/stdout --force`` with stdout redirected to a file passed every check (the link's target
    is a regular file) and then unlinked /dev/stdout itself (as root: for every process until a reboot),
    and wrote the job record as /dev/stdout.job.json."""
    import edge_runtime as er
    from edge_runtime.score_job import check_output, overwrite

    for out in ("/dev/stdout", "/proc/self/fd/1", "/dev/fd/1"):
        with pytest.raises(er.InputError, match="under /dev or /proc") as ei:
            overwrite(Path(out), True)
        assert ei.value.code == "input_invalid"
    check_output(tmp_path / "out.jsonl")        # an ordinary path is fine, /dev/shm (a tmpfs) too
    check_output(Path("/dev/shm/edge-runtime-test-never-written.jsonl"))
