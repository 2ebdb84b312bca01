"""The gRPC front end of ``edge-infer serve`` (KServe v2 ``inference.GRPCInferenceService``),
driven by the real ``tritonclient.grpc``.

The wire layer against a scripted core in-process: every RPC, raw and typed
tensors, every error mapping, the token, the message cap, and tritonclient's
generated classes beside ours in one process -- about 5 s. The real server on
real artifacts is ``test_serve_grpc_real.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("grpc")
tg = pytest.importorskip("tritonclient.grpc")

import grpc  # noqa: E402
from grpc_harness import FakeCore, LoopServer  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from edge_runtime import serve_proto as sp  # noqa: E402
from edge_runtime.serve_grpc import ERROR_CODE_KEY, join_bytes, split_bytes  # noqa: E402
from edge_runtime.serve_types import GRPC_STATUS, ServeError  # noqa: E402

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def fake():
    core = FakeCore()
    srv = LoopServer(core)
    yield srv
    srv.close()


@pytest.fixture
def core(fake):
    c = fake.core
    c.live, c.ready, c.fail, c.delay_s = True, True, None, 0.0
    c.requests.clear()
    c.rejections.clear()
    c.cancelled = c.finished = 0
    return c


@pytest.fixture
def client(fake):
    c = tg.InferenceServerClient(fake.target)
    yield c
    c.close()


def raw_rpc(target: str, method: str, **channel_kw):
    ch = grpc.insecure_channel(target, **channel_kw)
    req_name, resp_name = sp.METHODS[method]
    return ch, ch.unary_unary(sp.method_path(method), request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=sp.message_class(resp_name).FromString)


def rpc_error(target: str, method: str, msg, metadata=None) -> grpc.RpcError:
    ch, call = raw_rpc(target, method)
    try:
        with pytest.raises(grpc.RpcError) as ei:
            call(msg, metadata=metadata, timeout=10)
        return ei.value
    finally:
        ch.close()


def infer_request(**kw):
    return sp.message_class("ModelInferRequest")(model_name="echo", **kw)


# -- the message classes -----------------------------------------------------------------------------

def _signature(d):
    fields = {f.name: (f.number, f.type, f.is_repeated, f.message_type.full_name if f.message_type else "",
                       f.containing_oneof.name if f.containing_oneof else "") for f in d.fields}
    return fields, {n.name: _signature(n) for n in d.nested_types}, d.GetOptions().map_entry


def test_messages_match_tritonclient_and_live_beside_it():
    """Our private-pool classes and tritonclient's generated ones, in one process, same wire."""
    from tritonclient.grpc import service_pb2

    for name in sp._MESSAGES:
        ours = sp.message_class(name).DESCRIPTOR
        theirs = service_pb2.DESCRIPTOR.message_types_by_name[name.split(".")[0]]
        for part in name.split(".")[1:]:
            theirs = theirs.nested_types_by_name[part]
        assert ours.full_name == theirs.full_name
        assert _signature(ours) == _signature(theirs), name
        assert ours.file.pool is not theirs.file.pool
    theirs_svc = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for m in sp.service_descriptor().methods:
        t = theirs_svc.methods_by_name[m.name]
        assert (m.input_type.full_name, m.output_type.full_name) == (t.input_type.full_name, t.output_type.full_name)
    # bytes written by one parse in the other
    msg = infer_request(id="r", raw_input_contents=[b"\x01\x00"])
    msg.parameters["timeout"].int64_param = 7
    msg.inputs.add(name="x", datatype="INT16", shape=[1])
    back = service_pb2.ModelInferRequest.FromString(msg.SerializeToString())
    assert back.parameters["timeout"].int64_param == 7 and back.inputs[0].datatype == "INT16"
    assert sp.message_class("ModelInferRequest").FromString(back.SerializeToString()) == msg


def test_bytes_framing():
    items = [b"", b"abc", "wörld".encode()]
    assert split_bytes(join_bytes(items), 3, "x") == items
    for bad, n in ((b"\x05\x00\x00\x00ab", 1), (b"\x01\x00", 1), (join_bytes([b"a", b"b"]), 1),
                   (join_bytes([b"a"]), 2)):
        with pytest.raises(ServeError) as ei:
            split_bytes(bad, n, "x")
        assert ei.value.status == "bad_request"


