"""README's "Hardware detection and device selection" against what the program does (h37).

Each test failed before its fix:
- a third-party backend whose SDK is not installed counted as "can run" (the probe records only the
  built-in backends' packages and ``probe()`` read any other one as present): ``auto`` chose it and the
  load failed later; now the package is looked up (``find_spec``), as the probe looks up its own;
- ``--device edgetpu:usb:01`` on a machine without an Edge TPU repeated its one reason twice, and a
  forced device whose backend runs none of the targets lost that reason when nothing else ran either;
- ``devices --artifact`` printed neither the tier nor the policy row README promises in its table;
- a limited CPU count printed its reasons as a Python list (``(['affinity: ...'])``).
"""

import sys

import pytest
from boards import detect_board
from click.testing import CliRunner

from edge_runtime import errors as er
from edge_runtime import hardware
from edge_runtime.cli import main
from edge_runtime.cli_devices import hardware_lines
from edge_runtime.devices import registry
from edge_runtime.devices.base import DeviceBackend, Suitability
from edge_runtime.selection import choose

ABSENT = "edge_runtime_h37_no_such_sdk"


class _SdkBackend(DeviceBackend):
    """A plug-in backend whose SDK (``packages``) decides whether it can run."""
    name = "h37sdk"
    targets = ("h37-int8",)
    packages = (ABSENT,)
    package_label = "h37-sdk"
    install = "pip install h37-sdk"
    devices = ("npu",)

    def assess(self, target, hardware, sub, forced, facts):
        return Suitability("accelerator", f"{self.name}:{sub}", "an H37 NPU was found")


def _backend(*packages):
    return type("B", (_SdkBackend,), {"packages": packages})()


def test_a_plugin_package_the_probe_does_not_record_is_looked_up_not_assumed_present():
    hw = hardware.detect_cached()
    assert ABSENT not in hw.get("packages", {})
    s = _backend(ABSENT).suitability("h37-int8", hw)
    assert not s.ok and "h37-sdk is not installed (pip install h37-sdk)" in s.reason
    # a dotted import name: looked up in its parent's folders (a missing submodule is missing)
    assert not _backend("json.h37_no_such_module").suitability("h37-int8", hw).ok
    assert not _backend(f"{ABSENT}.runtime").suitability("h37-int8", hw).ok
    # any one present will do, and a present one still runs
    assert _backend(ABSENT, "json").suitability("h37-int8", hw).ok
    before = "xmlrpc" in sys.modules
    assert _backend("xmlrpc.client").suitability("h37-int8", hw).ok
    assert before or "xmlrpc" not in sys.modules          # found, never imported
    # a failed packages probe leaves {} ("unknown"): the package is looked up too, never assumed
    assert not _backend(ABSENT).suitability("h37-int8", {**hw, "packages": {}}).ok
    # the record stays authoritative for what it holds
    assert _backend(ABSENT).suitability("h37-int8", {**hw, "packages": {ABSENT: True}}).ok


@pytest.fixture
def sdk_backend():
    registry.register("h37sdk", _SdkBackend)
    yield
    registry.unregister("h37sdk")


def test_auto_does_not_choose_a_plugin_whose_sdk_is_missing(sdk_backend, make_artifact, tmp_path, monkeypatch):
    hw = detect_board(tmp_path, "x86")
    with pytest.raises(er.DeviceError) as ei:
        choose([{"target": "h37-int8"}], hw)
    assert ei.value.code == "device_unavailable" and "pip install h37-sdk" in ei.value.message
    # next to a variant that runs, auto takes that one and the plug-in's row says why not
    c = choose([{"target": "h37-int8"}, {"target": "fake"}], hw)
    assert c.backend_name == "fake"
    row = next(r for r in c.candidates if r["backend"] == "h37sdk")
    assert row["score"] == 0 and "h37-sdk is not installed" in row["reason"]
    # edge-infer devices --artifact: would fail (exit 4) naming the install step, not "would run"
    monkeypatch.setattr(hardware, "detect", lambda *a, **k: hw)
    art = make_artifact("tensors", target="h37-int8")
    r = CliRunner().invoke(main, ["devices", "--artifact", str(art)])
    assert r.exit_code == 4 and "would run" not in r.output and "pip install h37-sdk" in r.output, r.output


