"""``edge-infer eval``: figures that measured nothing, rows dropped in silence, and a TSV read whole.

- an image folder given to a text classifier: each row's input is the image's *path*, classified as
  text (a figure, exit 0): refused (``input_invalid``, exit 2);
- every evaluated sample failing (a TSV of text given to an image classifier): "accuracy 0.0000",
  exit 0: now the report, then ``eval_nothing_succeeded`` with the errors' class (input: exit 2);
- a label folder that cannot be listed: ``rglob`` passed over it and its images dropped out of the
  accuracy without a word; an unreadable DATA folder was an untyped PermissionError; a pipe was
  "does not exist": all ``eval_data_unreadable``;
- a zero-padded folder ("09") with labels "1".."10": read as index 9 (the text "10") while "9" is
  class 8: refused as naming two classes, as a repeated label text is;
- ``--limit`` on a TSV read the whole file into memory first;
- ``--min-accuracy nan`` (a gate that never fails) is refused.
"""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

import edge_runtime as er
from edge_runtime.cli import main
from edge_runtime.errors import InputError
from edge_runtime.evaluate import evaluate
from test_eval_hardening import IMAGE, image_classifier


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def last_error(res) -> str:
    assert "Traceback" not in res.output
    err = res.stderr.strip().splitlines()
    return err[-1] if err else ""


def folder(root: Path, *names: str) -> Path:
    for name in names:
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "x.png").write_bytes(IMAGE)
    return root


def test_an_image_folder_given_to_a_text_classifier_is_refused(text_art, tmp_path):
    data = folder(tmp_path / "data", "negative", "positive")     # the text classifier's own labels
    res = run("eval", text_art, data, "--device", "fake")
    assert res.exit_code == 2, res.output                        # was: "accuracy 0.5000 (1/2)", exit 0
    assert "input_invalid" in last_error(res) and "text" in last_error(res)
    assert "accuracy" not in res.stdout


def test_every_sample_failing_is_no_accuracy_of_0(image_art, tmp_path):
    tsv = tmp_path / "text.tsv"
    tsv.write_text("a good movie\t3\nbad\t4\n")                 # text for an image classifier: no such image
    res = run("eval", image_art, tsv, "--device", "fake")
    assert res.exit_code == 2, res.output                        # was: "accuracy 0.0000 (0/2)", exit 0
    assert "accuracy 0.0000 (0/2)" in res.stdout                 # the report still comes first
    assert last_error(res).startswith("error [eval_nothing_succeeded]: all 2 evaluated samples failed")
    out = run("eval", image_art, tsv, "--device", "fake", "--json")
    assert out.exit_code == 2
    doc = json.loads(out.stdout)
    assert doc["error"]["code"] == "eval_nothing_succeeded" and doc["error"]["type"] == "InputError"
    assert doc["errors"] == {"input_file_unreadable": 2} and doc["error_types"] == {"InputError": 2}


def test_some_samples_failing_still_gives_the_figure_and_exit_0(image_art, tmp_path):
    data = folder(tmp_path / "data", "3")
    (data / "3" / "empty.png").write_bytes(b"")
    res = run("eval", image_art, data, "--device", "fake", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["samples"] == 2 and doc["errors"] == {"input_empty": 1} and doc["error"] is None


def test_a_label_folder_that_cannot_be_listed_is_an_error_not_a_silent_drop(image_art, tmp_path, monkeypatch):
    data = folder(tmp_path / "data", "3", "7")
    real = os.scandir

    def scandir(path="."):
        if Path(path).name == "7":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with er.load(image_art, device="fake") as rt:
        with pytest.raises(InputError) as e:                     # was: samples 1 (3/x.png), 7/ left out unsaid
            evaluate(rt, data)
    assert e.value.code == "eval_data_unreadable" and "7" in e.value.message


def test_an_unreadable_data_folder_is_a_typed_error(image_art, tmp_path, monkeypatch):
    data = folder(tmp_path / "data", "3")
    real = os.listdir

    def listdir(path="."):
        if Path(path) == data:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "listdir", listdir)
    with er.load(image_art, device="fake") as rt:
        with pytest.raises(InputError) as e:                     # was: a bare PermissionError
            evaluate(rt, data)
    assert e.value.code == "eval_data_unreadable"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_pipe_is_not_said_to_be_missing(image_art, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    res = run("eval", image_art, fifo, "--device", "fake")
    assert res.exit_code == 2
    assert last_error(res).startswith("error [eval_data_unreadable]")   # was: eval_data_missing, "does not exist"


def test_a_zero_padded_folder_naming_one_class_by_index_and_another_by_text_is_refused(tmp_path):
    art = image_classifier(tmp_path / "art", [str(i) for i in range(1, 11)])    # labels "1".."10"
    with er.load(art, device="fake") as rt:
        c = rt.infer(IMAGE).class_id
        if c == 9:
            pytest.skip("the fake model predicts the one class with no padded twin")
        padded = str(c + 1).zfill(2)                             # "0<c+1>": index c+1, but "c+1" is class c
        res = evaluate(rt, folder(tmp_path / "plain", str(c + 1)))
        assert res["accuracy"] == 1.0                            # the label text names class c
        with pytest.raises(InputError) as e:                     # was: scored against class c+1: accuracy 0.0
            evaluate(rt, folder(tmp_path / "padded", padded))
        assert e.value.code == "input_invalid" and e.value.details["classes"] == [c + 1, c]
        tsv = tmp_path / "padded.tsv"
        tsv.write_text(f"x\t1\n{tmp_path / 'padded' / padded / 'x.png'}\t{padded}\n")
        with pytest.raises(InputError):
            evaluate(rt, tsv)


def test_a_zero_padded_folder_whose_readings_agree_is_still_evaluated(image_art, tmp_path):
    with er.load(image_art, device="fake") as rt:                # labels "0".."9": "07" is class 7 both ways
        c = rt.infer(IMAGE).class_id
        assert evaluate(rt, folder(tmp_path / "data", str(c).zfill(2)))["accuracy"] == 1.0


def test_limit_on_a_tsv_does_not_read_the_whole_file(text_art, tmp_path):
    tsv = tmp_path / "big.tsv"
    tsv.write_bytes(b"a good movie\tpositive\n" * 1_000_000)   # 22 MB
    with er.load(text_art, device="fake") as rt:
        tracemalloc.start()
        try:
            res = evaluate(rt, tsv, limit=3)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert res["samples"] == 3
    assert peak < 4_000_000, f"{peak / 1e6:.1f} MB held for 3 lines"    # was: ~80 MB (the file, split)


@pytest.mark.parametrize("bad", ["nan", "NaN"])
def test_min_accuracy_nan_is_refused_not_a_gate_that_never_fails(image_art, tmp_path, bad):
    res = run("eval", image_art, folder(tmp_path / "data", "3"), "--device", "fake", "--min-accuracy", bad)
    assert res.exit_code == 2 and "--min-accuracy" in res.output     # was: exit 0 whatever the accuracy
