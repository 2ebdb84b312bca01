"""Conformance cases over artifacts built on x86 (ci/aarch64/build_artifacts.py),
registered the way a third-party backend registers its own: an entry point in
the ``edge_runtime.conformance`` group. On PYTHONPATH only inside the aarch64
run, where no converter toolchain exists; ids avoid the names of the fixture
cases they replace (``-k`` deselects those by substring)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

_IDS = {"digits-onnx-int8": "x86built-ort-digits", "digits-tflite-int8": "x86built-tfl-digits",
        "digits-openvino": "x86built-ov-digits"}


def conformance_cases() -> list:
    from factories import png_bytes     # tests/ is on sys.path (tests/conftest.py)

    digit = png_bytes(np.eye(8, dtype=np.uint8) * 200)      # the inputs of tests/conformance/cases.py
    cat_file = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "coral" / "cat.bmp"
    cat = cat_file.read_bytes() if cat_file.exists() else np.full((224, 224, 3), 120, np.uint8)
    root = Path(os.environ.get("EDGE_AARCH64_ARTIFACTS", ""))
    if not (root / "index.json").is_file():
        return []
    out = []
    for name, spec in json.loads((root / "index.json").read_text()).items():
        if spec["inputs"] == "coral":
            # MobileNetV2 at 224x224: ~2 min of qemu per case; the tflite backend is covered by the
            # tflite-coral case (an imported Coral model) and x86built-tfl-digits, MobileNetV2 itself by
            # libcoral's cases and the x86/aarch64 comparison
            continue
        inputs = ([digit, np.full((8, 8), 30, np.uint8)] if spec["inputs"] == "digits"
                  else [cat, np.full((40, 60, 3), 90, np.uint8)])
        out.append((_IDS.get(name, f"x86built-{name}"), spec["device"], ("builder", lambda _tmp, p=root / name: p),
                    inputs))
    return out