@pytest.fixture
def no_faked_tpu():
    """The session's ``edgetpu-faked`` backend (conftest: a faked Coral that *can* run) out of the registry
    for the test: these tests are about a host with no Edge TPU, whatever ran before them."""
    from edge_runtime.devices import registry

    saved = registry._factories.get("edgetpu-faked")
    registry.unregister("edgetpu-faked")
    yield
    if saved is not None:
        registry.register("edgetpu-faked", saved)


def test_a_forced_sub_device_that_cannot_run_names_its_reason_once(tmp_path, no_faked_tpu):
    hw = detect_board(tmp_path, "x86")
    for device in ("edgetpu:usb:01", "edgetpu:pci"):
        with pytest.raises(er.DeviceError) as ei:
            choose([{"target": "edgetpu"}], hw, device=device)
        msg = ei.value.message
        assert ei.value.code == "device_unavailable"
        assert msg.count("no Edge TPU found") == 1 and device in msg, msg
    # a forced backend that runs none of the targets: that is said too, next to why nothing else runs
    with pytest.raises(er.DeviceError) as ei:
        choose([{"target": "edgetpu"}], hw, device="coreml:cpu_only")
    msg = ei.value.message
    assert "coreml:cpu_only" in msg and "runs none of the artifact's targets" in msg and "no Edge TPU" in msg, msg


def test_cli_devices_forced_edgetpu_sub_device_says_it_once(make_artifact, tmp_path, monkeypatch, no_faked_tpu):
    hw = detect_board(tmp_path, "x86")
    monkeypatch.setattr(hardware, "detect", lambda *a, **k: hw)
    monkeypatch.setattr(hardware, "detect_cached", lambda *a, **k: hw)
    art = make_artifact("tensors", target="edgetpu")
    r = CliRunner().invoke(main, ["devices", "--artifact", str(art), "--device", "edgetpu:usb:01"])
    line = next(x for x in r.output.splitlines() if "would fail" in x)
    assert r.exit_code == 4 and "[device_unavailable]" in line and line.count("no Edge TPU found") == 1, r.output


def test_devices_artifact_prints_each_candidates_tier_and_policy_row(make_artifact, tmp_path, monkeypatch):
    hw = detect_board(tmp_path, "x86")
    monkeypatch.setattr(hardware, "detect", lambda *a, **k: hw)
    art = make_artifact("tensors")
    r = CliRunner().invoke(main, ["devices", "--artifact", str(art), "--device", "fake:gpu"])
    assert r.exit_code == 0, r.output
    rows = r.output.split("candidates:", 1)[1].splitlines()
    chosen = next(x for x in rows if x.lstrip().startswith("* fake"))
    forced = next(x for x in rows if x.lstrip().startswith("! fake"))
    assert " cpu " in chosen and "[policy: any other backend that can run" in chosen, chosen
    assert " - " in forced and "[policy:" not in forced, forced      # cannot run: no tier, no row


def test_a_limited_cpu_count_prints_its_reasons_as_text():
    hw = {"system": "Linux", "machine": "x86_64", "packages": {},
          "cpu": {"model": "m", "vendor": "v", "cores": 8, "features": [], "int8_dot": False, "usable": 3,
                  "usable_limited_by": ["affinity: CPUs 0-3 (4)", "cgroup CPU quota: cpu.max 300000/100000 (3 CPUs)"]}}
    line = next(x for x in hardware_lines(hw) if x.startswith("cpu usable"))
    assert line == ("cpu usable by this process: 3 of 8 (affinity: CPUs 0-3 (4); cgroup CPU quota: cpu.max "
                    "300000/100000 (3 CPUs))"), line
