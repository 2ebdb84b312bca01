"""``edge-infer serve`` keeps to the Open Inference Protocol where it was lenient (2026-12 bug hunt):

1. an input name the model does not declare is refused (400 / INVALID_ARGUMENT,
   ``serve_request_malformed``, naming the model's inputs), for text, image and tensors models,
   as Triton refuses it;
2. JSON ``data`` is flat (row-major) or nested exactly as ``shape``; any other nesting with the
   right element count is refused (flat data is taken without a pass over its elements);
3. every 405 carries ``Allow`` (RFC 9110), on the Starlette paths too;
4. a request the HTTP front end answers before the core (bad JSON, a bad
   Inference-Header-Content-Length, a body over the cap, no token, ...) is in
   ``edge_serve_requests_total`` once, with its status, and its bytes in
   ``edge_serve_received_bytes_total``; so is a malformed gRPC ModelInfer.

The HTTP front end is driven in-process (ASGI calls on ``create_app``'s endpoint, no socket);
gRPC on 127.0.0.1 with a free port, stopped after each test. The models are the tiny
fake-backend artifacts of ``factories``: no real model runs.
"""

from __future__ import annotations

import asyncio
import json
import re

import numpy as np
import pytest

from edge_runtime import error_codes as ec
from edge_runtime.serve_types import InferRequest, ServeError, Tensor

TOKEN = "s3cret-token"


@pytest.fixture
def core_of(make_artifact):
    """An in-process ``ServeCore`` of a tiny artifact of ``task``, loaded unless ``load=False`` (the gRPC
    harness loads it in its own loop); closed after the test."""
    from edge_runtime.serve_core import ServeCore

    made = []

    def build(task: str, load: bool = True):
        c = ServeCore([make_artifact(task)], verify=False)
        if load:
            c.load_all()
        made.append(c)
        return c

    yield build
    for c in made:
        c.close()


def _name(core) -> str:
    (m,) = core.models.values()
    return m.name


def _png(side: int = 8) -> bytes:
    from factories import png_bytes

    return png_bytes(np.arange(side * side, dtype=np.uint8).reshape(side, side))


def _infer(core, *reqs) -> list:
    """Each request's response or ServeError, in one event loop."""
    async def run():
        return await asyncio.gather(*(core.infer(r) for r in reqs), return_exceptions=True)
    return asyncio.run(run())


# -- 1: input names --------------------------------------------------------------------------------
def _one_input(task: str, name: str) -> Tensor:
    if task == "text-classification":
        return Tensor(name, "BYTES", [1], [b"good movie"])
    return Tensor(name, "BYTES", [1], [_png()])


@pytest.mark.parametrize("task, want", [("text-classification", "text"), ("image-classification", "image")])
def test_an_undeclared_input_name_is_refused_for_text_and_image_models(core_of, task, want):
    core = core_of(task)
    model = _name(core)
    good, bad = _infer(core, InferRequest(model, None, [_one_input(task, want)]),
                       InferRequest(model, None, [_one_input(task, "foo")]))
    assert not isinstance(good, BaseException), good
    assert isinstance(bad, ServeError), bad
    assert (bad.status, bad.code) == ("bad_request", ec.SERVE_REQUEST_MALFORMED), bad
    assert "'foo'" in bad.message and repr(want) in bad.message, bad.message
    meta = core.model_metadata(model, None)
    assert [i["name"] for i in meta["inputs"]] == [want]          # the name refused for is the one published


def test_an_undeclared_input_name_is_refused_for_a_tensors_model(core_of):
    core = core_of("tensors")
    model = _name(core)
    x = Tensor("x", "FP32", [1, 4], np.ones((1, 4), np.float32))
    k = Tensor("k", "INT32", [1, 2], np.ones((1, 2), np.int32))
    z = Tensor("z", "FP32", [1, 4], np.ones((1, 4), np.float32))
    good, extra, renamed = _infer(core, InferRequest(model, None, [x, k]), InferRequest(model, None, [x, k, z]),
                                  InferRequest(model, None, [z, k]))
    assert not isinstance(good, BaseException), good
    for bad in (extra, renamed):
        assert isinstance(bad, ServeError) and (bad.status, bad.code) == ("bad_request", ec.SERVE_REQUEST_MALFORMED), bad
        assert "'z'" in bad.message and "'x'" in bad.message and "'k'" in bad.message, bad.message


