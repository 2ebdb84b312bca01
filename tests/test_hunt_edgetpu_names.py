"""``edgetpu:usb`` and ``edgetpu:usb:0`` name one device (libedgetpu's first USB Edge TPU) but keyed two
delegates: a second runtime on ``usb:0`` beside one on ``usb`` opened the device again, which a libedgetpu
that opens it exclusively refuses (the load failed with device_unavailable though the TPU was ours)."""

from __future__ import annotations

import weakref

import pytest

from test_edgetpu_hunt import _bucket, _fake, _mnv1


@pytest.mark.parametrize("first,second", [("usb", "usb:0"), ("usb:0", "usb"), ("pci", "pci:0")])
def test_one_device_under_two_names_shares_one_delegate(first, second):
    from edge_runtime.devices.tflite_backend import EdgeTpuBackend

    compiled, plain = _mnv1()
    module = _fake({compiled: plain})
    live: weakref.WeakSet = weakref.WeakSet()
    plain_load = module.load_delegate

    def exclusive(library, options=None):
        if live:                                  # one Edge TPU here, opened exclusively
            raise ValueError(f"Failed to load delegate from {library}\n")
        d = plain_load(library, options)
        live.add(d)
        return d

    module.load_delegate = exclusive
    a = EdgeTpuBackend(module=module).load(compiled, _bucket(compiled), first)
    try:
        b = EdgeTpuBackend(module=module).load(compiled, _bucket(compiled), second)
        b.close()
        assert len(module.loaded) == 1
    finally:
        a.close()


def test_two_devices_keep_two_delegates():
    from edge_runtime.devices.tflite_backend import EdgeTpuBackend

    compiled, plain = _mnv1()
    module = _fake({compiled: plain})
    a = EdgeTpuBackend(module=module).load(compiled, _bucket(compiled), "usb:0")
    b = EdgeTpuBackend(module=module).load(compiled, _bucket(compiled), "usb:1")
    try:
        assert [d.options for d in module.loaded] == [{"device": "usb:0"}, {"device": "usb:1"}]
    finally:
        a.close()
        b.close()
