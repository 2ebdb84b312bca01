"""``edge-infer shadow`` made to refuse what ``score`` refuses (after ``test_score_hunt2.py``), and hunted
again for wrong answers with exit 0 (after ``test_shadow_hunt2.py``).

Each test reproduces one defect of the code before it:
- ``-o`` inside artifact B was not refused (the job record names A's artifact only): ``-o B/manifest.json
  --force`` deleted B's manifest, a new file changed the folder B was sealed in, exit 0;
- ``--field`` / ``--id-field`` (and ``--label-field``) on a plain-text input or an image folder were
  silently ignored: the CSV header of a ``.txt`` was compared as an input, no accuracy, exit 0;
- ``-o - >> IN`` read every line written as one more input: a run without end;
- a piped input (``cat in.csv | shadow A B /dev/stdin``) was read a second time for its labels: a CSV
  pipe lost the records after the reader's first block (5000 piped, ~2200 compared, exit 0), a JSONL one
  was drained ("the input held no records", exit 2, on a full input).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from factories import png_bytes
from output_cases import cli_shadow, strict_lines



def _tree(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(Path(root).rglob("*")) if p.is_file()}


def _png(seed: int) -> bytes:
    return png_bytes(np.random.default_rng(seed).integers(0, 255, (8, 8, 3), dtype=np.uint8))


@pytest.fixture
def pair(make_artifact, tmp_path):
    """Two text classifiers (A, B) and a small text input."""
    a, b = make_artifact("text-classification"), make_artifact("text-classification")
    src = tmp_path / "in.txt"
    src.write_text("good movie\nbad movie\nawful\n")
    return a, b, src


@pytest.fixture
def imgs(tmp_path):
    folder = tmp_path / "imgs"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.png").write_bytes(_png(1))
    (folder / "sub" / "b.png").write_bytes(_png(2))
    return folder


def _shadow_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "edge_runtime", "shadow", *map(str, args), "--quiet"]


# -- 1. -o inside either artifact ---------------------------------------------------------------------------

@pytest.mark.parametrize("name,flags", [("manifest.json", ["--force"]), ("pairs.jsonl", []),
                                        ("sub/pairs.jsonl", []), ("via-link", [])])
def test_an_output_inside_artifact_b_is_refused_as_inside_a(pair, tmp_path, name, flags):
    """Before: ``-o B/manifest.json --force`` deleted B's manifest and wrote the lines there, exit 0 (only
    A's artifact is in the job record that ``check_output`` reads)."""
    a, b, src = pair
    before_a, before_b = _tree(a), _tree(b)
    for art in (b, a):
        out = art / name
        if name == "via-link":
            (tmp_path / f"link-{art.name}").symlink_to(art)
            out = tmp_path / f"link-{art.name}" / "pairs.jsonl"
        res = cli_shadow(a, b, src, "-o", out, *flags)
        assert res.exit_code == 2 and "input_invalid" in res.output and "inside the artifact" in res.output, res.output
    assert (_tree(a), _tree(b)) == (before_a, before_b)           # nothing deleted, nothing added
    assert cli_shadow(a, b, src, "-o", tmp_path / "ok.jsonl").exit_code == 0


def test_the_library_refuses_an_output_inside_b_too(pair, tmp_path):
    from edge_runtime.errors import InputError
    from edge_runtime.runtime import load
    from edge_runtime.score_inputs import read_records
    from edge_runtime.shadow import shadow

    a, b, src = pair
    before = _tree(b)
    with load(a) as rt_a, load(b) as rt_b:
        with pytest.raises(InputError, match="inside the artifact") as err:
            shadow(rt_a, rt_b, read_records(src), b / "manifest.json", force=True)
    assert err.value.code == "input_invalid" and _tree(b) == before


# -- 2. --field / --id-field / --label-field where the input has no fields ------------------------------------

