"""Target name → converter, fed by the ``edge_runtime.converters`` entry points."""

from __future__ import annotations

import importlib
from importlib import metadata

GROUP = "edge_runtime.converters"


class ConversionFailed(ValueError):
    """The toolchain could not build the target from this source (not a bad recipe)."""
_BUILTIN = {"onnx-int8": "edge_runtime.converters.onnx_int8:OnnxInt8Converter",
            "openvino": "edge_runtime.converters.openvino_int8:OpenVinoConverter",
            "tflite-int8": "edge_runtime.converters.tflite_int8:TfliteInt8Converter",
            "edgetpu": "edge_runtime.converters.edgetpu:EdgeTpuConverter",
            "coreml": "edge_runtime.converters.coreml:CoremlConverter"}


def converter_targets() -> dict[str, str]:
    found = dict(_BUILTIN)
    try:
        for ep in metadata.entry_points(group=GROUP):
            found[ep.name] = ep.value
    except Exception:
        pass
    return found


def get_converter(target: str):
    refs = converter_targets()
    if target not in refs:
        raise KeyError(f"no converter for target {target!r} (known: {', '.join(sorted(refs))})")
    module, _, attr = refs[target].partition(":")
    return getattr(importlib.import_module(module), attr)()
