"""Third-party plug-in seams that made a plug-in second-class or blamed the wrong party (hunt h34,
2026-12-07; README: "How to add a backend", "How to add a task"):

- a backend that fails to load was left out of ``known_targets`` silently: an artifact of a target
  only it declares was refused as ``artifact_target_unknown`` (exit 3, the artifact blamed, the
  plug-in's error never said), and ``--device boom`` warned "boom runs none of the artifact's targets";
- an entry point whose factory gives no backend (a dict, ``targets`` a string) was used as it was:
  ``edge-infer devices`` crashed with an untyped ``AttributeError`` (exit 1);
- a ``Task`` subclass without ``prepare``/``finish``/``compare`` passed the registry and failed at
  its first input with an empty message (``input_invalid``: the caller blamed);
- an exception with no text made messages that end in ": ", and the skeleton's ``open``/``_run``
  raised ``NotImplementedError`` with no text;
- a broken ``edge_runtime.conformance`` entry point broke the suite's collection for every backend.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner
from conftest import ROOT, TESTS, add_distribution

import edge_runtime as er
from edge_runtime.cli import main
from edge_runtime.devices import registry
from edge_runtime.devices.base import DeviceBackend, DeviceSession
from edge_runtime.errors import ArtifactError, DeviceError
from edge_runtime.models.base import Task


class _Boom(DeviceBackend):
    """Declares its targets, and fails in ``__init__`` (a driver missing at import time, say)."""
    name = "h34-boom"
    targets = ("h34-t", "fake")

    def __init__(self, *a, **kw):
        raise RuntimeError("no driver here")


@pytest.fixture
def boom():
    registry.register("h34-boom", _Boom)
    yield
    registry.unregister("h34-boom")


# -- 1. a broken backend is named, not the artifact --------------------------------------------
def test_an_artifact_of_a_target_only_a_broken_backend_declares_names_the_backend(make_artifact, boom):
    art = make_artifact("tensors", target="h34-t")
    with pytest.raises(DeviceError) as ei:       # before: ArtifactError artifact_target_unknown (exit 3)
        er.load(art)
    assert ei.value.code == "device_backend_broken", ei.value
    assert "h34-boom" in ei.value.message and "no driver here" in ei.value.message
    res = CliRunner().invoke(main, ["inspect", str(art)])
    assert res.exit_code == 4 and "h34-boom" in res.output and "no driver here" in res.output, res.output

    # a target no broken backend declares is still the artifact's fault
    other = make_artifact("tensors", target="h34-nobody")
    with pytest.raises(ArtifactError) as ei2:
        er.load(other)
    assert ei2.value.code == "artifact_target_unknown"


def test_a_broken_backend_whose_targets_cannot_be_read_may_declare_the_target(make_artifact):
    def factory():
        raise ImportError("h34_sdk is not installed")

    registry.register("h34-lazy", factory)
    try:
        known = registry.known_targets()
        assert "h34-lazy" in known.broken and "fake" in known
        with pytest.raises(DeviceError) as ei:
            er.load(make_artifact("tensors", target="h34-unknowable"))
        assert ei.value.code == "device_backend_broken"
        assert "h34-lazy" in ei.value.message and "may declare" in ei.value.message
        assert "h34_sdk is not installed" in ei.value.message
    finally:
        registry.unregister("h34-lazy")


def test_a_forced_broken_backend_says_its_error_not_runs_none_of_the_targets(make_artifact, boom, caplog):
    art = make_artifact("tensors")
    with pytest.raises(DeviceError) as ei:       # before: device_unavailable, "h34-boom runs none of ..."
        er.load(art, device="h34-boom", strict=True)
    assert ei.value.code == "device_backend_broken" and "no driver here" in ei.value.message
    with er.load(art, device="h34-boom") as rt:
        fallback = rt.info()["fallback"]
    assert "no driver here" in fallback and "runs none" not in fallback, fallback
    assert rt.device.startswith("fake")
    # devices/verify/tune choose without load(): the same words (before: "runs none of the targets")
    res = CliRunner().invoke(main, ["devices", "--artifact", str(art), "--device", "h34-boom", "--json"])
    assert "no driver here" in res.output and "runs none" not in res.output, res.output


# -- 2. a factory that gives no backend ----------------------------------------------------------
class _StringTargets(DeviceBackend):
    name = "h34-str"
    targets = "h34-str-int8"        # type: ignore[assignment]  # the mistake: a string, not a tuple


def test_a_factory_giving_no_backend_is_device_backend_broken_naming_the_entry_point():
    registry.register("h34-dict", lambda: {"name": "h34-dict", "targets": ("x",)})
    registry.register("h34-str", _StringTargets)
    try:
        with pytest.raises(DeviceError) as ei:
            registry.get_backend("h34-dict")
        assert ei.value.code == "device_backend_broken"
        assert "h34-dict" in ei.value.message and "lacks" in ei.value.message and "suitability" in ei.value.message
        with pytest.raises(DeviceError) as ei2:
            registry.get_backend("h34-str")
        assert ei2.value.code == "device_backend_broken" and "'h34-str-int8'" in ei2.value.message
        assert "_StringTargets" in ei2.value.message                # the entry point's object named
        assert "h" not in dict(registry.known_targets())              # before: "h", "3", "4", ... were targets
        res = CliRunner().invoke(main, ["devices", "--json"])          # before: AttributeError, exit 1
        assert res.exit_code == 0, res.output
        backends = json.loads(res.stdout)["backends"]
        assert "not a backend" in backends["h34-dict"]["error"] and "not a backend" in backends["h34-str"]["error"]
        assert "suitability" in backends["fake"]
    finally:
        registry.unregister("h34-dict")
        registry.unregister("h34-str")


# -- 3. a task that leaves the contract's methods undefined ---------------------------------------
def test_a_task_without_prepare_finish_or_compare_is_refused_at_registration():
    from edge_runtime.models import TaskInvalid, get_task, register, unregister

    class Half(Task):
        name = "h34-half"

        def finish(self, outputs, prepared):
            return None

    register("h34-half", Half)
    try:
        with pytest.raises(TaskInvalid) as ei:    # before: it loaded; its first input failed, empty message
            get_task("h34-half")
        assert ei.value.code == "task_invalid"
        assert "prepare" in ei.value.message and "compare" in ei.value.message
        assert "finish" not in ei.value.message.split("does not define")[1].split(":")[0]
        assert get_task("tensors").name == "tensors"            # a task that defines them all loads
    finally:
        unregister("h34-half")


# -- 4. messages of exceptions with no text --------------------------------------------------------
class _NoOpen(DeviceBackend):
    name = "h34-noopen"
    targets = ("fake",)


class _EmptyError(DeviceBackend):
    name = "h34-empty"
    targets = ("fake",)

    def open(self, model_path, bucket, sub, options):
        raise RuntimeError()


class _NoRunSession(DeviceSession):
    pass


class _NoRun(DeviceBackend):
    name = "h34-norun"
    targets = ("fake",)

    def open(self, model_path, bucket, sub, options):
        return _NoRunSession(bucket, f"h34-norun:{sub}")


class _NoneSession(DeviceBackend):
    name = "h34-none"
    targets = ("fake",)

    def open(self, model_path, bucket, sub, options):
        return None


class _DictCapsSession(_NoRunSession):
    capabilities = {"inline": True}        # type: ignore[assignment]  # the mistake: not a Capabilities


class _DictCaps(DeviceBackend):
    name = "h34-dictcaps"
    targets = ("fake",)

    def open(self, model_path, bucket, sub, options):
        return _DictCapsSession(bucket, f"h34-dictcaps:{sub}")


class _NoPackages(DeviceBackend):
    name = "h34-nopkg"
    targets = ("fake",)

    def open(self, model_path, bucket, sub, options):
        return self.vendor()


@pytest.mark.parametrize("cls, code, words", [
    (_NoOpen, "device_load_failed", ["'h34-noopen'", "_NoOpen", "DeviceBackend.open"]),
    (_EmptyError, "device_load_failed", ["RuntimeError"]),
    (_NoRun, "device_warmup_failed", ["_NoRunSession", "h34-norun:cpu", "DeviceSession._run"]),
    # what load gives is checked against the Session protocol (before: an untyped AttributeError)
    (_NoneSession, "device_load_failed", ["NoneType", "lacks device"]),
    (_DictCaps, "device_load_failed", ["not a Capabilities"]),
    # the skeleton's vendor() of a backend without packages (before: "tuple index out of range")
    (_NoPackages, "device_load_failed", ["'h34-nopkg' declares no packages"]),
])
def test_a_seam_left_unwritten_or_broken_is_a_typed_load_error_naming_what(make_artifact, cls, code, words):
    registry.register(cls.name, cls)
    try:
        with pytest.raises(DeviceError) as ei:
            er.load(make_artifact("tensors"), device=cls.name, strict=True)
        assert ei.value.code == code, ei.value
        assert not ei.value.message.rstrip().endswith(":"), ei.value.message     # before: "...npz: "
        for word in words:
            assert word in ei.value.message, ei.value.message
    finally:
        registry.unregister(cls.name)


# -- 5. a broken conformance entry point is one failing case ---------------------------------------
CONFORMANCE = '''
def cases():
    raise RuntimeError("h34 cases exploded")

def not_cases():
    return [("only-two", "fake")]
'''


def test_a_broken_conformance_entry_point_is_one_failing_case_not_a_collection_error(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    (site / "h34_conf.py").write_text(textwrap.dedent(CONFORMANCE))
    add_distribution(site, "h34-conformance", {"edge_runtime.conformance": {
        "h34-missing": "h34_no_such_module:cases", "h34-raises": "h34_conf:cases", "h34-shape": "h34_conf:not_cases"}})
    monkeypatch.syspath_prepend(str(site))
    try:
        cases = importlib.import_module("conformance.cases")
        found = {c[0]: c for c in cases.plugin_cases()}       # before: ModuleNotFoundError from ep.load()
        for name, why in (("h34-missing", "h34_no_such_module"), ("h34-raises", "h34 cases exploded"),
                          ("h34-shape", "only-two")):
            cid, device, (kind, builder), inputs = found[f"broken-entry-point-{name}"]
            with pytest.raises(AssertionError) as ei:
                builder(tmp_path)
            assert name in str(ei.value) and why in str(ei.value), ei.value
    finally:
        sys.modules.pop("h34_conf", None)

    # the suite collects, every built-in case included, plus the broken ones
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", str(TESTS / "conformance"), "--collect-only", "-q",
                           "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "broken-entry-point-h34-raises" in proc.stdout and "fake-text" in proc.stdout

