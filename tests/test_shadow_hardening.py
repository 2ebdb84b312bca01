"""``edge-infer shadow`` (and ``score --engine ray``) hardened as ``score`` was
(tests/test_score_hardening.py): a bad ``-o`` is a typed input error naming the path (exit 2);
``--force`` / ``--resume`` never delete or write anything but a regular file that is not the
input; every output line is strict UTF-8 JSON whatever the id holds, and no record is lost or
turned into a failure because of its id."""

import json
import os
import stat
from pathlib import Path

import pytest

from edge_runtime import score_lines
from edge_runtime.errors import InputError
from edge_runtime.score_inputs import Record
from output_cases import fifo_output, input_as_output, no_constant, run_cli, strict_lines, text_input


@pytest.fixture
def arts(make_artifact):
    return make_artifact("text-classification"), make_artifact("text-classification", seed=3)


def shadow(arts, src, out, *flags):
    return run_cli("shadow", *arts, src, "-o", out, *flags, "--quiet")


# -- 1. a bad -o is the caller's: a typed input error naming the path, exit 2 --------------------------

def test_an_output_under_a_file_is_a_typed_input_error(arts, tmp_path):
    src = text_input(tmp_path)
    blocker = tmp_path / "plain.txt"
    blocker.write_text("a file, not a folder")
    out = blocker / "x.jsonl"
    res = shadow(arts, src, out)
    assert res.exit_code == 2 and "input_invalid" in res.output and f"cannot write the output {out}" in res.output, \
        res.output
    assert "FileExistsError" not in res.output and blocker.read_text() == "a file, not a folder"


@pytest.mark.parametrize("out", ["/proc/nope/x.jsonl", "/proc/x.jsonl"])   # no folder; the job record's write
def test_an_output_that_cannot_be_created_is_a_typed_input_error(arts, tmp_path, out):
    if not Path("/proc/self").exists():
        pytest.skip("no /proc")
    res = shadow(arts, text_input(tmp_path), out)
    # refused before any write is tried (score_job: nothing under /proc or /dev is an output)
    assert res.exit_code == 2 and "input_invalid" in res.output and f"the output {out} is under /dev or /proc" \
        in res.output, res.output


def test_an_existing_folder_as_output_is_a_typed_input_error(arts, tmp_path):
    src = text_input(tmp_path)
    folder = tmp_path / "somedir"
    folder.mkdir()
    (folder / "keep.txt").write_text("kept")
    for flags in (["--force"], []):
        res = shadow(arts, src, folder, *flags)
        assert res.exit_code == 2 and f"{folder} is a folder" in res.output, res.output
        assert "IsADirectoryError" not in res.output
    assert (folder / "keep.txt").read_text() == "kept"


def test_a_report_path_that_cannot_be_written_is_a_typed_input_error(arts, tmp_path):
    blocker = tmp_path / "plain.txt"
    blocker.write_text("x")
    res = run_cli("shadow", *arts, text_input(tmp_path), "--report", blocker / "r.html", "--quiet")
    assert res.exit_code == 2 and "input_invalid" in res.output and str(blocker / "r.html") in res.output, res.output


def test_an_input_path_with_an_undecodable_byte_gets_its_job_record(arts, tmp_path):
    """The job record names the input's path: one with a byte that is not UTF-8 is written as score
    writes it (score_job._write_job), not a UnicodeEncodeError before the first line."""
    src = Path(os.fsdecode(bytes(tmp_path) + b"/in\xe9.txt"))
    src.write_text("good\nbad\n")
    out = tmp_path / "out.jsonl"
    res = shadow(arts, src, out)
    assert res.exit_code == 0, res.output
    assert len(strict_lines(out)) == 2 and Path(f"{out}.job.json").exists()
    res = shadow(arts, src, out, "--resume")       # and read back (score's own resume had the same hole)
    assert res.exit_code == 0, res.output
    res = run_cli("score", arts[0], src, "-o", tmp_path / "s.jsonl", "--quiet")
    assert res.exit_code == 0, res.output
    res = run_cli("score", arts[0], src, "-o", tmp_path / "s.jsonl", "--resume", "--quiet")
    assert res.exit_code == 0, res.output


# -- 1b. --force / --resume never delete or write anything but a regular file that is not the input ------
# (shadow goes through score_job.prepare_output, whose check_output refuses these: pinned here)

@pytest.mark.parametrize("via", ["fifo", "link-to-fifo"])
def test_force_refuses_an_output_that_is_not_a_regular_file(arts, tmp_path, via):
    src = text_input(tmp_path)
    fifo, out = fifo_output(tmp_path, via)
    res = shadow(arts, src, out, "--force")
    assert res.exit_code == 2 and "input_invalid" in res.output and "not a regular file" in res.output, res.output
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and os.path.lexists(out)
    assert not Path(f"{out}.job.json").exists()


