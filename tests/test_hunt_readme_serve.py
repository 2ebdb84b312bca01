"""README's "Serving: ``edge-infer serve``" against the server, as a client reads it: the defects found.

- a tensors model's text (BYTES) output: over HTTP, JSON and binary, a ``[N, K]`` one went out as the
  memory of numpy's object rows (pointers) with a 200; gRPC answered right. Now every BYTES output is a
  flat list of bytes before any wire sees it, and the three wires agree (read back by tritonclient);
- a BYTES element that is not UTF-8 went out in JSON altered (decoded with U+FFFD replacement) with a
  200: now a typed 400 that asks for ``binary_data``, and the binary form carries it unchanged;
- a tensors output that a device returns in a narrower type than the manifest declares (Core ML's
  float16 for float32, int32 for int64: the output contract accepts both) came back in that type while
  the metadata said the declared one: now the declared datatype, where it holds every value exactly;
- a request for a model that runs on the event loop measured its items (``task.request_bytes``) once
  per check on its way, two or three times a request: now once.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from edge_runtime import error_codes as ec
from edge_runtime.serve_output_kinds import tensors_outputs
from edge_runtime.serve_outputs import ServedOutputs
from edge_runtime.serve_types import InferRequest, InferResponse, ServeError, Tensor
from edge_runtime.serve_wire import encode_response


class _Result:
    """What a tensors model's result holds for the server: its outputs by name."""

    def __init__(self, **outputs):
        self.outputs = outputs


def _served(*declared) -> ServedOutputs:
    return ServedOutputs(tensors_outputs(list(declared)))


def _texts_response() -> tuple[InferResponse, list[list[str]]]:
    """Two items of a model whose output ``names`` is declared [1, 2]: texts, one of them not ASCII."""
    rows = [["ab", "c"], ["d", "é"]]
    results = [_Result(names=np.array([row], dtype=object)) for row in rows]
    outs = _served(("names", "BYTES", [1, 2])).build(results, ["names"])
    return InferResponse("m", "1", outs), rows


# -- 1: a tensors model's BYTES output on every wire -------------------------------------------------
def test_a_2d_text_output_goes_out_as_its_texts_over_json():
    resp, rows = _texts_response()
    body, json_len = encode_response(resp, False, {})
    assert json_len is None
    (out,) = json.loads(body)["outputs"]
    assert out["datatype"] == "BYTES" and out["shape"] == [2, 2]
    assert out["data"] == [s for row in rows for s in row]      # before: 2 strings of pointer bytes


def test_a_2d_text_output_goes_out_as_its_texts_in_binary_as_tritonclient_reads_it():
    th = pytest.importorskip("tritonclient.http")
    resp, rows = _texts_response()
    body, json_len = encode_response(resp, True, {})
    got = th.InferResult.from_response_body(body, header_length=json_len).as_numpy("names")
    assert got.shape == (2, 2)
    assert got.tolist() == [[s.encode() for s in row] for row in rows]


def test_grpc_and_http_binary_carry_the_same_bytes_for_a_text_output():
    pytest.importorskip("grpc")
    from edge_runtime.serve_grpc_wire import to_message

    resp, rows = _texts_response()
    body, json_len = encode_response(resp, True, {})
    msg = to_message(resp)
    assert list(msg.outputs[0].shape) == [2, 2]
    assert msg.raw_output_contents[0] == body[json_len:]


def test_a_str_array_output_is_bytes_too():
    results = [_Result(names=np.array([["x", "yz"]]))]          # numpy '<U2', not object
    (t,) = _served(("names", "BYTES", [1, 2])).build(results, ["names"])
    assert t.datatype == "BYTES" and t.shape == [1, 2] and t.data == [b"x", b"yz"]


def test_a_non_utf8_text_output_is_refused_in_json_and_carried_in_binary():
    results = [_Result(blob=np.array([b"\xff\xfe"], dtype=object))]
    outs = _served(("blob", "BYTES", [1])).build(results, ["blob"])
    resp = InferResponse("m", "1", outs)
    with pytest.raises(ServeError) as exc:                       # before: "\ufffd\ufffd" with a 200
        encode_response(resp, False, {})
    assert exc.value.status == "bad_request" and exc.value.code == ec.SERVE_REQUEST_MALFORMED
    assert "binary_data" in exc.value.message
    body, json_len = encode_response(resp, False, {"blob": True})
    assert body[json_len:] == b"\x02\x00\x00\x00\xff\xfe"


# -- 2: the answer's datatype is the metadata's ------------------------------------------------------
@pytest.mark.parametrize("declared,got", [("INT64", np.int32), ("FP32", np.float16)])
def test_a_narrower_device_output_is_answered_in_the_declared_datatype(declared, got):
    served = _served(("y", declared, [1, 3]))
    assert served.metadata()[0] == {"name": "y", "datatype": declared, "shape": [-1, 3]}
    results = [_Result(y=np.array([[1, 2, 3]], dtype=got)), _Result(y=np.array([[4, 5, 6]], dtype=got))]
    (t,) = served.build(results, None)
    assert t.datatype == declared and t.shape == [2, 3]        # before: INT32 / FP16
    assert np.asarray(t.data).tolist() == [[1, 2, 3], [4, 5, 6]]
    # float32 where float16 is declared: rounded to the declared FP16 (what the manifest promises)
    (t,) = _served(("y", "FP16", [1, 1])).build([_Result(y=np.array([[0.1]], dtype=np.float32))], None)
    assert t.datatype == "FP16" and np.asarray(t.data).tolist() == [[np.float16(0.1)]]