def test_an_undeclared_input_name_over_http_is_a_400(core_of):
    core = core_of("image-classification")
    app = _app(core)
    body = json.dumps({"inputs": [{"name": "foo", "datatype": "UINT8", "shape": [8, 8], "data": [0] * 64}]}).encode()
    status, _, raw = _asgi(app, "POST", f"/v2/models/{_name(core)}/infer", body)
    assert status == 400 and json.loads(raw)["code"] == ec.SERVE_REQUEST_MALFORMED, raw
    assert "'image'" in json.loads(raw)["error"], raw


def test_an_undeclared_input_name_over_grpc_is_invalid_argument(core_of):
    grpc = pytest.importorskip("grpc")
    from grpc_harness import LoopServer

    from edge_runtime import serve_proto as sp
    from edge_runtime.serve_grpc import ERROR_CODE_KEY, join_bytes

    core = core_of("text-classification", load=False)
    srv = LoopServer(core)
    ch = grpc.insecure_channel(srv.target)
    try:
        call = ch.unary_unary(sp.method_path("ModelInfer"), request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=sp.message_class("ModelInferResponse").FromString)
        for name, ok in (("text", True), ("foo", False)):
            msg = sp.message_class("ModelInferRequest")(model_name=_name(core))
            msg.inputs.add(name=name, datatype="BYTES", shape=[1])
            msg.raw_input_contents.append(join_bytes([b"good movie"]))
            if ok:
                assert call(msg, timeout=20).outputs
                continue
            with pytest.raises(grpc.RpcError) as e:
                call(msg, timeout=20)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
            assert dict(e.value.trailing_metadata())[ERROR_CODE_KEY] == ec.SERVE_REQUEST_MALFORMED
            assert "'text'" in e.value.details(), e.value.details()
    finally:
        ch.close()
        srv.close()


# -- 2: JSON data nested as the shape, or flat ----------------------------------------------------
def _decode(shape, data, datatype="INT32"):
    from edge_runtime.serve_wire import decode_request

    doc = {"inputs": [{"name": "x", "datatype": datatype, "shape": shape, "data": data}]}
    return decode_request(json.dumps(doc).encode(), None, "m", None)[0].inputs[0]


@pytest.mark.parametrize("shape, data", [
    ([2, 2], [[1, 2, 3], [4]]), ([2, 2], [[[1, 2, 3, 4]]]), ([2, 2], [[1, 2, 3, 4]]), ([2, 2], [[1], [2], [3], [4]]),
    ([4, 1], [[1, 2], [3, 4]]), ([2, 2], [[1, 2], [[3, 4]]]), ([1, 4], [[[1], [2], [3], [4]]]), ([1], [[5]]),
    ([1], 5), ([], [[5]]), ([2, 2], [[1, 2], 3, 4]),
])
def test_data_nested_otherwise_than_the_shape_is_refused(shape, data):
    with pytest.raises(ServeError) as e:
        _decode(shape, data)
    assert (e.value.status, e.value.code) == ("bad_request", ec.SERVE_REQUEST_MALFORMED), e.value


@pytest.mark.parametrize("shape, nested", [
    ([2, 2], [[1, 2], [3, 4]]), ([4, 1], [[1], [2], [3], [4]]), ([1, 4], [[1, 2, 3, 4]]),
    ([2, 1, 2], [[[1, 2]], [[3, 4]]]), ([4], [1, 2, 3, 4]),
])
def test_flat_data_and_data_nested_as_the_shape_both_work(shape, nested):
    flat = np.asarray(nested).ravel().tolist()
    a, b = _decode(shape, flat), _decode(shape, nested)
    np.testing.assert_array_equal(a.data, b.data)
    assert list(a.data.shape) == shape and a.data.ravel().tolist() == flat
    assert _decode([], 7).data.tolist() == 7 == _decode([], [7]).data.tolist()     # a 0-d tensor: bare or [x]
    assert _decode([2, 0], []).data.shape == (2, 0) == _decode([2, 0], [[], []]).data.shape
    assert _decode([2, 1], [["a"], ["b"]], "BYTES").data == [b"a", b"b"]