@pytest.mark.parametrize("how", ["same", "symlink", "hardlink"])
@pytest.mark.parametrize("flag", ["--force", "--resume"])
def test_the_input_itself_is_never_the_output(arts, tmp_path, how, flag):
    src = text_input(tmp_path)
    before = src.read_bytes()
    out = input_as_output(src, tmp_path, how)
    res = shadow(arts, src, out, flag)
    assert res.exit_code == 2 and "is the input" in res.output and "input_invalid" in res.output, res.output
    assert src.read_bytes() == before and os.path.lexists(out)
    assert not Path(f"{out}.job.json").exists()


def test_a_job_record_path_that_is_a_folder_is_refused(arts, tmp_path):
    src = text_input(tmp_path)
    out = tmp_path / "out.jsonl"
    assert shadow(arts, src, out).exit_code == 0
    job = Path(f"{out}.job.json")
    job.unlink()
    job.mkdir()
    res = shadow(arts, src, out, "--force")
    assert res.exit_code == 2 and "job record" in res.output and "a folder" in res.output, res.output
    assert job.is_dir() and len(strict_lines(out)) == 3


# -- 2. ids with a lone surrogate, an undecodable byte, NaN: strict UTF-8 JSON, every record compared ------

def test_lone_surrogate_ids_and_inputs_are_escaped_and_every_record_is_compared(arts, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "ok1", "text": "good"}\n{"id": "\\ud800", "text": "bad"}\n'
                   '{"id": "x\\udcff", "text": "gr\\udc80eat"}\n{"id": "ok2", "text": "awful"}\n')
    out = tmp_path / "out.jsonl"
    res = shadow(arts, src, out, "--report", tmp_path / "r.html")
    assert res.exit_code == 0, res.output
    got = strict_lines(out)
    assert [g["id"] for g in got] == ["ok1", "\ud800", "x\udcff", "ok2"]
    assert all(g["ok"] and g["compare"] is not None for g in got[:2] + got[3:])
    # a text with a lone surrogate is the model's typed refusal on both sides, its line written all the same
    assert got[2]["input"] == "gr\udc80eat" and got[2]["error"]["code"] == "input_bad_encoding"
    assert b"\\ud800" in out.read_bytes()
    (tmp_path / "r.html").read_bytes().decode("utf-8")
    res = shadow(arts, src, out, "--resume")             # it reads back, and the last id matches, for a resume
    assert res.exit_code == 0 and len(strict_lines(out)) == 4, res.output


def test_lone_surrogate_ids_to_stdout_are_strict_utf8(arts, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "\\ud800", "text": "bad"}\n')
    res = run_cli("shadow", *arts, src, "-o", "-", "--quiet")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout_bytes.decode("utf-8").splitlines()[0])["id"] == "\ud800"


def test_an_undecodable_csv_id_cell_keeps_the_line_valid_utf8(arts, tmp_path):
    src = tmp_path / "in.csv"
    src.write_bytes(b"id,text\nr\xe9,good\nr2,bad\n")
    out = tmp_path / "out.jsonl"
    res = shadow(arts, src, out)                        # the text summary names the worst ids too
    assert res.exit_code == 0, res.output
    got = strict_lines(out)
    assert [(g["id"], g["ok"]) for g in got] == [("r\udce9", True), ("r2", True)]
    assert got[0]["id"].encode("utf-8", "surrogateescape") == b"r\xe9"


def test_nan_and_infinite_ids_are_strings_the_comparison_stays_and_resume_matches(arts, tmp_path):
    src = tmp_path / "in.jsonl"
    body = ('{"id": NaN, "text": "good"}\n{"id": Infinity, "text": "bad"}\n'
            '{"id": -Infinity, "text": "awful"}\n{"id": 1e999, "text": "fine"}\n')
    src.write_text(body)
    out = tmp_path / "out.jsonl"
    res = shadow(arts, src, out, "--json")
    assert res.exit_code == 0, res.output
    got = strict_lines(out)
    assert [g["id"] for g in got] == ["NaN", "Infinity", "-Infinity", "Infinity"]
    assert all(g["ok"] and g["compare"] is not None for g in got)
    s = json.loads(res.output)
    assert s["compared"] == 4 and not s["errors"]["a"] and not s["errors"]["b"]
    # a resume whose last complete line is a NaN id: the id read back ("NaN") matches the input's
    out.write_bytes(b"".join(out.read_bytes().splitlines(keepends=True)[:1]))
    res = shadow(arts, src, out, "--resume")
    assert res.exit_code == 0, res.output
    assert [g["id"] for g in strict_lines(out)] == ["NaN", "Infinity", "-Infinity", "Infinity"]


