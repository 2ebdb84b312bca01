"""Static .tflite inspection, the Edge TPU compatibility report and ``edge-infer check``.

Real models come from ../shared/data (coral/, tflm/; skipped when absent);
small synthetic models, built here with the ``tflite`` flatbuffer builders,
cover what those lack: a float graph, constants stored by Buffer.offset/size,
Flex ops, >3 non-unit dims, CPU boundary ops, parameters over on-chip memory.
"""

import json
import random

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import shared

pytest.importorskip("tflite")
from tflite.BuiltinOperator import BuiltinOperator as B  # noqa: E402

from edge_runtime.cli_check import check  # noqa: E402
from edge_runtime.converters.edgetpu_report import ON_CHIP_BYTES, edgetpu_report  # noqa: E402
from edge_runtime.converters.tflite_inspect import inspect_tflite  # noqa: E402
from edge_runtime.errors import ArtifactError  # noqa: E402
from tflite_builder import F32, I8, I32, U8, build_model  # noqa: E402


def _float_fc(offset_buffers=False):
    w = np.arange(8, dtype=np.float32).reshape(2, 4)
    return build_model([("x", F32, [1, 4], None, 0), ("w", F32, [2, 4], None, 1), ("y", F32, [1, 2], None, 0)],
                       [(B.FULLY_CONNECTED, None, [0, 1, -1], [2])], [0], [2], [b"", w.tobytes()],
                       offset_buffers=offset_buffers)


def _ops(ins):
    return [o["op"] for o in ins["subgraphs"][0]["operators"]]


# --- real models -------------------------------------------------------------------------------------------

def test_mobilenet_v2_quant_inspection():
    path = shared("coral", "mobilenet_v2_1.0_224_quant.tflite")
    ins = inspect_tflite(path)
    s = ins["summary"]
    assert ins["subgraph_count"] == 1 and s["op_count"] == 66
    assert s["op_counts"] == {"ADD": 10, "AVERAGE_POOL_2D": 1, "CONV_2D": 36, "DEPTHWISE_CONV_2D": 17,
                              "RESHAPE": 1, "SOFTMAX": 1}
    ops = _ops(ins)
    assert ops[:3] == ["CONV_2D", "DEPTHWISE_CONV_2D", "CONV_2D"] and ops[-2:] == ["RESHAPE", "SOFTMAX"]
    (inp,), (out,) = ins["subgraphs"][0]["inputs"], ins["subgraphs"][0]["outputs"]
    assert (inp["name"], inp["dtype"], inp["shape"], inp["dynamic"]) == ("input", "uint8", [1, 224, 224, 3], False)
    assert inp["quantization"] == {"scale": [0.0078125], "zero_point": [128]}
    assert (out["dtype"], out["shape"], out["quantization"]["zero_point"]) == ("uint8", [1, 1001], [0])
    assert s["activation_dtypes"] == ["uint8"] and s["constant_dtypes"] == ["int32", "uint8"]
    assert s["all_int8"] and not s["dynamic"] and not s["custom_ops"] and not s["flex_ops"]
    assert not s["edgetpu_compiled"]
    assert s["parameter_bytes"] == 3_543_276  # weights (uint8) + biases (int32), stored inline
    conv = ins["subgraphs"][0]["operators"][0]
    assert [t["dtype"] for t in conv["inputs"]] == ["uint8", "uint8", "int32"]
    assert [t["constant"] for t in conv["inputs"]] == [False, True, True]
    assert conv["inputs"][1]["shape"] == [32, 3, 3, 3] and conv["outputs"][0]["shape"] == [1, 112, 112, 32]


def test_op_names_and_io_agree_with_the_litert_interpreter():
    interp_mod = pytest.importorskip("ai_edge_litert.interpreter")
    for parts in (("coral", "mobilenet_v2_1.0_224_quant.tflite"), ("coral", "keras_lstm_mnist_ptq.tflite"),
                  ("tflm", "micro_speech_quantized.tflite"), ("coral", "deeplabv3_mnv2_dm05_pascal_quant.tflite")):
        path = shared(*parts)
        ins = inspect_tflite(path)
        interp = interp_mod.Interpreter(model_path=str(path))
        assert _ops(ins) == [o["op_name"] for o in interp._get_ops_details()], parts
        ours = ins["subgraphs"][0]["inputs"][0]
        theirs = interp.get_input_details()[0]
        assert (ours["dtype"], ours["shape"]) == (np.dtype(theirs["dtype"]).name, list(theirs["shape"]))


