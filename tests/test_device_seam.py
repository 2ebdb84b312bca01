"""The device seam (#16): one written protocol, one skeleton, one choice policy, declared options.

- a backend written as ONE file outside the package, registered through an entry point
  of a temporary distribution, passes the whole conformance suite;
- a clean install lists no fake backend (test code lives in tests/);
- options are declared, validated at load, and the CLI's help comes from the declarations;
- the policy table is the one in README; a measurement can override it;
- recorded provenance is kept apart from options; a worker crash is typed without a name match;
- the CLI modules import no cycle.
"""

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import ROOT, TESTS, add_distribution

import edge_runtime as er
from edge_runtime.devices import registry
from edge_runtime.devices.base import (Capabilities, DeviceBackend, DeviceSession, Option, SessionCrashed,
                                       resolve_options)

ONE_FILE_BACKEND = '''
"""A device backend in one file: numpy matmuls over its own model format (target "onefile-npz").

Everything a backend shares (target and package checks, the device string, options,
the closed guard and feed check) comes from edge_runtime.devices.base."""

import numpy as np

from edge_runtime.devices.base import Capabilities, DeviceBackend, DeviceSession, Option


class OneFileSession(DeviceSession):
    capabilities = Capabilities(inline=True, cancellable=True)    # checks the token between outputs

    def __init__(self, path, bucket, options):
        super().__init__(bucket, "onefile:cpu")
        with np.load(path, allow_pickle=False) as data:
            self._w = {k: data[k] for k in data.files}
        self._scale = options["scale"]

    def _run(self, feeds, cancel):
        x = np.concatenate([feeds[t["name"]].astype(np.float32).ravel() for t in self._bucket["inputs"]])
        out = {}
        for t in self._bucket["outputs"]:
            if cancel is not None and cancel.fired:
                raise RuntimeError("cancelled")
            y = (x @ self._w["w_" + t["name"]]) * self._scale
            out[t["name"]] = y.reshape(t["shape"]).astype(t["dtype"])
        return out

    def info(self):
        return {"scale": self._scale}


class OneFileBackend(DeviceBackend):
    name = "onefile"
    targets = ("onefile-npz",)
    options = (Option("scale", float, 1.0, "multiply every output by this", minimum=0),)

    def open(self, model_path, bucket, sub, options):
        return OneFileSession(model_path, bucket, options)


def write_model(path, bucket, seed=0):
    rng = np.random.default_rng(seed)
    n_in = sum(int(np.prod(t["shape"])) for t in bucket["inputs"])
    arrays = {"w_" + t["name"]: (rng.standard_normal((n_in, int(np.prod(t["shape"])))) * 0.05).astype(np.float32)
              for t in bucket["outputs"]}
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def conformance_cases():
    kw = {"target": "onefile-npz", "write_model": write_model}
    return [
        ("onefile-text", "onefile", ("factory", "text-classification", kw), ["good movie", "bad", "the market " * 9]),
        ("onefile-embed", "onefile", ("factory", "text-embedding", kw), ["stock market rises", "awful"]),
        ("onefile-image", "onefile", ("factory", "image-classification", kw),
         [np.eye(8, dtype=np.uint8) * 200, np.zeros((8, 8), np.uint8)]),
        ("onefile-tensors", "onefile", ("factory", "tensors", kw),
         [{"x": np.arange(4, dtype=np.float32)[None], "k": np.ones((1, 2), np.int32)}]),
    ]
'''


