"""Wrong answers found in `edge-infer diff`, `inspect` and `doctor` (each test failed before its fix)."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from edge_runtime import hardware
from edge_runtime.cli import main
from edge_runtime.errors import ArtifactError
from edge_runtime.limits import DEFAULT_LIMITS
from factories import rewrite_manifest


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def diff_json(a, b) -> tuple[int, dict]:
    res = run("diff", a, b, "--json")
    return res.exit_code, json.loads(res.stdout)


# -- diff ------------------------------------------------------------------------------------------

def test_a_field_named_like_a_timing_outside_the_build_records_is_counted(make_artifact):
    """``seconds`` of audio in a plug-in task's preprocess (or a runtime option of that name) is
    what runs, not a build timing: it was listed as timing and the diff said same, exit 0."""
    a = make_artifact("tensors")
    b = make_artifact("tensors")
    rewrite_manifest(a, lambda m: m["preprocess"].update(seconds=1.0))
    rewrite_manifest(b, lambda m: m["preprocess"].update(seconds=2.0))
    code, r = diff_json(a, b)
    assert code == 1 and r["same"] is False
    d = {x["path"]: x for x in r["differences"]}
    assert d["preprocess.seconds"]["side"] == "prediction"
    assert "prediction side" in run("diff", a, b).output

    c = make_artifact("tensors")
    rewrite_manifest(c, lambda m: m["variants"][0].update(runtime={"seconds": 5}))
    code, r = diff_json(make_artifact("tensors"), c)
    assert code == 1 and {x["path"]: x["side"] for x in r["differences"]}["variants[fake].runtime.seconds"] \
        == "inference"


def test_build_timings_are_still_timings(make_artifact):
    a = make_artifact("tensors")
    b = make_artifact("tensors")

    def timed(s):
        def edit(m):
            m["created"] = f"2026-01-0{s}T00:00:00Z"
            m["build"] = {"seconds": s}
            m["variants"][0]["quantization"]["seconds"] = s
            m["variants"][0]["parity"]["device_ms_median"] = s / 10
            m["variants"][0]["runtime"] = {"why": f"fastest {s} ms"}
        return edit

    rewrite_manifest(a, timed(1))
    rewrite_manifest(b, timed(2))
    code, r = diff_json(a, b)
    assert code == 0 and r["same"] and r["counts"]["timing"] == 5, r


def test_a_bool_is_not_the_number_one(make_artifact):
    """``True == 1`` in Python: a limit of ``true`` (refused at load) against ``1`` was 'same', exit 0."""
    a = make_artifact("tensors", limits={"max_batch": 1})
    b = make_artifact("tensors")
    rewrite_manifest(b, lambda m: m["limits"].update(max_batch=True))
    with pytest.raises(ArtifactError):
        DEFAULT_LIMITS.merged({"max_batch": True}, source="manifest")     # B cannot load, A can
    code, r = diff_json(a, b)
    assert code == 1 and [(x["path"], x["a"], x["b"]) for x in r["differences"]] == [("limits.max_batch", 1, True)]
    assert "~ limits.max_batch: 1 -> true" in run("diff", a, b).output


def test_an_artifact_with_a_nan_figure_and_its_copy_are_the_same(make_artifact, tmp_path):
    """NaN != NaN: an artifact and its byte-identical copy were 'different', exit 1."""
    a = make_artifact("tensors")
    rewrite_manifest(a, lambda m: m["variants"][0]["parity"].update(max_score_diff=float("nan")))
    shutil.copytree(a, tmp_path / "copy")
    res = run("diff", a, tmp_path / "copy")
    assert res.exit_code == 0 and "same: no difference" in res.output, res.output


def test_tensors_sharing_a_name_are_compared_by_position(make_artifact):
    """Two outputs with one name: matching by name kept only the last, so a change in the first
    (its quantization here) was invisible and the diff said same, exit 0."""
    def outputs(scale):
        def edit(m):
            b = m["variants"][0]["buckets"][0]
            y = b["outputs"][0]
            b["outputs"] = [dict(y, quantization={"scale": scale, "zero_point": 0}),
                            dict(y, quantization={"scale": 0.5, "zero_point": 0})]
        return edit

    a = make_artifact("tensors")
    b = make_artifact("tensors")
    rewrite_manifest(a, outputs(0.1))
    rewrite_manifest(b, outputs(0.2))
    code, r = diff_json(a, b)
    assert code == 1 and r["counts"]["prediction"] == 1
    assert r["differences"][0]["path"] == "variants[fake].buckets[static].outputs[0].quantization.scale"


# -- inspect ---------------------------------------------------------------------------------------

def test_inspect_says_where_a_stand_in_parity_was_measured(make_artifact):
    """A Core ML (w8a8, built off macOS) or Edge TPU parity is measured on a stand-in; inspect
    showed the figure as the target's own."""
    art = make_artifact("image-classification")
    on = "fake-quantized torch model (w8a8 simulated on the CPU)"
    rewrite_manifest(art, lambda m: m["variants"][0].update(parity={
        "metric": "top1_agreement", "value": 0.995, "samples": 200, "budget": 0.99, "passed": True,
        "measured": "stand-in", "measured_on": on, "not_measured_on_target": "Core ML predicts only on macOS"}))
    res = run("inspect", art)
    assert res.exit_code == 0, res.output
    assert f"parity top1_agreement 0.995 (200 samples, budget 0.99), measured on the {on}; not on the target" \
        in res.output
    edgetpu = ("the tflite-int8 model given to the compiler: the compiled model runs only on an Edge TPU, "
               "absent at build time")
    rewrite_manifest(art, lambda m: m["variants"][0]["parity"].update(measured_on=edgetpu))
    assert f"measured on {edgetpu}; not on the target" in run("inspect", art).output