def test_mobilenet_v2_quant_is_fully_edgetpu_mappable():
    rep = edgetpu_report(inspect_tflite(shared("coral", "mobilenet_v2_1.0_224_quant.tflite")))
    assert rep["fully_mappable"] and rep["first_unsupported"] is None
    assert (rep["tpu_ops"], rep["cpu_ops"], rep["boundary_ops"]) == (66, 0, 0)
    assert rep["split"]["CONV_2D"] == {"tpu": 36, "cpu": 0}
    assert rep["tpu_parameter_bytes"] == 3_543_276 < ON_CHIP_BYTES and not rep["exceeds_on_chip_memory"]
    assert rep["verdict"].startswith("fully mappable: all 66")


@pytest.mark.parametrize("source, compiled, n_ops", [
    ("mobilenet_v1_0.25_128_quant.tflite", "mobilenet_v1_0.25_128_quant_edgetpu.tflite", 31),
    ("keras_lstm_mnist_ptq.tflite", "keras_lstm_mnist_ptq_edgetpu.tflite", 6),
    ("tools/split_concat.tflite", "tools/split_concat_edgetpu.tflite", 3),
])
def test_report_agrees_with_coral_compiled_twins(source, compiled, n_ops):
    """Coral's compiler turned each source model into one edgetpu-custom-op: the static report must say all map."""
    src = edgetpu_report(inspect_tflite(shared("coral", *source.split("/"))))
    assert src["fully_mappable"] and (src["tpu_ops"], src["cpu_ops"]) == (n_ops, 0)
    ins = inspect_tflite(shared("coral", *compiled.split("/")))
    assert ins["summary"]["edgetpu_compiled"] and _ops(ins) == ["edgetpu-custom-op"]
    assert ins["summary"]["custom_ops"] == ["edgetpu-custom-op"] and ins["summary"]["custom_payload_bytes"] > 10_000
    rep = edgetpu_report(ins)
    assert rep["edgetpu_compiled"] and rep["fully_mappable"] and (rep["tpu_ops"], rep["cpu_ops"]) == (1, 0)
    assert rep["verdict"].startswith("already compiled for the Edge TPU")


def test_invalid_model_custom_op_is_unsupported():
    ins = inspect_tflite(shared("coral", "invalid_models", "model_invoking_error.tflite"))
    assert _ops(ins) == ["fake-op-double"] and ins["summary"]["custom_ops"] == ["fake-op-double"]
    assert not ins["summary"]["edgetpu_compiled"] and not ins["summary"]["all_int8"]
    sg = ins["subgraphs"][0]
    assert [(t["dtype"], t["shape"]) for t in sg["inputs"] + sg["outputs"]] == [("uint8", [1, 3]), ("float32", [])]
    rep = edgetpu_report(ins)
    assert rep["first_unsupported"] == {"index": 0, "op": "fake-op-double",
                                        "reason": "custom op 'fake-op-double' is not an Edge TPU op"}
    assert (rep["tpu_ops"], rep["cpu_ops"], rep["fully_mappable"]) == (0, 1, False)
    assert rep["verdict"].startswith("not mappable")


def test_keras_lstm_has_int16_state_but_maps():
    ins = inspect_tflite(shared("coral", "keras_lstm_mnist_ptq.tflite"))
    assert _ops(ins) == ["QUANTIZE", "UNIDIRECTIONAL_SEQUENCE_LSTM", "RESHAPE", "FULLY_CONNECTED", "SOFTMAX",
                         "QUANTIZE"]
    s = ins["summary"]
    assert s["activation_dtypes"] == ["int16", "int8", "uint8"] and s["constant_dtypes"] == ["int32", "int8"]
    assert not s["all_int8"]  # the LSTM cell state is an int16 variable tensor
    assert [(t["dtype"], t["variable"]) for t in s["non_int8_tensors"]] == [("int16", True)]
    assert s["parameter_bytes"] == 9808
    lstm = ins["subgraphs"][0]["operators"][1]
    assert lstm["outputs"][0]["shape"] == [1, 28, 20] and lstm["inputs"][0]["dtype"] == "int8"
    rep = edgetpu_report(ins)
    assert rep["fully_mappable"] and rep["split"]["UNIDIRECTIONAL_SEQUENCE_LSTM"] == {"tpu": 1, "cpu": 0}