# -- every RPC through tritonclient.grpc -------------------------------------------------------------

def test_health_and_metadata(client, core):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("echo") and client.is_model_ready("echo", "1")
    md = client.get_server_metadata(as_json=True)
    assert md["name"] == "edge-runtime" and md["extensions"] == ["binary_tensor_data"]
    mm = client.get_model_metadata("echo", as_json=True)
    assert mm["versions"] == ["1"] and mm["platform"] == "fake"
    assert mm["inputs"] == [{"name": "x", "datatype": "BYTES", "shape": ["-1"]}]
    assert mm["outputs"][0]["shape"] == ["-1", "2"]
    core.ready = False
    assert not client.is_server_ready() and not client.is_model_ready("echo")
    core.live = False
    assert not client.is_server_live()


def _inputs():
    texts = np.array([b"hello", "wörld".encode(), b""], dtype=object)
    a = tg.InferInput("text", [3], "BYTES")
    a.set_data_from_numpy(texts)
    f = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = tg.InferInput("f", [2, 3], "FP32")
    b.set_data_from_numpy(f)
    h = np.array([[1.5, -2]], dtype=np.float16)
    c = tg.InferInput("h", [1, 2], "FP16")
    c.set_data_from_numpy(h)
    u = np.array([0, 255], dtype=np.uint8)
    d = tg.InferInput("u", [2], "UINT8")
    d.set_data_from_numpy(u)
    return [a, b, c, d], (texts, f, h, u)


def _check_echo(res, core, arrays):
    texts, f, h, u = arrays
    assert list(res.as_numpy("text_out")) == list(texts)
    np.testing.assert_array_equal(res.as_numpy("f_out"), f)
    np.testing.assert_array_equal(res.as_numpy("h_out"), h)
    np.testing.assert_array_equal(res.as_numpy("u_out"), u)
    resp = res.get_response(as_json=True)
    p = {k: list(v.values())[0] for k, v in resp["parameters"].items()}
    assert p["prediction"] == "ok" and p["n"] in (4, "4") and p["score"] == 0.25 and p["flag"] is True
    assert json.loads(p["top_k"]) == [{"index": 1, "score": 0.5}]
    req = core.requests[-1]
    assert req.model == "echo" and req.received_bytes > 0
    assert [t.name for t in req.inputs] == ["text", "f", "h", "u"]
    assert req.inputs[0].data == list(texts)


def test_infer_raw_tensors(client, core):
    inputs, arrays = _inputs()
    res = client.infer("echo", inputs, model_version="1", request_id="r-1", timeout=250_000,
                       outputs=[tg.InferRequestedOutput("f_out")])
    assert res.get_response().id == "r-1"
    req = core.requests[-1]
    assert req.version == "1" and req.id == "r-1" and req.outputs == ["f_out"]
    assert req.parameters["timeout"] == 250_000          # tritonclient's unit (µs), passed through as is
    _check_echo(res, core, arrays)


def test_async_infer(client, core):
    inputs, arrays = _inputs()
    done = []
    client.async_infer("echo", inputs, callback=lambda result, error: done.append((result, error)))
    import time

    end = time.monotonic() + 10
    while not done and time.monotonic() < end:
        time.sleep(0.01)
    result, error = done[0]
    assert error is None
    _check_echo(result, core, arrays)


def test_typed_contents(fake, core):
    msg = infer_request()
    t = msg.inputs.add(name="i", datatype="INT32", shape=[2, 2])
    t.contents.int_contents.extend([1, -2, 3, 4])
    s = msg.inputs.add(name="s", datatype="BYTES", shape=[1])
    s.contents.bytes_contents.append(b"text")
    s.parameters["lang"].string_param = "en"
    ch, call = raw_rpc(fake.target, "ModelInfer")
    resp = call(msg, timeout=10)
    ch.close()
    req = core.requests[-1]
    np.testing.assert_array_equal(req.inputs[0].data, [[1, -2], [3, 4]])
    assert req.inputs[0].data.dtype == np.int32
    assert req.inputs[1].data == [b"text"] and req.inputs[1].parameters == {"lang": "en"}
    assert [o.name for o in resp.outputs] == ["i_out", "s_out"]
    assert np.frombuffer(resp.raw_output_contents[0], "<i4").tolist() == [1, -2, 3, 4]


