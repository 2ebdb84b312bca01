"""``score`` and ``eval`` never give a wrong answer with exit 0 and never drop rows silently
(#15, part B): resume checks the job's identity, eval reports every skipped row, score fails
when nothing (or too much) failed, CSV ids and fallback ids, ``-o -``, --help examples."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import need_litert, shared
from factories import png_bytes

import edge_runtime as er
from edge_runtime.cli import main
from edge_runtime.score import score
from edge_runtime.score_inputs import read_records


def job_path(out):
    """The job record beside an output (edge_runtime.score.job_path)."""
    return Path(str(out) + ".job.json")


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def lines(path):
    return [json.loads(x) for x in Path(path).read_text(encoding="utf-8").splitlines()]


def keep_lines(path, n):
    """What a crash leaves: the first ``n`` complete lines and a partial one."""
    data = Path(path).read_bytes().split(b"\n")
    Path(path).write_bytes(b"\n".join(data[:n]) + b"\n" + data[n][:17])


def one_error(res, code):
    err = res.stderr.strip().splitlines()
    assert err and err[-1].startswith(f"error [{code}]"), res.output
    assert "Traceback" not in res.output
    return err[-1]


def _texts(path, n, word):
    path.write_text("".join(f"{word} {i}\n" for i in range(n)))
    return path


# -- 5. resume checks that it resumes the same job ------------------------------------------------

def test_job_record_is_written_before_the_lines_and_a_same_job_resume_goes_on(text_art, tmp_path):
    src = _texts(tmp_path / "in.txt", 40, "good")
    out = tmp_path / "out.jsonl"
    res = run("score", text_art, src, "-o", out, "--quiet", "--batch-size", "8")
    assert res.exit_code == 0, res.output
    job = json.loads(job_path(out).read_text())
    man = json.loads((text_art / "manifest.json").read_text())
    assert job["schema"] == "edge-infer-score-job/1"
    assert job["artifact"]["manifest_sha256"] == man["manifest_sha256"]
    assert (job["variant"], job["device"]) == ("fake", "fake:cpu")
    assert job["input"]["format"] == "text" and job["input"]["bytes"] == src.stat().st_size
    assert len(job["input"]["sha256"]) == 64 and job["options"] == {"deadline_ms": None, "device_options": {}}
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]       # written atomically, nothing left over
    keep_lines(out, 23)
    res = run("score", text_art, src, "-o", out, "--quiet", "--resume", "--json")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert (s["resumed_from"], s["scored"], s["warnings"]) == (23, 17, [])
    assert [g["id"] for g in lines(out)] == list(range(1, 41))


def test_resume_with_another_input_file_of_the_same_length_is_refused(text_art, tmp_path):
    """Ids are line numbers in a text file: the last line's id matches any 40-line input."""
    src = _texts(tmp_path / "in.txt", 40, "good")
    out = tmp_path / "out.jsonl"
    assert run("score", text_art, src, "-o", out, "--quiet").exit_code == 0
    keep_lines(out, 20)
    before = out.read_bytes()
    other = _texts(tmp_path / "other.txt", 40, "bad")
    res = run("score", text_art, other, "-o", out, "--quiet", "--resume")
    assert res.exit_code == 2
    msg = one_error(res, "score_output_mismatch")
    assert "input sha256" in msg and "--force" in msg
    assert out.read_bytes() == before                                     # nothing written, nothing cut
    moved = tmp_path / "moved.txt"                     # the same content under another name is the same input
    shutil.copy(src, moved)
    res = run("score", text_art, moved, "-o", out, "--quiet", "--resume")
    assert res.exit_code == 0, res.output
    assert len(lines(out)) == 40


