"""``edge-infer serve --device X`` where X cannot run fell back to another device with a warning only, and
serve had no ``--require-device`` (every other command that takes ``--device`` has it): a Jetson operator
asking for ``onnxruntime:cuda`` could not make a CPU fallback an error. Now ``serve --require-device`` loads
strictly: the device that cannot run ends the start, ``device_unavailable``, exit 4, before any port is
bound; without it, the fallback is taken and said, as before."""

from __future__ import annotations

import pytest

from edge_runtime import error_codes as ec
from edge_runtime.errors import DeviceError


def test_serve_require_device_ends_the_start_instead_of_falling_back(make_artifact):
    """Through the console script in a child process (a serve that did start would be stopped by the
    timeout, never hang the suite, and leaves no handler or thread in pytest's process)."""
    import subprocess
    import sys

    art = make_artifact("tensors")
    proc = subprocess.run([sys.executable, "-m", "edge_runtime", "serve", str(art), "--device", "fake:gpu",
                           "--require-device", "--no-grpc", "--port", "0"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 4, proc.stderr + proc.stdout
    assert "device_unavailable" in proc.stderr and "fake:gpu" in proc.stderr, proc.stderr


def test_the_core_loads_strictly_only_when_asked(make_artifact):
    from edge_runtime.serve_core import ServeCore

    art = make_artifact("tensors")
    core = ServeCore([art], device="fake:gpu", strict=True)
    with pytest.raises(DeviceError) as ei:
        core.load_all()
    assert ei.value.code == ec.DEVICE_UNAVAILABLE
    loose = ServeCore([art], device="fake:gpu")
    try:
        loose.load_all()
        (m,) = loose.models.values()
        assert m.rt.device == "fake:cpu" and "fake:gpu" in (m.rt.info()["fallback"] or "")
    finally:
        loose.close()
