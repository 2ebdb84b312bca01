"""``convert --with-fp32``: an onnx-fp32 variant beside the int8 ones, never chosen by the static
policy, measured by tune like every other path, loadable when asked for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import edge_runtime as er
from edge_runtime.frozen import thaw

ROOT = Path(__file__).resolve().parents[1]
Z = ROOT / "models" / "zoo" / "digits-cnn"


@pytest.fixture(scope="module")
def fp32_artifact(tmp_path_factory):
    """digits-cnn through the CLI with the float variant listed FIRST, so that the policy, not
    the manifest order, must be what ranks it below int8."""
    out = tmp_path_factory.mktemp("with-fp32") / "digits"
    cmd = [sys.executable, "-m", "edge_runtime", "convert", str(Z / "model.onnx"), "-o", str(out),
           "--task", "image-classification", "--target", "onnx-fp32", "--target", "onnx-int8", "--with-fp32",
           "--calibration", str(Z / "calibration"), "--parity-data", str(Z / "held_out"),
           "--labels", str(Z / "labels.txt"), "--preprocess", str(Z / "preprocess.json"), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def test_the_float_variant_is_built_and_measured(fp32_artifact):
    man = json.loads((fp32_artifact / "manifest.json").read_text())
    targets = [v["target"] for v in man["variants"]]
    assert targets == ["onnx-fp32", "onnx-int8"]                # --with-fp32 did not add a second one
    fp32 = man["variants"][0]
    assert fp32["quantization"]["scheme"] == "float (not quantized)"
    assert fp32["parity"]["passed"] and fp32["parity"]["value"] >= 0.999, fp32["parity"]


@pytest.mark.parametrize("int8_dot", [True, False])
def test_the_policy_never_prefers_float(fp32_artifact, int8_dot):
    """With or without int8 dot products (VNNI box / AVX2 laptop), the static choice is the int8
    variant; the float one runs when asked for and gives the reference answers."""
    from edge_runtime.hardware import detect_cached

    hw = thaw(detect_cached())
    hw["cpu"]["int8_dot"] = int8_dot
    with er.load(fp32_artifact, device="onnxruntime", hardware=hw) as rt:
        assert rt.variant.target == "onnx-int8", rt.info()["candidates"]
        fp32_row = next(c for c in rt.info()["candidates"] if c["target"] == "onnx-fp32")
        assert fp32_row["score"] < next(c for c in rt.info()["candidates"] if c["chosen"])["score"]
        assert "below every int8 path" in fp32_row["policy"]
    files = sorted((Z / "held_out").rglob("*.png"))[::40]
    with er.load(fp32_artifact, device="onnxruntime", target="onnx-fp32") as rt:
        assert rt.variant.target == "onnx-fp32"
        got = [rt.infer(str(f)).prediction for f in files]
        assert sum(g == f.parent.name for g, f in zip(got, files)) >= len(files) - 1


def test_tune_measures_the_float_variant_and_keeps_the_fastest(fp32_artifact, tmp_path, monkeypatch):
    from edge_runtime import tune

    monkeypatch.setenv("EDGE_RUNTIME_CACHE_DIR", str(tmp_path))
    entry = tune.tune(fp32_artifact, rounds=2, batch=False)
    rows = {r["target"]: r for r in entry["rows"] if r["backend"] == "onnxruntime"}
    assert rows["onnx-fp32"]["passed"] and rows["onnx-int8"]["passed"]
    fastest = min((r for r in entry["rows"] if r.get("passed")), key=lambda r: r["latency_ms_median"])
    assert (entry["decision"]["latency"]["target"], entry["decision"]["latency"]["backend"]) == \
        (fastest["target"], fastest["backend"])
    with er.load(fp32_artifact) as rt:                             # the cached decision, whichever it is
        assert rt.choice.decided_by == "measurement"
        assert rt.variant.target == fastest["target"]
