"""Small wrong answers in eval, infer and the call path (before 2026-12-07):

- ``edge-infer eval`` printed an unmeasured parity as "not_measured None on 0 samples (budget None)"
  (the fake artifacts' "none None ..."), and a figure measured on a stand-in as the target's;
- it left the images of a dot-folder (``.cache/``, ``3/.ipynb_checkpoints/``) out in silence, where
  every other row it does not evaluate is a skip with its reason;
- ``rt.infer(x, trace_id="")`` got a generated trace id instead of a refusal;
- ``edge-infer infer --deadline-ms 2.5`` was click's usage error and ``--limit deadline_ms=2.5``
  "must be a positive integer", while ``rt.infer(deadline_ms=2.5)`` ran;
- an exception with no text made a message ending in ": ".
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import edge_runtime as er
from edge_runtime.cli import main
from factories import png_bytes, rewrite_manifest

IMAGE = png_bytes(np.arange(64, dtype=np.uint8).reshape(8, 8) * 3)


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def set_parity(art: Path, parity: dict) -> Path:
    rewrite_manifest(art, lambda m: m["variants"][0].update(parity=parity))
    return art


def parity_line(out: str) -> str:
    line, = [x for x in out.splitlines() if x.startswith("parity vs fp32")]
    return line


def image_data(root: Path) -> Path:
    (root / "3").mkdir(parents=True)
    (root / "3" / "a.png").write_bytes(IMAGE)
    return root


# -- 1. eval's parity line -----------------------------------------------------------------------------


def test_eval_says_plainly_that_parity_was_not_measured(make_artifact, tmp_path):
    data = image_data(tmp_path / "data")
    res = run("eval", make_artifact("image-classification"), data, "--device", "fake")
    assert res.exit_code == 0, res.output
    line = parity_line(res.output)
    assert "not measured" in line and "None" not in line, line


def test_eval_names_why_parity_was_not_measured(make_artifact, tmp_path):
    art = set_parity(make_artifact("image-classification"),
                     {"metric": "not_measured", "value": None, "samples": 0,
                      "note": "imported model: no fp32 reference to measure against"})
    data = image_data(tmp_path / "data")
    res = run("eval", art, data, "--device", "fake")
    assert res.exit_code == 0, res.output
    line = parity_line(res.output)
    assert line.endswith("not measured (imported model: no fp32 reference to measure against)"), line
    rep = json.loads(run("eval", art, data, "--device", "fake", "--json").stdout)
    assert rep["parity"]["note"].startswith("imported model")


def test_eval_says_a_stand_in_parity_was_not_measured_on_the_target(make_artifact, tmp_path):
    art = set_parity(make_artifact("image-classification"),
                     {"metric": "top1_agreement", "value": 0.995, "samples": 200, "budget": 0.99,
                      "measured": "stand-in", "measured_on": "fake-quantized torch model",
                      "not_measured_on_target": "coremltools cannot run here"})
    res = run("eval", art, image_data(tmp_path / "data"), "--device", "fake")
    line = parity_line(res.output)
    assert "top1_agreement 0.995 on 200 samples (budget 0.99)" in line
    assert "measured on the fake-quantized torch model; not on the target" in line, line


# -- 2. dot-folders in an image folder ----------------------------------------------------------------


def test_images_in_dot_folders_are_hidden_skips(make_artifact, tmp_path):
    data = image_data(tmp_path / "data")
    (data / ".cache").mkdir()
    (data / ".cache" / "b.png").write_bytes(IMAGE)
    (data / "3" / ".ipynb_checkpoints").mkdir()
    (data / "3" / ".ipynb_checkpoints" / "c.png").write_bytes(IMAGE)
    (data / "3" / ".ipynb_checkpoints" / "notes.txt").write_text("no image")
    (data / "3" / ".DS_Store").write_bytes(b"\0")           # a dot-file: no row
    res = run("eval", make_artifact("image-classification"), data, "--device", "fake", "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["samples"] == 1
    assert rep["skipped"]["by_reason"] == {"hidden": 2}
    assert sorted(x["path"] for x in rep["skipped"]["examples"]) == [".cache/b.png", "3/.ipynb_checkpoints/c.png"]
    res = run("eval", make_artifact("image-classification"), data, "--device", "fake")
    assert "skipped 2 rows: hidden 2" in res.output and ".cache/b.png: hidden" in res.output
    res = run("eval", make_artifact("image-classification"), data, "--device", "fake", "--fail-on-skip")
    assert res.exit_code == 2 and "error [eval_rows_skipped]" in res.stderr
    os.symlink("3", data / ".old")       # a hidden link to a label folder: its image is counted there
    os.symlink(".", data / ".self")      # and to the data folder: a loop, not entered
    rep = json.loads(run("eval", make_artifact("image-classification"), data, "--device", "fake", "--json").stdout)
    assert rep["samples"] == 1 and rep["skipped"]["by_reason"] == {"hidden": 2}, rep["skipped"]


def test_a_data_folder_whose_only_images_are_hidden_says_so(make_artifact, tmp_path):
    data = tmp_path / "data"
    (data / ".cache" / "3").mkdir(parents=True)
    (data / ".cache" / "3" / "a.png").write_bytes(IMAGE)
    res = run("eval", make_artifact("image-classification"), data, "--device", "fake")
    assert res.exit_code == 2
    assert "error [eval_nothing_evaluated]" in res.stderr and "hidden 1" in res.stderr, res.stderr


# -- 3. an empty trace id -----------------------------------------------------------------------------


# (the blank ids "" and "   " are in tests/test_hunt_trace_id.py's refused list)


# -- 4. fractional deadlines on the command line ------------------------------------------------------


@pytest.mark.parametrize("flags", [["--deadline-ms", "2500.5"], ["--limit", "deadline_ms=2500.5"],
                                   ["--limit", "deadline_ms=2500.5", "--deadline-ms", "2500.5"]])
def test_a_fractional_deadline_runs_as_the_api_s(make_artifact, flags):
    res = run("infer", make_artifact(), "--text", "good", "--device", "fake", "--json", *flags)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["prediction"] in ("negative", "positive")


@pytest.mark.parametrize("flags", [["--deadline-ms", "50.5"], ["--limit", "deadline_ms=50.5"]])
def test_a_fractional_deadline_is_kept(make_artifact, flags):
    res = run("infer", make_artifact(), "--text", "good", "--device", "fake", "--device-option", "stall_ms=500",
              *flags)
    assert res.exit_code == 5 and "error [inference_timeout]" in res.stderr and "50.5 ms" in res.stderr, res.output


@pytest.mark.parametrize("flags", [["--deadline-ms", "abc"], ["--deadline-ms", "nan"], ["--deadline-ms", "0"],
                                   ["--deadline-ms", "-2.5"], ["--limit", "deadline_ms=abc"]])
def test_a_deadline_that_is_no_positive_number_is_a_typed_error(make_artifact, flags):
    res = run("infer", make_artifact(), "--text", "good", "--device", "fake", *flags)
    assert res.exit_code == 2 and res.stderr.startswith("error [limit_invalid]"), res.output
    named = "--deadline-ms" if flags[0] == "--deadline-ms" else "--limit deadline_ms"
    assert "Usage:" not in res.output and named in res.stderr and "integer" not in res.stderr, res.stderr


def test_two_different_fractional_limit_deadlines_are_refused(make_artifact):
    res = run("infer", make_artifact(), "--text", "good", "--device", "fake",
              "--limit", "deadline_ms=2.5", "--limit", "deadline_ms=3")
    assert res.exit_code == 2 and res.stderr.startswith("error [input_invalid]"), res.output


# -- 5. an exception without text ---------------------------------------------------------------------


def test_an_exception_without_text_is_named_by_its_type(make_artifact):
    with er.load(make_artifact(), device="fake") as rt:
        def prepare(raw, lim):
            raise ValueError()

        real_prepare, rt.task.prepare = rt.task.prepare, prepare
        with pytest.raises(er.InputError) as ei:
            rt.infer("good film")
        assert str(ei.value.message).endswith("input could not be prepared: ValueError"), ei.value.message

        def finish(outputs, prepared):
            raise KeyError()

        rt.task.prepare, rt.task.finish = real_prepare, finish
        with pytest.raises(er.InferenceRuntimeError) as ei:
            rt.infer("good film")
        assert ei.value.message.endswith("post-processing failed: KeyError"), ei.value.message


def test_a_device_failure_without_text_is_named_by_its_type(make_artifact):
    with er.load(make_artifact(), device="fake") as rt:
        def broken(*a, **k):
            raise RuntimeError()

        for sess in rt._sessions:
            sess.run = broken
        with pytest.raises(er.InferenceRuntimeError) as ei:
            rt.infer("good film")
        assert ei.value.message.endswith(": RuntimeError"), ei.value.message
