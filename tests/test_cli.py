"""End-to-end through the `edge-infer` CLI on the converted digits artifact."""

import json
import subprocess
import sys

import pytest

from conftest import ZOO


def cli(*args, check=None):
    proc = subprocess.run([sys.executable, "-m", "edge_runtime", *map(str, args)], capture_output=True, text=True)
    if check is not None:
        assert proc.returncode == check, proc.stderr + proc.stdout
    return proc


def test_infer_image_json(digits_artifact):
    img = ZOO / "digits-cnn" / "held_out" / "3"
    first = sorted(img.iterdir())[0]
    out = json.loads(cli("infer", digits_artifact, "--image", first, "--json", check=0).stdout)
    assert out["prediction"] == "3"
    assert out["device"] == "onnxruntime:cpu" and out["target"] == "onnx-int8"
    assert out["model"] == "digits-cnn" and len(out["trace_id"]) == 32


def test_eval_reports_accuracy_parity_latency(digits_artifact):
    rep = json.loads(cli("eval", digits_artifact, ZOO / "digits-cnn" / "held_out", "--json", check=0).stdout)
    assert rep["samples"] == 360 and rep["accuracy"] >= 0.97
    assert rep["parity"]["metric"] == "top1_agreement" and rep["parity"]["value"] >= 0.99
    assert rep["latency_ms"]["p50"] > 0


def test_inspect(digits_artifact):
    d = json.loads(cli("inspect", digits_artifact, "--json", check=0).stdout)
    assert d["verified"] and d["variants"][0]["target"] == "onnx-int8"
    assert d["variants"][0]["quantization"]["weights"] == "int8"
    assert d["probe"]["samples"] == 32 and d["probe"]["buckets"] == {d["variants"][0]["buckets"][0]: 32}
    human = cli("inspect", digits_artifact, check=0).stdout
    assert "all sha256 verified" in human
    assert f"probe set: 32 samples, {d['probe']['bytes']} bytes; per bucket {d['variants'][0]['buckets'][0]} 32" in human


@pytest.mark.parametrize("args,code,needle", [
    (["--text", ""], 2, "input_wrong_type"),            # text into an image model: the caller's error
    (["--image", "/nonexistent.png"], 2, "input_file_unreadable"),
    ([], 2, "exactly one"),
])
def test_exit_codes_input(digits_artifact, args, code, needle):
    proc = cli("infer", digits_artifact, *args)
    assert proc.returncode == code, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr


def test_exit_codes_artifact_and_device(digits_artifact, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(digits_artifact, bad)
    onnx_file = next((bad / "onnx-int8").iterdir())
    onnx_file.write_bytes(onnx_file.read_bytes()[:-1] + b"\x00")
    proc = cli("infer", bad, "--image", "x.png")
    assert proc.returncode == 3 and "sha256 mismatch" in proc.stderr and onnx_file.name in proc.stderr
    proc = cli("infer", digits_artifact, "--image", "x.png", "--device", "fake", "--require-device")
    assert proc.returncode == 4, proc.stderr
    proc = cli("--debug", "infer", bad, "--image", "x.png")
    assert "Traceback" in proc.stderr


def test_devices_lists_backends():
    d = json.loads(cli("devices", "--json", check=0).stdout)
    assert "onnxruntime" in d["backends"] and d["hardware"]["cpu"]["cores"] >= 1
    assert d["backends"]["onnxruntime"]["suitability"]["onnx-int8"]["score"] > 0


def test_convert_fails_under_budget_and_leaves_nothing(tmp_path):
    z = ZOO / "digits-cnn"
    out = tmp_path / "never"
    proc = cli("convert", z / "model.onnx", "-o", out, "--task", "image-classification", "--calibration",
               z / "calibration", "--parity-data", z / "held_out", "--labels", z / "labels.txt",
               "--preprocess", z / "preprocess.json", "--min-parity", "0.999")
    assert proc.returncode == 7, proc.stderr
    assert "top1_agreement = 0.99" in proc.stderr and "budget 0.999" in proc.stderr
    assert not out.exists() and not list(tmp_path.iterdir())


def test_convert_input_errors(tmp_path):
    proc = cli("convert", tmp_path / "missing.onnx", "-o", tmp_path / "o", "--task", "image-classification",
               "--calibration", tmp_path)
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_infer_tensors_from_json_file(make_artifact, tmp_path):
    art = make_artifact("tensors")
    f = tmp_path / "in.json"
    f.write_text(json.dumps({"inputs": {"x": [[1, 2, 3, 4]], "k": [[1, 2]]}}))
    out = json.loads(cli("infer", art, "--input", f, "--json", check=0).stdout)
    assert out["outputs"]["y"]["shape"] == [1, 3] and out["device"] == "fake:cpu"
    f.write_text(json.dumps({"inputs": {"x": [[1, 2, 3]], "k": [[1, 2]]}}))
    proc = cli("infer", art, "--input", f)
    assert proc.returncode == 2 and "input_wrong_shape" in proc.stderr


def test_a_reader_that_leaves_the_pipe_ends_the_command_quietly():
    """``edge-infer infer ... | head -3``: the reader closes the pipe; the command ends with the
    status a shell gives SIGPIPE (141), no ``error: BrokenPipeError`` line, no traceback."""
    code = ("import click\nfrom edge_runtime.cli_common import _guard\n@click.command()\n@_guard\n"
            "def c():\n    for _ in range(100000):\n        click.echo('x' * 100)\nc()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.read(300)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141
    assert "Error" not in err and "Traceback" not in err and "Exception ignored" not in err, err