# -- 3: a request's items are measured once on its way to the event loop ----------------------------
@pytest.fixture
def inline_core(make_artifact):
    from edge_runtime.serve_core import ServeCore
    from edge_runtime.serve_inline import Inline

    core = ServeCore([make_artifact("image-classification")], max_in_flight=2, batch_delay_ms=1)
    core.load_all()
    (m,) = core.models.values()
    m.inline = Inline(0.05, 0)             # a sub-ms model, whatever this busy box measured
    yield core, m
    core.close()


def _count_request_bytes(monkeypatch, rt) -> list[int]:
    calls = [0]
    real = rt.task.request_bytes

    def counted(raw):
        calls[0] += 1
        return real(raw)

    monkeypatch.setattr(rt.task, "request_bytes", counted)
    return calls


@pytest.mark.parametrize("batched", [False, True])
def test_an_inline_request_measures_its_item_once(inline_core, monkeypatch, batched):
    from factories import png_bytes

    core, m = inline_core
    m.batched = batched
    img = png_bytes(np.full((8, 8), 40, dtype=np.uint8))
    calls = _count_request_bytes(monkeypatch, m.rt)
    m.rt.infer(img)
    by_runtime = calls[0]                  # the runtime's own limit check
    calls[0] = 0
    req = InferRequest(m.name, None, [Tensor("image", "BYTES", [1], [img])])
    resp = asyncio.run(core.infer(req))
    assert calls[0] - by_runtime == 1       # before: 2 (3 for a model that batches)
    assert m.inline.calls == 1 and core._batches == 0
    assert resp.outputs[0].data == [m.rt.infer(img).prediction.encode()]


# -- 4: gRPC holds a BYTES input to HTTP's element cap, before splitting it ---------------------------
@pytest.mark.parametrize("typed", [False, True])
def test_grpc_refuses_a_bytes_input_over_the_element_cap_before_splitting_it(monkeypatch, typed):
    pytest.importorskip("grpc")
    from edge_runtime import serve_grpc_wire, serve_proto as sp
    from edge_runtime.serve_wire import MAX_BYTES_ELEMENTS

    n = MAX_BYTES_ELEMENTS + 1
    msg = sp.message_class("ModelInferRequest")(model_name="m")
    t = msg.inputs.add(name="text", datatype="BYTES", shape=[n])
    if typed:
        t.contents.bytes_contents.extend([b""] * n)
    else:
        msg.raw_input_contents.append(b"\x00\x00\x00\x00" * n)     # n empty elements: 256 KiB

    def no_split(*a):
        raise AssertionError("split before the cap was checked")

    monkeypatch.setattr(serve_grpc_wire, "split_bytes", no_split)
    with pytest.raises(ServeError) as exc:     # before: split one by one on the event loop (an 8 MiB message:
        serve_grpc_wire.to_request(msg, msg.ByteSize())    # 2M elements, seconds), then the runtime's 413
    assert exc.value.status == "bad_request" and exc.value.code == ec.SERVE_REQUEST_MALFORMED
    assert f"{n} BYTES elements" in exc.value.message


# -- 5: an answer HTTP JSON cannot carry is counted as what it was answered --------------------------
def test_a_json_refusal_after_the_model_ran_is_counted_as_a_400_not_ok(make_artifact, monkeypatch):
    from edge_runtime.serve_core import ServeCore
    from edge_runtime.serve_http_infer import InferEndpoint

    core = ServeCore([make_artifact("tensors")], inline=False)
    try:
        core.load_all()
        (m,) = core.models.values()
        real = m.rt.infer(m.rt.task.bucket_samples(m.rt.limits)[0])

        class Texty:            # the model's result, its output a text that is not UTF-8
            outputs = {"y": np.array([[b"\xff", b"a", b"b"]], dtype=object)}
            device, target, trace_id, truncated = real.device, real.target, real.trace_id, False

        monkeypatch.setattr(m.rt, "infer", lambda raw, **kw: Texty())
        body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0, 1, 2, 3]},
                                      {"name": "k", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}]}).encode()
        sent: list = []

        async def receive():
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(msg):
            sent.append(msg)

        scope = {"type": "http", "method": "POST", "path": f"/v2/models/{m.name}/infer",
                 "headers": [(b"content-length", str(len(body)).encode())]}
        asyncio.run(InferEndpoint(core, None, token=None, read_timeout_s=5)(scope, receive, send))
        assert sent[0]["status"] == 400
        assert json.loads(sent[1]["body"])["code"] == ec.SERVE_REQUEST_MALFORMED
        metrics = core.metrics_text()
        assert f'edge_serve_requests_total{{model="{m.name}",status="bad_request"}} 1' in metrics
        assert f'edge_serve_requests_total{{model="{m.name}",status="ok"}}' not in metrics   # before: ok 1
    finally:
        core.close()
