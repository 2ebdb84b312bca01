"""``edge-infer score``: one line per input, in order; typed errors; resume after kill -9."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import edge_runtime as er
from edge_runtime.cli import main
from edge_runtime.score import _dump, score
from edge_runtime.score_inputs import Record, count_records, read_records
from factories import png_bytes


def lines(path):
    return [json.loads(x) for x in Path(path).read_text(encoding="utf-8").splitlines()]


def run_cli(*args):
    res = CliRunner().invoke(main, list(map(str, args)))
    return res


def test_text_file_every_line_answered_in_order(text_art, tmp_path):
    src = tmp_path / "in.txt"
    src.write_bytes(b"good movie\nbad\n\xff\xfe broken utf8\n" + b"x" * 20_000 + b"\nlast line")
    out = tmp_path / "out.jsonl"
    res = run_cli("score", text_art, src, "-o", out, "--json", "--batch-size", "2", "--quiet")
    assert res.exit_code == 0, res.output
    got = lines(out)
    assert [g["index"] for g in got] == [0, 1, 2, 3, 4] and [g["id"] for g in got] == [1, 2, 3, 4, 5]
    assert [g["ok"] for g in got] == [True, True, False, False, True]
    assert got[2]["error"]["code"] == "input_bad_encoding" and got[2]["error"]["type"] == "InputError"
    assert got[3]["error"]["code"] == "input_too_long"
    assert got[0]["result"]["prediction"] in ("negative", "positive") and got[0]["result"]["device"] == "fake:cpu"
    summary = json.loads(res.output)
    assert (summary["total"], summary["ok"], summary["rejected"], summary["failed"]) == (5, 3, 2, 0)
    assert summary["errors"] == {"input_bad_encoding": 1, "input_too_long": 1}
    assert summary["latency_ms"]["p50"] > 0 and summary["throughput_per_s"] > 0


def test_jsonl_bad_records_are_kept_with_their_error(text_art, tmp_path):
    src = tmp_path / "in.jsonl"
    rows = ['{"id": "a", "text": "good"}', "{not json", '[1, 2]', '{"id": "d", "body": "no text field"}',
            '{"id": "e", "text": 5}', '{"id": {"nested": 1}, "text": "fine"}', "[" * 100_000 + "]" * 100_000]
    src.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out.jsonl"
    assert run_cli("score", text_art, src, "-o", out, "--quiet").exit_code == 0
    got = lines(out)
    assert len(got) == len(rows) and [g["index"] for g in got] == list(range(len(rows)))
    assert [g["ok"] for g in got] == [True, False, False, False, False, True, False]
    assert got[0]["id"] == "a" and got[1]["id"] is None and got[1]["line"] == 2   # no id of its own: null, its line in "line"
    codes = [g.get("error", {}).get("code") for g in got]
    assert codes[1] == codes[2] == codes[6] == "input_bad_json"
    assert codes[3] == "input_field_missing" and codes[4] == "input_wrong_type"
    assert got[5]["id"] == '{"nested": 1}'


def test_jsonl_custom_field_and_id(text_art, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"key": 7, "body": "good"}\n{"key": 8, "body": "bad"}\n')
    out = tmp_path / "out.jsonl"
    assert run_cli("score", text_art, src, "-o", out, "--field", "body", "--id-field", "key", "--quiet").exit_code == 0
    assert [(g["id"], g["ok"]) for g in lines(out)] == [(7, True), (8, True)]


def test_csv_column_and_bad_rows(text_art, tmp_path):
    src = tmp_path / "in.csv"
    src.write_text('id,review\nr1,"good, really"\nr2\nr3,"multi\nline"\n')
    out = tmp_path / "out.jsonl"
    res = run_cli("score", text_art, src, "-o", out, "--field", "review", "--id-field", "id", "--quiet")
    assert res.exit_code == 0, res.output
    got = lines(out)
    assert [(g["id"], g["ok"]) for g in got] == [("r1", True), ("r2", False), ("r3", True)]
    assert got[1]["error"]["code"] == "input_field_missing"
    res = run_cli("score", text_art, src, "-o", tmp_path / "o2.jsonl", "--field", "nope", "--quiet")
    assert res.exit_code == 2 and "no column 'nope'" in res.output


def test_image_folder_recursive_with_broken_file(make_artifact, tmp_path):
    art = make_artifact("image-classification")
    folder = tmp_path / "imgs"
    (folder / "7").mkdir(parents=True)
    (folder / "a.png").write_bytes(png_bytes(np.eye(8, dtype=np.uint8) * 200))
    (folder / "7" / "b.png").write_bytes(png_bytes(np.full((8, 8), 30, np.uint8)))
    (folder / "7" / "c.png").write_bytes(png_bytes(np.full((8, 8), 30, np.uint8))[:40])   # truncated
    (folder / "notes.txt").write_text("not an image")
    out = tmp_path / "out.jsonl"
    assert run_cli("score", art, folder, "-o", out, "--quiet").exit_code == 0
    got = lines(out)
    assert [g["id"] for g in got] == ["7/b.png", "7/c.png", "a.png"]
    assert [g["ok"] for g in got] == [True, False, True] and got[1]["error"]["type"] == "InputError"


def test_output_exists_needs_resume_or_force(text_art, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("a\nb\n")
    out = tmp_path / "out.jsonl"
    assert run_cli("score", text_art, src, "-o", out, "--quiet").exit_code == 0
    res = run_cli("score", text_art, src, "-o", out, "--quiet")
    assert res.exit_code == 2 and "score_output_exists" in res.output
    assert run_cli("score", text_art, src, "-o", out, "--quiet", "--force").exit_code == 0
    assert len(lines(out)) == 2


def test_resume_cuts_a_partial_line_and_checks_the_input(text_art, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "text": f"text number {i}"}) + "\n" for i in range(10)))
    out = tmp_path / "out.jsonl"
    with er.load(text_art, device="fake") as rt:
        score(rt, (r for r in read_records(src, field="text") if r.index < 4), out)
    full = out.read_bytes()
    out.write_bytes(full + b'{"index": 4, "id": "r4", "ok": tr')          # a crash mid-line
    res = run_cli("score", text_art, src, "-o", out, "--resume", "--json", "--quiet")
    assert res.exit_code == 0, res.output
    got = lines(out)
    assert [g["id"] for g in got] == [f"r{i}" for i in range(10)]
    s = json.loads(res.output)
    assert s["resumed_from"] == 4 and s["scored"] == 6 and s["total"] == 10
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"id": f"x{i}", "text": "t"}) + "\n" for i in range(12)))
    res = run_cli("score", text_art, other, "-o", out, "--resume", "--quiet")
    assert res.exit_code == 2 and "score_output_mismatch" in res.output
    out.write_text('{"index": 0, "id": 1, "ok": true}\n{"index": 5}\n')
    res = run_cli("score", text_art, src, "-o", out, "--resume", "--quiet")
    assert res.exit_code == 2 and "score_output_corrupt" in res.output


def test_a_batch_refused_as_a_whole_is_retried_item_by_item(make_artifact, tmp_path):
    art = make_artifact("text-classification", limits={"max_request_bytes": 64})
    src = tmp_path / "in.txt"
    src.write_text("\n".join(["twenty bytes of text"] * 6 + ["y" * 100]) + "\n")
    out = tmp_path / "out.jsonl"
    assert run_cli("score", art, src, "-o", out, "--batch-size", "7", "--quiet").exit_code == 0
    got = lines(out)
    assert [g["ok"] for g in got] == [True] * 6 + [False] and got[6]["error"]["code"] == "input_too_large"


def test_nonfinite_results_are_failures_not_nan():
    class Bad:
        def to_dict(self):
            return {"prediction": "x", "scores": {"x": float("nan")}}

    line, text = _dump(Record(3, "id3"), Bad())
    assert not line["ok"] and line["error"]["code"] == "result_nonfinite" and "NaN" not in text.replace("NaN or", "")


def test_progress_lines_when_not_a_terminal(text_art, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("a\nb\nc\n")
    res = subprocess.run([sys.executable, "-m", "edge_runtime", "score", str(text_art), str(src), "-o",
                          str(tmp_path / "o.jsonl")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "progress done=3 total=3" in res.stderr and "3 inputs: 3 ok" in res.stdout
    assert count_records(src) == 3


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_resume_after_kill_9_scores_every_input_exactly_once(make_artifact, tmp_path, seed):
    """A real process killed with SIGKILL at a random point, then resumed."""
    art = make_artifact("text-classification")
    n = 400
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "text": f"input {i} " + "word " * (i % 13)}) + "\n"
                           for i in range(n)))
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "edge_runtime", "score", str(art), str(src), "-o", str(out), "--quiet",
           "--batch-size", "8", "--device", "fake", "--device-option", "stall_ms=3"]
    rng = random.Random(seed)
    kill_after = rng.randint(5, n - 60)           # lines written before the kill
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t_end = time.time() + 90
    while time.time() < t_end:
        if out.exists() and out.read_bytes().count(b"\n") >= kill_after:
            break
        if proc.poll() is not None:
            break
        time.sleep(rng.uniform(0, 0.01))
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    before = out.read_bytes().count(b"\n")
    assert 0 < before < n
    res = subprocess.run(cmd + ["--resume", "--json"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    got = lines(out)
    assert [g["index"] for g in got] == list(range(n))
    assert [g["id"] for g in got] == [f"r{i}" for i in range(n)]
    assert all(g["ok"] for g in got)
    s = json.loads(res.stdout)
    assert s["resumed_from"] == before and s["resumed_from"] + s["scored"] == n
