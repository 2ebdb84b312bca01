"""A device string with an empty part (``onnxruntime:``, ``fake::``, ``:cpu``) read as the backend's
default, or was handed on as it was, and ran with exit 0: the caller asked for something and got
another device without a word. Now ``device_unknown`` before anything loads."""

from __future__ import annotations

import pytest

import edge_runtime as er


@pytest.mark.parametrize("device", ["fake:", "fake::", "fake:cpu:", ":cpu", "onnxruntime:"])
def test_a_device_string_with_an_empty_part_is_refused(make_artifact, device):
    with pytest.raises(er.DeviceError) as e:
        er.load(make_artifact(), device=device)
    assert e.value.code == "device_unknown" and "empty part" in str(e.value)


@pytest.mark.parametrize("device", ["fake", "fake:cpu", "auto"])
def test_whole_device_strings_still_load(make_artifact, device):
    with er.load(make_artifact(), device=device) as rt:
        assert rt.infer("good film").prediction in ("negative", "positive")
