"""A chosen path that fails to load or warm up here (a Core ML package its loader refuses, an Edge TPU
delegate that cannot open its device, a session whose first run fails): without ``strict``, ``load``
tries the next candidate and says so as a fallback; before, the whole load failed although the
artifact held a variant this machine runs. ``strict`` (``--require-device``) refuses as before."""

from __future__ import annotations

import pytest

import edge_runtime as er
from edge_runtime import error_codes as ec
from edge_runtime.devices.openvino_backend import OpenVinoBackend


def _refuse(monkeypatch, code=ec.DEVICE_UNAVAILABLE):
    calls = []

    def load(self, *a, **kw):
        calls.append(1)
        raise er.DeviceError("injected: the device refused the model", code=code)

    monkeypatch.setattr(OpenVinoBackend, "load", load)
    return calls


def test_auto_falls_back_to_the_next_candidate_and_says_why(ov_digits_artifact, monkeypatch):
    from edge_runtime.devices import registry

    with er.load(ov_digits_artifact) as rt:     # whichever path this CPU's policy (or a tune) picks first
        first, target = rt.choice.backend_name, rt.variant.target
    calls = []

    def refuse(self, *a, **kw):
        calls.append(1)
        raise er.DeviceError("injected: the device refused the model", code=ec.DEVICE_UNAVAILABLE)

    monkeypatch.setattr(type(registry.get_backend(first)), "load", refuse)
    with er.load(ov_digits_artifact) as rt:
        assert calls == [1]
        assert rt.choice.backend_name != first
        fb = rt.info()["fallback"]
        assert f"{first} for {target}: injected: the device refused the model" in fb
        assert "tried the next candidate" in fb
        row = next(c for c in rt.choice.candidates if c["backend"] == first and c["target"] == target)
        assert "failed to load here" in row["reason"]
        assert rt.infer(__import__("numpy").zeros((8, 8), "uint8")).prediction is not None


def test_strict_refuses_with_the_first_error(ov_digits_artifact, monkeypatch):
    _refuse(monkeypatch)
    with pytest.raises(er.DeviceError, match="injected") as ei:
        er.load(ov_digits_artifact, strict=True)
    assert ei.value.code == "device_unavailable"


def test_a_forced_device_without_strict_falls_back_too(ov_digits_artifact, monkeypatch):
    _refuse(monkeypatch, ec.DEVICE_LOAD_FAILED)
    with er.load(ov_digits_artifact, device="openvino") as rt:
        assert rt.choice.backend_name != "openvino" and "injected" in rt.info()["fallback"]


def test_nothing_left_raises_the_first_error(ov_digits_artifact, monkeypatch):
    from edge_runtime.devices.onnxruntime_backend import OnnxRuntimeBackend

    _refuse(monkeypatch)
    monkeypatch.setattr(OnnxRuntimeBackend, "load", lambda self, *a, **kw: (_ for _ in ()).throw(
        er.DeviceError("injected: ort too", code=ec.DEVICE_LOAD_FAILED)))
    with pytest.raises(er.DeviceError, match="the device refused the model"):
        er.load(ov_digits_artifact)


def test_an_artifact_error_is_never_retried(make_artifact, monkeypatch):
    """Only a device's failure moves on; a bad artifact is refused at once (one variant here anyway)."""
    import fake_backend

    monkeypatch.setattr(fake_backend.FakeBackend, "load", lambda self, *a, **kw: (_ for _ in ()).throw(
        er.ArtifactError("injected: bad file", file="x")))
    with pytest.raises(er.ArtifactError, match="bad file"):
        er.load(make_artifact("text-classification"), device="fake")