def test_person_detect_int8_with_quantization_tflite_rejects():
    path = shared("tflm", "person_detect.tflite")
    ins = inspect_tflite(path)
    s = ins["summary"]
    assert s["op_counts"] == {"AVERAGE_POOL_2D": 1, "CONV_2D": 14, "DEPTHWISE_CONV_2D": 14, "RESHAPE": 1,
                              "SOFTMAX": 1}
    inp = ins["subgraphs"][0]["inputs"][0]
    assert (inp["dtype"], inp["shape"], inp["quantization"]["zero_point"]) == ("int8", [1, 96, 96, 1], [-1])
    assert s["all_int8"] and s["activation_dtypes"] == ["int8"] and s["parameter_bytes"] == 218_928
    # per-channel biases carry quantized_dimension 3 at rank 1: the TFLite loader refuses the file
    errs = s["quantization_errors"]
    assert len(errs) == 14 and errs[0]["reason"] == "quantized_dimension 3 is outside rank 1"
    rep = edgetpu_report(ins)
    assert not rep["fully_mappable"] and rep["tpu_ops"] == 0 and rep["verdict"].startswith("not compilable")
    interp_mod = pytest.importorskip("ai_edge_litert.interpreter")
    with pytest.raises(ValueError, match="quantized_dimension"):
        interp_mod.Interpreter(model_path=str(path))
    for other in (("coral", "mobilenet_v2_1.0_224_quant.tflite"), ("tflm", "mobilenet_v2_quantized_1x3x224x224.tflite")):
        assert inspect_tflite(shared(*other))["summary"]["quantization_errors"] == []  # per-channel, valid


def test_hello_world_dynamic_batch_blocks_the_edgetpu():
    ins = inspect_tflite(shared("tflm", "hello_world_int8.tflite"))
    s = ins["summary"]
    assert s["op_counts"] == {"FULLY_CONNECTED": 3} and s["all_int8"] and s["dynamic"]
    inp = ins["subgraphs"][0]["inputs"][0]
    assert (inp["shape"], inp["shape_signature"], inp["dynamic_dims"]) == ([1, 1], [-1, 1], [0])
    rep = edgetpu_report(ins)
    f = rep["first_unsupported"]
    assert (f["index"], f["op"]) == (0, "FULLY_CONNECTED") and "dynamic dims" in f["reason"]
    assert (rep["tpu_ops"], rep["cpu_ops"]) == (0, 3)


def test_deeplab_argmax_splits_the_graph():
    ins = inspect_tflite(shared("coral", "deeplabv3_mnv2_dm05_pascal_quant.tflite"))
    assert ins["subgraphs"][0]["outputs"][0]["dtype"] == "int64" and not ins["summary"]["all_int8"]
    rep = edgetpu_report(ins)
    assert rep["first_unsupported"]["index"] == 71 and rep["first_unsupported"]["op"] == "ARG_MAX"
    assert (rep["tpu_ops"], rep["cpu_ops"], rep["fully_mappable"]) == (71, 1, False)
    assert rep["verdict"].startswith("partially mappable: 71 of 72")


def test_int16_keyword_model_is_not_mappable():
    rep = edgetpu_report(inspect_tflite(shared("tflm", "keyword_scrambled_8bit.tflite")))
    f = rep["first_unsupported"]
    assert (f["index"], f["op"]) == (0, "QUANTIZE") and "int16" in f["reason"] and rep["tpu_ops"] == 0


# --- synthetic models ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("offset_buffers", [False, True])
def test_float_model_and_offset_stored_constants(offset_buffers):
    model = _float_fc(offset_buffers)
    ins = inspect_tflite(model)
    s = ins["summary"]
    assert s["parameter_bytes"] == 32  # 2x4 float32 weights, inline or after the flatbuffer
    assert s["activation_dtypes"] == ["float32"] and s["constant_dtypes"] == ["float32"] and not s["all_int8"]
    rep = edgetpu_report(ins)
    assert rep["first_unsupported"]["op"] == "FULLY_CONNECTED" and "float32" in rep["first_unsupported"]["reason"]
    interp_mod = pytest.importorskip("ai_edge_litert.interpreter")
    interp = interp_mod.Interpreter(model_content=model)  # the synthetic file is a real, runnable model
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], np.ones((1, 4), np.float32))
    interp.invoke()
    assert interp.get_tensor(interp.get_output_details()[0]["index"]).tolist() == [[6.0, 22.0]]


def test_offset_buffer_past_end_of_file_is_rejected():
    model = _float_fc(offset_buffers=True)
    with pytest.raises(ArtifactError, match="past the end"):
        inspect_tflite(model[:-16])


