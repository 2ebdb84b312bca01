"""The first outputs of each bucket against the manifest's output specs, once per bucket per runtime.

A task reads a device's outputs through the manifest: an integer output with a scale and zero point is
dequantized with them, a float output is taken as real values, an output is sliced by its element count.
A backend that hands back something else (int8 codes for a uint8 output whose zero point is 128, raw
codes for an output the manifest calls float, another element count, an output missing) makes every
answer wrong while each call "succeeds". Checked on the first call of each bucket (the warm-up, the
verify's first probe, or the caller's first call): one flag test per call after that.

What is accepted: a float output for a quantized integer one (a backend that dequantized it itself:
OpenVINO reading a quantized .tflite), another float width (Core ML's float16), another integer type for
an integer output without quantization (an int32 class map for an int64 one)."""

from __future__ import annotations

import math

import numpy as np


def output_problems(outputs: dict, specs) -> list[str]:
    """What is wrong with ``outputs`` (name -> array) against ``specs`` (the bucket's output specs:
    name, dtype, shape, optional quantization); empty when they fit."""
    problems = []
    for spec in specs:
        name = spec["name"]
        if name not in outputs:
            problems.append(f"output {name!r} is missing (returned: {sorted(map(str, outputs))})")
            continue
        arr = outputs[name]
        dtype, got = np.dtype(spec["dtype"]), getattr(arr, "dtype", None)
        size = getattr(arr, "size", None)
        want = math.prod(int(d) for d in spec["shape"])
        if size is not None and size != want:
            problems.append(f"output {name!r} has {size} elements, the manifest's shape {list(spec['shape'])} "
                            f"holds {want}")
        if got is None:
            continue
        if dtype.kind in "iu" and spec.get("quantization") and got.kind in "iub" and got != dtype:
            problems.append(f"output {name!r} is {got}, the manifest's is {dtype} with zero point "
                            f"{spec['quantization'].get('zero_point')}: its codes would be dequantized with "
                            "another type's parameters")
        elif dtype.kind == "f" and got.kind in "iub":
            problems.append(f"output {name!r} is {got}, the manifest's is {dtype}: integer codes would be read "
                            "as real values")
    return problems