def test_resume_through_the_api_matches_a_nonfinite_or_numpy_last_id(arts, tmp_path):
    """Records given to ``shadow()`` directly keep their raw id (the JSONL reader already spells NaN
    "NaN"): the last line's id read back is compared as written (``_jsonable``), as ``score`` does."""
    import numpy as np

    from edge_runtime.runtime import load
    from edge_runtime.shadow import shadow as run_shadow

    out = tmp_path / "out.jsonl"
    for rid in (float("nan"), np.float32("inf"), np.int64(7)):
        recs = [Record(0, "r0", "good", line=1), Record(1, rid, "bad", line=2), Record(2, "r2", "awful", line=3)]
        with load(arts[0]) as a, load(arts[1]) as b:
            run_shadow(a, b, recs, out, force=True)
            out.write_bytes(b"".join(out.read_bytes().splitlines(keepends=True)[:2]))     # cut after rid
            s = run_shadow(a, b, recs, out, resume=True)
        assert s.resumed_from == 2 and s.total == 3 and len(strict_lines(out)) == 3


@pytest.mark.parametrize("writer", ["orjson", "json"])
@pytest.mark.parametrize("rid", ["\ud800", "a\udcff", "caf\u00e9\\\ud800", float("nan"), float("-inf")])
def test_dumps_is_strict_utf8_json_with_either_writer(monkeypatch, writer, rid):
    from edge_runtime.shadow import _dumps, shadow_line

    if writer == "json":
        monkeypatch.setattr(score_lines, "_orjson", None)
    err = InputError("x", code="input_empty")
    text, line = _dumps(shadow_line(Record(0, rid, "t\ud800", line=1), err, err, None, None))
    back = json.loads(text.encode("utf-8"), parse_constant=no_constant)
    assert back == line and back["error"]["code"] == "input_empty" and back["input"] == "t\ud800"
    assert back["id"] == (rid if isinstance(rid, str) else json.dumps(rid))


def test_a_nan_comparison_with_both_sides_finite_never_crashes_the_writer():
    from edge_runtime.shadow import _dumps

    side = {"ok": True, "result": {"prediction": "x", "latency_ms": 1.0}}
    line = {"index": 0, "id": "\ud800", "line": 1, "ok": True, "agree": True, "truth": None, "input": "t",
            "a": side, "b": side, "compare": {"kind": "tensors", "cosine": float("nan"), "agree": True}}
    text, written = _dumps(line)
    back = json.loads(text.encode("utf-8"), parse_constant=no_constant)
    assert back == written and back["a"]["ok"] and back["b"]["ok"] and back["ok"] is False
    assert back["error"]["code"] == "result_nonfinite" and back["agree"] is False and back["id"] == "\ud800"


# -- 3. score --engine ray: a parquet -o that is the input is refused like the local engine -------------

@pytest.mark.parametrize("flags", [{"force": True}, {"resume": True}])
def test_ray_parquet_output_that_is_the_input_is_refused(make_artifact, tmp_path, flags):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from edge_runtime.score_ray import score_ray

    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["good", "bad"]}), src)
    before = src.read_bytes()
    with pytest.raises(InputError) as e:
        score_ray(make_artifact("text-classification"), src, src, field="text", batch_size=4, **flags)
    assert e.value.code == "input_invalid" and "is the input" in e.value.message
    assert src.read_bytes() == before


def test_ray_parquet_output_that_links_to_a_jsonl_input_is_refused(make_artifact, tmp_path):
    from edge_runtime.score_ray import score_ray

    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "text": "good"}\n')
    out = tmp_path / "out.parquet"
    os.link(src, out)
    with pytest.raises(InputError) as e:
        score_ray(make_artifact("text-classification"), src, out, batch_size=4, force=True)
    assert e.value.code == "input_invalid" and "is the input" in e.value.message
    assert out.exists() and src.read_text() == '{"id": "a", "text": "good"}\n'


def test_ray_output_under_a_file_is_a_typed_input_error(make_artifact, tmp_path):
    from edge_runtime.score_ray import score_ray

    src = text_input(tmp_path)
    blocker = tmp_path / "plain.txt"
    blocker.write_text("x")
    with pytest.raises(InputError) as e:
        score_ray(make_artifact("text-classification"), src, blocker / "o.jsonl", batch_size=4)
    assert e.value.code == "input_invalid" and "cannot write the output" in e.value.message
