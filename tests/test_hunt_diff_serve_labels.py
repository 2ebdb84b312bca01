"""Wrong answers of 2026-12-07 in ``edge-infer diff`` (limits and labels) and in serve's per-model
request counters (each test failed before its fix).

- ``diff`` listed a limit one manifest sets as ``+ limits.max_text_chars: 100 (only in B)``, never the
  limit A's users get (the default), and a labels file only as a changed sha256: two versions whose
  classes were renamed or swapped (the same weights) read as one hash change, with nothing saying
  which class now answers under which name; a B whose output lost a class while the labels file
  stayed (every load of B refuses it) showed one shape change and no warning. Now ``limits`` and
  ``labels`` sections (text and ``--json``) give each limit as a load applies it, each class id
  whose name differs, and flag labels that no longer match the model's classes.
- serve counted a refusal of a served model inside the core (the 400 of a versionless request when
  the versions do not order as numbers, the 503 while draining) under ``model=""``: the per-model
  error counters said the model had none.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner

from edge_runtime import error_codes as ec
from edge_runtime.cli import main
from edge_runtime.serve_types import InferRequest, ServeError, Tensor
from factories import rewrite_manifest


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def diff_json(a, b) -> tuple[int, dict]:
    res = run("diff", a, b, "--json")
    return res.exit_code, json.loads(res.stdout)


# -- diff: limits ----------------------------------------------------------------------------------

def test_a_limit_set_on_one_side_reads_as_both_values_a_load_applies(make_artifact):
    a = make_artifact("text-classification")
    b = make_artifact("text-classification", limits={"max_text_chars": 100, "deadline_ms": 50})
    code, r = diff_json(a, b)
    assert code == 1 and r["same"] is False
    assert r["limits"]["changed"] == [
        {"limit": "max_text_chars", "a": 10000, "b": 100, "a_source": "default", "b_source": "manifest"},
        {"limit": "deadline_ms", "a": 5000, "b": 50, "a_source": "default", "b_source": "manifest"}]
    assert r["limits"]["a"]["values"]["max_text_chars"] == 10000 and r["limits"]["b"]["error"] is None
    out = run("diff", a, b).output
    assert "limits (as a load applies them: A -> B):" in out
    assert "~ max_text_chars: 10000 (default) -> 100 (manifest)" in out
    assert "~ deadline_ms: 5000 (default) -> 50 (manifest)" in out


def test_a_task_default_limit_is_named_as_such_and_an_unloadable_limit_is_flagged(make_artifact):
    a = make_artifact("image-classification")
    b = make_artifact("image-classification", limits={"max_request_bytes": 1024})
    code, r = diff_json(a, b)
    assert code == 1 and r["limits"]["changed"] == [
        {"limit": "max_request_bytes", "a": 32 * 1024 * 1024, "b": 1024, "a_source": "task default",
         "b_source": "manifest"}]
    c = make_artifact("image-classification")
    rewrite_manifest(c, lambda m: m["limits"].update(max_batch=2))     # no such limit: every load refuses it
    code, r = diff_json(a, c)
    assert code == 1 and r["limits"]["b"]["values"] is None and ec.LIMIT_UNKNOWN in r["limits"]["b"]["error"]
    assert "! B: its limits do not load, every load refuses it: unknown limit 'max_batch'" in run("diff", a, c).output


# -- diff: labels ----------------------------------------------------------------------------------

def test_renamed_labels_are_listed_per_class(make_artifact):
    a = make_artifact("text-classification")
    b = make_artifact("text-classification", labels=("neg", "pos"))
    code, r = diff_json(a, b)
    assert code == 1
    assert r["labels"]["changed"] == [{"class": 0, "a": "negative", "b": "neg"},
                                      {"class": 1, "a": "positive", "b": "pos"}]
    assert r["labels"]["a"]["file"] == "labels.txt" and r["labels"]["b"]["count"] == 2
    assert r["labels"]["b"]["mismatch"] is None
    out = run("diff", a, b).output
    assert 'labels (class id: name in A -> name in B):\n  ~ [0]: "negative" -> "neg"\n  ~ [1]: "positive" -> "pos"' in out


def test_swapped_labels_say_which_class_answers_under_which_name(make_artifact):
    """The same two names in the other order: the same weights now answer every input with the
    other class's name. Before: one sha256 change, nothing more."""
    a = make_artifact("text-classification")
    b = make_artifact("text-classification", labels=("positive", "negative"))
    code, r = diff_json(a, b)
    assert code == 1 and [(c["class"], c["a"], c["b"]) for c in r["labels"]["changed"]] == [
        (0, "negative", "positive"), (1, "positive", "negative")]
    assert '~ [0]: "negative" -> "positive"' in run("diff", a, b).output


