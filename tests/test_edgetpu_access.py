"""An Edge TPU whose device file this user may not open (no udev rule, not in the apex/plugdev group):
detection named it present and the backend ranked it an accelerator, so `auto` chose it and the load
failed with libedgetpu's bare "failed to open device"; doctor said nothing. Now the hardware record
says ``access: "denied"``, the backend is ``unready`` with the fix, and doctor gives the commands."""

from __future__ import annotations

import os

import pytest
from boards import coral_pcie, usb, write, x86_host

from edge_runtime import hardware
from edge_runtime.devices.tflite_backend import EdgeTpuBackend
from edge_runtime.doctor import diagnose


@pytest.fixture
def denied(monkeypatch):
    """Device files under the fake root named in the set are not readable and writable (as root every
    file is: the check is os.access)."""
    names: set[str] = set()
    real = os.access
    monkeypatch.setattr(hardware, "ACCESS", lambda path, mode: os.path.basename(str(path)) not in names
                        and real(path, mode))
    return names


def test_a_pcie_card_this_user_may_not_open_is_unready_with_the_fix(tmp_path, denied):
    kw = coral_pcie(tmp_path)
    assert hardware.detect(tmp_path, **kw)["edgetpus"] == [{"type": "pci", "path": "/dev/apex_0"}]
    denied.add("apex_0")
    hw = hardware.detect(tmp_path, **kw)
    assert hw["edgetpus"] == [{"type": "pci", "path": "/dev/apex_0", "access": "denied"}]
    suit = EdgeTpuBackend().suitability("edgetpu", hw)
    assert suit.tier == "unready" and "may not open" in suit.reason and "apex" in suit.reason
    found = [f for f in diagnose(hw)["findings"] if "permission denied" in f["problem"]]
    assert len(found) == 1 and "adduser $USER apex" in found[0]["fix"] and "/dev/apex_0" in found[0]["found"]


def test_a_usb_accelerator_whose_bus_node_is_closed_to_this_user(tmp_path, denied):
    kw = x86_host(tmp_path)
    usb(tmp_path, "2-1", "18d1", "9302")
    write(tmp_path, "sys/bus/usb/devices/2-1/busnum", "2\n")
    write(tmp_path, "sys/bus/usb/devices/2-1/devnum", "7\n")
    write(tmp_path, "dev/bus/usb/002/007")
    write(tmp_path, "usr/lib/x86_64-linux-gnu/libedgetpu.so.1")
    hw = hardware.detect(tmp_path, **kw)
    assert "access" not in hw["edgetpus"][0] and hw["coral"]["usb"][0]["node"] == "/dev/bus/usb/002/007"
    assert EdgeTpuBackend().suitability("edgetpu", hw).tier == "accelerator"
    denied.add("007")
    hw = hardware.detect(tmp_path, **kw)
    assert hw["edgetpus"][0]["access"] == "denied"
    assert EdgeTpuBackend().suitability("edgetpu", hw).tier == "unready"
    assert any("plugdev" in f["fix"] for f in diagnose(hw)["findings"] if "permission denied" in f["problem"])


def test_one_closed_device_of_two_only_refuses_when_asked_for(tmp_path, denied):
    kw = coral_pcie(tmp_path)
    write(tmp_path, "dev/apex_1")
    denied.add("apex_1")
    hw = hardware.detect(tmp_path, **kw)
    b = EdgeTpuBackend()
    assert b.suitability("edgetpu", hw).tier == "accelerator"        # any Edge TPU: apex_0 opens
    assert b.suitability("edgetpu", hw, device="pci:0").tier == "accelerator"
    closed = b.suitability("edgetpu", hw, device="pci:1")
    assert closed.tier == "unready" and "pci:/dev/apex_1" in closed.reason


# -- macOS: no sysfs; the USB registry (ioreg) ---------------------------------------------------
IOREG = """+-o Root  <class IORegistryEntry, id 0x100000100, retain 20>
  +-o AppleT8112USBXHCI@00000000  <class AppleT8112USBXHCI, id 0x100000abc, registered, matched, active>
    | {
    |   "locationID" = 0
    | }
    +-o USB Receiver@00100000  <class IOUSBHostDevice, id 0x100000bcd, registered, matched, active>
    |   {
    |     "idProduct" = 50475
    |     "idVendor" = 1133
    |     "locationID" = 1048576
    |   }
    +-o Coral USB Accelerator@00200000  <class IOUSBHostDevice, id 0x100000cde, registered, matched, active>
        {
          "idProduct" = 37634
          "USB Product Name" = "Coral USB Accelerator"
          "idVendor" = 6353
          "locationID" = 2097152
        }
"""


def test_a_coral_usb_on_a_mac_is_found_through_ioreg(tmp_path):
    """Before: detection read only Linux sysfs, so on a Mac the Edge TPU was never found and even
    `device="edgetpu"` was refused ("no Edge TPU found")."""
    from boards import board

    root, kw = board(tmp_path, "apple-silicon")
    assert hardware.detect(root, **kw, ioreg=IOREG)["edgetpus"] == []      # no runtime: ioreg is not read
    write(root, "usr/local/lib/libedgetpu.1.dylib")
    calls = []
    hw = hardware.detect(root, **kw, ioreg=lambda: calls.append(1) or IOREG)
    assert calls == [1]
    assert hw["edgetpus"] == [{"type": "usb", "path": "0x00200000", "id": "18d1:9302"}]
    assert hw["coral"]["usb"][0]["firmware_loaded"] is True
    suit = EdgeTpuBackend().suitability("edgetpu", hw)
    assert suit.tier == "accelerator" and suit.device == "edgetpu:usb"
    assert hardware.detect(root, **kw, ioreg="")["edgetpus"] == []          # ioreg unreadable: nothing found
