"""``edge-infer shadow`` hunted again for wrong answers with exit 0 (after ``test_shadow_hunt.py``).

Each test reproduces one defect of the code before it: ``--report`` silently replaced an existing
file (the ``-o`` output refuses that without ``--force``/``--resume``), and wrote into a FIFO or a
folder only after the whole run; where A's and B's labels share no text the agreement counted
class indices while the flip matrix keyed its rows and columns by label text, so every agreeing
input was listed as a flip (``zero -> 0``) and the matrix had no diagonal; a text B repeats sat on
the diagonal though the comparison called it a disagreement; labels that share only some texts
(every other class of B never agrees) or a side without labels were not said."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from edge_runtime.score_inputs import Record, read_records
from edge_runtime.shadow import shadow
from factories import png_bytes, relabel
from output_cases import cli_shadow

DIGITS = [str(i) for i in range(10)]
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]




def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


@pytest.fixture
def images(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(12):
        (folder / f"{i}.png").write_bytes(png_bytes(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)))
    return folder


@pytest.fixture
def text_run(make_artifact, tmp_path):
    art = make_artifact("text-classification")
    data = tmp_path / "in.txt"
    data.write_text("good movie\nbad movie\nthe market rises\n")
    return art, data


# -- 1. --report never replaces an existing file unasked ------------------------------------------------

def test_an_existing_report_is_refused_without_force_before_anything_runs(text_run, tmp_path):
    """``--report notes.html`` onto a user's existing file replaced it with the page, exit 0, while ``-o``
    refuses an existing output without --force. Now ``score_output_exists``, exit 2, nothing run."""
    art, data = text_run
    report, out = tmp_path / "notes.html", tmp_path / "o.jsonl"
    report.write_text("my own notes")
    res = cli_shadow(art, art, data, "-o", out, "--report", report)
    assert res.exit_code == 2 and "score_output_exists" in res.output and "--force" in res.output, res.output
    assert report.read_text() == "my own notes" and not out.exists()
    res = cli_shadow(art, art, data, "-o", out, "--report", report, "--json")
    assert res.exit_code == 2 and json.loads(res.stdout)["error"]["code"] == "score_output_exists"
    res = cli_shadow(art, art, data, "-o", out, "--report", report, "--force")
    assert res.exit_code == 0, res.output
    assert report.read_text().startswith("<!DOCTYPE html>") and len(lines(out)) == 3


def test_resume_rewrites_its_own_report_but_never_another_file(text_run, tmp_path):
    """--resume (which excludes --force) may replace a page shadow wrote: the run's own report, rewritten
    over every line of the output. Any other file at that path is refused, as without --resume."""
    art, data = text_run
    report, out = tmp_path / "r.html", tmp_path / "o.jsonl"
    assert cli_shadow(art, art, data, "-o", out, "--report", report).exit_code == 0
    report.write_text(report.read_text().replace("</body>", "<p>stale</p></body>"))
    res = cli_shadow(art, art, data, "-o", out, "--report", report, "--resume", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["total"] == 3 and "stale" not in report.read_text()
    other = tmp_path / "other.html"
    other.write_text("<!DOCTYPE html><title>mine</title>")
    res = cli_shadow(art, art, data, "-o", out, "--report", other, "--resume")
    assert res.exit_code == 2 and "score_output_exists" in res.output, res.output
    assert other.read_text() == "<!DOCTYPE html><title>mine</title>"


def test_a_report_that_is_a_folder_or_a_fifo_is_refused_before_anything_runs(text_run, tmp_path):
    """A folder failed only after the whole run (its lines written, exit 2 at the end); a FIFO took the
    page (and blocked with no reader). Both are refused up front now, --force or not."""
    art, data = text_run
    folder = tmp_path / "dir.html"
    folder.mkdir()
    fifo = tmp_path / "pipe.html"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)     # the old code's write would block without one
    try:
        for target in (folder, fifo):
            for flags in ((), ("--force",)):
                out = tmp_path / "o.jsonl"
                res = cli_shadow(art, art, data, "-o", out, "--report", target, *flags)
                assert res.exit_code == 2 and "input_invalid" in res.output and str(target) in res.output, res.output
                assert not out.exists(), "the run ran before the report was refused"
        assert os.read(reader, 100) == b""
    finally:
        os.close(reader)
    assert list(folder.iterdir()) == []


def test_a_report_created_during_the_run_is_not_overwritten(text_run, tmp_path):
    from edge_runtime.errors import InputError
    from edge_runtime.shadow_report import is_report, write_report

    art, data = text_run
    from edge_runtime import load

    with load(art, device="fake") as rt:
        summary = shadow(rt, rt, read_records(data))
    meta = {k: {"model": "m", "version": "1", "target": "t", "device": "d", "manifest_sha256": "0" * 64,
                "path": "p"} for k in ("a", "b")}
    meta.update(input="in", cpu="c", output=None)
    page = tmp_path / "late.html"
    page.write_text("arrived meanwhile")
    with pytest.raises(InputError) as exc:
        write_report(page, summary, meta, replace=False)
    assert exc.value.code == "score_output_exists" and page.read_text() == "arrived meanwhile"
    assert not is_report(page) and is_report(write_report(page, summary, meta))


# -- 2. labels that share no text: every figure by class index -----------------------------------------------

def _matrix_agrees_with_the_lines(s: dict, got: list[dict]) -> None:
    """The flip matrix's diagonal is the agreeing inputs and its flips the others, input for input."""
    m = s["matrix"]
    diag = sum(m["counts"][i][i] for i in range(len(m["labels"])))
    compared = [x for x in got if x["compare"] is not None and x["compare"]["kind"] == "classification"]
    assert diag == sum(bool(x["agree"]) for x in compared)
    assert sum(f["count"] for f in s["flips"]) == sum(not x["agree"] for x in compared)