def test_flat_data_costs_no_pass_over_its_elements():
    """The shape check is a few ``len`` calls per nesting level: flat data comes back as it is (a
    3x224x224 image's 150,528 values: no Python step per element); nested data is flattened with
    ``list.extend``, one call per inner list."""
    from edge_runtime.serve_wire import _flat

    shape = [3, 224, 224]
    flat = list(range(3 * 224 * 224))
    assert _flat("x", shape, len(flat), flat) is flat
    nested = np.arange(len(flat)).reshape(shape).tolist()
    assert _flat("x", shape, len(flat), nested) == flat


def test_misnested_data_over_http_is_a_400(core_of):
    core = core_of("image-classification")
    app = _app(core)
    url = f"/v2/models/{_name(core)}/infer"
    rows = [[0] * 8 for _ in range(8)]
    for data, want in ((rows, 200), ([x for r in rows for x in r], 200), ([[0] * 64], 400), ([[0] * 7] * 8 + [[0] * 8], 400)):
        body = json.dumps({"inputs": [{"name": "image", "datatype": "UINT8", "shape": [8, 8], "data": data}]}).encode()
        status, _, raw = _asgi(app, "POST", url, body)
        assert status == want, (status, raw[:300])
        if want == 400:
            assert json.loads(raw)["code"] == ec.SERVE_REQUEST_MALFORMED


# -- 3: Allow on every 405 --------------------------------------------------------------------------
@pytest.mark.parametrize("method, path, allow", [
    ("POST", "/v2", {"GET", "HEAD"}), ("DELETE", "/v2/health/live", {"GET", "HEAD"}),
    ("PUT", "/v2/health/ready", {"GET", "HEAD"}), ("POST", "/v2/models/m", {"GET", "HEAD"}),
    ("POST", "/v2/models/m/versions/1", {"GET", "HEAD"}), ("POST", "/v2/models/m/ready", {"GET", "HEAD"}),
    ("PATCH", "/metrics", {"GET", "HEAD"}), ("GET", "/v2/models/m/infer", {"POST"}),
    ("PUT", "/v2/models/m/versions/1/infer", {"POST"}),
])
def test_every_405_names_the_allowed_methods(core_of, method, path, allow):
    app = _app(core_of("text-classification"))
    status, headers, raw = _asgi(app, method, path)
    assert status == 405, (status, raw[:200])
    assert {m.strip() for m in headers.get("allow", "").split(",") if m.strip()} == allow, headers
    assert json.loads(raw)["code"] == ec.SERVE_REQUEST_MALFORMED


# -- 4: requests answered before the core are counted -----------------------------------------------
def _counts(core) -> tuple[dict, int]:
    """(edge_serve_requests_total per (model, status), edge_serve_received_bytes_total) from /metrics."""
    text = core.metrics_text()
    reqs = {(m, s): int(v) for m, s, v in re.findall(
        r'^edge_serve_requests_total\{model="([^"]*)",status="([^"]*)"\} (\d+)$', text, re.M)}
    (received,) = re.findall(r"^edge_serve_received_bytes_total (\d+)$", text, re.M)
    return reqs, int(received)


