"""Core ML compute units reach the policy: a loaded runtime's tier, reason and device are those of
the units its sessions run with, not of the device string the choice was made from.

``er.load(art, device_options={"compute_units": "CPU_ONLY"})`` on Apple Silicon ran CPU only (the
session's device ``coreml:cpu_only``) while ``rt.info()`` said ``coreml:auto`` "Neural Engine, GPU or
CPU", tier ``accelerator``. The Core ML boundary is a stub module (``models.MLModel``, ``ComputeUnit``)
whose models answer a spec of plain objects: no coremltools import, no conversion."""

import types

import numpy as np
import pytest

import edge_runtime as er
from edge_runtime.devices import registry
from edge_runtime.devices.coreml_backend import CoremlBackend
from edge_runtime.selection import Choice, for_options, place, policy_table
from factories import make_artifact, rewrite_manifest

# not macOS: the real ``coreml`` backend cannot run, so ``auto`` has the stub's rows only
HOST = {"system": "Linux", "machine": "x86_64", "cpu": {}, "packages": {"coremltools": True}}
NAME = "coreml-apple"       # sorts before the conftest's ``coreml-faked``: ties keep registry order


class _Units:
    ALL, CPU_AND_NE, CPU_ONLY, CPU_AND_GPU = "ALL", "CPU_AND_NE", "CPU_ONLY", "CPU_AND_GPU"


def _feature(name, shape):
    arr = types.SimpleNamespace(shape=list(shape), WhichOneof=lambda field: None)
    kind = types.SimpleNamespace(multiArrayType=arr, WhichOneof=lambda field: "multiArrayType")
    return types.SimpleNamespace(name=name, type=kind)


class _Model:
    def __init__(self, path, compute_units):
        self.units, self.__proxy__, self._framework_error = compute_units, object(), None

    def get_spec(self):
        return types.SimpleNamespace(description=types.SimpleNamespace(
            input=[_feature("x", (1, 4)), _feature("k", (1, 2))]))

    def predict(self, data):
        return {"y": np.asarray(data["x"], np.float32)[:, :3] * 2}


def _stub():
    loaded = []

    def mlmodel(path, compute_units):
        loaded.append(compute_units)
        return _Model(path, compute_units)

    return types.SimpleNamespace(ComputeUnit=_Units, models=types.SimpleNamespace(MLModel=mlmodel)), loaded


def _probe(apple_silicon):
    return lambda hw: {"installed": True, "macos": True, "apple_silicon": apple_silicon}


@pytest.fixture()
def loaded():
    module, units = _stub()
    registry.register(NAME, lambda: CoremlBackend(module=module, probe=_probe(True), name=NAME))
    yield units
    registry.unregister(NAME)


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    def write(path, bucket, seed=0):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")

    root = make_artifact(tmp_path_factory.mktemp("coreml-units") / "art", task="tensors", target="coreml",
                         write_model=write, suffix=".mlpackage/Manifest.json")

    def packaged(data):
        for b in data["variants"][0]["buckets"]:
            b["package"] = b["file"].rsplit("/", 1)[0]

    rewrite_manifest(root, packaged)
    return root


def _chosen(info):
    (row,) = [r for r in info["candidates"] if r["chosen"]]
    return row


def _score(tier):
    return next(r["score"] for r in policy_table() if r["backend"] == "coreml" and r["tier"] == tier)


def test_cpu_only_option_on_auto_is_placed_as_the_cpu(art, loaded):
    """The bug: auto + compute_units=CPU_ONLY said accelerator / "Neural Engine, GPU or CPU"."""
    with er.load(art, hardware=HOST, device_options={"compute_units": "CPU_ONLY"}) as rt:
        info = rt.info()
        assert loaded == ["CPU_ONLY"] and info["backend"] == NAME
        assert info["device"] == f"{NAME}:cpu_only" and info["sessions"][0]["compute_units"] == "CPU_ONLY"
        assert "CPU only" in info["device_reason"] and "Neural Engine" not in info["device_reason"]
        assert "CPU_ONLY" in info["device_policy"] and "Neural Engine" not in info["device_policy"]
        row = _chosen(info)
        assert (row["tier"], row["device"], row["reason"], row["score"]) == \
            ("cpu", f"{NAME}:cpu_only", info["device_reason"], _score("cpu"))
        assert info["fallback"] is None
        assert rt.infer({"x": np.ones((1, 4), np.float32), "k": np.zeros((1, 2), np.int32)})


def test_named_backend_with_units_strict_and_the_opposite_direction(art, loaded):
    """Forced backend + CPU_AND_NE: the reason names what CPU_AND_NE allows (it said ALL's); strict
    keeps the units asked for. A suffix and an option that disagree are the caller's error."""
    with er.load(art, device=NAME, hardware=HOST, strict=True, device_options={"compute_units": "cpu_and_ne"}) as rt:
        info = rt.info()
        assert info["device"] == f"{NAME}:cpu_and_ne" == _chosen(info)["device"]
        assert "Neural Engine or CPU" in info["device_reason"] and "CPU_AND_NE" in info["device_reason"]
        assert _chosen(info)["tier"] == "accelerator" and _chosen(info)["score"] == _score("accelerator")
    with er.load(art, device=NAME, hardware=HOST, strict=True, device_options={"compute_units": "CPU_ONLY"}) as rt:
        assert rt.info()["device"] == f"{NAME}:cpu_only" and _chosen(rt.info())["tier"] == "cpu"
        assert rt.info()["fallback"] is None
    # the suffix and the option agree: one device, placed once
    with er.load(art, device=f"{NAME}:cpu_only", hardware=HOST, device_options={"compute_units": "cpu_only"}) as rt:
        assert _chosen(rt.info())["tier"] == "cpu" and rt.info()["device"] == f"{NAME}:cpu_only"
    before = list(loaded)
    for device, units in ((f"{NAME}:cpu_and_ne", "CPU_ONLY"), (f"{NAME}:cpu_only", "ALL")):
        with pytest.raises(er.InputError, match="disagree") as ei:
            er.load(art, device=device, hardware=HOST, strict=True, device_options={"compute_units": units})
        assert ei.value.code == "device_option_invalid"
    assert loaded == before        # refused before any package was opened


def test_for_options_follows_device_for_and_leaves_other_backends_alone():
    """``for_options`` did not exist: the choice kept the device string's placement."""
    variant = {"target": "coreml"}
    intel = CoremlBackend(module=_stub()[0], probe=_probe(False), name=NAME)
    suit = place("coreml", intel.suitability("coreml", HOST), HOST, "coreml")
    row = {"target": "coreml", "backend": NAME, "score": suit.score, "tier": suit.tier, "device": suit.device,
           "reason": suit.reason, "policy": suit.policy, "forced": False, "chosen": True}
    choice = Choice(variant, NAME, suit, [row, {**row, "chosen": False}])
    moved = for_options(choice, intel, HOST, {"compute_units": "CPU_AND_NE"})
    assert moved.suitability.device == f"{NAME}:cpu_and_ne"
    assert "CPU only (no Neural Engine)" in moved.suitability.reason
    assert moved.candidates[0]["device"] == f"{NAME}:cpu_and_ne" and moved.candidates[1] == {**row, "chosen": False}
    assert for_options(choice, intel, HOST, {}) is choice
    assert for_options(choice, intel, HOST, {"compute_units": "ALL"}) is choice
    plain = types.SimpleNamespace(name="fake", family="fake")      # no device_for: untouched
    assert for_options(choice, plain, HOST, {"compute_units": "CPU_ONLY"}) is choice