def test_labels_sharing_no_text_name_the_flip_matrix_by_class_index(make_artifact, images, tmp_path):
    """A's labels ``zero``..``nine``, B's ``0``..``9`` (the same weights): agreement 1.0 by class index,
    while the flips listed every input (``seven -> 7``) and the matrix held 20 labels, no diagonal."""
    a = relabel(make_artifact("image-classification"), WORDS)
    b = make_artifact("image-classification")
    out = tmp_path / "o.jsonl"
    res = cli_shadow(a, b, images, "--json", "-o", out, "--report", tmp_path / "r.html")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["agreement"] == 1.0 and s["flips"] == [], s["flips"][:3]     # was: zero -> 0, one -> 1, ...
    assert s["labels_basis"] == "index" and s["labels_note"]
    assert s["matrix"]["labels"] == [n for n in (f"{w}={d}" for w, d in zip(WORDS, DIGITS))
                                     if n in s["matrix"]["labels"]]
    _matrix_agrees_with_the_lines(s, lines(out))
    text = cli_shadow(a, b, images).output
    assert "label flips (A -> B by class index, A's label=B's): none" in text, text
    page = (tmp_path / "r.html").read_text()
    assert "No label flips." in page and "by class index" in page and "share no text" in page
    assert "<th>zero</th>" not in page and any(f"<th>{w}={d}</th>" in page for w, d in zip(WORDS, DIGITS))


def test_labels_sharing_no_text_with_real_flips_count_the_same_flips(make_artifact, images, tmp_path):
    """Another model (seed) under the other labels: the flips are exactly the disagreements."""
    a = relabel(make_artifact("image-classification"), WORDS)
    b = make_artifact("image-classification", seed=5)
    out = tmp_path / "o.jsonl"
    res = cli_shadow(a, b, images, "--json", "-o", out)
    s = json.loads(res.stdout)
    got = lines(out)
    assert s["agree"] < s["compared"], "the two seeds agree everywhere: the test shows nothing"
    _matrix_agrees_with_the_lines(s, got)
    want: dict = {}
    for x in got:
        if not x["agree"]:
            ca, cb = x["a"]["result"]["class_id"], x["b"]["result"]["class_id"]
            key = (f"{WORDS[ca]}={ca}", f"{WORDS[cb]}={cb}")
            want[key] = want.get(key, 0) + 1
    assert {(f["a"], f["b"]): f["count"] for f in s["flips"]} == want


