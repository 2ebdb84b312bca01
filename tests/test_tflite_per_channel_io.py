"""TFLite import of a model whose input or output tensor is quantized per channel.

LiteRT reports such a tensor's ``quantization`` tuple as ``(0.0, 0)``, the real
parameters being in ``quantization_parameters`` (``scales``, ``zero_points``,
``quantized_dimension``). Read from the tuple alone, an int8 I/O tensor quantized
per channel was recorded as unquantized: the runtime then fed it unscaled values
and returned its raw integers as the output (a wrong answer, exit 0). The runtime
(de)quantizes I/O with one scale and zero point per tensor, so import refuses it
(``import_io_per_channel``) naming the tensor, its axis and scale count; a
per-tensor model, and an integer one with no quantization at all, import as before.

The models are built with tests/tflite_builder.py: one RESHAPE,
int8 ``x [1, 2, 2, 3]`` -> int8 ``y [1, 12]``, each tensor's quantization chosen.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("tflite")
pytest.importorskip("ai_edge_litert.interpreter")
from tflite.BuiltinOperator import BuiltinOperator as B  # noqa: E402

import edge_runtime as er  # noqa: E402
from edge_runtime import error_codes as ec  # noqa: E402
from edge_runtime.cli import main  # noqa: E402
from edge_runtime.converters.import_common import import_model  # noqa: E402
from edge_runtime.converters.tflite_import import _spec  # noqa: E402
from tflite_builder import I8, I32, build_model  # noqa: E402

PER_TENSOR = ([0.5], [1], 0)
PER_CHANNEL_IN = ([0.1, 0.2, 0.3], [0, 0, 0], 3)                       # 3 scales along x's channel axis
PER_CHANNEL_OUT = ([0.01 * (k + 1) for k in range(12)], [0] * 12, 1)   # 12 scales along y's axis 1


def _reshape_model(x_q, y_q) -> bytes:
    """int8 x [1, 2, 2, 3] -RESHAPE-> int8 y [1, 12]; ``x_q``/``y_q``: (scales, zero_points, axis) or None."""
    return build_model([("x", I8, [1, 2, 2, 3], None, 0, x_q), ("new_shape", I32, [2], None, 1),
                        ("y", I8, [1, 12], None, 0, y_q)],
                       [(B.RESHAPE, None, [0, 1], [2])], [0], [2], [b"", np.array([1, 12], dtype=np.int32).tobytes()])


def _write(tmp_path, name, x_q, y_q):
    path = tmp_path / f"{name}.tflite"
    path.write_bytes(_reshape_model(x_q, y_q))
    return path


def _details(path):
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(path))
    return it.get_input_details()[0], it.get_output_details()[0]


def test_the_interpreter_reports_per_channel_io_as_a_zero_tuple(tmp_path):
    """The premise: the legacy tuple hides per-channel parameters (what the old importer read)."""
    d_in, d_out = _details(_write(tmp_path, "pc", PER_CHANNEL_IN, PER_CHANNEL_OUT))
    for d, (scales, _, axis) in ((d_in, PER_CHANNEL_IN), (d_out, PER_CHANNEL_OUT)):
        assert d["quantization"] == (0.0, 0)
        qp = d["quantization_parameters"]
        assert len(qp["scales"]) == len(scales) and int(qp["quantized_dimension"]) == axis


@pytest.mark.parametrize("where, x_q, y_q, tensor, axis, count", [
    ("input", PER_CHANNEL_IN, PER_TENSOR, "x", 3, 3),
    ("output", PER_TENSOR, PER_CHANNEL_OUT, "y", 1, 12),
])
def test_per_channel_io_is_refused_at_import(tmp_path, where, x_q, y_q, tensor, axis, count):
    model = _write(tmp_path, f"pc_{where}", x_q, y_q)
    out = tmp_path / "art"
    with pytest.raises(er.ArtifactError) as ei:
        import_model(model, out, task="tensors")
    err = ei.value
    assert err.code == ec.IMPORT_IO_PER_CHANNEL == "import_io_per_channel" and err.exit_code == 3
    assert f"{where} tensor '{tensor}'" in err.message
    assert f"{count} scales along axis {axis}" in err.message
    assert "per-tensor quantization on its inputs and outputs" in err.message
    assert err.message.startswith(model.name)
    assert err.details["tensor"] == tensor and err.details["axis"] == axis and err.details["scales"] == count
    assert not out.exists()


def test_cli_import_refuses_per_channel_input_with_exit_3(tmp_path):
    """``edge-infer import`` with the default task: x [1, 2, 2, 3] would pass for an NHWC image."""
    model = _write(tmp_path, "pc_cli", PER_CHANNEL_IN, PER_TENSOR)
    res = CliRunner().invoke(main, ["import", str(model), "-o", str(tmp_path / "art"), "--json"])
    assert res.exit_code == 3, res.output
    err = json.loads(res.stdout.strip().splitlines()[-1])["error"]
    assert err["type"] == "ArtifactError" and err["code"] == "import_io_per_channel"
    assert "input tensor 'x'" in err["message"] and "3 scales along axis 3" in err["message"]
    assert not (tmp_path / "art").exists()


def test_per_tensor_model_still_imports_and_dequantizes(tmp_path):
    model = _write(tmp_path, "pt", PER_TENSOR, PER_TENSOR)
    man = import_model(model, tmp_path / "art", task="tensors")
    bucket = man["variants"][0]["buckets"][0]
    assert bucket["inputs"][0]["quantization"] == {"scale": 0.5, "zero_point": 1}
    assert bucket["outputs"][0]["quantization"] == {"scale": 0.5, "zero_point": 1}
    with er.load(tmp_path / "art") as rt:
        q = np.arange(12, dtype=np.int8).reshape(1, 2, 2, 3)
        res = rt.infer({"x": q})
        np.testing.assert_array_equal(res.outputs["y"], (q.reshape(1, 12).astype(np.float32) - 1) * 0.5)


def test_integer_io_without_quantization_imports_as_before(tmp_path):
    man = import_model(_write(tmp_path, "none", None, None), tmp_path / "art", task="tensors")
    bucket = man["variants"][0]["buckets"][0]
    assert "quantization" not in bucket["inputs"][0] and "quantization" not in bucket["outputs"][0]


def test_spec_reads_a_single_scale_from_quantization_parameters():
    """One scale recorded as before, whether it comes in the tuple or only in ``quantization_parameters``."""
    base = {"name": "t", "dtype": np.int8, "shape": np.array([1, 4])}
    one = {"scales": np.array([0.25], np.float32), "zero_points": np.array([-3], np.int32), "quantized_dimension": 0}
    want = {"scale": 0.25, "zero_point": -3}
    assert _spec({**base, "quantization": (0.25, -3), "quantization_parameters": one})["quantization"] == want
    assert _spec({**base, "quantization": (0.0, 0), "quantization_parameters": one})["quantization"] == want
    assert _spec({**base, "quantization": (0.25, -3)})["quantization"] == want
    assert "quantization" not in _spec({**base, "quantization": (0.0, 0)})
