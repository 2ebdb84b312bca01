"""Target name → converter, fed by the ``edge_runtime.converters`` entry points.

The built-in converters register through the same group (``pyproject.toml``);
the table below is used where the distribution's metadata is not installed.
An entry point from another distribution for a built-in target name replaces
the built-in converter. What an entry point loads must be a
:class:`~.base.Converter` subclass.
"""

from __future__ import annotations

from edge_runtime.plugins import entry_point_refs, resolve_ref

from edge_runtime import error_codes as ec
from edge_runtime.errors import EdgeRuntimeError, InputError

from .base import Converter

GROUP = "edge_runtime.converters"


class ConversionFailed(ValueError):
    """The toolchain could not build the target from this source (not a bad recipe)."""


class UnknownTarget(InputError):
    """No converter is registered for the target asked for."""

    code = ec.CONVERT_TARGET_UNKNOWN


class ConverterInvalid(EdgeRuntimeError):
    """A registered converter cannot be loaded, or is not a Converter (a broken plugin: not the caller's)."""

    code = ec.CONVERTER_INVALID


_BUILTIN = {"onnx-int8": "edge_runtime.converters.onnx_int8:OnnxInt8Converter",
            "openvino": "edge_runtime.converters.openvino_int8:OpenVinoConverter",
            "tflite-int8": "edge_runtime.converters.tflite_int8:TfliteInt8Converter",
            "edgetpu": "edge_runtime.converters.edgetpu:EdgeTpuConverter",
            "coreml": "edge_runtime.converters.coreml:CoremlConverter"}


def converter_targets() -> dict[str, str]:
    """target -> "module:attr"."""
    found = dict(_BUILTIN)
    found.update(entry_point_refs(GROUP))
    return found


def unknown_target(target: str, known) -> UnknownTarget:
    return UnknownTarget(f"unknown --target {target!r} (known targets: {', '.join(sorted(known))})")


def get_converter(target: str) -> Converter:
    """A new converter instance for ``target`` (one per target per convert: a build may keep state)."""
    refs = converter_targets()
    if target not in refs:
        raise unknown_target(target, refs)
    ref = refs[target]
    try:
        obj = resolve_ref(ref)
    except Exception as exc:
        raise ConverterInvalid(f"converter for target {target!r} ({ref}) cannot be loaded: "
                               f"{type(exc).__name__}: {exc}") from exc
    if not (isinstance(obj, type) and issubclass(obj, Converter)):
        raise ConverterInvalid(f"converter for target {target!r} ({ref}) is {obj!r}, not a subclass of "
                               f"edge_runtime.converters.base.Converter")
    try:
        return obj()
    except Exception as exc:   # an abstract member left undefined, or an __init__ that fails
        raise ConverterInvalid(f"converter for target {target!r} ({ref}) cannot be made: "
                               f"{type(exc).__name__}: {exc}") from exc