@pytest.mark.parametrize("flags", [["--field", "review"], ["--id-field", "id"], ["--label-field", "label"]])
def test_a_field_option_on_a_text_input_is_refused_not_ignored(pair, tmp_path, flags):
    """Before: ``data.txt --field review`` compared the CSV header and every row whole, ids the line numbers,
    and ``--label-field`` gave no accuracy and no word of why; exit 0 each."""
    a, b, _ = pair
    src = tmp_path / "data.txt"
    src.write_text("id,review,label\n1,great movie,positive\n2,awful,negative\n")     # a CSV under a .txt name
    out = tmp_path / "out.jsonl"
    res = cli_shadow(a, b, src, "-o", out, *flags)
    assert res.exit_code == 2 and "input_invalid" in res.output and "--format jsonl or csv" in res.output, res.output
    assert "read as text" in res.output and not out.exists()
    res = cli_shadow(a, b, src, "-o", out, "--format", "csv", "--field", "review", *flags)
    assert res.exit_code == 0, res.output
    assert [g["id"] for g in strict_lines(out)] == ["1", "2"]                 # as CSV: two rows, no header
    assert cli_shadow(a, b, src, "-o", out, "--force").exit_code == 0         # the default --label-field: no option


@pytest.mark.parametrize("flags", [["--field", "image"], ["--id-field", "id"], ["--label-field", "label"]])
def test_a_field_option_on_an_image_folder_is_refused(make_artifact, imgs, tmp_path, flags):
    art = make_artifact("image-classification")
    out = tmp_path / "out.jsonl"
    res = cli_shadow(art, art, imgs, "-o", out, *flags)
    assert res.exit_code == 2 and "input_invalid" in res.output and "read as images" in res.output, res.output
    assert not out.exists()
    assert cli_shadow(art, art, imgs, "-o", out).exit_code == 0


# -- 3. -o - appended to the input itself -------------------------------------------------------------------

@pytest.mark.parametrize("how", ["path", "stdin"])
def test_stdout_appended_to_the_input_is_refused_not_a_run_without_end(pair, tmp_path, how):
    """Before: each line written to stdout (the input, opened for append) was read as one more input: the
    run never ended (the test's timeout). Now ``input_invalid`` before any line, the input untouched."""
    a, b, src = pair
    text = src.read_text()
    arg = src if how == "path" else "/dev/stdin"
    with open(src, "ab") as out, open(src, "rb") as inp:
        res = subprocess.run(_shadow_cmd(a, b, arg, "-o", "-"), stdin=inp, stdout=out, stderr=subprocess.PIPE,
                             timeout=60)
    assert res.returncode == 2 and b"input_invalid" in res.stderr and b"stdout is the input" in res.stderr, res.stderr
    assert src.read_text() == text
    with open(tmp_path / "o.jsonl", "wb") as out, open(src, "rb") as inp:      # stdout to another file: fine
        res = subprocess.run(_shadow_cmd(a, b, arg, "-o", "-"), stdin=inp, stdout=out, stderr=subprocess.PIPE,
                             timeout=60)
    assert res.returncode == 0, res.stderr
    assert [g["id"] for g in strict_lines(tmp_path / "o.jsonl")] == [1, 2, 3]


# -- 4. a piped input is read once, by the run ---------------------------------------------------------------

JSONL3 = "".join(json.dumps({"id": i, "text": t, "label": lab}) + "\n"
                 for i, (t, lab) in enumerate([("good", "positive"), ("bad", "negative"), ("ok", "positive")]))
CSV3 = "id,text,label\n0,good,positive\n1,bad,negative\n2,ok,positive\n"
CSV_BIG = "id,text,label\n" + "".join(f"{i},text number {i},positive\n" for i in range(5000))


@pytest.mark.parametrize("fmt,data", [("jsonl", JSONL3), ("csv", CSV3), ("csv", CSV_BIG)],
                         ids=["jsonl", "csv", "big-csv"])