def test_boundary_ops_and_split_after_first_unsupported():
    t = [("x", F32, [1, 8], None, 0), ("q", I8, [1, 8], None, 0), ("a", I8, [1, 8], None, 0),
         ("sq", I8, [1, 8], None, 0), ("r", I8, [1, 8], None, 0), ("y", F32, [1, 8], None, 0)]
    ops = [(B.QUANTIZE, None, [0], [1]), (B.ADD, None, [1, 1], [2]), (B.SQUARE, None, [2], [3]),
           (B.RELU, None, [3], [4]), (B.DEQUANTIZE, None, [4], [5])]
    rep = edgetpu_report(inspect_tflite(build_model(t, ops, [0], [5], [b""])))
    assert [(o["op"], o["placement"]) for o in rep["operators"]] == [
        ("QUANTIZE", "cpu"), ("ADD", "tpu"), ("SQUARE", "cpu"), ("RELU", "cpu"), ("DEQUANTIZE", "cpu")]
    assert rep["first_unsupported"] == {"index": 2, "op": "SQUARE",
                                        "reason": "op type SQUARE is not supported by the Edge TPU"}
    assert "after the first unsupported op #2" in rep["operators"][3]["reason"]
    assert (rep["tpu_ops"], rep["cpu_ops"], rep["boundary_ops"]) == (1, 4, 2)
    # without SQUARE, float I/O conversion alone does not stop the model from being fully mappable
    ops2 = [(B.QUANTIZE, None, [0], [1]), (B.ADD, None, [1, 1], [2]), (B.DEQUANTIZE, None, [2], [5])]
    rep2 = edgetpu_report(inspect_tflite(build_model(t, ops2, [0], [5], [b""])))
    assert rep2["fully_mappable"] and (rep2["tpu_ops"], rep2["boundary_ops"]) == (1, 2)


def test_flex_op_and_outer_dims():
    t = [("x", I8, [2, 1, 4, 4, 3], None, 0), ("y", I8, [2, 1, 4, 4, 3], None, 0), ("z", I8, [1, 2, 2, 3], None, 0)]
    ins = inspect_tflite(build_model(t, [(B.CUSTOM, "FlexErf", [0], [1])], [0], [1], [b""]))
    assert ins["summary"]["flex_ops"] == ["FlexErf"] and ins["summary"]["custom_ops"] == []
    assert "Flex" in edgetpu_report(ins)["first_unsupported"]["reason"]
    rep = edgetpu_report(inspect_tflite(build_model(t, [(B.RELU, None, [0], [1])], [0], [1], [b""])))
    assert "only the 3 innermost dimensions" in rep["first_unsupported"]["reason"]
    ok = edgetpu_report(inspect_tflite(build_model(t, [(B.RELU, None, [2], [2])], [2], [2], [b""])))
    assert ok["fully_mappable"]  # [1, 2, 2, 3]: the outer dimension is 1


def test_parameters_over_on_chip_memory_are_flagged():
    n_out, n_in = 2304, 4096  # 9 MiB of int8 weights, stored by offset
    t = [("x", I8, [1, n_in], None, 0), ("w", I8, [n_out, n_in], None, 1), ("y", I8, [1, n_out], None, 0)]
    model = build_model(t, [(B.FULLY_CONNECTED, None, [0, 1, -1], [2])], [0], [2],
                        [b"", bytes(n_out * n_in)], offset_buffers=True)
    rep = edgetpu_report(inspect_tflite(model))
    assert rep["fully_mappable"] and rep["tpu_parameter_bytes"] == 9 * 1024 * 1024
    assert rep["exceeds_on_chip_memory"] and "streamed from host" in rep["warnings"][0]


# --- hostile input ----------------------------------------------------------------------------------------