def test_resume_with_another_model_is_refused_coral(coral_artifact, tmp_path):
    """The issue's case: an output made by one Coral MobileNet resumed with the other."""
    from edge_runtime.converters.tflite_import import import_tflite

    need_litert()
    coral = shared("coral")
    mnv2 = tmp_path / "mnv2"
    import_tflite(coral / "mobilenet_v2_1.0_224_quant.tflite", mnv2, labels=coral / "imagenet_labels.txt")
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    for name in ("cat.bmp", "parrot.jpg", "grace_hopper.bmp", "bird.bmp"):
        shutil.copy(coral / name, imgs / name)
    out = tmp_path / "out.jsonl"
    res = run("score", coral_artifact, imgs, "-o", out, "--quiet", "--batch-size", "1")
    assert res.exit_code == 0, res.output
    keep_lines(out, 2)
    before = out.read_bytes()
    res = run("score", mnv2, imgs, "-o", out, "--quiet", "--resume")
    assert res.exit_code == 2
    assert "artifact manifest_sha256" in one_error(res, "score_output_mismatch")
    assert out.read_bytes() == before                                     # untouched
    res = run("score", coral_artifact, imgs, "-o", out, "--quiet", "--resume")
    assert res.exit_code == 0, res.output
    got = lines(out)
    assert [g["id"] for g in got] == sorted(["cat.bmp", "parrot.jpg", "grace_hopper.bmp", "bird.bmp"])
    assert {g["result"]["model"] for g in got} == {json.loads((coral_artifact / "manifest.json").read_text())
                                                   ["model"]["name"]}


def test_resume_with_changed_options_is_refused(text_art, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "text": "good", "body": "bad"}) + "\n" for i in range(10)))
    out = tmp_path / "out.jsonl"
    assert run("score", text_art, src, "-o", out, "--quiet").exit_code == 0
    keep_lines(out, 5)
    for extra, needle in [(["--field", "body"], "input field"), (["--deadline-ms", "999"], "deadline_ms"),
                          (["--device-option", "stall_ms=1"], "device_options"),
                          (["--format", "text"], "input format")]:
        res = run("score", text_art, src, "-o", out, "--quiet", "--resume", *extra)
        assert res.exit_code == 2, (extra, res.output)
        assert needle in one_error(res, "score_output_mismatch"), extra
    assert run("score", text_art, src, "-o", out, "--quiet", "--resume").exit_code == 0


