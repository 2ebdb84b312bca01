"""``edge-infer shadow`` hunted for wrong answers with exit 0: the tool that decides whether version B
of a model may replace version A must never say "agree" (or a rate) that is not true.

Each test reproduces one defect of the code before it: a detector or segmenter whose labels file was
swapped agreed on every box and pixel (their class ids were compared, not their classes); ``nan``
passed ``--min-agreement`` (and made ``--agree-at`` disagree on everything); a B that answered no
input at all exited 0; tensors of other shapes (one total size) read as cosine 1.0; all-zero outputs
read as orthogonal; a B without the output A's comparison reads "agreed" as equal predictions;
detectors that found nothing anywhere passed ``--min-agreement`` on an F1 of 1.0 over no box; a
text B cut (its largest bucket shorter) was invisible in the summary."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from edge_runtime.errors import InputError, ParityError
from edge_runtime.score_inputs import Record, read_records
from edge_runtime.shadow import shadow, verdict
from edge_runtime.shadow_compare import compare
from factories import png_bytes, relabel, rewrite_manifest
from output_cases import cli_shadow, run_cli




@pytest.fixture
def images(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(6):
        (folder / f"{i}.png").write_bytes(png_bytes(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)))
    return folder


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


# -- 1. labels of a detector or segmenter: classes, not class ids ------------------------------------------

def test_a_detector_whose_labels_were_swapped_does_not_agree(make_artifact, images, tmp_path):
    """The same weights with ``cat`` and ``dog`` swapped in B's labels file: every box A calls a cat, B
    calls a dog. Before: F1 1.0 on every input, ``agreement 1.0``, exit 0 under --min-agreement 0.9."""
    a = make_artifact("object-detection")
    b = relabel(make_artifact("object-detection"), ["dog", "cat", "bird"])
    out = tmp_path / "o.jsonl"
    res = cli_shadow(a, b, images, "--json", "-o", out, "--min-agreement", "0.9")
    got = lines(out)
    swapped = [x for x in got if {d["label"] for d in x["a"]["result"]["detections"]} & {"cat", "dog"}]
    assert swapped, "the tiny detector found no cat or dog: the test shows nothing"
    for x in swapped:
        a_labels = [d["label"] for d in x["a"]["result"]["detections"]]       # the same boxes, in one order
        b_labels = [d["label"] for d in x["b"]["result"]["detections"]]
        assert a_labels != b_labels and x["agree"] is False and x["compare"]["f1"] < 1.0
    s = json.loads(res.stdout)
    assert s["agreement"] < 0.9 and res.exit_code == 7, res.output
    assert s["error"]["code"] == "shadow_agreement_below"
    same = cli_shadow(a, relabel(make_artifact("object-detection"), ["cat", "dog", "bird"]), images, "--json",
                      "--min-agreement", "1")
    assert same.exit_code == 0 and json.loads(same.stdout)["agreement"] == 1.0      # the same classes agree


def test_a_detector_with_its_classes_reordered_agrees_box_for_box():
    """B's labels reordered with its class ids (what a re-export with another class order gives): each
    box is the same class, so they agree; their raw class ids differ."""
    class Det:
        def __init__(self, labels, dets):
            self.labels, self.dets = labels, dets
            self.artifact = SimpleNamespace(task="object-detection")
            self.task = SimpleNamespace(labels=labels, parity_metric="detection_f1", name="object-detection")

        def infer(self, value):
            d = {"prediction": self.dets[0]["label"], "class_id": None, "latency_ms": 1.0, "detections": self.dets}
            return SimpleNamespace(to_dict=lambda: dict(d))

    box = [1.0, 1.0, 9.0, 9.0]
    a = Det(["cat", "dog"], [{"label": "cat", "class_id": 0, "score": 0.9, "box": box}])
    b = Det(["dog", "cat"], [{"label": "cat", "class_id": 1, "score": 0.9, "box": box}])
    s = shadow(a, b, iter([Record(0, "r0", "x", line=1)])).to_dict()
    assert (s["agree"], s["compared"], s["figures"]["f1"]["mean"]) == (1, 1, 1.0)


def test_a_segmenter_whose_labels_were_swapped_does_not_agree(make_artifact, images):
    """Masks hold class ids: B's ``cat`` pixels are A's ``dog`` ones. Before: pixel agreement 1.0."""
    a = make_artifact("semantic-segmentation")
    b = relabel(make_artifact("semantic-segmentation"), ["background", "dog", "cat"])
    recs = list(read_records(images))
    from edge_runtime import load

    with load(a, device="fake") as ra, load(b, device="fake") as rb:
        classes = {int(v) for r in recs for v in np.unique(ra.infer(r.value).outputs["mask"])}
        assert classes & {1, 2}, "the tiny segmenter found no cat or dog: the test shows nothing"
        s = shadow(ra, rb, iter(recs)).to_dict()
    assert s["kind"] == "segmentation" and s["figures"]["pixel_agreement"]["mean"] < 1.0
    assert s["agree"] < s["compared"]


# -- 2. thresholds: NaN is no number in [0, 1] -----------------------------------------------------------

def test_nan_min_agreement_is_refused_not_passed(make_artifact, tmp_path):
    """``--min-agreement nan``: click's FloatRange lets NaN through and ``agreement < nan`` is false, so
    a pair that agreed on nothing (B's labels reversed: every answer flips) exited 0."""
    a = make_artifact("text-classification")
    b = make_artifact("text-classification", labels=("positive", "negative"))
    data = tmp_path / "in.txt"
    data.write_text("good movie\nbad movie\nthe market rises\n")
    flipped = cli_shadow(a, b, data, "--json")
    assert flipped.exit_code == 0 and json.loads(flipped.stdout)["agreement"] == 0.0
    for flag in ("--min-agreement", "--agree-at"):
        for value in ("nan", "NaN", "-nan"):
            res = cli_shadow(a, b, data, flag, value)
            assert res.exit_code == 2 and "0<=x<=1" in res.output, (flag, value, res.output)
    assert cli_shadow(a, b, data, "--min-agreement", "0.5").exit_code == 7


def test_nan_thresholds_through_the_api_are_input_errors(make_artifact, tmp_path):
    from edge_runtime import load

    art = make_artifact("text-classification")
    recs = [Record(0, "r0", "good movie", line=1)]
    with load(art, device="fake") as rt:
        with pytest.raises(InputError) as exc:
            shadow(rt, rt, iter(recs), agree_at=float("nan"))
        assert exc.value.code == "input_invalid" and "agree_at" in exc.value.message
        s = shadow(rt, rt, iter(recs))
    for bad in (float("nan"), 1.5, -0.1):
        with pytest.raises(InputError) as exc:
            verdict(s, bad)
        assert exc.value.code == "input_invalid"
    assert verdict(s, 1.0) is None


# -- 3. a side that answered nothing ----------------------------------------------------------------------

def test_a_b_that_answered_no_input_does_not_exit_0(make_artifact, tmp_path):
    """B's limits refuse every input (``max_text_chars`` 3): it answered nothing, was compared with
    nothing, and the run exited 0 with 'agreement 0.0000'. Now B's error ends the run as ``score``'s
    does (0 of N succeeded), naming the side; the report still shows each side's failures."""
    a = make_artifact("text-classification")
    b = make_artifact("text-classification", limits={"max_text_chars": 3})
    data = tmp_path / "in.txt"
    data.write_text("good movie\nbad movie\n")
    res = cli_shadow(a, b, data, "--json", "--report", tmp_path / "r.html")
    s = json.loads(res.stdout)
    assert (s["only_b_failed"], s["compared"]) == (2, 2)
    assert res.exit_code == 2, res.output
    assert s["error"]["code"] == "score_nothing_succeeded" and s["error"]["message"].startswith("side B: 0 of 2")
    assert "2 only on B" in (tmp_path / "r.html").read_text()
    ok = cli_shadow(a, make_artifact("text-classification", limits={"max_text_chars": 9}), data, "--json")
    assert ok.exit_code == 0 and json.loads(ok.stdout)["only_b_failed"] == 1       # B answered one: a rate


# -- 4. results that cannot be compared -----------------------------------------------------------------

def _t(**arrays):
    return {"outputs": {k: {"dtype": "float32", "shape": list(np.shape(v)), "data": np.asarray(v).tolist()}
                        for k, v in arrays.items()}}


def test_tensors_of_other_shapes_never_agree():
    """A's ``p`` is 3 values and ``q`` 1, B's ``p`` 1 and ``q`` 3: flattened together they lined up as
    the same 4 values, cosine 1.0, agree."""
    a = _t(p=[1.0, 2.0, 3.0], q=[4.0])
    b = _t(p=[1.0], q=[2.0, 3.0, 4.0])
    c = compare(a, b)
    assert c["agree"] is False and "cosine" not in c and "'p'" in c["mismatch"]
    same = compare(a, _t(p=[1.0, 2.0, 3.0], q=[4.0]))
    assert same["agree"] and same["cosine"] == pytest.approx(1.0)


def test_identical_all_zero_outputs_agree():
    """Two all-zero outputs (a ReLU head on a dark frame) are the same answer; 0/0 read as cosine 0.0."""
    c = compare(_t(y=[0.0, 0.0, 0.0]), _t(y=[0.0, 0.0, 0.0]))
    assert c["agree"] and c["cosine"] == 1.0
    assert not compare(_t(y=[0.0, 0.0, 0.0]), _t(y=[0.0, 1.0, 0.0]))["agree"]


def test_embeddings_of_other_sizes_or_a_missing_output_are_no_agreement_and_no_figure():
    """Another embedding size read as cosine 0.0 (a figure in the mean); B with no embedding at all
    fell through to 'equal predictions' (both None): agree."""
    c = compare({"embedding": [1.0, 0.0, 0.0]}, {"embedding": [1.0, 0.0]})
    assert c["agree"] is False and "cosine" not in c and "sizes differ" in c["mismatch"]
    gone = compare({"embedding": [1.0, 0.0], "prediction": None}, {"embedding": None, "prediction": None})
    assert gone["agree"] is False and gone["kind"] == "embedding" and gone["mismatch"]
    seg = compare({"outputs": {"mask": [[0, 1]]}, "prediction": "cat"}, {"outputs": {"x": [[0, 1]]},
                                                                         "prediction": "cat"})
    assert seg["agree"] is False and seg["mismatch"]


def test_a_mismatch_counts_apart_and_stays_out_of_the_figures():
    from edge_runtime.shadow_lines import shadow_line
    from edge_runtime.shadow_summary import ShadowSummary

    class Res:
        def __init__(self, emb):
            self.emb = emb

        def to_dict(self):
            return {"prediction": None, "embedding": self.emb, "latency_ms": 1.0}

    s = ShadowSummary()
    s.add(shadow_line(Record(0, "r0", "t", line=1), Res([1.0, 0.0]), Res([1.0, 0.0]), None, None))
    s.add(shadow_line(Record(1, "r1", "t", line=2), Res([1.0, 0.0]), Res([1.0, 0.0, 0.0]), None, None))
    d = s.to_dict()
    assert (d["agree"], d["compared"], d["mismatched"]) == (1, 2, 1)
    assert d["figures"]["cosine"] == {"mean": 1.0, "min": 1.0, "p5": 1.0}


# -- 5. an agreement over nothing ------------------------------------------------------------------------

def test_detectors_that_find_nothing_anywhere_cannot_pass_min_agreement(make_artifact, images):
    """Two detectors (zero weights: every box empty) that find no box on any input on either side.
    Before: 'agreement 1.0000', f1 mean 1.0, exit 0 under --min-agreement 0.99: an agreement over nothing."""
    from functools import partial

    from fake_backend import write_fake_model

    blind = partial(write_fake_model, scale=0.0)
    a, b = make_artifact("object-detection", write_model=blind), make_artifact("object-detection", write_model=blind)
    res = cli_shadow(a, b, images, "--json", "--min-agreement", "0.99")
    s = json.loads(res.stdout)
    assert (s["compared"], s["empty"]) == (6, 6), res.output
    assert "f1" not in s["figures"]
    assert res.exit_code == 7 and s["error"]["code"] == "shadow_agreement_below"
    assert "anything to compare" in s["error"]["message"]
    text = cli_shadow(a, b, images)
    assert text.exit_code == 0 and "6 of the 6 compared inputs: nothing found on either side" in text.output


def test_an_input_with_nothing_on_either_side_leaves_the_figures_to_the_others():
    box = {"label": "cat", "class_id": 0, "score": 0.9, "box": [0.0, 0.0, 10.0, 10.0]}
    from edge_runtime.shadow_summary import ShadowSummary

    s = ShadowSummary()
    for i, (da, db) in enumerate((([], []), ([box], [dict(box, class_id=1)]))):
        cmp = compare({"detections": da}, {"detections": db})
        s.add({"index": i, "id": str(i), "agree": cmp["agree"], "compare": cmp,
               "a": {"ok": True, "result": {"latency_ms": 1.0}}, "b": {"ok": True, "result": {"latency_ms": 1.0}}})
    d = s.to_dict()
    assert (d["empty"], d["agree"], d["compared"]) == (1, 1, 2)
    assert d["figures"]["f1"]["mean"] == 0.0            # the one input with boxes: they differ
    assert verdict(s, 0.5) is None                      # one judged input: the gate reads the rate
    kp = compare({"keypoints": []}, {"keypoints": []})
    assert kp["agree"] and kp["empty"]


# -- 6. a text cut on one side ----------------------------------------------------------------------------

def test_a_text_cut_on_one_side_only_is_reported(make_artifact, tmp_path):
    """B's largest bucket is 8 tokens, A's 16: a 12-word input is cut on B only, so the two answered
    different texts; the summary said nothing of it."""
    a = make_artifact("text-classification", buckets=(8, 16))
    b = make_artifact("text-classification", buckets=(8,))
    data = tmp_path / "in.txt"
    data.write_text("good movie\n" + " ".join(["good", "bad"] * 6) + "\n")
    res = cli_shadow(a, b, data, "--json", "--report", tmp_path / "r.html")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["truncated"] == {"a": 0, "b": 1, "one_side": 1}
    text = cli_shadow(a, b, data)
    assert "truncated (longer than the largest bucket): A 0, B 1 inputs; 1 cut on one side only" in text.output
    assert "truncated A / B" in (tmp_path / "r.html").read_text()


def test_the_fraction_check_is_strict():
    from edge_runtime.shadow_summary import check_fraction

    assert check_fraction("x", None) is None and check_fraction("x", 0) == 0.0 and check_fraction("x", 1) == 1.0
    for bad in (math.nan, math.inf, 2, "0.5", True):
        with pytest.raises(InputError):
            check_fraction("x", bad)
    assert ParityError.exit_code == 7


# -- 7. a long run: the summary's memory per input ---------------------------------------------------------

def test_the_summary_keeps_a_few_doubles_per_input_not_float_objects():
    """Each input's latencies and figures were Python floats in lists (32 bytes each with the pointer):
    about 130 bytes an input for a classifier, 1.3 GB over ten million inputs; now 8 bytes each."""
    import tracemalloc

    from edge_runtime.shadow_summary import ShadowSummary

    s = ShadowSummary()
    n = 5_000

    def line(i):
        cmp = compare({"class_id": 0, "top_k": [{"index": 0, "score": 0.9}, {"index": 1, "score": 0.1}]},
                      {"class_id": 0, "top_k": [{"index": 0, "score": 0.8 + i * 1e-9}, {"index": 1, "score": 0.2}]})
        res = {"latency_ms": 1.0 + i * 1e-6, "prediction": "x", "class_id": 0}
        return {"index": i, "id": str(i), "agree": True, "compare": cmp, "a": {"ok": True, "result": dict(res)},
                "b": {"ok": True, "result": dict(res)}}

    for i in range(100):        # the summary's fixed parts (the worst heap, the matrix) before measuring
        s.add(line(i))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(100, 100 + n):
        s.add(line(i))
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert s.to_dict()["latency_ms"]["a"]["n"] == n + 100
    assert grown / n < 64, f"{grown / n:.0f} bytes kept per input"


def test_a_p99_from_few_inputs_is_marked_as_the_slowest_call(make_artifact, tmp_path):
    """Three inputs gave 'p99 1.234' as if measured; with fewer than 100 it is the slowest call
    (bench's rule, ``few_calls_for``): starred, with the counts, in the text and the JSON."""
    a = make_artifact("text-classification")
    data = tmp_path / "in.txt"
    data.write_text("good movie\nbad movie\nthe market rises\n")
    res = cli_shadow(a, a, data, "--json")
    lat = json.loads(res.stdout)["latency_ms"]
    assert lat["a"]["n"] == 3 and lat["a"]["few_samples_for"] == ["p99"] and lat["b"]["few_samples_for"] == ["p99"]
    text = cli_shadow(a, a, data).output
    line = next(x for x in text.splitlines() if x.startswith("latency per input"))
    assert line.count("p99 ") == 2 and line.count("*") == 2 and "p50 " in line
    assert "* from A 3, B 3 answered inputs: a p50 needs 2, a p99 100" in text
    cli_shadow(a, a, data, "--report", tmp_path / "r.html")
    assert "from 3 / 3 inputs: under 100, a p99 is the slowest call" in (tmp_path / "r.html").read_text()


# -- 8. what the text says of inputs that were not compared ------------------------------------------------

class _Side:
    """A runtime of ``task`` whose answer to each input is ``answer(value)``: a result dict or an error."""

    def __init__(self, answer, task="text-embedding"):
        self.answer = answer
        self.artifact = SimpleNamespace(task=task)
        self.task = SimpleNamespace(labels=None, parity_metric="cosine", name=task)

    def infer(self, value):
        out = self.answer(value)
        if isinstance(out, Exception):
            raise out
        return SimpleNamespace(to_dict=lambda: dict(out, latency_ms=1.0))


def _text(summary) -> str:
    from edge_runtime.cli_shadow import summary_lines

    meta = {"model": "m", "version": "1", "target": "t", "device": "d", "manifest_sha256": "0" * 64}
    return "\n".join(summary_lines(dict(summary.to_dict(), a=meta, b=meta, cpu="cpu", output=None)))


def test_both_sides_failing_with_other_errors_is_said_and_a_mismatch_is_named():
    """Both failing is not compared (README); but A refusing an input while B times out on it is no
    likeness, and the text showed only 'on both 1'. A worst item that could not be compared showed
    no reason at all."""
    from edge_runtime.errors import InferenceTimeout

    recs = [Record(i, f"r{i}", f"t{i}", line=i + 1) for i in range(3)]
    a = _Side(lambda v: InputError("too long", code="input_invalid") if v == "t0" else {"embedding": [1.0, 0.0]})
    b = _Side(lambda v: InferenceTimeout("slow", code="inference_timeout") if v == "t0"
              else {"embedding": [1.0, 0.0, 0.0] if v == "t1" else [1.0, 0.0]})
    s = shadow(a, b, iter(recs))
    d = s.to_dict()
    assert (d["both_failed"], d["both_failed_differently"], d["compared"], d["agree"]) == (1, 1, 2, 1)
    text = _text(s)
    assert "on both 1 (1 with another error on each side, not compared)" in text
    assert "not comparable: embedding sizes differ: A 2, B 3" in text


# -- 9. diff --json: strict JSON ------------------------------------------------------------------------

def test_diff_json_is_strict_json_when_a_figure_is_nan(make_artifact):
    """A parity figure of NaN against one of infinity: ``diff --json`` printed bare ``NaN`` and
    ``Infinity`` (Python's extension), which ``jq`` and every strict parser refuse."""
    a, b = make_artifact("tensors"), make_artifact("tensors")
    rewrite_manifest(a, lambda m: m["variants"][0]["parity"].update(max_score_diff=float("nan")))
    rewrite_manifest(b, lambda m: m["variants"][0]["parity"].update(max_score_diff=float("inf")))
    res = run_cli("diff", a, b, "--json")

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    report = json.loads(res.stdout, parse_constant=refuse)
    assert res.exit_code == 1
    assert [(d["path"], d["a"], d["b"]) for d in report["differences"]] == [
        ("variants[fake].parity.max_score_diff", "NaN", "Infinity")]


# -- 10. rates are never rounded up to a perfect score ------------------------------------------------------

def test_one_disagreement_in_twenty_thousand_never_reads_1_0000(tmp_path):
    """19999 of 20000: the text said 'agreement 1.0000' (4 digits, rounded) while --min-agreement 1
    failed with 'agree on 19999 of 20000 inputs (1.0000)'; 1999999 of 2000000 was ``1.0`` in the
    JSON (6 digits). Rates are cut now, in integers."""
    from edge_runtime.shadow_report import render
    from edge_runtime.shadow_summary import ShadowSummary

    s = ShadowSummary()
    ok = {"latency_ms": 1.0, "prediction": "0", "class_id": 0}
    for i in range(20_000):
        cid = 1 if i == 0 else 0
        s.add({"index": i, "id": str(i), "agree": i != 0, "truth": "0", "truth_id": 0,
               "compare": {"kind": "classification", "agree": i != 0, "margin": 0.5, "badness": -0.5},
               "a": {"ok": True, "result": dict(ok, class_id=cid, prediction=str(cid))},
               "b": {"ok": True, "result": dict(ok, class_id=cid, prediction=str(cid))}})
    d = s.to_dict()
    assert d["agreement"] < 1.0 and d["accuracy"]["a"] < 1.0
    text = _text(s)
    assert "agreement 0.9999 (19999 of 20000 compared" in text and "1.0000" not in text
    assert "accuracy over 20000 labelled inputs (class ids): A 0.9999, B 0.9999" in text
    problem = verdict(s, 1.0)
    assert problem is not None and "(0.9999)" in problem.message and "1.0000" not in problem.message
    meta = {"model": "m", "version": "1", "target": "t", "device": "d", "manifest_sha256": "0" * 64, "path": "p"}
    page = render(d, ([], []), {}, {"a": meta, "b": meta, "input": "i", "cpu": "c"})
    assert "<b>0.9999</b>" in page and "1.0000" not in page
    from edge_runtime.shadow_summary import floor_rate

    assert floor_rate(1_999_999, 2_000_000) == 0.999999 and floor_rate(99, 100, 2) == 0.99
    assert floor_rate(9899, 10_000, 2) == 0.98          # 0.9899 is under 0.99, never shown as it


# -- 11. two label spaces with no text in common -----------------------------------------------------------

def test_labels_sharing_no_text_say_the_agreement_is_by_class_index(make_artifact, tmp_path):
    """A sentiment model against a toxicity one of the same weights and task: A's ``negative`` and B's
    ``toxic`` are both class 0, so every answer 'agreed' (1.0) while the flips listed every input as
    'negative -> toxic'; nothing said the two answer in other label spaces."""
    a = make_artifact("text-classification")
    b = make_artifact("text-classification", labels=("toxic", "clean"))
    data = tmp_path / "in.txt"
    data.write_text("good movie\nbad movie\nthe market rises\n")
    res = cli_shadow(a, b, data, "--json", "--report", tmp_path / "r.html")
    s = json.loads(res.stdout)
    assert s["agreement"] == 1.0 and s["labels_note"].startswith("A's and B's labels share no text")
    assert "'negative' = 'toxic', 'positive' = 'clean'" in s["labels_note"]
    assert "labels: A's and B's labels share no text" in cli_shadow(a, b, data).output
    assert "by class index" in (tmp_path / "r.html").read_text()
    assert json.loads(cli_shadow(a, a, data, "--json").stdout)["labels_note"] is None
    reordered = make_artifact("text-classification", labels=("positive", "negative"))
    assert json.loads(cli_shadow(a, reordered, data, "--json").stdout)["labels_note"] is None


# -- 12. a difference's worst tail is its top ----------------------------------------------------------------

def test_score_diff_shows_its_largest_drift_not_its_smallest():
    """``score_diff`` is |A's top-1 probability - B's| (lower is better), but it was summarised like
    the other figures by its low tail: 'score_diff: mean 0.0500, p5 0.0000, min 0.0000' over inputs
    one of which drifted by 0.9. Now its p95 and max."""
    from edge_runtime.shadow_summary import ShadowSummary

    s = ShadowSummary()
    ok = {"latency_ms": 1.0, "prediction": "0", "class_id": 0}
    for i in range(20):
        cmp = compare({"class_id": 0, "top_k": [{"index": 0, "score": 0.95}, {"index": 1, "score": 0.05}]},
                      {"class_id": 0, "top_k": [{"index": 0, "score": 0.05 if i == 7 else 0.95},
                                                {"index": 1, "score": 0.0}]})
        s.add({"index": i, "id": str(i), "agree": True, "compare": cmp, "a": {"ok": True, "result": ok},
               "b": {"ok": True, "result": ok}})
    fig = s.to_dict()["figures"]["score_diff"]
    assert fig["max"] == pytest.approx(0.9) and fig["worst"] == "max"
    assert "score_diff: mean 0.0450, p95 0.0450, max 0.9000" in _text(s)
    assert "margin: mean" in _text(s) and "p5" in _text(s)        # margin's worst is still its low tail


# -- 13. a margin from a top-k of one ----------------------------------------------------------------------

def test_a_margin_from_a_top_1_list_is_a_lower_bound_not_the_probability():
    """B's manifest keeps ``top_k`` 1: B lists A's class alone at 0.51, its runner-up (0.49) unlisted.
    The margin read 0.51 - 0 = 0.51 with ``margin_bound`` false, as if measured; B kept A's answer
    by 0.02 at most. Now the lower bound 2p - 1 (0.02), flagged."""
    a = {"class_id": 3, "top_k": [{"index": 3, "score": 0.6}, {"index": 8, "score": 0.4}]}
    c = compare(a, {"class_id": 3, "top_k": [{"index": 3, "score": 0.51}]})
    assert c["agree"] and c["margin_bound"] and c["margin"] == pytest.approx(0.02)
    low = compare(a, {"class_id": 3, "top_k": [{"index": 3, "score": 0.3}]})     # a runner-up may be 0.3 too
    assert low["margin_bound"] and low["margin"] == 0.0
    full = compare(a, {"class_id": 3, "top_k": [{"index": 3, "score": 0.51}, {"index": 8, "score": 0.49}]})
    assert not full["margin_bound"] and full["margin"] == pytest.approx(0.02)


def test_a_top_1_b_through_the_cli_gets_bounded_margins(make_artifact, tmp_path):
    from factories import probe_inputs

    a = make_artifact("image-classification")
    b = make_artifact("image-classification")
    rewrite_manifest(b, lambda m: m["postprocess"].update(top_k=1))
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i, raw in enumerate(probe_inputs("image-classification", 4)):
        (folder / f"{i}.png").write_bytes(raw)
    out = tmp_path / "o.jsonl"
    res = cli_shadow(a, b, folder, "--json", "-o", out)
    assert res.exit_code == 0, res.output
    for x in lines(out):
        p = x["b"]["result"]["top_k"][0]["score"]
        assert x["agree"] and x["compare"]["margin_bound"]
        assert x["compare"]["margin"] == pytest.approx(p - min(p, 1 - p), abs=1e-6) and x["compare"]["margin"] < p


# -- 14. labels that name no class ----------------------------------------------------------------------

def test_labels_that_name_no_class_are_said_not_silently_dropped(make_artifact, tmp_path):
    """A TSV labelled ``pos``/``neg`` for a model whose labels are ``positive``/``negative``: every
    input was silently unlabelled, so no accuracy and no word why (``eval`` counts them as
    ``unknown_label`` skips). One typo in many left that input out of the accuracy unsaid."""
    a = make_artifact("text-classification")
    data = tmp_path / "in.tsv"
    data.write_text("text\tlabel\ngood movie\tpos\nbad movie\tneg\nthe market rises\tpositive\n")
    res = cli_shadow(a, a, data, "--json", "--report", tmp_path / "r.html")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["accuracy"]["samples"] == 1
    assert s["unknown_labels"]["count"] == 2 and s["unknown_labels"]["first"].startswith("'pos' (")
    assert "accuracy: 2 labelled inputs name no class of A's labels (the first: 'pos'" in cli_shadow(a, a, data).output
    assert "unknown labels" in (tmp_path / "r.html").read_text()
    good = tmp_path / "good.tsv"
    good.write_text("text\tlabel\ngood movie\tpositive\n")
    assert json.loads(cli_shadow(a, a, good, "--json").stdout)["unknown_labels"] is None


# -- 15. --report never overwrites what the run reads or writes ----------------------------------------------

@pytest.mark.parametrize("which", ["input", "output", "job", "artifact"])
def test_a_report_onto_the_input_output_or_artifact_is_refused_before_anything_runs(make_artifact, tmp_path, which):
    """``--report in.txt`` replaced the user's input with the HTML page and exited 0; ``--report`` on
    the ``-o`` file replaced the lines (and the resume it promises) the same way; one into an artifact
    rewrote a sealed file. Now ``input_invalid``, exit 2, nothing written."""
    a = make_artifact("text-classification")
    data = tmp_path / "in.txt"
    data.write_text("good movie\nbad movie\n")
    out = tmp_path / "o.jsonl"
    target = {"input": data, "output": out, "job": tmp_path / "o.jsonl.job.json",
              "artifact": Path(a) / "labels.txt"}[which]
    before = target.read_bytes() if target.exists() else None
    res = cli_shadow(a, a, data, "-o", out, "--report", target)
    assert res.exit_code == 2 and "input_invalid" in res.output and "--report" in res.output, res.output
    assert (target.read_bytes() if target.exists() else None) == before
    assert not out.exists() and data.read_text() == "good movie\nbad movie\n"
    assert cli_shadow(a, a, data, "-o", out, "--report", tmp_path / "r.html").exit_code == 0
