"""``edge-infer shadow`` scores each side's accuracy by class ids, never by label texts, as ``eval`` does.

A labels file may repeat a text (ImageNet's ``crane`` at 134 and 517): a folder or field named by
an index is the class of that index, and a prediction of the other class with the same text is
wrong; a label that is such a text names no one class and is refused before anything runs
(``input_invalid``, exit 2, the indices named, nothing written). Side B is scored against the same
class among its own labels; where they cannot say which, B's accuracy is not reported (a note says
why). A task that is no classifier (detection, segmentation) gets no accuracy at all, only a note."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import edge_runtime as er
from edge_runtime.errors import InputError
from edge_runtime.score_inputs import read_records
from edge_runtime.shadow import shadow
from output_cases import cli_shadow, run_cli, strict_lines
from test_eval_hardening import IMAGE, _folder, dup_image, image_classifier, one_error  # noqa: F401 (a fixture)



class Stub:
    """A classifier runtime whose answer to each input is the class ``answers[value]`` of ``labels``."""

    def __init__(self, labels, answers, task="image-classification", metric="top1_agreement"):
        self.labels, self.answers, self.calls = list(labels), answers, 0
        self.artifact = SimpleNamespace(task=task)
        self.task = SimpleNamespace(labels=self.labels, parity_metric=metric, name=task)

    def infer(self, value):
        self.calls += 1
        k = self.answers(value)
        d = {"prediction": self.labels[k], "class_id": k, "latency_ms": 1.0,
             "top_k": [{"index": k, "label": self.labels[k], "score": 1.0}]}
        return SimpleNamespace(to_dict=lambda: dict(d))


def by_folder(rel_to_class: dict):
    """The answer of each image of a folder input by its ``<folder>/<file>`` (its path's last two parts)."""
    return lambda value: rel_to_class["/".join(str(value).replace("\\", "/").split("/")[-2:])]


# -- 1. a folder named by an index: the other class with its text is wrong ------------------------------

def test_a_prediction_of_the_other_class_with_the_same_text_is_wrong_as_eval_says(dup_image, tmp_path):
    art, c, d = dup_image                           # the artifact predicts c; labels[d] is labels[c]'s text
    wrong = _folder(tmp_path / "wrong", str(d))
    ev = json.loads(run_cli("eval", art, wrong, "--json").stdout)
    res = cli_shadow(art, art, wrong, "--json", "-o", tmp_path / "o.jsonl")
    assert res.exit_code == 0, res.output
    acc = json.loads(res.stdout)["accuracy"]
    assert (ev["correct"], ev["accuracy"]) == (0, 0.0)
    assert (acc["samples"], acc["correct_a"], acc["correct_b"], acc["a"], acc["b"]) == (1, 0, 0, 0.0, 0.0)
    line = strict_lines(tmp_path / "o.jsonl")[0]
    assert (line["truth"], line["truth_id"], line["a"]["result"]["class_id"]) == (f"class{c}", d, c)
    right = cli_shadow(art, art, _folder(tmp_path / "right", str(c)), "--json")
    assert json.loads(right.stdout)["accuracy"]["correct_a"] == 1


def test_each_side_is_scored_by_its_own_class_id_not_its_text(tmp_path):
    labels = ["crane", "heron", "crane"]
    (tmp_path / "d" / "2").mkdir(parents=True)
    for name in ("x.png", "y.png"):
        (tmp_path / "d" / "2" / name).write_bytes(IMAGE)
    a = Stub(labels, by_folder({"2/x.png": 2, "2/y.png": 2}))       # the machine crane: right
    b = Stub(labels, by_folder({"2/x.png": 0, "2/y.png": 2}))       # the bird once: wrong once
    s = shadow(a, b, read_records(tmp_path / "d")).to_dict()
    assert s["accuracy"]["samples"] == 2 and (s["accuracy"]["correct_a"], s["accuracy"]["correct_b"]) == (2, 1)
    assert s["agree"] == 1 and s["worst"][0]["truth_id"] == 2
    assert s["flips"] == [{"a": "crane#2", "b": "crane#0", "count": 1}]     # a flip between the cranes shows
    assert s["matrix"]["labels"] == ["crane#0", "crane#2"]


# -- 2. a label that names several classes: refused before anything runs --------------------------------

def test_a_folder_named_by_a_repeated_text_is_refused_and_nothing_is_written(dup_image, tmp_path):
    art, c, d = dup_image
    out = tmp_path / "o.jsonl"
    res = cli_shadow(art, art, _folder(tmp_path / "data", f"class{c}"), "-o", out)
    assert res.exit_code == 2
    msg = one_error(res, "input_invalid")
    lo, hi = sorted((c, d))
    assert f"folder 'class{c}'" in msg and f"indices {lo}, {hi}" in msg and f"{lo}/ or {hi}/" in msg, msg
    assert not out.exists() and not (tmp_path / "o.jsonl.job.json").exists()
    res = cli_shadow(art, art, tmp_path / "data", "--json")
    err = json.loads(res.stdout)["error"]
    assert res.exit_code == 2 and err["code"] == "input_invalid" and err["details"]["classes"] == [lo, hi]


def test_a_repeated_text_on_the_last_csv_line_is_refused_before_any_input_runs(tmp_path):
    labels = ["neg", "pos", "neg"]
    csv = tmp_path / "data.csv"
    csv.write_text("text,label\ngood movie,pos\nawful movie,0\nthe market rises,neg\n")
    a, b = Stub(labels, lambda v: 1, task="text-classification"), Stub(labels, lambda v: 1, task="text-classification")
    with pytest.raises(InputError) as exc:
        shadow(a, b, read_records(csv, field="text"))
    assert exc.value.code == "input_invalid" and "line 4" in exc.value.message and "indices 0, 2" in exc.value.message
    assert (a.calls, b.calls) == (0, 0)


def test_index_labels_in_a_tsv_compare_ids_through_the_cli(make_artifact, tmp_path):
    art = make_artifact("text-classification", labels=("same", "same"))   # every class has one text
    with er.load(art, device="fake") as rt:
        c = rt.infer("good movie").class_id
    tsv = tmp_path / "data.tsv"
    tsv.write_text(f"text\tlabel\ngood movie\t{c}\ngood movie\t{1 - c}\n")
    res = cli_shadow(art, art, tsv, "--json")
    assert res.exit_code == 0, res.output
    acc = json.loads(res.stdout)["accuracy"]
    assert (acc["samples"], acc["correct_a"], acc["correct_b"], acc["a"]) == (2, 1, 1, 0.5)
    tsv.write_text("text\tlabel\ngood movie\tsame\n")
    res = cli_shadow(art, art, tsv)
    assert res.exit_code == 2 and "indices 0, 1" in one_error(res, "input_invalid")


# -- 3. B's labels differ from A's --------------------------------------------------------------------

def test_b_with_other_labels_is_scored_by_its_class_of_the_same_text_or_not_at_all(tmp_path):
    (tmp_path / "d" / "heron").mkdir(parents=True)
    (tmp_path / "d" / "heron" / "x.png").write_bytes(IMAGE)
    a = Stub(["crane", "heron", "stork"], lambda v: 1)
    moved = Stub(["stork", "crane", "heron"], lambda v: 2)          # the same classes, reordered: heron is 2
    s = shadow(a, moved, read_records(tmp_path / "d")).to_dict()
    assert (s["accuracy"]["correct_a"], s["accuracy"]["correct_b"], s.get("accuracy_note")) == (1, 1, None)
    assert (s["agree"], s["flips"]) == (1, [])                      # heron and heron agree, whatever their index
    dup = Stub(["heron", "crane", "heron"], lambda v: 0)            # B repeats heron: which one is A's?
    s = shadow(a, dup, read_records(tmp_path / "d")).to_dict()
    assert s["accuracy"]["a"] == 1.0 and s["accuracy"]["b"] is None and s["accuracy"]["correct_b"] is None
    assert "B's labels differ from A's" in s.get("accuracy_note", "") and "not measured" in s["accuracy_note"]
    report = tmp_path / "r.html"
    from edge_runtime.shadow_report import write_report

    summary = shadow(a, dup, read_records(tmp_path / "d"))
    meta = {k: {"model": "m", "version": "1", "target": "t", "device": "d", "manifest_sha256": "0" * 64,
                "path": "p"} for k in ("a", "b")}
    assert "not measured" in write_report(report, summary, {**meta, "input": "d", "cpu": "c", "output": None}
                                          ).read_text()


# -- 4. no classifier, no accuracy ---------------------------------------------------------------------

@pytest.mark.parametrize("task", ["object-detection", "semantic-segmentation"])
def test_a_labelled_folder_gives_no_accuracy_for_a_task_that_is_no_classifier(make_artifact, tmp_path, task):
    from factories import png_bytes
    import numpy as np

    data = tmp_path / "d" / "cat"
    data.mkdir(parents=True)
    data.joinpath("x.png").write_bytes(png_bytes(np.full((16, 16, 3), 90, dtype=np.uint8)))
    a, b = make_artifact(task), make_artifact(task, seed=5)
    res = cli_shadow(a, b, tmp_path / "d", "--json", "-o", tmp_path / "o.jsonl")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["accuracy"] is None and "classifiers only" in s["accuracy_note"]
    assert strict_lines(tmp_path / "o.jsonl")[0]["truth"] is None
    text = cli_shadow(a, b, tmp_path / "d").output
    assert "accuracy over" not in text and "accuracy: the input holds 1 labelled record" in text


# -- 5. a resumed output written before truths were class ids ------------------------------------------

def test_resumed_lines_without_a_truth_id_are_scored_by_class_ids(dup_image, tmp_path):
    art, c, d = dup_image
    data = _folder(_folder(tmp_path / "data", str(d)), str(c))      # two images: c/x.png (right), d/x.png (wrong)
    out = tmp_path / "o.jsonl"
    assert cli_shadow(art, art, data, "-o", out).exit_code == 0
    first = strict_lines(out)[0]
    first.pop("truth_id", None)                                     # as the text-truth writer wrote it
    out.write_text(json.dumps(first) + "\n")
    res = cli_shadow(art, art, data, "-o", out, "--resume", "--json")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["resumed_from"] == 1 and (s["accuracy"]["samples"], s["accuracy"]["correct_a"]) == (2, 1)