def test_resume_of_a_changed_image_folder_is_refused(image_art, tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(4):
        (folder / f"{i}.png").write_bytes(png_bytes(np.full((8, 8), 40 * i, np.uint8)))
    out = tmp_path / "out.jsonl"
    assert run("score", image_art, folder, "-o", out, "--quiet").exit_code == 0
    job = json.loads(job_path(out).read_text())["input"]
    assert (job["kind"], job["files"]) == ("folder", 4)
    keep_lines(out, 2)
    (folder / "0.png").write_bytes(png_bytes(np.full((8, 8), 255, np.uint8)))     # same name, other pixels
    res = run("score", image_art, folder, "-o", out, "--quiet", "--resume")
    assert res.exit_code == 2 and "input sha256" in one_error(res, "score_output_mismatch")


@pytest.mark.parametrize("resume, force, out, refused", [
    (True, True, "out.jsonl", True), (True, False, "-", True), (True, False, None, True),
    (True, False, "out.jsonl", False), (False, True, "-", False), (False, False, None, False)])
def test_every_scorer_refuses_the_same_resume_options(resume, force, out, refused, tmp_path):
    """score, score --engine ray and shadow share one check (score_job.check_resume_options), made
    before any model, input or Ray is touched: the arguments below would fail later otherwise."""
    from edge_runtime.errors import InputError
    from edge_runtime.score_job import check_resume_options
    from edge_runtime.score_ray import score_ray
    from edge_runtime.shadow import shadow

    calls = [lambda: check_resume_options(resume, force, out)]
    if refused:
        calls += [lambda: score(None, [], "-" if out is None else out, resume=resume, force=force),
                  lambda: score_ray(tmp_path / "no-artifact", tmp_path / "no-input", "-" if out is None else out,
                                    resume=resume, force=force),
                  lambda: shadow(None, None, [], out, resume=resume, force=force)]
    for call in calls:
        if refused:
            with pytest.raises(InputError) as e:
                call()
            assert e.value.code == "score_options_conflict" and "--resume" in str(e.value)
        else:
            call()


def test_resume_and_force_together_is_an_error(text_art, tmp_path):
    src = _texts(tmp_path / "in.txt", 5, "good")
    out = tmp_path / "out.jsonl"
    assert run("score", text_art, src, "-o", out, "--quiet").exit_code == 0
    res = run("score", text_art, src, "-o", out, "--quiet", "--resume", "--force")
    assert res.exit_code == 2
    one_error(res, "score_options_conflict")


def test_resume_of_an_output_without_a_job_record_is_refused(text_art, tmp_path):
    src = _texts(tmp_path / "in.txt", 6, "good")
    out = tmp_path / "out.jsonl"
    assert run("score", text_art, src, "-o", out, "--quiet").exit_code == 0
    keep_lines(out, 3)
    job_path(out).unlink()                                   # what an older edge-runtime left
    res = run("score", text_art, src, "-o", out, "--quiet", "--resume")
    assert res.exit_code == 2 and "--force" in one_error(res, "score_resume_unverifiable")
    out.write_bytes(b'{"index": 0, "id": 1, "ok"')           # not even one complete line: nothing to mix up
    res = run("score", text_art, src, "-o", out, "--quiet", "--resume")
    assert res.exit_code == 0, res.output
    assert len(lines(out)) == 6 and job_path(out).exists()


def test_resume_of_an_output_longer_than_the_input_is_refused(text_art, tmp_path):
    """Records without a source (a generator) leave the input unchecked: a warning, and the
    line count still has to fit."""
    src = _texts(tmp_path / "in.txt", 10, "good")
    out = tmp_path / "out.jsonl"
    with er.load(text_art, device="fake") as rt:
        score(rt, (r for r in read_records(src)), out)
    assert json.loads(job_path(out).read_text())["input"] is None
    keep_lines(out, 6)
    res = run("score", text_art, src, "-o", out, "--quiet", "--resume")
    assert res.exit_code == 0, res.output
    assert "warning: the input could not be checked" in res.stderr and len(lines(out)) == 10
    short = _texts(tmp_path / "short.txt", 5, "good")
    res = run("score", text_art, short, "-o", out, "--quiet", "--resume")
    assert res.exit_code == 2
    assert "holds 10 lines" in one_error(res, "score_output_mismatch")


def test_score_to_stdout(text_art, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = _texts(tmp_path / "in.txt", 3, "good")
    res = run("score", text_art, src, "-o", "-", "--json")
    assert res.exit_code == 0, res.output
    got = [json.loads(x) for x in res.stdout.splitlines()]
    assert [g["id"] for g in got] == [1, 2, 3] and all(g["ok"] for g in got)
    assert '"total": 3' in res.stderr and "progress done=3" in res.stderr      # the summary and progress on stderr
    assert not (Path.cwd() / "-").exists()
    res = run("score", text_art, src, "-o", "-", "--resume")
    assert res.exit_code == 2
    one_error(res, "score_options_conflict")


# -- 7. exit codes: nothing succeeded, --max-error-rate, the summary ----------------------------

def test_score_fails_when_no_input_succeeded(text_art, image_art, tmp_path):
    src = _texts(tmp_path / "in.txt", 3, "good")
    res = run("score", image_art, src, "-o", tmp_path / "a.jsonl", "--quiet")     # every line read as an image path
    assert res.exit_code == 2
    assert "0 of 3 inputs succeeded" in one_error(res, "score_nothing_succeeded")
    assert "None" not in res.stdout and "batch latency: none" in res.stdout
    res = run("score", text_art, src, "-o", tmp_path / "b.jsonl", "--quiet", "--device-option", "fail_after=1",
              "--json")
    assert res.exit_code == 6                                                     # the runtime's layer
    s = json.loads(res.stdout)                                                    # stdout stays one document
    assert s["failed"] == 3 and s["error"]["code"] == "score_nothing_succeeded"
    assert s["error"]["type"] == "InferenceRuntimeError"
    one_error(res, "score_nothing_succeeded")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    res = run("score", text_art, empty, "-o", tmp_path / "c.jsonl", "--quiet")
    assert res.exit_code == 2
    one_error(res, "score_input_empty")


def test_max_error_rate(text_art, tmp_path):
    src = tmp_path / "in.txt"
    src.write_bytes(b"good\nbad\n\xff broken\nthe movie\n")                       # 1 of 4 rejected
    res = run("score", text_art, src, "-o", tmp_path / "a.jsonl", "--quiet", "--max-error-rate", "0.2")
    assert res.exit_code == 2
    msg = one_error(res, "score_error_rate_exceeded")
    assert "0.2500" in msg and "0.2" in msg and "input_bad_encoding 1" in msg
    res = run("score", text_art, src, "-o", tmp_path / "b.jsonl", "--quiet", "--max-error-rate", "0.25")
    assert res.exit_code == 0, res.output
    res = run("score", text_art, src, "-o", tmp_path / "c.jsonl", "--quiet", "--max-error-rate", "1.5")
    assert res.exit_code == 2                                                    # a fraction 0..1


def test_the_summary_says_what_its_latency_is(text_art, tmp_path):
    src = _texts(tmp_path / "in.txt", 5, "good")
    res = run("score", text_art, src, "-o", tmp_path / "a.jsonl", "--quiet", "--batch-size", "2")
    assert res.exit_code == 0, res.output
    assert "latency p50" not in res.stdout
    assert "batch latency (result latency_ms: from its batch's start, batches of up to 2)" in res.stdout
    assert "ms wall per input" in res.stdout and "None" not in res.stdout
    s = json.loads(run("score", text_art, src, "-o", tmp_path / "b.jsonl", "--quiet", "--json").stdout)
    assert "batch" in s["latency_basis"] and s["wall_ms_per_input"] > 0


# -- 8. ids ------------------------------------------------------------------------------------

def test_csv_id_column_is_the_default_id(text_art, tmp_path):
    src = tmp_path / "in.csv"
    src.write_text('id,text\nr1,good\nr2,"bad, really"\n,the movie\n')
    out = tmp_path / "out.jsonl"
    assert run("score", text_art, src, "-o", out, "--quiet").exit_code == 0
    assert [(g["id"], g["line"]) for g in lines(out)] == [("r1", 2), ("r2", 3), (None, 4)]
    plain = tmp_path / "plain.csv"
    plain.write_text('text\ngood\nbad\n')
    out2 = tmp_path / "out2.jsonl"
    assert run("score", text_art, plain, "-o", out2, "--quiet").exit_code == 0
    assert [(g["id"], g["line"]) for g in lines(out2)] == [(None, 2), (None, 3)]


def test_a_fallback_id_never_collides_with_a_real_one_and_resume_still_works(text_art, tmp_path):
    src = tmp_path / "in.jsonl"
    rows = ['{"id": 3, "text": "good"}', "{broken", '{"id": 2, "text": "bad"}', '{"text": "no id"}'] + \
           [json.dumps({"text": f"t {i}"}) for i in range(8)]
    src.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out.jsonl"
    assert run("score", text_art, src, "-o", out, "--quiet", "--batch-size", "3").exit_code == 0
    got = lines(out)
    assert [(g["id"], g["line"]) for g in got[:4]] == [(3, 1), (None, 2), (2, 3), (None, 4)]
    assert [g["id"] for g in got if g["id"] is not None] == [3, 2]           # 2 and 3 are the records' own ids
    keep_lines(out, 7)
    res = run("score", text_art, src, "-o", out, "--quiet", "--resume", "--json")
    assert res.exit_code == 0, res.output
    again = lines(out)
    assert [g["line"] for g in again] == list(range(1, 13)) and [g["index"] for g in again] == list(range(12))


# -- 6. eval reports every row it does not evaluate ------------------------------------------------

def test_eval_sst2_limit_100_evaluates_100_the_header_is_a_header(text_art):
    sst = shared("text", "sst2", "dev.tsv")
    res = run("eval", text_art, sst, "--limit", "100", "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["samples"] == 100 and rep["skipped"]["count"] == 0
    assert rep["header"] == {"line": 1, "text": "text\tlabel"}
    full = json.loads(run("eval", text_art, sst, "--json").stdout)
    assert full["samples"] == 872 and full["skipped"]["count"] == 0          # 444 + 428, nothing lost


def test_eval_tsv_counts_and_shows_every_skipped_row(text_art, tmp_path):
    tsv = tmp_path / "data.tsv"
    tsv.write_bytes(b"sentence\tlabel\n"
                    b"good movie\t1\n"
                    b"no tab on this line\n"
                    b"bad\tmaybe\n"
                    b"\tpositive\n"
                    b"\xff\xfe\tnegative\n"
                    b"the stock\tnegative\n"
                    b"a great movie\t0\n")
    res = run("eval", text_art, tsv, "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["samples"] == 3 and rep["header"]["line"] == 1
    sk = rep["skipped"]
    assert sk["count"] == 4
    assert sk["by_reason"] == {"no_tab": 1, "unknown_label": 1, "empty_text": 1, "bad_encoding": 1}
    assert [(e["reason"], e["line"]) for e in sk["examples"]] == [
        ("no_tab", 3), ("unknown_label", 4), ("empty_text", 5), ("bad_encoding", 6)]
    human = run("eval", text_art, tsv).stdout
    assert "4 rows skipped, not in it" in human
    assert "skipped 4 rows:" in human and "line 3: no_tab" in human and "line 4: unknown_label" in human
    res = run("eval", text_art, tsv, "--limit", "2", "--json")
    rep = json.loads(res.stdout)
    assert rep["samples"] == 2 and rep["skipped"]["by_reason"] == {"no_tab": 1, "unknown_label": 1, "empty_text": 1,
                                                                   "bad_encoding": 1}


def test_eval_image_folder_reports_a_folder_that_is_no_label(image_art, tmp_path):
    data = tmp_path / "held_out"
    (data / "3").mkdir(parents=True)
    (data / "cats").mkdir()
    for i in range(4):
        (data / "3" / f"{i}.png").write_bytes(png_bytes(np.full((8, 8), 60 * i, np.uint8)))
    for i in range(37):
        (data / "cats" / f"{i:02d}.png").write_bytes(png_bytes(np.full((8, 8), i, np.uint8)))
    (data / "3" / "notes.txt").write_text("not an image")
    (data / "stray.png").write_bytes(png_bytes(np.zeros((8, 8), np.uint8)))
    res = run("eval", image_art, data, "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["samples"] == 4
    assert rep["skipped"]["by_reason"] == {"unknown_label": 37, "not_an_image": 1, "not_in_label_folder": 1}
    paths = [e["path"] for e in rep["skipped"]["examples"] if e["reason"] == "unknown_label"]
    assert paths == [f"cats/{i:02d}.png" for i in range(5)]                   # the first few, by path
    human = run("eval", image_art, data).stdout
    assert "unknown_label 37" in human and "cats/00.png: unknown_label" in human


def test_eval_with_nothing_evaluable_exits_2(text_art, tmp_path):
    tsv = tmp_path / "data.tsv"
    tsv.write_text("text\tlabel\ngood\tpos\nbad\tneg\n")
    res = run("eval", text_art, tsv)
    assert res.exit_code == 2
    msg = one_error(res, "eval_nothing_evaluated")
    assert "unknown_label 2" in msg and "line 2" in msg


def test_eval_min_accuracy_says_why(text_art, tmp_path):
    tsv = tmp_path / "data.tsv"
    tsv.write_text("good\tpositive\nbad\tnegative\nthe movie\tpositive\ngreat\tnegative\n")
    rep = json.loads(run("eval", text_art, tsv, "--json").stdout)
    assert rep["accuracy"] < 1          # a gate of 1 fails it (over 1 is no accuracy: refused, exit 2)
    res = run("eval", text_art, tsv, "--min-accuracy", "1")
    assert res.exit_code == 1
    msg = one_error(res, "eval_below_min_accuracy")
    assert f"accuracy {rep['accuracy']:.4f} ({rep['correct']}/4)" in msg and "--min-accuracy 1" in msg
    assert res.stdout.startswith("accuracy ")                                    # the report still printed
    res = run("eval", text_art, tsv, "--min-accuracy", "1", "--json")
    assert res.exit_code == 1 and json.loads(res.stdout)["error"]["code"] == "eval_below_min_accuracy"
    assert run("eval", text_art, tsv, "--min-accuracy", "0").exit_code == 0


def test_eval_fail_on_skip(text_art, tmp_path):
    tsv = tmp_path / "data.tsv"
    tsv.write_text("good\tpositive\nno tab\n")
    assert run("eval", text_art, tsv).exit_code == 0
    res = run("eval", text_art, tsv, "--fail-on-skip")
    assert res.exit_code == 2 and "no_tab 1" in one_error(res, "eval_rows_skipped")


# -- --help examples --------------------------------------------------------------------------------

@pytest.mark.parametrize("cmd", ["score", "eval"])
def test_help_has_examples(cmd):
    res = run(cmd, "--help")
    assert res.exit_code == 0
    text = res.stdout.splitlines()
    i = next(n for n, x in enumerate(text) if x.strip() == "Examples:")
    examples = [x.strip() for x in text[i + 1:] if x.startswith("    edge-infer ")]
    assert len(examples) >= 2 and all(x.startswith(f"edge-infer {cmd} ") for x in examples)
    assert "Exit codes:" in res.stdout