def test_a_class_added_and_the_count_are_shown(make_artifact):
    a = make_artifact("text-classification")
    b = make_artifact("text-classification", labels=("negative", "positive", "neutral"))
    code, r = diff_json(a, b)
    assert code == 1 and r["labels"]["changed"] == [{"class": 2, "a": None, "b": "neutral"}]
    out = run("diff", a, b).output
    assert '+ [2]: "neutral" (only in B)' in out and "~ count: 2 -> 3" in out
    code, r = diff_json(b, a)
    assert r["labels"]["changed"] == [{"class": 2, "a": "neutral", "b": None}]
    assert '- [2]: "neutral" (only in A)' in run("diff", b, a).output


def test_labels_that_no_longer_match_the_outputs_in_b_are_flagged(make_artifact):
    """B's output lost a class and its labels file did not: every load of B refuses it
    (``artifact_labels_mismatch``); the diff showed one shape change and nothing else."""
    a = make_artifact("image-classification")
    b = make_artifact("image-classification")
    rewrite_manifest(b, lambda m: m["variants"][0]["buckets"][0]["outputs"][0].update(shape=[1, 9]))
    code, r = diff_json(a, b)
    assert code == 1 and r["labels"]["a"]["mismatch"] is None
    assert "10 labels for 9 classes" in r["labels"]["b"]["mismatch"]
    assert ec.ARTIFACT_LABELS_MISMATCH in r["labels"]["b"]["mismatch"]
    out = run("diff", a, b).output
    assert "! B: every load refuses its labels: fake: labels.txt: 10 labels for 9 classes" in out


def test_default_labels_against_a_labels_file(make_artifact):
    """A without a labels file answers ``0``, ``1``; B with one answers names: listed per class."""
    a = make_artifact("text-classification")
    rewrite_manifest(a, lambda m: m["postprocess"].pop("labels"))
    b = make_artifact("text-classification")
    code, r = diff_json(a, b)
    assert code == 1 and r["labels"]["a"]["file"] is None and r["labels"]["a"]["labels"] == ["0", "1"]
    assert r["labels"]["changed"] == [{"class": 0, "a": "0", "b": "negative"}, {"class": 1, "a": "1", "b": "positive"}]


def test_many_changed_labels_are_cut_in_the_text_not_in_the_json(make_artifact):
    n = 30
    a = make_artifact("text-classification", labels=tuple(f"c{i}" for i in range(n)))
    b = make_artifact("text-classification", labels=tuple(f"d{i}" for i in range(n)))
    code, r = diff_json(a, b)
    assert code == 1 and len(r["labels"]["changed"]) == n
    out = run("diff", a, b).output
    assert '~ [19]: "c19" -> "d19"' in out and "[20]" not in out
    assert "... 10 more classes differ (--json lists every one)" in out


def test_the_same_artifact_twice_has_no_limit_or_label_difference(make_artifact, tmp_path):
    import shutil

    a = make_artifact("image-classification", limits={"max_text_chars": 7})
    b = tmp_path / "copy"
    shutil.copytree(a, b)
    code, r = diff_json(a, b)
    assert code == 0 and r["same"] and r["limits"]["changed"] == [] and r["labels"]["changed"] == []
    out = run("diff", a, b).output
    assert "limits (" not in out and "labels (" not in out


# -- serve: refusals of a served model are counted under its name ----------------------------------

NAME = "tiny-text-classification"


# the served repository of versions: test_serve_hunt's fixture
from test_serve_hunt import repo_core  # noqa: E402,F401  (a fixture: used by name)


def _refused(core, model: str, version: str | None) -> ServeError:
    req = InferRequest(model=model, version=version, inputs=[Tensor("text", "BYTES", [1], [b"good film"])])
    with pytest.raises(ServeError) as e:
        asyncio.run(core.infer(req))
    return e.value


def _count(core, model: str, status: str) -> int:
    line = f'edge_serve_requests_total{{model="{model}",status="{status}"}} '
    return sum(int(x[len(line):]) for x in core.metrics_text().splitlines() if x.startswith(line))


def test_a_versionless_request_refused_for_versions_that_do_not_order_counts_under_the_model(repo_core):
    core = repo_core("rc", "beta")
    err = _refused(core, NAME, None)
    assert err.status == "bad_request" and err.code == ec.SERVE_REQUEST_MALFORMED
    assert _count(core, NAME, "bad_request") == 1 and _count(core, "", "bad_request") == 0
    _refused(core, NAME, "")                               # gRPC's empty model_version: the same request
    assert _count(core, NAME, "bad_request") == 2
    # names and versions not served here stay out of the labels (a client cannot add series)
    assert _refused(core, "made-up", None).status == "not_found"
    assert _refused(core, NAME, "7").status == "not_found"
    assert _count(core, "", "not_found") == 2 and "made-up" not in core.metrics_text()
    assert _count(core, NAME, "not_found") == 0


def test_a_refusal_while_draining_counts_under_the_model(repo_core):
    core = repo_core("1")
    asyncio.run(core.drain(0.1))
    err = _refused(core, NAME, None)
    assert err.status == "unavailable" and err.code == ec.SERVE_NOT_READY
    _refused(core, NAME, "1")
    _refused(core, "made-up", None)
    assert _count(core, NAME, "unavailable") == 2 and _count(core, "", "unavailable") == 1
