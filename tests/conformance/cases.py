"""The backends under conformance and, for each, artifacts and inputs.

A case is (id, device, artifact, sample inputs); the artifact is ("fixture",
conftest fixture name), ("factory", task[, make_artifact keyword arguments:
target, write_model, suffix]) or ("builder", callable(tmp_path) -> artifact
path). Every check in test_conformance.py runs on every case.

A backend joins the suite by adding a case here or, without touching this
project, through an entry point in the ``edge_runtime.conformance`` group of
its own distribution: a callable returning its cases.
"""

import numpy as np

from conftest import SHARED_DATA as SHARED
from factories import png_bytes

from edge_runtime.plugins import entry_point_refs, resolve_ref

DIGIT = png_bytes((np.eye(8, dtype=np.uint8) * 200))
_CAT = SHARED / "coral" / "cat.bmp"
CAT = _CAT.read_bytes() if _CAT.exists() else DIGIT   # the fixtures skip when shared data is absent

CASES = [
    # id, device, artifact builder (fixture name or task for the fake factory), inputs
    ("fake-text", "fake", ("factory", "text-classification"), ["good movie", "the market crashes " * 3, "bad"]),
    ("fake-embed", "fake", ("factory", "text-embedding"), ["stock market rises", "awful", "a great movie"]),
    ("fake-image", "fake", ("factory", "image-classification"), [DIGIT, np.zeros((8, 8), np.uint8)]),
    ("fake-tensors", "fake", ("factory", "tensors"),
     [{"x": np.arange(4, dtype=np.float32)[None], "k": np.ones((1, 2), np.int32)}]),
    ("onnxruntime-digits", "onnxruntime", ("fixture", "digits_artifact"), [DIGIT, np.full((8, 8), 30, np.uint8)]),
    ("onnxruntime-minilm-embed", "onnxruntime", ("fixture", "minilm_embedding_artifact"),
     ["Stock market crashes!", "A quiet day of trading ends with small gains for tech shares " * 3]),
    ("onnxruntime-minilm-cls", "onnxruntime", ("fixture", "minilm_classifier_artifact"),
     ["Stock market crashes!", "What a wonderful, uplifting film."]),
    ("openvino-digits", "openvino", ("fixture", "ov_digits_artifact"), [DIGIT, np.full((8, 8), 30, np.uint8)]),
    ("openvino-minilm-embed", "openvino", ("fixture", "ov_minilm_embedding_artifact"),
     ["Stock market crashes!", "A quiet day of trading ends with small gains for tech shares " * 3]),
    ("openvino-minilm-cls", "openvino", ("fixture", "ov_minilm_classifier_artifact"),
     ["Stock market crashes!", "What a wonderful, uplifting film."]),
    ("tflite-coral", "tflite", ("fixture", "coral_artifact"), [CAT, np.full((40, 60, 3), 90, np.uint8)]),
    ("tflite-digits", "tflite", ("fixture", "tflite_digits_artifact"), [DIGIT, np.full((8, 8), 30, np.uint8)]),
    ("edgetpu-faked-coral", "edgetpu-faked", ("fixture", "edgetpu_faked_artifact"),
     [CAT, np.full((40, 60, 3), 90, np.uint8)]),
    # the real coreml backend over the faked Core ML boundary (tests/fake_coreml.py): the
    # w8a8 .mlpackage's spec is read for real, predict runs the fp32 ONNX twin
    ("coreml-faked-digits", "coreml-faked", ("fixture", "coreml_faked_digits_artifact"),
     [DIGIT, np.full((8, 8), 30, np.uint8)]),
    # MiniLM's coreml packages (spec read for real, int32 token ids fed), each bucket's twin the fp32 ONNX
    ("coreml-faked-minilm-embed", "coreml-faked", ("fixture", "coreml_faked_minilm_embedding_artifact"),
     ["Stock market crashes!", "A quiet day of trading ends with small gains for tech shares " * 3]),
    ("coreml-faked-minilm-cls", "coreml-faked", ("fixture", "coreml_faked_minilm_classifier_artifact"),
     ["Stock market crashes!", "What a wonderful, uplifting film."]),
]


def _broken_case(name: str, why: str) -> tuple:
    """A case that fails every check of the suite with ``why``, naming the entry point (before 2026-12-07
    a broken entry point raised while this module was imported: a collection error of the whole suite,
    every backend's cases lost, and the entry point not named)."""
    message = f"edge_runtime.conformance entry point {name!r}: {why}"

    def builder(tmp_path):
        raise AssertionError(message)

    return (f"broken-entry-point-{name}", name, ("builder", builder), [])


def _is_case(c) -> bool:
    return (isinstance(c, (tuple, list)) and len(c) == 4 and isinstance(c[0], str) and isinstance(c[1], str)
            and isinstance(c[2], (tuple, list)) and len(c[2]) >= 2)


def plugin_cases() -> list:
    """Cases from the ``edge_runtime.conformance`` entry points of installed distributions, read as the
    registries read theirs (``edge_runtime.plugins``: a name two distributions claim is a clash). An entry
    point that does not load, raises, or returns something that is not a list of cases ``(id, device,
    artifact, inputs)`` is one failing case that names it and why; the other cases run."""
    out = []
    for name, ref in sorted(entry_point_refs("edge_runtime.conformance").items()):
        try:
            found = list(resolve_ref(ref)())
        except Exception as exc:
            out.append(_broken_case(name, f"{ref} failed: {type(exc).__name__}: {exc}"))
            continue
        bad = [c for c in found if not _is_case(c)]
        if bad:
            out.append(_broken_case(name, f"{ref} returned {repr(bad[0])[:120]}, not a case (id, device, "
                                          f"artifact, inputs)"))
            continue
        out.extend(tuple(c) for c in found)
    return out


CASES += plugin_cases()
