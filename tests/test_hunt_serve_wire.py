"""Open Inference Protocol wire decoding, hunted for wrong answers (2026-12-07, h21).

Requests a real client may send that were answered wrongly (a 200 with changed values, or an
untyped 500 / gRPC INTERNAL) and are now a typed 400 / INVALID_ARGUMENT
``serve_request_malformed``:

1. JSON FP16/FP32/FP64 data past the datatype's range (FP16 ``1e5``, FP32 ``1e300``) was taken
   as infinity, silently;
2. a shape numpy cannot hold even empty (a 0 beside huge dimensions; more than 64 dimensions
   over HTTP) raised ``ValueError`` in the decoder: a 500 / INTERNAL;
3. gRPC typed contents out of range for a narrow datatype (``int_contents`` 300 for INT8,
   ``uint_contents`` 70000 for UINT16) raised numpy's ``OverflowError``: INTERNAL;
4. gRPC data given both in ``contents`` and ``raw_input_contents``: the contents were dropped
   silently (Triton refuses it); data in another datatype's contents field, likewise;
5. binary BOOL bytes other than 0 / 1 (HTTP binary extension, gRPC raw) became a numpy bool
   holding that byte, fed to the model as is.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from edge_runtime import serve_proto as sp
from edge_runtime.serve_grpc_wire import to_request
from edge_runtime.serve_types import ServeError
from edge_runtime.serve_wire import decode_request

MALFORMED = "serve_request_malformed"


def _http(doc: dict, binary: bytes = b""):
    head = json.dumps(doc).encode()
    return decode_request(head + binary, str(len(head)) if binary else None, "m", None)[0]


def _json_input(datatype: str, shape: list, data) -> dict:
    return {"inputs": [{"name": "x", "datatype": datatype, "shape": shape, "data": data}]}


def _refused(call, *args, match: str = "") -> ServeError:
    with pytest.raises(ServeError) as ei:
        call(*args)
    err = ei.value
    assert err.status == "bad_request" and err.code == MALFORMED, (err.status, err.code, err.message)
    assert match in err.message, err.message
    return err


def _grpc(**kw):
    return sp.message_class("ModelInferRequest")(model_name="m", **kw)


# -- 1. JSON floats past the datatype's range ---------------------------------------------------------

@pytest.mark.parametrize("datatype,value", [("FP16", 1e5), ("FP16", -70000), ("FP32", 1e300), ("FP32", -3.5e38)])
def test_json_float_past_its_datatype_is_refused_not_infinity(datatype, value):
    _refused(_http, _json_input(datatype, [2], [1.5, value]), match=f"values outside {datatype}")
    # the edges of the range still decode, exactly
    t = _http(_json_input("FP16", [3], [65504, -65504, 0.5])).inputs[0]
    assert t.data.dtype == np.float16 and t.data.tolist() == [65504.0, -65504.0, 0.5]
    t = _http(_json_input("FP32", [2, 1], [[3.4e38], [1]])).inputs[0]
    assert t.data.dtype == np.float32 and np.isfinite(t.data).all() and t.data.shape == (2, 1)


# -- 2. shapes numpy cannot hold ----------------------------------------------------------------------

def test_http_shape_with_a_zero_and_huge_dims_is_a_400_not_a_500():
    _refused(_http, _json_input("FP32", [0, 2 ** 62, 2 ** 62], []), match="too large")
    _refused(_http, {"inputs": [{"name": "x", "datatype": "UINT8", "shape": [0, 2 ** 62, 2 ** 62],
                                 "parameters": {"binary_data_size": 0}}]}, match="too large")
    assert _http(_json_input("FP32", [0, 3], [])).inputs[0].data.shape == (0, 3)     # one numpy holds: as before


def test_http_shape_of_too_many_dims_is_a_400_not_a_500():
    _refused(_http, _json_input("FP32", [1] * 70, [1.0]), match="dimensions")
    _refused(_http, {"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1] * 70,
                                 "parameters": {"binary_data_size": 1}}]}, b"\x01", match="dimensions")


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "contents"])
def test_grpc_shape_with_a_zero_and_huge_dims_is_invalid_argument_not_internal(raw):
    m = _grpc(raw_input_contents=[b""] if raw else [])
    m.inputs.add(name="x", datatype="FP32", shape=[0, 2 ** 62, 2 ** 62])
    _refused(to_request, m, 0, match="too large")
    m = _grpc(raw_input_contents=[b""] if raw else [])
    m.inputs.add(name="x", datatype="FP32", shape=[0, 3])
    assert to_request(m, 0).inputs[0].data.shape == (0, 3)       # one numpy holds: as before


# -- 3. gRPC typed contents out of a narrow datatype's range ------------------------------------------

@pytest.mark.parametrize("datatype,field,value", [
    ("INT8", "int_contents", 300), ("INT8", "int_contents", -129), ("INT16", "int_contents", 40000),
    ("UINT8", "uint_contents", 256), ("UINT16", "uint_contents", 70000)])
def test_grpc_contents_out_of_range_is_invalid_argument_not_internal(datatype, field, value):
    m = _grpc()
    getattr(m.inputs.add(name="x", datatype=datatype, shape=[2]).contents, field).extend([1, value])
    _refused(to_request, m, 0, match=f"values outside {datatype}")
    # the range's edges decode exactly
    m = _grpc()
    m.inputs.add(name="a", datatype="INT8", shape=[2]).contents.int_contents.extend([-128, 127])
    m.inputs.add(name="b", datatype="UINT16", shape=[2]).contents.uint_contents.extend([0, 65535])
    a, b = to_request(m, 0).inputs
    assert a.data.dtype == np.int8 and a.data.tolist() == [-128, 127]
    assert b.data.dtype == np.uint16 and b.data.tolist() == [0, 65535]


def test_grpc_contents_out_of_range_over_the_wire_is_invalid_argument():
    """Through the gRPC front end (scripted core): before, INTERNAL with ``unexpected``."""
    pytest.importorskip("grpc")
    import grpc
    from grpc_harness import FakeCore, LoopServer

    from edge_runtime.serve_grpc import ERROR_CODE_KEY

    srv = LoopServer(FakeCore())
    try:
        ch = grpc.insecure_channel(srv.target)
        call = ch.unary_unary(sp.method_path("ModelInfer"), request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=sp.message_class("ModelInferResponse").FromString)
        m = sp.message_class("ModelInferRequest")(model_name="echo")
        m.inputs.add(name="x", datatype="INT8", shape=[1]).contents.int_contents.append(300)
        with pytest.raises(grpc.RpcError) as ei:
            call(m, timeout=10)
        ch.close()
    finally:
        srv.close()
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value.details()
    assert dict(ei.value.trailing_metadata())[ERROR_CODE_KEY] == MALFORMED


# -- 4. gRPC data in two places -------------------------------------------------------------------------

def test_grpc_contents_and_raw_input_contents_together_are_refused():
    m = _grpc(raw_input_contents=[np.float32(1.0).tobytes()])
    m.inputs.add(name="x", datatype="FP32", shape=[1]).contents.fp32_contents.append(7.0)
    _refused(to_request, m, 0, match="both contents and raw_input_contents")
    m = _grpc(raw_input_contents=[np.float32(2.5).tobytes()])
    t = m.inputs.add(name="x", datatype="FP32", shape=[1])
    t.contents.SetInParent()            # present, empty: no data in two places
    assert to_request(m, 0).inputs[0].data.tolist() == [2.5]


def test_grpc_data_in_another_datatypes_contents_field_is_refused():
    m = _grpc()
    t = m.inputs.add(name="x", datatype="FP32", shape=[1])
    t.contents.fp32_contents.append(7.0)
    t.contents.int_contents.append(3)
    _refused(to_request, m, 0, match="int_contents")


# -- 5. binary BOOL bytes other than 0 / 1 ------------------------------------------------------------

def test_http_binary_bool_byte_other_than_0_or_1_is_refused():
    doc = {"inputs": [{"name": "x", "datatype": "BOOL", "shape": [2], "parameters": {"binary_data_size": 2}}]}
    _refused(_http, doc, b"\x02\x01", match="BOOL")
    assert _http(doc, b"\x00\x01").inputs[0].data.tolist() == [False, True]


def test_grpc_raw_bool_byte_other_than_0_or_1_is_refused():
    m = _grpc(raw_input_contents=[b"\x01\xff"])
    m.inputs.add(name="x", datatype="BOOL", shape=[2])
    _refused(to_request, m, 0, match="BOOL")
    m = _grpc(raw_input_contents=[b"\x01\x00"])
    m.inputs.add(name="x", datatype="BOOL", shape=[2])
    assert to_request(m, 0).inputs[0].data.tolist() == [True, False]
