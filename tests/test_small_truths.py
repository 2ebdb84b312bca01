"""Small wrong answers with exit 0 in eval, verify and the thread fit: each test pins one.

- ``eval`` on an image folder with a label folder that is a symlink to another (``03 -> 3``)
  evaluated the same images twice (``score`` does not enter such a folder): now each image is
  evaluated once and the second name's rows are ``duplicate`` skips; a symlinked image whose
  target is evaluated already is a ``duplicate`` too, a dangling or looping symlink is
  ``broken_symlink`` (was: an inference error counted as a wrong answer), and a label folder
  that is a symlink to DATA itself is not entered (``symlink_loop``).
- ``verify`` printed "no budget" on a not-judged row's line (its budget is recorded), and its
  ``--json`` said ``"passed": true`` for a chosen path with no verdict: now "not judged" in
  both, with a ``verdict`` field.
- the thread fit read the planned tier: after ONNX Runtime fell back from CUDA to the CPU it
  skipped the fit ("not a CPU device") though every session ran on the CPU, and the reverse
  would fit threads for a session that is not on the CPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

import edge_runtime as er
from edge_runtime.cli import main
from edge_runtime.evaluate import evaluate, read_labelled
from test_eval_hardening import IMAGE, image_classifier

DIGITS = [str(i) for i in range(10)]


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def images(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for n in names:
        (folder / n).write_bytes(IMAGE)
    return folder


# -- 1. eval: symlinks in an image folder ------------------------------------------------------------------

def test_a_label_folder_symlinked_to_another_is_evaluated_once(tmp_path):
    # data/3 holds 2 images, data/03 -> 3: before, 4 samples (each image twice), exit 0
    art = image_classifier(tmp_path / "art", DIGITS)
    data = tmp_path / "data"
    images(data / "3", "a.png", "b.png")
    os.symlink("3", data / "03")
    res = run("eval", art, data, "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["samples"] == 2, rep                              # was 4
    assert rep["skipped"]["by_reason"] == {"duplicate": 2}, rep["skipped"]
    paths = sorted(e["path"] for e in rep["skipped"]["examples"])
    assert paths == ["03/a.png", "03/b.png"]
    assert all("'3/'" in e["detail"] for e in rep["skipped"]["examples"])
    text = run("eval", art, data).stdout
    assert "2 rows skipped" in text and "duplicate 2" in text and "03/a.png: duplicate" in text, text


def test_the_real_folder_is_counted_whatever_the_sort_order(tmp_path):
    # "3 -> seven" sorts before "seven": the real folder's rows are evaluated, the link's are the duplicates
    labels = ["zero", "one", "two", "3", "four", "five", "six", "seven", "eight", "nine"]
    art = image_classifier(tmp_path / "art", labels)
    data = tmp_path / "data"
    images(data / "seven", "a.png")
    os.symlink("seven", data / "3")
    with er.load(art, device="fake") as rt:
        rep = evaluate(rt, data)
    assert rep["samples"] == 1 and rep["skipped"]["by_reason"] == {"duplicate": 1}, rep
    assert rep["skipped"]["examples"][0]["path"] == "3/a.png"


def test_a_symlinked_image_of_an_image_already_evaluated_is_a_duplicate(tmp_path):
    data = tmp_path / "data"
    images(data / "3", "a.png")
    images(data / "5")
    os.symlink(data / "3" / "a.png", data / "5" / "same.png")
    samples, skipped, _ = read_labelled(data, DIGITS)
    assert [w["path"] for _, _, w in samples] == ["3/a.png"]     # was also 5/same.png (as a 5)
    assert skipped.by_reason == {"duplicate": 1} and skipped.examples[0]["path"] == "5/same.png"
    assert "3/a.png" in skipped.examples[0]["detail"]


def test_symlinks_to_images_outside_the_folder_are_evaluated_once_each(tmp_path):
    # a data set assembled from links to images elsewhere: each one is a row; two links to one file, one row
    outside = images(tmp_path / "pool", "p.png", "q.png")
    data = tmp_path / "data"
    (data / "3").mkdir(parents=True)
    os.symlink(outside / "p.png", data / "3" / "p.png")
    os.symlink(outside / "q.png", data / "3" / "q.png")
    os.symlink(outside / "q.png", data / "3" / "r.png")
    os.symlink(outside, data / "4")                         # a label folder outside DATA: entered, once
    samples, skipped, _ = read_labelled(data, DIGITS)
    assert [(w["path"], t) for _, t, w in samples] == [("3/p.png", 3), ("3/q.png", 3)]
    assert skipped.by_reason == {"duplicate": 3}, skipped.to_dict()     # 3/r.png, 4/p.png, 4/q.png


def test_a_dangling_or_looping_symlink_is_skipped_not_a_wrong_answer(tmp_path):
    # before: each was a row whose inference failed (counted as wrong: accuracy 0.5 for a right model)
    art = image_classifier(tmp_path / "art", DIGITS)
    with er.load(art, device="fake") as rt:
        c = rt.infer(IMAGE).class_id
    data = tmp_path / "data"
    images(data / str(c), "a.png")
    os.symlink("missing.png", data / str(c) / "gone.png")
    os.symlink("loop.png", data / str(c) / "loop.png")
    os.symlink("nowhere", data / "7")                      # a label folder whose link resolves to nothing
    res = run("eval", art, data, "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert (rep["samples"], rep["correct"], rep["accuracy"]) == (1, 1, 1.0), rep
    assert rep["errors"] == {} and rep["skipped"]["by_reason"] == {"broken_symlink": 3}, rep["skipped"]


def test_a_label_folder_linking_to_the_data_folder_is_not_entered(tmp_path):
    data = tmp_path / "data"
    images(data / "3", "a.png")
    os.symlink(".", data / "4")
    os.symlink("..", data / "5")
    samples, skipped, _ = read_labelled(data, DIGITS)
    assert [w["path"] for _, _, w in samples] == ["3/a.png"]
    assert skipped.by_reason == {"symlink_loop": 2}, skipped.to_dict()      # was nested_folder rows of 4/3/a.png


# -- 2. verify: a row that is not judged ---------------------------------------------------------------------

@pytest.fixture
def no_box_detector(make_artifact, own_cache, monkeypatch):
    """A detector with a budget whose probe set holds no box on either side (F1 1.0 over nothing)."""
    from edge_runtime.models.object_detection import ObjectDetection

    art = make_artifact("object-detection", probe=4, budget=0.9)
    monkeypatch.setattr(ObjectDetection, "compare", staticmethod(lambda ref, cand: {
        "metric": "detection_f1", "value": 1.0, "samples": len(ref), "matched": 0, "unmatched_reference": 0,
        "unmatched_candidate": 0}))
    return art


def test_verify_text_says_not_judged_on_the_row_never_no_budget(no_box_detector):
    # the row's line read "detection_f1 1.0000 (budget 0.9, no budget)": a budget is recorded
    for args in ([], ["--all"]):
        res = run("verify", no_box_detector, *args)
        assert res.exit_code == 0, res.output
        row = [ln for ln in res.stdout.splitlines() if ln.startswith("* ")]
        assert len(row) == 1 and "(budget 0.9, not judged)" in row[0], res.stdout
        assert "no budget" not in res.stdout, res.stdout
        assert "chosen path (policy): not judged" in res.stdout


def test_verify_json_has_no_pass_for_a_row_that_is_not_judged(no_box_detector):
    # --json said "passed": true at the top for a chosen path with no verdict
    rep = json.loads(run("verify", no_box_detector, "--json").stdout)
    assert rep["passed"] is None and rep["verdict"] == "not_judged", {k: rep[k] for k in ("passed", "verdict")}
    assert rep["chosen"]["verdict"] == "not_judged" and rep["chosen"]["budget"] == 0.9
    assert [r["verdict"] for r in rep["rows"]] == ["not_judged"] and "error" not in rep, rep["rows"]


def test_the_remembered_verify_of_a_row_not_judged_reads_not_judged_at_load(no_box_detector):
    # the ISA note at load read "against budget 0.9: no budget recorded": the record dropped not_judged
    import edge_runtime as er
    from edge_runtime import tune_cache
    from edge_runtime.measured_here import _verified_text

    assert run("verify", no_box_detector).exit_code == 0
    with er.load(no_box_detector) as rt:
        rec = tune_cache.lookup_verify(rt.artifact.manifest.get("manifest_sha256"), rt.hardware, rt.device,
                                       rt.variant.target, dict(rt.device_options))
        assert rt.info()["isa"]["verified_here"] == rec
    assert rec["not_judged"] and rec["budget"] == 0.9
    text = _verified_text(rec)
    assert "against budget 0.9: not judged" in text and "no budget" not in text, text


def test_verify_verdicts_of_a_budget_less_and_a_passing_artifact(make_artifact, own_cache):
    from edge_runtime.verify import verdict, verify_artifact

    rep = verify_artifact(make_artifact("text-classification", probe=4))
    assert rep["chosen"]["passed"] is True and (rep["passed"], rep["verdict"]) == (True, "pass"), rep["chosen"]
    assert verdict({"passed": None, "budget": None}) == "no_budget"
    assert verdict({"passed": False, "error": {"code": "device_load_failed"}}) == "failed"
    assert verdict({"passed": False, "budget": 0.99}) == "under_budget"


# -- 3. the thread fit: where the session runs, not the plan ---------------------------------------------------

def test_the_thread_fit_runs_after_a_fallback_from_cuda_to_the_cpu(fake_ort, digits_artifact, tmp_path,
                                                                   monkeypatch):
    # CUDA asked for, ORT keeps only the CPU provider: the fit said "not a CPU device" and kept the
    # default (every core spinning) for a session on the CPU
    from boards import detect_board
    from fake_onnxruntime import CPU

    import edge_runtime.threads_fit as tf

    monkeypatch.setattr(tf.os, "cpu_count", lambda: 4)
    fake_ort(initialises={CPU})
    hw = detect_board(tmp_path, "nvidia-x86")
    with er.load(digits_artifact, hardware=hw, device="onnxruntime:cuda") as rt:
        assert rt.choice.suitability.tier != "cpu" and rt.device == "onnxruntime:cpu" and rt.choice.fallback
        fit = rt.info()["threads_fit"]
    assert "not a CPU device" not in fit["why"], fit
    assert fit.get("default_ms"), fit           # measured: the default sessions were timed


def test_the_thread_fit_is_skipped_for_a_session_that_is_not_on_the_cpu(monkeypatch):
    # the plan said the CPU (tier "cpu"), the sessions report a GPU: no one-thread session is opened
    import edge_runtime.threads_fit as tf

    monkeypatch.delenv("EDGE_RUNTIME_THREADS", raising=False)
    monkeypatch.setattr(tf.os, "cpu_count", lambda: 4)
    backend = SimpleNamespace(name="openvino", options=[SimpleNamespace(name="threads")])

    def runtime(*devices):
        return SimpleNamespace(device_options={}, device=devices[0], choice=SimpleNamespace(
            suitability=SimpleNamespace(tier="cpu")), _sessions=[SimpleNamespace(device=d) for d in devices])

    opened = []
    rec = tf.fit_threads(runtime("openvino:gpu"), backend, lambda b, o: opened.append(b))
    assert rec["threads"] is None and "openvino:gpu" in rec["why"] and not opened, rec
    assert "onnxruntime:cuda:1" in (tf.eligible(runtime("onnxruntime:cpu", "onnxruntime:cuda:1"), backend) or "")
    assert tf.eligible(runtime("openvino:cpu"), backend) is None
    assert tf.eligible(runtime("tflite:cpu", "tflite:cpu"), backend) is None
    # a device that does not say where it runs ("openvino:auto" not read back): the plan decides
    assert tf.eligible(runtime("openvino:auto"), backend) is None
    gpu_plan = runtime("openvino:auto")
    gpu_plan.choice.suitability.tier = "gpu"
    assert tf.eligible(gpu_plan, backend) == "not a CPU device"


# -- 4. eval: labels in another Unicode form, a byte-order mark, a digit that is no ASCII ----------------------

def test_a_folder_named_in_decomposed_unicode_is_its_label(tmp_path):
    # a folder made on macOS is "cafe" + U+0301 (NFD), labels.txt says "café" (NFC): it looked the same on
    # the screen and was skipped as "not a label of the artifact", its images out of the accuracy
    import unicodedata

    labels = ["café", "thé", "crème brûlée"]
    data = tmp_path / "data"
    for lab in labels:
        images(data / unicodedata.normalize("NFD", lab), "x.png")
    samples, skipped, _ = read_labelled(data, labels)
    assert sorted(t for _, t, _ in samples) == [0, 1, 2] and skipped.count == 0, skipped.to_dict()
    tsv = tmp_path / "t.tsv"
    tsv.write_text(f"hot\t{unicodedata.normalize('NFD', 'thé')}\n", encoding="utf-8")
    samples, skipped, header = read_labelled(tsv, labels)
    assert [t for _, t, _ in samples] == [1] and header is None and skipped.count == 0


def test_a_byte_order_mark_is_not_part_of_the_first_text(tmp_path):
    # a TSV saved by Excel as "UTF-8" starts with EF BB BF: the first sample's text began with U+FEFF
    tsv = tmp_path / "t.tsv"
    tsv.write_bytes(b"\xef\xbb\xbfgood movie\tpos\nbad movie\tneg\n")
    samples, _, header = read_labelled(tsv, ["neg", "pos"])
    assert [(x, t) for x, t, _ in samples] == [("good movie", 1), ("bad movie", 0)] and header is None
    tsv.write_bytes(b"\xef\xbb\xbftext\tlabel\ngood movie\tpos\n")
    samples, _, header = read_labelled(tsv, ["neg", "pos"])
    assert header == {"line": 1, "text": "text\tlabel"} and [x for x, _, _ in samples] == ["good movie"]


def test_resolve_label_of_a_digit_that_is_no_ascii_is_no_label():
    from edge_runtime.evaluate import resolve_label

    assert resolve_label("²", ["a", "b", "c"]) is None                 # was: an untyped ValueError from int()
    assert resolve_label("2", ["a", "b", "c"]) == "c"


def test_a_symlinked_folder_inside_a_label_folder_is_reported_not_passed_over(tmp_path):
    # a real sub-folder's images are nested_folder skips; a symlinked one was passed over without a word
    outside = images(tmp_path / "pool", "p.png")
    data = tmp_path / "data"
    images(data / "3", "a.png")
    images(data / "3" / "real", "b.png")
    os.symlink(outside, data / "3" / "linked")
    os.symlink("..", data / "3" / "up")                    # a loop back to DATA: not entered either
    samples, skipped, _ = read_labelled(data, DIGITS)
    assert [w["path"] for _, _, w in samples] == ["3/a.png"]
    assert skipped.by_reason == {"nested_folder": 3}, skipped.to_dict()
    assert sorted(e["path"] for e in skipped.examples) == ["3/linked", "3/real/b.png", "3/up"]


def test_the_thread_fit_counts_the_usable_cpus(digits_artifact, monkeypatch):
    # a container given one CPU of a many-core host: os.cpu_count() said 64, and the fit timed a
    # one-thread session against a default that could only ever get that one CPU
    import edge_runtime as er
    import edge_runtime.threads_fit as tf
    from edge_runtime.devices import registry

    monkeypatch.setattr(tf.os, "cpu_count", lambda: 64)
    with er.load(digits_artifact, device="onnxruntime") as rt:
        cpu = dict(rt.hardware["cpu"])
        backend = registry.get_backend("onnxruntime")
        rt.hardware = {"cpu": {**cpu, "usable": 1}}
        assert tf.usable_cpus(rt) == 1
        assert tf.eligible(rt, backend) == "one usable CPU (affinity or cgroup quota included)"
        rt.hardware = {"cpu": {**cpu, "usable": None}}
        assert tf.usable_cpus(rt) == 64


def test_a_cpu_quota_sets_the_thread_count_a_backend_would_default_to_every_core(digits_artifact):
    # docker --cpus 2 on a 64-core host: ONNX Runtime's default started a thread per core it saw (64),
    # spinning threads the quota throttled; the runtime now gives the backend the usable count
    import edge_runtime as er
    from edge_runtime.hardware import detect_cached

    real = detect_cached()
    cpu = {**dict(real["cpu"]), "cores": 64, "usable": 2, "usable_limited_by": "cgroup v2 cpu.max 200000 100000"}
    hw = {**{k: real[k] for k in real.keys()}, "cpu": cpu} if hasattr(real, "keys") else {**real, "cpu": cpu}
    with er.load(digits_artifact, device="onnxruntime", hardware=hw) as rt:
        assert rt.threads_from_quota["threads"] == 2 and "2 of the 64 CPUs" in rt.threads_from_quota["why"]
        assert rt.device_options["threads"] == 2
        info = rt.info()
        assert info["threads_from_quota"]["threads"] == 2
        assert info["sessions"][0]["threads"] in (1, 2)          # 2, or 1 when the fit kept one thread
        assert info["threads_fit"]["default_threads"]["threads"] == 2     # the fit ran against the quota's 2
    with er.load(digits_artifact, device="onnxruntime", hardware=hw, device_options={"threads": 3}) as rt:
        assert rt.threads_from_quota is None and rt.device_options["threads"] == 3     # the caller decides
    unlimited = {**cpu, "usable": 64, "usable_limited_by": None}
    hw2 = {**hw, "cpu": unlimited}
    with er.load(digits_artifact, device="onnxruntime", hardware=hw2) as rt:
        assert rt.threads_from_quota is None and "threads" not in rt.device_options


def test_score_says_which_symlinked_subfolders_it_did_not_enter(tmp_path, caplog):
    # os.walk does not enter a symlinked subfolder: its images were left out of score without a word
    import logging
    import shutil

    from edge_runtime.score_inputs import image_files

    img = sorted((Path(__file__).resolve().parents[1] / "models" / "zoo" / "digits-cnn" / "held_out" / "3")
                 .glob("*.png"))[0]
    (tmp_path / "data" / "a").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(img, tmp_path / "data" / "a" / "x.png")
    shutil.copy(img, tmp_path / "elsewhere" / "y.png")
    os.symlink(tmp_path / "elsewhere", tmp_path / "data" / "b")
    with caplog.at_level(logging.WARNING, logger="edge_runtime.score"):
        assert [rel for rel, _ in image_files(tmp_path / "data")] == ["a/x.png"]
        image_files(tmp_path / "data")                    # listed again (fingerprint, count, records): said once
    said = [r.getMessage() for r in caplog.records if "symlinked subfolder" in r.getMessage()]
    assert len(said) == 1 and "b/" in said[0] and "not scored" in said[0], said