def test_requests_refused_before_the_core_are_counted_with_status_and_bytes(core_of):
    core = core_of("image-classification")
    model = _name(core)
    app = _app(core, token=TOKEN)
    url = f"/v2/models/{model}/infer"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    good = json.dumps({"inputs": [{"name": "image", "datatype": "UINT8", "shape": [8, 8], "data": [0] * 64}]}).encode()
    cases = [   # (body, headers, status code, status label, bytes counted)
        (b"{not json", auth, 400, "bad_request", 9),
        (good, {**auth, "Inference-Header-Content-Length": "x"}, 400, "bad_request", len(good)),
        (good, {**auth, "Inference-Header-Content-Length": str(len(good) + 5)}, 400, "bad_request", len(good)),
        (b'{"inputs": 3}', auth, 400, "bad_request", 13),
        (good, {**auth, "Content-Length": str(core.max_body_bytes + 1)}, 413, "too_large", 0),
        (good, {}, 401, "unauthorized", 0),
        (good, {**auth, "Content-Length": "ten"}, 400, "bad_request", 0),
    ]
    before, bytes0 = _counts(core)
    for body, headers, code, label, nbytes in cases:
        status, _, raw = _asgi(app, "POST", url, body, headers)
        assert status == code, (headers, status, raw[:300])
        after, bytes1 = _counts(core)
        delta = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
        assert delta == {(model, label): 1}, (headers, body[:40], delta)
        assert bytes1 - bytes0 == nbytes, (headers, bytes1 - bytes0, nbytes)
        before, bytes0 = after, bytes1
    status, _, _ = _asgi(app, "GET", url, b"", auth)                       # 405 on the infer path
    after, _ = _counts(core)
    assert status == 405 and after.get((model, "method_not_allowed"), 0) == 1, after
    # a core-level refusal (an undeclared input name) and a success: still counted once each
    bad_name = good.replace(b'"image"', b'"foo"')
    for body, label in ((bad_name, "bad_request"), (good, "ok")):
        before, bytes0 = _counts(core)
        _asgi(app, "POST", url, body, auth)
        after, bytes1 = _counts(core)
        assert after[(model, label)] - before.get((model, label), 0) == 1 and sum(after.values()) - sum(
            before.values()) == 1, (label, before, after)
        assert bytes1 - bytes0 == len(body)
    # an unknown model's refusal before the core: no label a client made up
    _asgi(app, "POST", "/v2/models/made-up/infer", b"{not json", auth)
    assert _counts(core)[0].get(("", "bad_request"), 0) == 1


def test_a_malformed_grpc_infer_is_counted_with_its_bytes(core_of):
    grpc = pytest.importorskip("grpc")
    from grpc_harness import LoopServer

    from edge_runtime import serve_proto as sp

    core = core_of("text-classification", load=False)
    srv = LoopServer(core)
    model = _name(core)
    ch = grpc.insecure_channel(srv.target)
    try:
        msg = sp.message_class("ModelInferRequest")(model_name=model)
        msg.inputs.add(name="text", datatype="BYTES", shape=[1])
        msg.raw_input_contents.extend([b"\x01\x00\x00\x00a", b"extra"])     # two raw contents for one input
        before, bytes0 = _counts(core)
        with pytest.raises(grpc.RpcError) as e:
            ch.unary_unary(sp.method_path("ModelInfer"), request_serializer=lambda m: m.SerializeToString())(
                msg, timeout=20)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        after, bytes1 = _counts(core)
        assert after.get((model, "bad_request"), 0) - before.get((model, "bad_request"), 0) == 1, after
        assert bytes1 - bytes0 == msg.ByteSize()
        with pytest.raises(grpc.RpcError):                                   # not a message at all
            ch.unary_unary(sp.method_path("ModelInfer"))(b"\xff\xff\xff", timeout=20)
        assert _counts(core)[0].get(("", "bad_request"), 0) == 1
        assert _counts(core)[1] - bytes1 == 3
    finally:
        ch.close()
        srv.close()


# -- the in-process HTTP front end ------------------------------------------------------------------
def _app(core, token=None):
    pytest.importorskip("starlette")
    from edge_runtime.serve_http import create_app

    return create_app(core, token=token, read_timeout_s=5.0)


def _asgi(app, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> tuple[int, dict, bytes]:
    """One HTTP request through the ASGI app in a fresh event loop: (status, headers, body)."""
    headers = dict(headers or {})
    if body and not any(k.lower() == "content-length" for k in headers):
        headers["Content-Length"] = str(len(body))

    async def run():
        pending = [{"type": "http.request", "body": body, "more_body": False}]
        sent: list[dict] = []

        async def receive():
            if pending:
                return pending.pop(0)
            await asyncio.sleep(3600)          # a client that stays: never a disconnect mid-request

        async def send(msg):
            sent.append(msg)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
                 "headers": [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in headers.items()],
                 "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 40000)}
        await asyncio.wait_for(app(scope, receive, send), 30)
        start = next(m for m in sent if m["type"] == "http.response.start")
        out = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, out

    return asyncio.run(run())