def test_inspect_does_not_put_an_uncompiled_model_on_the_edge_tpu(make_artifact):
    """The static mappability report of a tflite-int8 variant read '31 op(s) on the Edge TPU' as
    if they ran there; as it is, the model runs on the CPU."""
    art = make_artifact("image-classification")
    rewrite_manifest(art, lambda m: m["variants"][0].update(edgetpu_report={
        "edgetpu_compiled": False, "tpu_ops": 31, "cpu_ops": 0, "first_unsupported": None,
        "verdict": "fully mappable: all 31 compute ops can run on the Edge TPU"}))
    out = run("inspect", art).output
    assert "edge tpu: 31 op(s) on the Edge TPU, 0 on the CPU once compiled (static check: this fake model is " \
           "not compiled for the Edge TPU" in out, out
    rewrite_manifest(art, lambda m: m["variants"][0]["edgetpu_report"].update(edgetpu_compiled=True))
    out = run("inspect", art).output
    assert "edge tpu: 31 op(s) on the Edge TPU, 0 on the CPU (compiled)" in out and "static check" not in out


def test_inspect_tells_an_imported_model_why_it_has_no_probe_set(make_artifact):
    """'verify cannot check this artifact here; re-convert it' is wrong for an imported model:
    no machine can verify it and it cannot be re-converted (its fp32 source is what converts)."""
    art = make_artifact("image-classification")
    rewrite_manifest(art, lambda m: m["model"].update(source={"file": "m.tflite", "imported": True}))
    out = run("inspect", art).output
    assert "an imported model has no fp32 source" in out and "re-convert it" not in out, out
    plain = make_artifact("image-classification")
    assert "re-convert it" in run("inspect", plain).output


# -- doctor ----------------------------------------------------------------------------------------