class Stub:
    """A classifier runtime whose answer to each input is the class ``answer(value)`` of ``labels``."""

    def __init__(self, labels, answer):
        self.labels, self.answer = list(labels), answer
        self.artifact = SimpleNamespace(task="image-classification")
        self.task = SimpleNamespace(labels=self.labels, parity_metric="top1_agreement", name="image-classification")

    def infer(self, value):
        k = self.answer(value)
        d = {"prediction": self.labels[k], "class_id": k, "latency_ms": 1.0,
             "top_k": [{"index": k, "label": self.labels[k], "score": 0.9}]}
        return SimpleNamespace(to_dict=lambda: dict(d))


def _records(n):
    return iter([Record(i, f"r{i}", i, line=i + 1) for i in range(n)])


def test_a_text_b_repeats_is_no_diagonal_when_the_comparison_says_they_differ():
    """B repeats ``crane`` (B's 0 and 2), A has it once: the comparison cannot say which of B's cranes is
    A's, so B's crane never agrees; but the matrix named both ``crane#0`` and counted it on the diagonal
    (no flip) while the agreement counted a disagreement."""
    a = Stub(["crane", "heron"], lambda v: 0)
    b = Stub(["crane", "heron", "crane"], lambda v: 0)
    s = shadow(a, b, _records(3)).to_dict()
    assert (s["agree"], s["compared"]) == (0, 3)
    assert s["flips"] == [{"a": "crane#0", "b": "crane#B0", "count": 3}]
    assert "share only some texts" in s["labels_note"] and "'crane'" in s["labels_note"]


def test_labels_sharing_only_some_texts_say_which_classes_never_agree():
    """A ``crane heron stork``, B ``crane reiher storch`` (the same classes, two renamed): one shared
    text switched the comparison to texts, so B's ``reiher`` never agrees with A's ``heron``; the flips
    showed it, but nothing said why the agreement fell. Now ``labels_note`` (and the basis) say it."""
    a = Stub(["crane", "heron", "stork"], lambda v: v % 3)
    b = Stub(["crane", "reiher", "storch"], lambda v: v % 3)
    s = shadow(a, b, _records(6)).to_dict()
    assert (s["agree"], s["compared"], s["labels_basis"]) == (2, 6, "text")
    assert "B's 'reiher', 'storch' name no one class of A's" in s["labels_note"]
    assert "A's 'heron', 'stork' have no one class among B's labels" in s["labels_note"]
    assert {(f["a"], f["b"]): f["count"] for f in s["flips"]} == {("heron", "reiher"): 2, ("stork", "storch"): 2}
    assert s["matrix"]["labels"] == ["crane", "heron", "stork", "reiher", "storch"]
    reordered = shadow(a, Stub(["stork", "crane", "heron"], lambda v: (v + 1) % 3), _records(6)).to_dict()
    assert (reordered["agree"], reordered["labels_note"], reordered["flips"]) == (6, None, [])


def test_a_side_without_labels_is_said_to_compare_by_index():
    from edge_runtime.shadow_truth import label_space_note

    assert label_space_note(["cat", "dog"], None).startswith("B has no labels: answers are compared by class index")
    assert label_space_note(None, ["cat", "dog"]).startswith("A has no labels")
    assert label_space_note(None, None) is None and label_space_note(["a"], ["a"]) is None


# -- 3. a figure never reads at the threshold when the input disagreed -----------------------------------

def test_a_cosine_just_under_agree_at_is_never_written_as_the_threshold():
    """cosine 0.9899996 at --agree-at 0.99: ``agree`` false, but the line (and the summary's min) said
    ``cosine 0.99``, a figure that meets the threshold. Figures are cut now, never rounded up."""
    from edge_runtime.shadow_compare import compare

    c = 0.9899996
    a, b = {"embedding": [1.0, 0.0]}, {"embedding": [c, float(np.sqrt(1 - c * c))]}
    got = compare(a, b, 0.99)
    assert got["agree"] is False and got["cosine"] < 0.99 and got["cosine"] == pytest.approx(0.989999)
    ok = compare(a, {"embedding": [0.99, float(np.sqrt(1 - 0.99 ** 2))]}, 0.99)
    assert ok["agree"] is True and ok["cosine"] >= 0.99
    t = compare({"outputs": {"y": [1.0, 0.0]}}, {"outputs": {"y": b["embedding"]}}, 0.99)
    assert t["agree"] is False and t["cosine"] < 0.99