def test_a_piped_input_is_compared_whole_not_drained_by_its_labels(pair, tmp_path, fmt, data):
    """Before: the labels were read from ``/dev/stdin`` a second time. A JSONL pipe was drained by it and
    the run found no record (``score_input_empty``, exit 2, on three records); a CSV pipe's reader had
    taken its first block already, so the labels read the rest: 5000 records piped, about 2200 compared,
    exit 0 (a small one: unlabelled without a word). Now every record is compared, and the summary says
    why there is no accuracy."""
    a, b, _ = pair
    n = data.count("\n") - (fmt == "csv")
    out = tmp_path / "o.jsonl"
    res = subprocess.run(_shadow_cmd(a, b, "/dev/stdin", "--format", fmt, "-o", out, "--json"),
                         input=data.encode(), capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["total"] == n and [str(g["id"]) for g in strict_lines(out)] == [str(i) for i in range(n)]
    assert summary["accuracy"] is None and "pipe" in summary["accuracy_note"], summary
    if n == 3:          # the same input as a file: labelled, as before
        src = tmp_path / f"in.{fmt}"
        src.write_text(data)
        res = cli_shadow(a, b, src, "-o", tmp_path / "f.jsonl", "--json")
        assert res.exit_code == 0 and json.loads(res.stdout)["accuracy"]["samples"] == 3, res.output


# -- 5. the label column: named, found, read as the run reads its input ------------------------------------------

@pytest.mark.parametrize("suffix", ["csv", "jsonl"])
def test_a_label_field_named_but_found_nowhere_is_refused(pair, tmp_path, suffix):
    """Before: ``--label-field gold`` over an input without that column ran unlabelled, no accuracy and no word
    of why, exit 0. Now ``input_field_missing`` before anything is written."""
    a, b, _ = pair
    src = tmp_path / f"in.{suffix}"
    src.write_text("id,text,label\n0,good,positive\n1,bad,negative\n" if suffix == "csv" else
                   "".join(json.dumps({"id": i, "text": t, "label": "positive"}) + "\n" for i, t in enumerate("ab")))
    out = tmp_path / "o.jsonl"
    res = cli_shadow(a, b, src, "-o", out, "--label-field", "gold")
    assert res.exit_code == 2 and "input_field_missing" in res.output and "--label-field gold" in res.output, res.output
    assert not out.exists()
    res = cli_shadow(a, b, src, "-o", out, "--label-field", "label", "--json")      # the column it has: measured
    assert res.exit_code == 0 and json.loads(res.stdout)["accuracy"]["samples"] == 2, res.output


def test_a_header_naming_the_label_column_twice_is_refused_not_unlabelled(pair, tmp_path):
    """Before: the label read was refused (the column named twice) and the refusal taken for "no label
    column": no accuracy, no word, exit 0. Which of the two columns is the truth is unclear: ``input_bad_csv``."""
    a, b, _ = pair
    src = tmp_path / "in.csv"
    src.write_text("id,text,label,label\n0,good,positive,negative\n1,bad,negative,positive\n")
    out = tmp_path / "o.jsonl"
    res = cli_shadow(a, b, src, "-o", out)
    assert res.exit_code == 2 and "input_bad_csv" in res.output and "'label' 2 times" in res.output, res.output
    assert not out.exists()


def test_labels_are_read_whatever_the_default_id_column_holds(pair, tmp_path):
    """Before: the labels were read with the default id column: a header naming ``id`` twice (the run reads
    ``--id-field key``) refused the label read, taken for "no label column": no accuracy, exit 0."""
    a, b, _ = pair
    src = tmp_path / "in.csv"
    src.write_text("id,id,key,text,label\n0,0,k0,good,positive\n1,1,k1,bad,negative\n")
    res = cli_shadow(a, b, src, "-o", tmp_path / "o.jsonl", "--id-field", "key", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["accuracy"]["samples"] == 2
    assert [g["id"] for g in strict_lines(tmp_path / "o.jsonl")] == ["k0", "k1"]


# -- 6. the human summary never rounds a figure past its threshold ---------------------------------------------

def test_the_text_summary_cuts_figures_toward_their_worse_side(pair, tmp_path):
    """Before: the text summary printed each figure rounded to 4 decimals: a cosine min of 0.989999 (an input
    under ``--agree-at 0.99``) read ``min 0.9900``, a margin of -0.00004 (B flipped) ``-0.0000``, a
    ``score_diff`` max of 0.00004 ``0.0000`` (no drift). Now cut toward the worse side."""
    from edge_runtime.cli_shadow import summary_lines

    a, b, src = pair
    res = cli_shadow(a, b, src, "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    d["figures"] = {"cosine": {"mean": 0.995, "p5": 0.989999, "min": 0.989999},
                    "margin": {"mean": 0.2, "p5": -0.00004, "min": -0.00004},
                    "score_diff": {"mean": 0.00002, "p95": 0.00004, "max": 0.00004, "worst": "max"}}
    d["worst"][0]["compare"] = {"margin": -0.00004}
    text = "\n".join(summary_lines(d))
    assert "cosine: mean 0.9950, p5 0.9899, min 0.9899" in text, text
    assert "margin: mean 0.2000, p5 -0.0001, min -0.0001" in text, text
    assert "score_diff: mean 0.0001, p95 0.0001, max 0.0001" in text, text
    assert "| margin -0.0001" in text and "0.9900" not in text and "-0.0000" not in text, text


# -- 7. --report never writes over the -o - lines -------------------------------------------------------------

@pytest.mark.parametrize("how", ["dev-stdout", "same-file"])
def test_a_report_onto_stdout_is_refused_not_written_over_the_lines(pair, tmp_path, how):
    """Before: ``-o - --report /dev/stdout --force > pairs.jsonl`` (or ``--report pairs.jsonl``) opened the
    file stdout writes to for writing after the run: every JSONL line truncated away, the page in their
    place, exit 0. Now ``input_invalid`` before anything runs (``/dev`` as ``score -o`` refuses it)."""
    a, b, src = pair
    pairs = tmp_path / "pairs.jsonl"
    report = "/dev/stdout" if how == "dev-stdout" else pairs
    with open(pairs, "wb") as out:
        res = subprocess.run(_shadow_cmd(a, b, src, "-o", "-", "--report", report, "--force"), stdout=out,
                             stderr=subprocess.PIPE, timeout=60)
    assert res.returncode == 2 and b"input_invalid" in res.stderr and b"--report" in res.stderr, res.stderr
    assert pairs.read_bytes() == b""                              # nothing run, nothing written
    with open(pairs, "wb") as out:                              # a report of its own: the lines stay
        res = subprocess.run(_shadow_cmd(a, b, src, "-o", "-", "--report", tmp_path / "r.html"), stdout=out,
                             stderr=subprocess.PIPE, timeout=60)
    assert res.returncode == 0, res.stderr
    assert [g["id"] for g in strict_lines(pairs)] == [1, 2, 3]


# -- 8. an input only B's limit refuses is B's failure, not both sides' ------------------------------------------

def test_an_input_over_only_bs_request_limit_is_a_disagreement_not_both_failed(make_artifact, tmp_path):
    """Before: the input was read under the smaller side's cap, so a line only B's ``max_request_bytes``
    refuses was an error record for both: ``both_failed``, out of the agreement (1.0 over the other
    inputs, ``--min-agreement 0.9`` passed, exit 0) though A answered it. Now A answers, B refuses it
    itself (``input_too_large``): a disagreement, exit 7."""
    a = make_artifact("text-classification", limits={"max_text_chars": 200_000})
    b = make_artifact("text-classification", limits={"max_request_bytes": 1024, "max_text_chars": 200_000})
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": 1, "text": "good"}) + "\n"
                   + json.dumps({"id": 2, "text": "word " * 16_000}) + "\n")
    out = tmp_path / "o.jsonl"
    res = cli_shadow(a, b, src, "-o", out, "--json", "--min-agreement", "0.9")
    d = json.loads(res.stdout)
    assert res.exit_code == 7 and (d["compared"], d["agree"], d["only_b_failed"], d["both_failed"]) == (2, 1, 1, 0), d
    long = strict_lines(out)[1]
    assert long["a"]["ok"] and long["b"]["error"]["code"] == "input_too_large" and long["agree"] is False