def test_a_one_file_backend_from_a_temporary_distribution_passes_the_whole_conformance_suite(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "onefile_backend.py").write_text(textwrap.dedent(ONE_FILE_BACKEND))
    add_distribution(site, "onefile-backend", {"edge_runtime.devices": {"onefile": "onefile_backend:OneFileBackend"},
                                               "edge_runtime.conformance": {
                                                   "onefile": "onefile_backend:conformance_cases"}})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", str(TESTS / "conformance"), "-q", "-p", "no:cacheprovider",
                           "-k", "onefile", "-W", "ignore"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    passed = int(next(line for line in out.splitlines() if " passed" in line).split(" passed")[0].split()[-1])
    n_checks = sum(1 for line in (TESTS / "conformance" / "test_conformance.py").read_text().splitlines()
                   if line.startswith("def test_"))
    assert passed == 4 * n_checks, out[-2000:]          # every check on every case of the new backend
    # and the backend is listed by the CLI like a built-in one, with its declared option
    d = json.loads(subprocess.run([sys.executable, "-m", "edge_runtime", "devices", "--json"], cwd=ROOT, env=env,
                                  capture_output=True, text=True, check=True).stdout)
    assert d["backends"]["onefile"]["options"][0]["name"] == "scale"
    assert d["backends"]["onefile"]["suitability"]["onefile-npz"]["score"] == 1   # the policy's catch-all row