def test_a_pixel_agreement_just_under_agree_at_reads_under_it():
    """3 million pixels, 90 001 of them different: 0.96999967, ``agree`` false at 0.97, written 0.97."""
    from edge_runtime.shadow_compare import compare

    ma = np.zeros(3_000_000, dtype=np.int64)
    mb = ma.copy()
    mb[:90_001] = 1
    got = compare({"outputs": {"mask": ma}}, {"outputs": {"mask": mb}}, None)
    assert got["agree"] is False and got["pixel_agreement"] < 0.97, got


# -- 4. a resume never mixes two label columns ---------------------------------------------------------------

def test_a_resume_with_another_label_field_is_refused_not_mixed(text_run, tmp_path):
    """The first lines took their truths from ``label``, the resumed ones from ``gold``: one accuracy over
    two columns, exit 0. The label field is in the job record now: ``score_output_mismatch``."""
    art, _ = text_run
    data = tmp_path / "in.tsv"
    data.write_text("text\tlabel\tgold\ngood movie\tpositive\tnegative\nbad movie\tpositive\tnegative\n"
                    "the market rises\tpositive\tnegative\nawful\tpositive\tnegative\n")
    out = tmp_path / "o.jsonl"
    assert cli_shadow(art, art, data, "-o", out).exit_code == 0
    kept = out.read_text().splitlines()[:2]
    out.write_text("\n".join(kept) + "\n")          # interrupted after two lines
    res = cli_shadow(art, art, data, "-o", out, "--resume", "--label-field", "gold", "--json")
    assert res.exit_code == 2 and json.loads(res.stdout)["error"]["code"] == "score_output_mismatch", res.output
    assert out.read_text().splitlines() == kept
    res = cli_shadow(art, art, data, "-o", out, "--resume", "--json")         # the same column: goes on
    assert res.exit_code == 0 and json.loads(res.stdout)["accuracy"]["samples"] == 4, res.output
    gold = tmp_path / "g.jsonl"
    assert cli_shadow(art, art, data, "-o", gold, "--label-field", "gold").exit_code == 0
    gold.write_text("\n".join(gold.read_text().splitlines()[:2]) + "\n")
    res = cli_shadow(art, art, data, "-o", gold, "--resume", "--label-field", "gold", "--json")
    assert res.exit_code == 0, res.output
    assert cli_shadow(art, art, data, "-o", gold, "--resume").exit_code == 2


# -- 5. an image folder's labels stay on their images ---------------------------------------------------

def test_a_subfolder_that_cannot_be_listed_does_not_shift_the_labels(tmp_path, monkeypatch):
    """A subfolder that cannot be listed is one error record of the input, but the labels were read from
    the images alone: every image after it took the label of the image after it (the error record the
    first one's), so a right answer was scored wrong, or unlabelled, exit 0."""
    from edge_runtime import score_images

    root = tmp_path / "d"
    for label, name in (("b", "x.png"), ("c", "y.png")):
        (root / label).mkdir(parents=True)
        (root / label / name).write_bytes(png_bytes(np.zeros((4, 4, 3), dtype=np.uint8)))
    real = score_images._image_entries

    def with_a_locked_folder(path):
        return [("a/", Path(path) / "a", PermissionError(13, "Permission denied"))] + real(path)
    monkeypatch.setattr(score_images, "_image_entries", with_a_locked_folder)
    labels = ["a", "b", "c"]

    def right(value):           # the class of the image's folder
        return labels.index(Path(value).parent.name)
    s = shadow(Stub(labels, right), Stub(labels, right), read_records(root)).to_dict()
    assert s["total"] == 3 and s["both_failed"] == 1
    assert (s["accuracy"]["samples"], s["accuracy"]["correct_a"], s["accuracy"]["correct_b"]) == (2, 2, 2)
