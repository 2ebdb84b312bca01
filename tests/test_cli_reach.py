"""The CLI's reach and its error output (#15, part D): text from files and stdin,
.npy/.npz tensors, --limit, tensors outputs in text mode, LiteRT's stderr line,
--debug anywhere, errors as JSON under --json, inspect's details, device option
values, the README's API example and each subcommand's --help example."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import ROOT, ZOO, need_litert, shared
from factories import _t, _variant, rewrite_manifest

from edge_runtime.cli import main
from edge_runtime.errors import DeviceError, EdgeRuntimeError, InputError


def run(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "edge_runtime", *map(str, args)], capture_output=True, text=True)


def one_error_line(stderr: str, code: str):
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error [{code}]"), stderr
    assert "Traceback" not in stderr


@pytest.fixture
def one_input_art(tmp_path):
    """A tensors artifact whose model has a single input (``x`` float32 [1, 4])."""
    from edge_runtime.artifact import ArtifactWriter
    from edge_runtime.manifest import FORMAT, FORMAT_VERSION

    root = tmp_path / "one-input"
    w = ArtifactWriter(root)
    spec = {"name": "static", "inputs": [_t("x", "float32", [1, 4])], "outputs": [_t("y", "float32", [1, 3])]}
    w.write_manifest({"format": FORMAT, "format_version": FORMAT_VERSION, "model": {"name": "one", "version": "1"},
                      "task": "tensors", "files": {}, "preprocess": {"kind": "tensors"}, "postprocess": {},
                      "limits": {}, "variants": [_variant(w, root, [spec])]})
    return root


# -- text from a file or stdin ------------------------------------------------------

def test_text_from_a_file_and_from_stdin(text_art, tmp_path):
    f = tmp_path / "review.txt"
    f.write_text("good movie\n", encoding="utf-8")
    by_file = run("infer", text_art, "--text-file", f, "--json")
    assert by_file.exit_code == 0, by_file.output
    direct = json.loads(run("infer", text_art, "--text", "good movie", "--json").stdout)
    assert json.loads(by_file.stdout)["scores"] == direct["scores"]          # the trailing newline dropped
    for args in (["--text", "-"], ["--text-file", "-"]):
        res = run("infer", text_art, *args, "--json", input="good movie\n")
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["scores"] == direct["scores"]


def test_long_text_files_are_typed_input_errors(text_art, tmp_path):
    over = tmp_path / "over.txt"
    over.write_text("good " * 2001)                         # 10,005 characters: over the 10,000 default
    res = run("infer", text_art, "--text-file", over)
    assert res.exit_code == 2 and "input_too_long" in res.stderr and "Traceback" not in res.output, res.output
    mega = tmp_path / "mega.txt"
    mega.write_text("a" * 1_000_000)                        # cannot be passed on a command line
    res = run("infer", text_art, "--text-file", mega)
    assert res.exit_code == 2 and "input_too" in res.stderr, res.output
    huge = tmp_path / "huge.txt"
    huge.write_bytes(b"a" * (3 << 20))                      # over the 2 MiB request limit: not even read whole
    res = run("infer", text_art, "--text-file", huge)
    assert res.exit_code == 2 and "input_too_large" in res.stderr, res.output
    res = run("infer", text_art, "--text", "-", input=b"\xff\xfe bad")
    assert res.exit_code == 2 and "input_bad_encoding" in res.stderr, res.output
    res = run("infer", text_art, "--text-file", tmp_path / "missing.txt")
    assert res.exit_code == 2 and "input_file_unreadable" in res.stderr, res.output


# -- .npy / .npz tensors ---------------------------------------------------------------

def test_npz_and_npy_inputs(make_artifact, one_input_art, tmp_path):
    art = make_artifact("tensors")
    npz = tmp_path / "feeds.npz"
    np.savez(npz, x=np.array([[1, 2, 3, 4]], np.float32), k=np.array([[1, 2]], np.int32))
    res = run("infer", art, "--input", npz, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["outputs"]["y"]["shape"] == [1, 3]
    npy = tmp_path / "x.npy"
    np.save(npy, np.array([1, 2, 3, 4], np.float32))
    res = run("infer", one_input_art, "--input", npy, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["outputs"]["y"]["shape"] == [1, 3]
    # one array for a model with two inputs: a typed error that says what to give instead
    res = run("infer", art, "--input", npy)
    assert res.exit_code == 2 and "input_wrong_names" in res.stderr and ".npz" in res.stderr, res.output


def test_npz_limits_and_pickles_are_checked_before_loading(make_artifact, one_input_art, tmp_path):
    art = make_artifact("tensors")
    bomb = tmp_path / "bomb.npz"                            # ~3 KiB on disk, 3.2 MB of float32 inside
    np.savez_compressed(bomb, x=np.zeros((800_000,), np.float32), k=np.zeros((1, 2), np.int32))
    assert bomb.stat().st_size < 100_000
    res = run("infer", art, "--input", bomb)
    assert res.exit_code == 2 and "input_too_large" in res.stderr, res.output
    liar = tmp_path / "liar.npy"                            # a header declaring 4 TB, no data
    from numpy.lib import format as npf

    with open(liar, "wb") as fh:
        npf.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False, "shape": (10 ** 12,)})
    res = run("infer", one_input_art, "--input", liar)
    assert res.exit_code == 2 and "input_too_large" in res.stderr, res.output
    pickled = tmp_path / "obj.npz"
    np.savez(pickled, x=np.array([{"a": 1}], dtype=object), k=np.zeros((1, 2), np.int32))
    res = run("infer", art, "--input", pickled)
    assert res.exit_code == 2 and "input_bad_file" in res.stderr and "pickle" in res.stderr, res.output
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"PK\x03\x04 not a zip")
    res = run("infer", art, "--input", junk)
    assert res.exit_code == 2 and "input_bad_file" in res.stderr, res.output
    res = run("infer", art, "--input", bomb, "--limit", "max_request_bytes=16")
    assert res.exit_code == 2 and "input_too_large" in res.stderr


# -- --limit --------------------------------------------------------------------------

def test_limit_lowers_and_never_raises(text_art):
    ok = run("infer", text_art, "--text", "good movie", "--limit", "max_text_chars=100", "--json")
    assert ok.exit_code == 0, ok.output
    res = run("infer", text_art, "--text", "good movie", "--limit", "max_text_chars=5")
    assert res.exit_code == 2 and "input_too_long" in res.stderr, res.output
    for pair, code in (("max_text_chars=20000", "limit_raise_refused"), ("nope=1", "limit_unknown"),
                       ("max_text_chars=abc", "limit_invalid"), ("max_text_chars=0", "limit_invalid"),
                       ("max_text_chars", "input_invalid")):
        res = run("infer", text_art, "--text", "good movie", "--limit", pair)
        assert res.exit_code == 2 and f"[{code}]" in res.stderr, (pair, res.output)
        if code in ("limit_raise_refused", "limit_unknown"):
            assert "valid keys: deadline_ms, max_batch_items" in res.stderr


# -- tensors outputs in text mode -----------------------------------------------------------

def test_tensors_outputs_are_shown_in_text_mode(make_artifact, tmp_path):
    art = make_artifact("tensors")
    f = tmp_path / "in.json"
    f.write_text(json.dumps({"inputs": {"x": [[1, 2, 3, 4]], "k": [[1, 2]]}}))
    res = run("infer", art, "--input", f)
    assert res.exit_code == 0, res.output
    line = next(x for x in res.stdout.splitlines() if x.startswith("output y:"))
    assert re.fullmatch(r"output y: float32 \[1, 3\] \[[-0-9.e]+, [-0-9.e]+, [-0-9.e]+\]", line), line
    assert "prediction: None" not in res.stdout


# -- LiteRT's INFO line -------------------------------------------------------------------

def test_litert_info_line_is_gone_and_real_errors_still_reach_stderr(coral_artifact, tmp_path):
    from edge_runtime.converters.tflite_import import import_tflite

    proc = cli("infer", coral_artifact, "--image", shared("coral", "cat.bmp"))
    assert proc.returncode == 0 and "cat" in proc.stdout, proc.stderr
    assert "INFO:" not in proc.stderr and "XNNPACK" not in proc.stderr
    sine = tmp_path / "sine"                       # a real LiteRT model on XNNPACK, no labels to warn about
    import_tflite(shared("tflm", "hello_world_int8.tflite"), sine, task="tensors")
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 1), np.int8))
    proc = cli("infer", sine, "--input", x)
    assert proc.returncode == 0 and "output " in proc.stdout, proc.stderr
    assert proc.stderr == ""
    bad = tmp_path / "bad"
    import_tflite(shared("coral", "invalid_models", "model_invoking_error.tflite"), bad, task="tensors")
    feeds = tmp_path / "x.npy"
    np.save(feeds, np.zeros((1, 3), np.uint8))
    proc = cli("infer", bad, "--input", feeds)
    assert proc.returncode == 4, proc.stderr
    one_error_line(proc.stderr, "device_load_failed")                 # LiteRT's two-line message joined
    assert "fake-op-double" in proc.stderr


def test_quiet_native_stderr_replays_everything_but_the_info_line(capfd):
    import os

    from edge_runtime.devices.native_stderr import quiet_native_stderr

    with quiet_native_stderr():
        os.write(2, b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.\nERROR: a real native error\n")
    with pytest.raises(RuntimeError):
        with quiet_native_stderr():
            raise RuntimeError("boom")
    os.write(2, b"after\n")                                          # fd 2 restored, even after an exception
    assert capfd.readouterr().err == "ERROR: a real native error\nafter\n"


# -- --debug anywhere, errors as JSON --------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["infer", "/nonexistent", "--image", "x.png"],
    ["inspect", "/nonexistent"],
    ["check", "/nonexistent.tflite"],
    ["devices", "--artifact", "/nonexistent"],
    ["bench", "/nonexistent", "--no-cold"],
    ["eval", "/nonexistent", "/nonexistent"],
])
def test_debug_after_the_subcommand_shows_the_error(args):
    res = run(*args, "--debug")
    assert isinstance(res.exception, EdgeRuntimeError), res.output      # re-raised: the traceback path
    plain = run(*args)
    assert plain.exit_code in (2, 3) and "Traceback" not in plain.output and plain.stderr.count("\n") == 1


def test_debug_after_the_subcommand_in_a_process():
    proc = cli("infer", "/nonexistent", "--image", "x.png", "--debug")
    assert "Traceback" in proc.stderr and "ArtifactError" in proc.stderr


def test_errors_under_json_are_json(text_art, tmp_path):
    res = run("inspect", tmp_path / "nope", "--json")
    assert res.exit_code == 3 and res.stdout.count("\n") == 1           # one line: JSONL-safe
    err = json.loads(res.stdout)["error"]
    assert set(err) == {"type", "code", "message", "details"}
    assert (err["type"], err["code"], err["details"]["file"]) == ("ArtifactError", "artifact_missing",
                                                                 str(tmp_path / "nope"))
    one_error_line(res.stderr, "artifact_missing")                   # stderr keeps its one line
    res = run("infer", text_art, "--text", "x" * 10_001, "--json")
    assert res.exit_code == 2
    err = json.loads(res.stdout)["error"]
    assert (err["type"], err["code"], err["details"]) == ("InputError", "input_too_long", {"limit": 10_000})
    res = run("infer", text_art, "--text-file", tmp_path / "missing.txt", "--json")
    assert res.exit_code == 2 and json.loads(res.stdout)["error"]["code"] == "input_file_unreadable"
    # without --json stdout stays empty
    res = run("infer", text_art, "--text", "x" * 10_001)
    assert res.exit_code == 2 and res.stdout == ""


# -- inspect --------------------------------------------------------------------------------

def test_inspect_rounds_parity_and_says_why_it_is_missing(make_artifact):
    art = make_artifact("image-classification")
    res = run("inspect", art)
    assert res.exit_code == 0, res.output
    assert "None" not in res.stdout and "parity not measured" in res.stdout
    assert "static inputs: image float32[1, 1, 8, 8]" in res.stdout
    assert "labels: 10 ('0', '1', '2', '3', '4', ...)" in res.stdout
    assert "preprocess: kind=image, size=[8, 8], channels=1, scale=0.00392157" in res.stdout

    def measured(m):
        m["variants"][0]["parity"] = {"metric": "top1_agreement", "value": 0.9972222222222222, "min": 0.9123456789,
                                      "samples": 360, "budget": 0.99}

    rewrite_manifest(art, measured)
    res = run("inspect", art)
    assert "parity top1_agreement 0.9972 (min 0.9123, 360 samples, budget 0.99)" in res.stdout, res.output
    d = json.loads(run("inspect", art, "--json").stdout)
    assert d["labels"]["count"] == 10 and d["variants"][0]["inputs"]["static"][0]["shape"] == [1, 1, 8, 8]


def test_inspect_shows_the_edgetpu_split_of_a_coral_model(coral_artifact):
    res = run("inspect", coral_artifact)
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "static inputs: input uint8[1, 128, 128, 3]" in out
    assert "labels: 1001 ('background', 'tench, Tinca tinca'" in out
    assert "parity not measured (imported model" in out and "None" not in out
    assert "edge tpu: 31 op(s) on the Edge TPU, 0 on the CPU" in out and "CONV_2D 15/0" in out
    d = json.loads(run("inspect", coral_artifact, "--json").stdout)
    assert d["variants"][0]["edgetpu_report"]["tpu_ops"] == 31


# -- device option values ------------------------------------------------------------------------

BUCKET = {"name": "static", "inputs": [_t("x", "float32", [1, 4])], "outputs": [_t("y", "float32", [1, 3])]}


@pytest.mark.parametrize("backend,options,needle", [
    ("onnxruntime", {"threads": "abc"}, "device option threads must be an integer, got 'abc'"),
    ("openvino", {"threads": "abc"}, "device option threads must be an integer, got 'abc'"),
    ("openvino", {"max_requests": "many"}, "device option max_requests must be an integer, got 'many'"),
    ("tflite", {"threads": "abc"}, "device option threads must be an integer, got 'abc'"),
    ("tflite", {"max_interpreters": 0}, "device option max_interpreters must be an integer >= 1, got 0"),
])
def test_bad_device_option_values_are_input_errors_naming_the_option(backend, options, needle, tmp_path):
    from edge_runtime.devices import registry

    if backend == "openvino":
        pytest.importorskip("openvino")
    if backend == "tflite":
        need_litert()
    model = tmp_path / "empty.model"          # checked before any model is parsed: an empty file will do
    model.write_bytes(b"")
    with pytest.raises(InputError, match=re.escape(needle)) as info:
        registry.get_backend(backend).load(model, BUCKET, None, options)
    assert info.value.code == "device_option_invalid" and info.value.exit_code == 2


def test_bad_threads_environment_is_a_device_error(monkeypatch, tmp_path):
    from edge_runtime.devices import registry

    monkeypatch.setenv("EDGE_RUNTIME_THREADS", "lots")
    with pytest.raises(DeviceError, match="environment variable EDGE_RUNTIME_THREADS must be an integer, got 'lots'"):
        registry.get_backend("onnxruntime").load(tmp_path / "absent.onnx", BUCKET, None, {})


def test_cli_device_option_threads_abc_exits_2(coral_artifact):
    res = run("infer", coral_artifact, "--image", shared("coral", "cat.bmp"), "--device-option", "threads=abc")
    assert res.exit_code == 2, res.output
    one_error_line(res.stderr, "device_option_invalid")
    assert "device option threads must be an integer, got 'abc'" in res.stderr


# -- README and --help ------------------------------------------------------------------------------

def test_readme_api_example_names_a_file_that_exists():
    text = (ROOT / "README.md").read_text()
    paths = re.findall(r'rt\.infer\("([^"]+)"\)', text)
    assert paths, "the README's API example calls rt.infer on a file"
    for p in paths:
        assert (ROOT / p).is_file(), p
        assert p.startswith("models/zoo/") and (ROOT / p).resolve().is_relative_to(ZOO)


@pytest.mark.parametrize("cmd", ["infer", "inspect", "check", "devices", "doctor", "bench"])
def test_help_has_an_example_with_its_line_breaks(cmd):
    res = run(cmd, "--help")
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    i = next(n for n, x in enumerate(lines) if x.strip() == "Examples:")
    examples = [x.strip() for x in lines[i + 1:] if x.startswith("    edge-infer ")]
    assert examples and all(x.startswith(f"edge-infer {cmd}") for x in examples), res.stdout
    if cmd != "doctor":
        assert len(examples) >= 2          # kept on their own lines, not re-wrapped into one paragraph


def test_an_embedding_prints_no_empty_prediction(make_artifact):
    res = run("infer", make_artifact("text-embedding"), "--text", "good movie")
    assert res.exit_code == 0, res.output
    assert "embedding: dim" in res.stdout and "prediction" not in res.stdout, res.stdout
