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


# 2026-12-07: a sub-device outside the backend's vocabulary fell back to the default device with only a
# warning (exit 0): a typo and a full-width look-alike ran somewhere the caller did not ask for
@pytest.mark.parametrize("device", ["fake:cpu:0:1", "fake:tpu", "onnxruntime:ｃｐｕ", "onnxruntime:cpu:x",
                                    "openvino:warp", "edgetpu:usb:"])
def test_a_sub_device_outside_the_vocabulary_is_unknown_not_a_fallback(make_artifact, device):
    with pytest.raises(er.DeviceError) as e:
        er.load(make_artifact(), device=device)
    assert e.value.code == "device_unknown" and "edge-infer devices" in str(e.value)


def test_an_empty_device_string_is_not_auto(make_artifact):
    with pytest.raises(er.DeviceError) as e:
        er.load(make_artifact(), device="")
    assert e.value.code == "device_unknown" and "empty" in str(e.value)
    with er.load(make_artifact(), device=None) as rt:      # None still means auto
        assert rt.infer("good film").prediction in ("negative", "positive")


def test_cli_names_the_unknown_sub_device_with_exit_4(make_artifact):
    from click.testing import CliRunner

    from edge_runtime.cli import main

    r = CliRunner().invoke(main, ["infer", str(make_artifact()), "--text", "good film", "--device", "fake:tpu"])
    assert r.exit_code == 4 and "unknown fake device 'tpu'" in r.output, r.output

