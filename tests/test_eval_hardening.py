"""``edge-infer eval`` compares class ids, never label texts, and measures classifiers only.

A labels file may repeat a text (Coral's ImageNet labels have ``crane`` at 135 and 518): a
folder named by an index whose label text is also another class's must not count that other
class as right; a folder or TSV label that is such a text names no one class and is refused
(``input_invalid``, exit 2, the indices named). An artifact that is no classifier (detection,
segmentation, pose, embeddings, tensors) is refused before any data is read, the supported
tasks named."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

import edge_runtime as er
from edge_runtime.artifact import ArtifactWriter
from edge_runtime.cli import main
from edge_runtime.errors import EdgeRuntimeError, InputError
from edge_runtime.evaluate import evaluate, labelled_samples, read_labelled
from edge_runtime.manifest import FORMAT, FORMAT_VERSION
from factories import _t, _variant, make_artifact, png_bytes

IMAGE = png_bytes(np.arange(64, dtype=np.uint8).reshape(8, 8) * 3)


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_error(res, code):
    err = res.stderr.strip().splitlines()
    assert err and err[-1].startswith(f"error [{code}]"), res.output
    assert "Traceback" not in res.output
    return err[-1]


def image_classifier(root: Path, labels: list[str]) -> Path:
    """The tiny fake image classifier of ``factories.make_artifact`` with ``labels`` of our choice
    (the same weights whatever the labels: the same prediction, class for class)."""
    w = ArtifactWriter(root)
    pre = {"kind": "image", "size": [8, 8], "channels": 1, "scale": 1 / 255, "mean": [0.5], "std": [0.5],
           "layout": "NCHW", "resize": "bilinear"}
    w.add_file("labels.txt", data=("\n".join(labels) + "\n").encode())
    specs = [{"name": "static", "inputs": [_t("image", "float32", [1, 1, 8, 8])],
              "outputs": [_t("logits", "float32", [1, len(labels)])]}]
    post = {"output": "logits", "softmax": True, "top_k": 3, "labels": "labels.txt"}
    variant = _variant(w, root, specs)
    w.write_manifest({"format": FORMAT, "format_version": FORMAT_VERSION,
                      "model": {"name": "tiny-dup", "version": "1"}, "task": "image-classification", "files": {},
                      "preprocess": pre, "postprocess": post, "limits": {}, "variants": [variant]})
    return root


@pytest.fixture
def dup_image(tmp_path):
    """(artifact, predicted class c, another class d): labels[d] is the same text as labels[c]."""
    plain = image_classifier(tmp_path / "plain", [f"class{i}" for i in range(10)])
    with er.load(plain, device="fake") as rt:
        c = rt.infer(IMAGE).class_id
    d = (c + 1) % 10
    labels = [f"class{i}" for i in range(10)]
    labels[d] = labels[c]                                   # c and d share one text, as ImageNet's "crane"
    return image_classifier(tmp_path / "dup", labels), c, d


def _folder(root: Path, name: str) -> Path:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "x.png").write_bytes(IMAGE)
    return root


# -- 1. class ids, not label texts -----------------------------------------------------------------------

def test_a_folder_named_by_index_is_wrong_when_another_class_with_its_text_is_predicted(dup_image, tmp_path):
    art, c, d = dup_image
    res = run("eval", art, _folder(tmp_path / "data", str(d)), "--json")   # the hunter's ev2/283 with 286 predicted
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert (rep["samples"], rep["correct"], rep["accuracy"]) == (1, 0, 0.0)
    rep = json.loads(run("eval", art, _folder(tmp_path / "right", str(c)), "--json").stdout)
    assert (rep["samples"], rep["correct"]) == (1, 1)


def test_a_folder_named_by_a_repeated_label_text_is_refused_naming_the_indices(dup_image, tmp_path):
    art, c, d = dup_image
    data = _folder(tmp_path / "data", f"class{c}")
    res = run("eval", art, data)
    assert res.exit_code == 2
    msg = one_error(res, "input_invalid")
    lo, hi = sorted((c, d))
    assert f"folder 'class{c}'" in msg and f"indices {lo}, {hi}" in msg and f"{lo}/ or {hi}/" in msg, msg
    assert res.stdout == ""                                 # refused before anything ran: no accuracy printed
    res = run("eval", art, data, "--json")
    err = json.loads(res.stdout)["error"]
    assert res.exit_code == 2 and err["code"] == "input_invalid" and err["details"]["classes"] == [lo, hi]


def test_a_repeated_label_in_a_tsv_is_refused_and_an_index_label_compares_ids(make_artifact, tmp_path):
    art = make_artifact("text-classification", labels=("neg", "pos", "neg"))
    with er.load(art, device="fake") as rt:
        c = rt.infer("good movie").class_id
    tsv = tmp_path / "data.tsv"
    tsv.write_text("text\tlabel\ngood movie\tneg\n")
    res = run("eval", art, tsv)
    assert res.exit_code == 2
    msg = one_error(res, "input_invalid")
    assert "line 2" in msg and "label 'neg'" in msg and "indices 0, 2" in msg and "0 or 2" in msg, msg
    other = next(i for i in (0, 2) if i != c) if c in (0, 2) else 0     # a class whose text may be c's, not c
    tsv.write_text(f"text\tlabel\ngood movie\t{c}\ngood movie\t{other}\n")
    rep = json.loads(run("eval", art, tsv, "--json").stdout)
    assert (rep["samples"], rep["correct"], rep["header"]["line"]) == (2, 1, 1)


def test_unique_label_texts_and_indices_still_name_their_class(image_art, tmp_path):
    """Labels 0..9: the folder ``7`` is the class labelled 7 (a text first), as before."""
    with er.load(image_art, device="fake") as rt:
        c = rt.infer(IMAGE).class_id
        samples, skipped, _ = read_labelled(_folder(tmp_path / "d", str(c)), rt.task.labels)
        assert [t for _, t, _ in samples] == [c] and skipped.count == 0
        rep = evaluate(rt, tmp_path / "d")
    assert (rep["samples"], rep["correct"]) == (1, 1)
    from edge_runtime.evaluate import LabelIndex

    idx = LabelIndex(["a", "b", "a", "7"])
    assert (idx.classes("a"), idx.classes("b"), idx.classes("1"), idx.classes("7"), idx.classes("9"),
            idx.classes("٣")) == ([0, 2], [1], [1], [3], [], [])


def test_labelled_samples_still_gives_the_raw_label_names(tmp_path):
    data = _folder(_folder(tmp_path / "d", "crane"), "518")
    assert sorted(label for _, label in labelled_samples(data)) == ["518", "crane"]


def test_a_classifier_result_without_a_class_id_is_not_scored_by_its_text(image_art, tmp_path, monkeypatch):
    data = _folder(tmp_path / "d", "3")
    with er.load(image_art, device="fake") as rt:
        monkeypatch.setattr(rt, "infer", lambda raw: SimpleNamespace(prediction="3", class_id=None, latency_ms=1.0))
        with pytest.raises(EdgeRuntimeError) as exc:
            evaluate(rt, data)
    assert exc.value.code == "task_invalid" and "class_id" in exc.value.message


# -- 2. classifiers only -----------------------------------------------------------------------------

NON_CLASSIFIERS = {"object-detection": "cat", "semantic-segmentation": "cat", "pose-estimation": "0",
                   "text-embedding": None, "tensors": "0"}


@pytest.mark.parametrize("task", sorted(NON_CLASSIFIERS))
def test_eval_refuses_an_artifact_that_is_no_classifier(make_artifact, tmp_path, task):
    art = make_artifact(task)
    folder = NON_CLASSIFIERS[task]
    if folder is None:
        data = tmp_path / "data.tsv"
        data.write_text("good movie\t0\n")
    else:
        data = _folder(tmp_path / "data", folder)
    res = run("eval", art, data)
    assert res.exit_code == 2, res.output
    msg = one_error(res, "input_invalid")
    assert f"task is {task}" in msg and "image-classification, text-classification" in msg, msg
    assert res.stdout == ""                                    # no accuracy printed
    res = run("eval", art, data, "--json")
    err = json.loads(res.stdout)["error"]
    assert res.exit_code == 2 and err["code"] == "input_invalid" and err["type"] == "InputError"
    assert err["details"]["task"] == task and err["details"]["supported"] == ["image-classification",
                                                                              "text-classification"]


def test_the_refusal_comes_before_the_data_is_read(make_artifact, tmp_path):
    art = make_artifact("object-detection")
    with er.load(art, device="fake") as rt:
        with pytest.raises(InputError) as exc:
            evaluate(rt, tmp_path / "does-not-exist")
    assert exc.value.code == "input_invalid" and exc.value.exit_code == 2


def test_classifiers_are_still_evaluated(text_art, tmp_path):
    tsv = tmp_path / "data.tsv"
    tsv.write_text("good\tpositive\nbad\tnegative\n")
    res = run("eval", text_art, tsv, "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["samples"] == 2