def test_garbage_and_truncated_files_raise_artifact_error(tmp_path):
    real = shared("coral", "mobilenet_v2_1.0_224_quant.tflite").read_bytes()
    cases = [b"", b"TFL3", b"\0\0\0\0TFL3", random.Random(0).randbytes(4096), b"\x10\0\0\0TFL3" + b"\xff" * 64,
             real[:100], real[: len(real) // 2], real[:1000]]
    for data in cases:
        with pytest.raises(ArtifactError) as exc:
            inspect_tflite(data)
        assert exc.value.code in ("artifact_not_tflite", "artifact_corrupt")
    bmp = shared("coral", "cat.bmp")
    with pytest.raises(ArtifactError, match="no TFL3"):
        inspect_tflite(bmp)
    with pytest.raises(ArtifactError) as exc:
        inspect_tflite(tmp_path / "missing.tflite")
    assert exc.value.code == "artifact_missing"
    with pytest.raises(ArtifactError) as exc:
        inspect_tflite(tmp_path)  # a directory: there, but not a model file
    assert exc.value.code == "artifact_file_invalid"


def test_aliased_vectors_cannot_amplify_work():
    t = [("x", I8, [1, 8], None, 0), ("y", I8, [1, 8], None, 0)]
    model = build_model(t, [(B.ADD, None, [0] * 4096, [1])] * 2000, [0], [1], [b""], alias=True)
    assert len(model) < 100_000  # 2000 ops x 4096 inputs = 8M references from one shared vector
    with pytest.raises(ArtifactError, match="aliased"):
        inspect_tflite(model)


def test_size_cap(monkeypatch):
    import edge_runtime.converters.tflite_inspect as ti

    monkeypatch.setattr(ti, "MAX_FILE_BYTES", 1000)
    with pytest.raises(ArtifactError) as exc:
        ti.inspect_tflite(shared("tflm", "hello_world_int8.tflite"))
    assert exc.value.code == "artifact_too_large"


def test_mutated_models_never_leak_untyped_errors():
    base = shared("tflm", "hello_world_int8.tflite").read_bytes()
    rng, parsed = random.Random(7), 0
    for i in range(1500):
        b = bytearray(base)
        if i % 5 == 0:
            b = b[: rng.randrange(len(b))]
        else:
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(8, len(b))] = rng.randrange(256)
        try:
            edgetpu_report(inspect_tflite(bytes(b)))
            parsed += 1
        except ArtifactError:
            pass
    assert 0 < parsed < 1500


# --- edge-infer check -------------------------------------------------------------------------------------

def test_cli_check_edgetpu_exit_codes(tmp_path):
    runner = CliRunner()
    res = runner.invoke(check, ["--target", "edgetpu", str(shared("coral", "mobilenet_v2_1.0_224_quant.tflite"))])
    assert res.exit_code == 0, res.output
    assert "CONV_2D" in res.output and "first unsupported: none" in res.output
    assert "verdict: fully mappable: all 66" in res.output
    res = runner.invoke(check, ["--target", "edgetpu", str(shared("coral", "deeplabv3_mnv2_dm05_pascal_quant.tflite"))])
    assert res.exit_code == 1 and "first unsupported: #71 ARG_MAX" in res.output
    assert "split: 71 op(s) on the Edge TPU, 1 on the CPU" in res.output
    junk = tmp_path / "junk.tflite"
    junk.write_bytes(b"\0\0\0\0TFL3" + b"\xff" * 100)
    res = runner.invoke(check, ["--target", "edgetpu", str(junk)])
    assert res.exit_code == 3 and "artifact_corrupt" in res.output
    res = runner.invoke(check, [str(tmp_path / "absent.tflite")])
    assert res.exit_code == 3 and "artifact_missing" in res.output


def test_cli_check_json_and_tflite_int8():
    runner = CliRunner()
    bad = shared("coral", "invalid_models", "model_invoking_error.tflite")
    res = runner.invoke(check, ["--target", "edgetpu", str(bad), "--json"])
    assert res.exit_code == 1
    out = json.loads(res.output)
    assert out["report"]["first_unsupported"]["op"] == "fake-op-double" and out["summary"]["custom_ops"]
    res = runner.invoke(check, ["--target", "tflite-int8", str(shared("tflm", "hello_world_int8.tflite"))])
    assert res.exit_code == 0 and "all-int8: yes" in res.output and "dynamic dims" in res.output
    res = runner.invoke(check, ["--target", "tflite-int8", str(shared("coral", "keras_lstm_mnist_ptq.tflite"))])
    assert res.exit_code == 1 and "all-int8: no (e.g. variable state tfl.pseudo_qconst1 is int16)" in res.output
    res = runner.invoke(check, ["--target", "tflite-int8", "--json", str(shared("tflm", "person_detect.tflite"))])
    summary = json.loads(res.output)["inspection"]["summary"]
    assert res.exit_code == 1 and summary["all_int8"] is True and summary["quantization_errors"]
    res = runner.invoke(check, ["--target", "tflite-int8", str(shared("tflm", "micro_speech_quantized.tflite"))])
    assert res.exit_code == 0 and "all-int8: yes" in res.output