def _without_test_backends() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def test_a_clean_install_lists_no_fake_backend(tmp_path):
    import tomllib

    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["edge_runtime.devices"]
    assert "fake" not in eps and "fake" not in registry._BUILTIN
    assert not (ROOT / "devices" / "fake.py").exists()
    proc = subprocess.run([sys.executable, "-m", "edge_runtime", "devices", "--json"], cwd=tmp_path,
                          env=_without_test_backends(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    backends = json.loads(proc.stdout)["backends"]
    assert "fake" not in backends and {"onnxruntime", "openvino", "tflite", "edgetpu", "coreml"} <= set(backends)
    assert all("error" not in b for b in backends.values())
    code = "import importlib.util as u; print(u.find_spec('edge_runtime.devices.fake'))"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_without_test_backends(),
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "None"


# -- declared, validated options -----------------------------------------------------------
def test_a_typo_in_a_device_option_exits_2_naming_the_valid_ones(make_artifact):
    from edge_runtime.cli import main

    art = make_artifact("image-classification")
    img = TESTS / "x.png"
    res = CliRunner().invoke(main, ["infer", str(art), "--image", str(img), "--device-option", "stal_ms=3"])
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error [device_option_unknown]: unknown device option 'stal_ms' for fake (valid: "
                                 "cancellable, fail_after, fail_load, nan_after, perturb, segfault_after, segfault_if_first, "
                                 "stall_ms); did you mean "
                                 "'stall_ms'?")
    assert "Traceback" not in res.stderr and len(res.stderr.splitlines()) == 1


def test_precison_typo_on_a_real_artifact_through_the_console_script(ov_digits_artifact):
    img = sorted((ROOT / "models" / "zoo" / "digits-cnn" / "held_out" / "3").iterdir())[0]
    proc = subprocess.run([sys.executable, "-m", "edge_runtime", "infer", str(ov_digits_artifact), "--image", str(img),
                           "--device-option", "precison=bf16"], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "unknown device option 'precison' for openvino (valid: cache, cache_dir, jobs, max_requests, precision, " \
           "threads); did you mean 'precision'?" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1
    proc = subprocess.run([sys.executable, "-m", "edge_runtime", "infer", str(ov_digits_artifact), "--image", str(img),
                           "--json", "--device-option", "precison=bf16"], capture_output=True, text=True)
    err = json.loads(proc.stdout)["error"]
    assert err["code"] == "device_option_unknown" and "precision" in err["details"]["valid"]


def test_option_parsing_and_errors():
    opts = (Option("n", int, 2, "n", minimum=1), Option("on", bool, True, "on"), Option("x", float, None, "x"),
            Option("mode", str, "a", "mode", choices=("a", "BB")), Option("t", int, None, "t", env="EDGE_TEST_T"))
    r = resolve_options(opts, {"n": "3", "on": "off", "x": 2, "mode": "bb", "why": "measured"}, "b")
    assert dict(r.values) == {"n": 3, "on": False, "x": 2.0, "mode": "BB", "t": None}
    assert dict(r.given) == {"n": 3, "on": False, "x": 2.0, "mode": "BB"} and dict(r.provenance) == {"why": "measured"}
    assert dict(resolve_options(opts, {}, "b").values) == {"n": 2, "on": True, "x": None, "mode": "a", "t": None}
    for bad, needle in [({"n": 0}, "device option n must be an integer >= 1, got 0"),
                        ({"on": "sometimes"}, "device option on must be a boolean (true or false), got 'sometimes'"),
                        ({"mode": "c"}, "device option mode must be one of a, BB, got 'c'"),
                        ({"x": "fast"}, "device option x must be a number, got 'fast'")]:
        with pytest.raises(er.InputError, match=re.escape(needle)) as ei:
            resolve_options(opts, bad, "b")
        assert ei.value.code == "device_option_invalid" and ei.value.exit_code == 2
    with pytest.raises(er.InputError) as ei:
        resolve_options(opts, {"m0de": 1, "zz": 2}, "b")
    assert ei.value.code == "device_option_unknown" and "'m0de', 'zz'" in ei.value.message
    assert "valid: mode, n, on, t, x" in ei.value.message and "did you mean 'mode'?" in ei.value.message


def test_bad_environment_value_is_the_operators_error(monkeypatch):
    monkeypatch.setenv("EDGE_TEST_T", "many")
    with pytest.raises(er.DeviceError, match="environment variable EDGE_TEST_T must be an integer, got 'many'"):
        resolve_options((Option("t", int, None, "t", env="EDGE_TEST_T"),), {}, "b")


def test_every_builtin_backend_declares_its_options_and_the_cli_help_is_generated():
    from edge_runtime.cli import main

    builtin = ("onnxruntime", "openvino", "tflite", "edgetpu", "coreml")
    for name in builtin:
        b = registry.get_backend(name)
        assert b.options and all(o.help for o in b.options), name
    res = CliRunner().invoke(main, ["infer", "--help"], terminal_width=400)
    text = " ".join(res.stdout.split())
    for name in builtin:
        opts = registry.get_backend(name).options
        assert f"{name}: " + ", ".join(f"{o.name}={o.metavar}" for o in opts) in text, name
    for cmd in ("score", "eval", "bench"):      # the same flags, the same help, in every command that loads
        other = " ".join(CliRunner().invoke(main, [cmd, "--help"], terminal_width=400).stdout.split())
        assert "precision=auto|f32|bf16|f16" in other and "--require-device" in other, cmd


def test_recorded_runtime_options_and_their_provenance(make_artifact):
    from factories import rewrite_manifest

    art = make_artifact("tensors")
    rewrite_manifest(art, lambda m: m["variants"][0].update(runtime={"stall_ms": 1, "why": "measured at convert",
                                                                     "precision": "bf16"}))
    with er.load(art, device="fake", warmup=False) as rt:
        info = rt.info()
        assert rt.device_options == {"stall_ms": 1.0} and rt.runtime_provenance == {"why": "measured at convert"}
        assert info["recorded_options_ignored"] == ["precision"]        # another backend's option: not this one's
    with er.load(art, device="fake", warmup=False, device_options={"stall_ms": 0}) as rt:
        assert rt.device_options == {"stall_ms": 0.0} and rt.runtime_provenance == {}   # overridden: no longer why
    rewrite_manifest(art, lambda m: m["variants"][0].update(runtime={"stall_ms": "slow"}))
    with pytest.raises(er.ArtifactError) as ei:
        er.load(art, device="fake", warmup=False)
    assert ei.value.code == "manifest_field_invalid" and "stall_ms" in ei.value.message


# -- the choice policy -------------------------------------------------------------------------
def test_readme_shows_the_policy_table():
    from edge_runtime.selection import policy_table

    readme = (ROOT / "README.md").read_text()
    for row in policy_table():
        line = f"| {row['score']} | {row['backend']} | {row['tier']} | {row['when'] or 'any'} | {row['why']} |"
        assert line in readme, line


def test_the_policy_places_facts_not_backends_numbers(tmp_path):
    from boards import detect_board

    from edge_runtime.selection import place
    from edge_runtime.devices.base import Suitability

    hw = detect_board(tmp_path, "x86")
    facts = Suitability("cpu", "openvino:cpu", "facts")
    assert place("openvino", facts, hw, "openvino").score > place("onnxruntime", facts, hw, "onnx-int8").score
    arm = detect_board(tmp_path, "jetson-orin-cpu-onnxruntime")
    assert place("tflite", facts, arm, "tflite-int8").score > place("onnxruntime", facts, arm, "onnx-int8").score
    assert place("anything-else", facts, hw, "x").score == 1
    assert place("openvino", Suitability(None, "openvino:cpu", "cannot"), hw, "openvino").score == 0


def test_a_measurement_may_override_the_static_order(tmp_path):
    from boards import detect_board

    from edge_runtime.selection import choose

    hw = detect_board(tmp_path, "x86")
    variants = [{"target": "openvino"}, {"target": "onnx-int8"}]
    assert choose(variants, hw).variant["target"] == "openvino"

    def measured(usable, hardware):
        assert [r["variant"]["target"] for r in usable][:2] == ["openvino", "onnx-int8"]   # policy order
        ort = next(r for r in usable if r["backend"] == "onnxruntime")
        return ort, "onnx-int8 measured 1.3x faster here"

    c = choose(variants, hw, measured=measured)
    assert (c.variant["target"], c.decided_by, c.measured) == ("onnx-int8", "measurement",
                                                               "onnx-int8 measured 1.3x faster here")
    assert [r for r in c.candidates if r["chosen"]][0]["backend"] == "onnxruntime"
    assert choose(variants, hw, measured=lambda usable, hw: None).decided_by == "policy"
    assert choose(variants, hw, device="openvino", measured=measured).decided_by == "forced"


# -- the protocol: crashes typed by class, capabilities read once -------------------------------
class _Crashing(DeviceSession):
    capabilities = Capabilities(inline=True)

    def _run(self, feeds, cancel):
        class NativeWorkerGone(SessionCrashed):    # any name: the class is what counts
            pass

        raise NativeWorkerGone("the backend's process died (signal SIGABRT)")


class _CrashingBackend(DeviceBackend):
    name = "crashing"
    targets = ("fake",)
    options = ()

    def open(self, model_path, bucket, sub, options):
        return _Crashing(bucket, "crashing:cpu")


def test_a_crashed_session_is_backend_crashed_whatever_its_name(make_artifact):
    registry.register("crashing", _CrashingBackend)
    try:
        with er.load(make_artifact("tensors"), device="crashing", strict=True, warmup=False) as rt:
            with pytest.raises(er.InferenceRuntimeError) as ei:
                rt.infer({"x": np.ones((1, 4), np.float32), "k": np.ones((1, 2), np.int32)})
            assert ei.value.code == "backend_crashed" and "SIGABRT" in ei.value.message
    finally:
        registry.unregister("crashing")


def test_capabilities_are_read_once_at_load(make_artifact):
    with er.load(make_artifact("tensors"), device="fake", warmup=False,
                 device_options={"cancellable": True}) as rt:
        assert rt._drive == [(True, True)] and rt.info()["capabilities"][0]["cancellable"] is True
        rt._sessions[0].capabilities = Capabilities()      # changing it afterwards changes nothing
        assert rt._drive == [(True, True)]
        assert rt.infer({"x": np.ones((1, 4), np.float32), "k": np.ones((1, 2), np.int32)}).outputs


# -- the CLI ------------------------------------------------------------------------------------
def _imports(path: Path) -> set[str]:
    """edge_runtime.cli* modules ``path`` imports, at module level or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module and node.module.startswith("cli"):
            out.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("edge_runtime.cli"):
            out.add(node.module.split(".")[1])
    return out


def test_no_import_cycle_among_the_cli_modules():
    mods = {p.stem: _imports(p) for p in (ROOT / "edge_runtime").glob("cli*.py")}
    assert not mods["cli_common"], mods["cli_common"]
    for name in mods:
        if name != "cli":
            assert "cli" not in mods[name], f"{name} imports the CLI root"
    seen, stack = set(), []

    def visit(m):
        assert m not in stack, f"import cycle: {' -> '.join(stack + [m])}"
        if m in seen:
            return
        stack.append(m)
        for dep in mods.get(m, ()):
            visit(dep)
        stack.pop()
        seen.add(m)

    for m in mods:
        visit(m)