# -- errors: status, message, and the code in trailing metadata ---------------------------------------

@pytest.mark.parametrize("status", sorted(GRPC_STATUS))
def test_every_serve_error_maps(fake, core, client, status):
    core.fail = ServeError(status, f"refused: {status}", f"code_{status}")
    err = rpc_error(fake.target, "ModelInfer", infer_request())
    assert err.code() == grpc.StatusCode[GRPC_STATUS[status]]
    assert err.details() == f"refused: {status}"
    assert dict(err.trailing_metadata())[ERROR_CODE_KEY] == f"code_{status}"
    with pytest.raises(InferenceServerException) as ei:        # and tritonclient reads the same status
        client.infer("echo", _inputs()[0])
    assert ei.value.status() == f"StatusCode.{GRPC_STATUS[status]}"
    core.fail = None
    assert client.infer("echo", _inputs()[0]).as_numpy("f_out") is not None   # still serving


def test_named_mappings_through_tritonclient(client, core):
    cases = [("overloaded", "RESOURCE_EXHAUSTED"), ("unavailable", "UNAVAILABLE"), ("timeout", "DEADLINE_EXCEEDED"),
             ("bad_request", "INVALID_ARGUMENT")]
    for status, code in cases:
        core.fail = ServeError(status, status, "c")
        with pytest.raises(InferenceServerException, match=code):
            client.infer("echo", _inputs()[0])
    core.fail = None
    for call in (lambda: client.is_model_ready("nope"), lambda: client.get_model_metadata("nope"),
                 lambda: client.infer("nope", _inputs()[0]), lambda: client.is_model_ready("echo", "9")):
        with pytest.raises(InferenceServerException) as ei:
            call()
        assert ei.value.status() == "StatusCode.NOT_FOUND"


def test_unexpected_exception_is_internal_with_code(fake, core):
    core.fail = RuntimeError("boom")
    err = rpc_error(fake.target, "ModelInfer", infer_request())
    assert err.code() == grpc.StatusCode.INTERNAL and "boom" in err.details()
    assert dict(err.trailing_metadata())[ERROR_CODE_KEY] == "unexpected"


def test_client_deadline(client, core):
    core.delay_s = 1.0
    with pytest.raises(InferenceServerException) as ei:
        client.infer("echo", _inputs()[0], client_timeout=0.2)
    assert ei.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    import time

    end = time.monotonic() + 15     # the abandoned request runs to its end: never cancelled mid-run
    while core.finished < len(core.requests) and time.monotonic() < end:
        time.sleep(0.02)
    assert core.cancelled == 0 and core.finished == len(core.requests) == 1
    core.delay_s = 0.0
    # the call's deadline reaches the core as the timeout parameter (µs) when none is given
    # (grpc's timeout header rounds: 200,115 µs was seen for a 0.2 s client deadline)
    assert 0 < core.requests[-1].parameters["timeout"] <= 201_000
    client.infer("echo", _inputs()[0], client_timeout=5, timeout=1234)
    assert core.requests[-1].parameters["timeout"] == 1234
    client.infer("echo", _inputs()[0])
    assert "timeout" not in core.requests[-1].parameters


def _malformed():
    def raw_count():
        m = infer_request(raw_input_contents=[b"ab", b"cd"])
        m.inputs.add(name="x", datatype="UINT8", shape=[2])
        return m

    def size_mismatch():
        m = infer_request(raw_input_contents=[b"abc"])
        m.inputs.add(name="x", datatype="FP32", shape=[1])
        return m

    def unknown_dtype():
        m = infer_request(raw_input_contents=[b"abcd"])
        m.inputs.add(name="x", datatype="COMPLEX64", shape=[1])
        return m

    def negative_shape():
        m = infer_request(raw_input_contents=[b""])
        m.inputs.add(name="x", datatype="FP32", shape=[-1])
        return m

    def huge_shape():
        m = infer_request(raw_input_contents=[b"abcd"])
        m.inputs.add(name="x", datatype="FP32", shape=[2 ** 40, 2 ** 40])
        return m

    def contents_count():
        m = infer_request()
        m.inputs.add(name="x", datatype="FP32", shape=[3]).contents.fp32_contents.extend([1.0])
        return m

    def fp16_contents():
        m = infer_request()
        m.inputs.add(name="x", datatype="FP16", shape=[1])
        return m

    def bytes_framing():
        m = infer_request(raw_input_contents=[b"\xff\xff\xff\x7fab"])
        m.inputs.add(name="x", datatype="BYTES", shape=[1])
        return m

    return [raw_count, size_mismatch, unknown_dtype, negative_shape, huge_shape, contents_count, fp16_contents,
            bytes_framing]