def test_doctor_does_not_promise_cuda_without_its_runtime(monkeypatch, tmp_path):
    """A GPU box with onnxruntime-gpu but neither TensorRT's libnvinfer nor CUDA's libcudart:
    doctor said onnxruntime 'will run on CUDA'."""
    from boards import detect_board

    hw = detect_board(tmp_path, "nvidia-x86")
    assert not hw["libraries"]["libcudart"] and "cuda" in hw["onnxruntime"]["providers"]
    monkeypatch.setattr(hardware, "detect", lambda *a, **k: hw)
    res = CliRunner().invoke(main, ["doctor", "--json"])
    problem = next(f["problem"] for f in json.loads(res.stdout)["findings"] if "TensorRT" in f["found"])
    assert "run on CUDA" not in problem and "libcudart was not found" in problem, problem

    hw = dict(hw, libraries={**hw["libraries"], "libcudart": "/usr/local/cuda/lib64/libcudart.so.12"})
    monkeypatch.setattr(hardware, "detect", lambda *a, **k: hw)
    res = CliRunner().invoke(main, ["doctor"])
    assert "drop the TensorRT provider and run on CUDA" in res.output, res.output


def test_a_long_value_that_differs_past_the_cut_does_not_read_the_same(make_artifact):
    """Both sides were cut at 70 characters: '~ postprocess.output: "…" -> "…"' showed two equal texts
    for a difference that --json has in full."""
    head = "StatefulPartitionedCall/model/detection_head/" + "x" * 40
    a = make_artifact("tensors")
    b = make_artifact("tensors")
    rewrite_manifest(a, lambda m: m["postprocess"].update(output=head + "/boxes"))
    rewrite_manifest(b, lambda m: m["postprocess"].update(output=head + "/scores"))
    line = next(x for x in run("diff", a, b).output.splitlines() if "postprocess.output" in x)
    shown_a, shown_b = line.split(": ", 1)[1].split(" -> ")
    assert shown_a != shown_b.split(" (first difference")[0], line
    assert "boxes" in shown_a and "scores" in shown_b, line


def test_a_tensor_name_is_a_name_not_a_manifest_key(make_artifact):
    """A tensor named ``head.seconds`` (PyTorch exports dotted names) removed from a bucket was
    counted as a build timing; one named ``backbone.quantization.out`` whose shape changed was
    put on the prediction side."""
    def outputs(name, shape):
        def edit(m):
            m["variants"][0]["buckets"][0]["outputs"] = [{"name": name, "dtype": "float32", "shape": shape}]
        return edit

    a = make_artifact("tensors")
    b = make_artifact("tensors")
    rewrite_manifest(a, outputs("head.seconds", [1, 3]))
    rewrite_manifest(b, outputs("head.minutes", [1, 3]))
    code, r = diff_json(a, b)
    assert code == 1 and r["counts"]["timing"] == 0 and r["counts"]["inference"] == 2, r
    c = make_artifact("tensors")
    d = make_artifact("tensors")
    rewrite_manifest(c, outputs("backbone.quantization.out", [1, 3]))
    rewrite_manifest(d, outputs("backbone.quantization.out", [1, 5]))
    code, r = diff_json(c, d)
    assert code == 1 and [(x["path"], x["side"]) for x in r["differences"]] == [
        ("variants[fake].buckets[static].outputs[backbone.quantization.out].shape", "inference")]


def test_doctor_does_not_say_nothing_is_missing_when_cuda_has_no_runtime(monkeypatch, tmp_path):
    """A GPU box whose onnxruntime-gpu has only the CUDA provider and no libcudart found: doctor said
    'nothing missing for the hardware found' while the CUDA provider cannot load."""
    from boards import detect_board

    hw = detect_board(tmp_path, "nvidia-x86")
    hw = dict(hw, onnxruntime={**hw["onnxruntime"], "providers": ["cpu", "cuda"]})
    monkeypatch.setattr(hardware, "detect", lambda *a, **k: hw)
    res = CliRunner().invoke(main, ["doctor"])
    assert res.exit_code == 0 and "nothing missing" not in res.output, res.output
    assert "WARNING: onnxruntime-gpu 1.19.0 (CUDA provider): CUDA's runtime libcudart was not found" in res.output
    hw = dict(hw, libraries={**hw["libraries"], "libcudart": "/usr/local/cuda/lib64/libcudart.so.12"})
    monkeypatch.setattr(hardware, "detect", lambda *a, **k: hw)
    assert "doctor: nothing missing for the hardware found" in CliRunner().invoke(main, ["doctor"]).output