@pytest.mark.parametrize("build", _malformed(), ids=lambda f: f.__name__)
def test_malformed_infer_is_invalid_argument(fake, core, build):
    err = rpc_error(fake.target, "ModelInfer", build())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert dict(err.trailing_metadata())[ERROR_CODE_KEY] == "serve_request_malformed"
    assert not core.requests and core.rejections == ["malformed"], (core.requests, core.rejections)


def test_unparsable_message_is_invalid_argument(fake, core):
    ch = grpc.insecure_channel(fake.target)
    call = ch.unary_unary(sp.method_path("ModelInfer"))     # raw bytes in, raw bytes out
    with pytest.raises(grpc.RpcError) as ei:
        call(b"\x0a\xff\xff\xff\xff\x0f", timeout=10)
    ch.close()
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_other_rpcs_are_unimplemented(fake):
    ch = grpc.insecure_channel(fake.target)
    for method in ("ModelConfig", "ModelStatistics", "RepositoryIndex"):
        with pytest.raises(grpc.RpcError) as ei:
            ch.unary_unary(f"/{sp.SERVICE_FULL_NAME}/{method}")(b"", timeout=10)
        assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED
    ch.close()


# -- the token and the message cap (their own servers) ----------------------------------------------

def test_token():
    core = FakeCore()
    srv = LoopServer(core, token=TOKEN)
    try:
        c = tg.InferenceServerClient(srv.target)
        assert c.is_server_live() and c.is_server_ready()          # probes need no token
        for headers in (None, {"authorization": "Bearer wrong"}, {"authorization": TOKEN}):
            with pytest.raises(InferenceServerException) as ei:
                c.infer("echo", _inputs()[0], headers=headers)
            assert ei.value.status() == "StatusCode.UNAUTHENTICATED"
            with pytest.raises(InferenceServerException):
                c.get_model_metadata("echo", headers=headers)
        assert not core.requests and core.rejections.count("unauthorized") == 6
        ok = {"authorization": f"Bearer {TOKEN}"}
        assert c.is_model_ready("echo", headers=ok)
        assert c.infer("echo", _inputs()[0], headers=ok).as_numpy("u_out").tolist() == [0, 255]
        err = rpc_error(srv.target, "ModelInfer", infer_request())
        assert dict(err.trailing_metadata())[ERROR_CODE_KEY] == "serve_unauthorized"
        c.close()
    finally:
        srv.close()


@pytest.mark.parametrize("how", ["core", "argument"])
def test_message_cap(how):
    """The cap is the core's body cap (``core.max_body_bytes``, as the CLI starts it) or the argument."""
    core = FakeCore()
    if how == "core":
        core.max_body_bytes = 64 * 1024
        srv = LoopServer(core)
    else:
        srv = LoopServer(core, max_message_bytes=64 * 1024)
    try:
        c = tg.InferenceServerClient(srv.target)
        big = tg.InferInput("x", [100_000], "UINT8")
        big.set_data_from_numpy(np.zeros(100_000, np.uint8))
        with pytest.raises(InferenceServerException) as ei:
            c.infer("echo", [big])
        assert ei.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        small = tg.InferInput("x", [1000], "UINT8")
        small.set_data_from_numpy(np.ones(1000, np.uint8))
        assert c.infer("echo", [small]).as_numpy("x_out").sum() == 1000
        assert len(core.requests) == 1
        c.close()
    finally:
        srv.close()
