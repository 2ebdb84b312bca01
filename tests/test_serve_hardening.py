"""``edge-infer serve`` hardening: the defects of the 2026-12 serve bug hunt, one test each.

- dynamic batching: a request's deadline or size never fails another request merged with it
  (in-process ``ServeCore`` on digits, its batch path switched on: the merging is the core's);
- the httptools head guard counts head bytes only (a large body or many pipelined requests in
  one read are not a 431);
- model readiness and metadata while the models load are 503, not 404;
- a port in use is ``device_unavailable`` (exit 4) for HTTP and gRPC alike;
- ``binary_data_output`` / ``binary_data`` are JSON booleans, nothing else;
- a load error names the artifact folder; a blank token is refused; a 401 names the Bearer
  scheme, whose name is matched in any case.

Every socket and HTTP call has a timeout; servers are started on 127.0.0.1 only and stopped.
"""

from __future__ import annotations

import asyncio
import io
import json
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from serve_proc import ServerProc

from edge_runtime import error_codes as ec
from edge_runtime.errors import InferenceTimeout, InputError
from edge_runtime.serve_types import InferRequest, ServeError, Tensor

from test_serve_http import digit_images  # noqa: E402

TOKEN = "s3cret-token"
MODEL = "digits-cnn"


def _req(images, timeout_us=None) -> InferRequest:
    params = {} if timeout_us is None else {"timeout": timeout_us}
    return InferRequest(MODEL, None, [Tensor("image", "BYTES", [len(images)], list(images))], parameters=params)


# -- 1, 2: dynamic batching keeps each request's own deadline and limits ----------------------------
@pytest.fixture
def bcore(_bcore):
    """Each test its own event loop (asyncio.run): the model's slots are made anew in it."""
    c, m = _bcore
    m.sem, m.pending, m.flush_handle = None, [], None
    yield c, m
    assert m.running == m.waiting == m.batches_out == 0, (m.running, m.waiting, m.batches_out)


@pytest.fixture(scope="module")
def _bcore(digits_artifact):
    """A core whose model batches (as OpenVINO's does): max_in_flight=1, so while one call runs the
    next requests wait together and are merged; inline off (a sub-ms model would skip batching)."""
    from edge_runtime.serve_core import ServeCore

    c = ServeCore([digits_artifact], max_in_flight=1, max_queue=64, batch_delay_ms=5, inline=False)
    c.load_all()
    (m,) = c.models.values()
    m.batched = True
    assert c._batches_on(m) and m.inline is None
    yield c, m
    c.close()


def _gate_first_call(monkeypatch, m) -> threading.Event:
    """The model's one-item call waits for the gate: the first request keeps the model busy."""
    gate = threading.Event()
    real = m.rt.infer

    def gated(raw, **kw):
        gate.wait(10)
        return real(raw, **kw)

    monkeypatch.setattr(m.rt, "infer", gated)
    return gate


async def _settle(*tasks) -> list:
    """Each task's result or exception, within 20 s."""
    return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)


async def _behind_a_busy_model(core, gate, first_images, rest: list) -> list:
    """The first request keeps the model busy (its call waits on ``gate``); the ``rest`` (one image
    list per request) queue behind it and are merged; then the gate opens. Every result or error."""
    first = asyncio.ensure_future(core.infer(_req(first_images)))
    await asyncio.sleep(0.05)
    queued = [asyncio.ensure_future(core.infer(_req(images))) for images in rest]
    await asyncio.sleep(0.05)
    gate.set()
    return await _settle(first, *queued)


def _timed(coro, stamps: dict, key: str):
    async def run():
        try:
            return await coro
        finally:
            stamps[key] = time.perf_counter()
    return asyncio.ensure_future(run())


def test_a_deadline_passed_in_the_queue_fails_only_its_own_request(bcore, monkeypatch):
    core, m = bcore
    img, _ = digit_images(1)
    gate = _gate_first_call(monkeypatch, m)
    stamps: dict = {}

    async def scenario():
        first = asyncio.ensure_future(core.infer(_req(img)))            # runs alone: the model is busy
        await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        a = _timed(core.infer(_req(img)), stamps, "a")                  # the artifact's deadline
        b = _timed(core.infer(_req(img, timeout_us=100_000)), stamps, "b")   # 100 ms
        await asyncio.sleep(0.4)                                         # b's deadline passes queued
        gate.set()
        return t0, await _settle(first, a, b)

    t0, (first, a, b) = asyncio.run(scenario())
    assert not isinstance(first, BaseException), first
    assert not isinstance(a, BaseException), f"a request without a deadline failed: {a!r}"
    assert a.outputs[0].name == "label"
    assert isinstance(b, ServeError) and (b.status, b.code) == ("timeout", ec.INFERENCE_TIMEOUT), b
    assert stamps["b"] - t0 < 0.35, "the short deadline was answered late, not at its own deadline"


def test_a_deadline_passed_mid_batch_fails_only_its_own_request(bcore, monkeypatch):
    """The batch runs under the latest deadline; the short one gets its 504 at its own deadline."""
    core, m = bcore
    img, _ = digit_images(1)
    gate = _gate_first_call(monkeypatch, m)
    real_batch = m.rt.infer_batch
    calls = []

    def slow_batch(items, *, deadline_ms=None, **kw):    # a runtime that honours the deadline it is given
        calls.append(len(items))
        time.sleep(0.8)
        if deadline_ms is not None and deadline_ms < 800:
            return [InferenceTimeout("late", code=ec.INFERENCE_TIMEOUT)] * len(items)
        return real_batch(items, deadline_ms=deadline_ms, **kw)

    monkeypatch.setattr(m.rt, "infer_batch", slow_batch)
    stamps: dict = {}

    async def scenario():
        first = asyncio.ensure_future(core.infer(_req(img)))
        await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        a = _timed(core.infer(_req(img)), stamps, "a")
        b = _timed(core.infer(_req(img, timeout_us=400_000)), stamps, "b")   # 400 ms
        await asyncio.sleep(0.05)
        gate.set()
        return t0, await _settle(first, a, b)

    t0, (first, a, b) = asyncio.run(scenario())
    assert calls == [2], calls                                   # a and b were merged
    assert not isinstance(a, BaseException), f"a request without a deadline failed: {a!r}"
    assert isinstance(b, ServeError) and b.status == "timeout", b
    assert stamps["b"] - t0 < 0.75 < stamps["a"] - t0           # b at its deadline, before the batch ended


def _noise_png(side: int, seed: int) -> bytes:
    from PIL import Image

    arr = np.random.RandomState(seed).randint(0, 256, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def test_merged_batches_stay_within_the_request_byte_limit(bcore, monkeypatch):
    core, m = bcore
    pytest.importorskip("PIL")
    img, _ = digit_images(1)
    big = [_noise_png(500, s) for s in range(5)]                  # ~0.75 MB each: 2 fit in 2 MiB, 5 do not
    monkeypatch.setattr(m.rt, "limits", m.rt.limits.replace(max_request_bytes=2 << 20))   # (image default: 32 MiB)
    limit = m.rt.limits.max_request_bytes
    assert all(limit / 3 < len(b) < limit / 2 for b in big), [len(b) for b in big]
    gate = _gate_first_call(monkeypatch, m)
    real_batch = m.rt.infer_batch
    sizes = []
    monkeypatch.setattr(m.rt, "infer_batch", lambda items, **kw: sizes.append(sum(map(len, items)))
                        or real_batch(items, **kw))

    got = asyncio.run(_behind_a_busy_model(core, gate, img, [[b] for b in big]))
    bad = [r for r in got if isinstance(r, BaseException)]
    assert not bad, bad                                            # no 413 for requests within the limit
    assert sizes and all(s <= limit for s in sizes), sizes
    assert max(sizes) > len(big[0]), sizes                        # still merged, two at a time


def test_a_batch_refused_as_a_whole_is_rerun_one_request_at_a_time(bcore, monkeypatch):
    """Should the runtime refuse a merged batch as a whole, no request gets a refusal it did not cause."""
    core, m = bcore
    img, _ = digit_images(2)
    gate = _gate_first_call(monkeypatch, m)

    def refuse(items, **kw):
        raise InputError("batch refused", code=ec.INPUT_BATCH_TOO_LARGE)

    monkeypatch.setattr(m.rt, "infer_batch", refuse)

    got = asyncio.run(_behind_a_busy_model(core, gate, img[:1], [[x] for x in img]))
    assert not [r for r in got if isinstance(r, BaseException)], got


# -- 3: the httptools head guard, in-process: one read holding a whole request -------------------------
class _Transport:
    """Just enough of an asyncio transport for uvicorn's protocol: what it writes, whether it closed."""

    def __init__(self):
        self.out, self.closed = bytearray(), False

    def write(self, data):
        self.out += data

    def close(self):
        self.closed = True

    def is_closing(self):
        return self.closed

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 1), "sockname": ("127.0.0.1", 2)}.get(name, default)

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass

    def set_write_buffer_limits(self, *a, **k):
        pass

    def get_write_buffer_size(self):
        return 0


def _feed_httptools(chunks: list[bytes], want: int) -> tuple[bytes, bool, int]:
    """Feed ``chunks`` (each one read) to our httptools protocol in front of an app that reads the body
    and answers 200: (what was written back, whether the connection was closed, app calls)."""
    pytest.importorskip("httptools")
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    from edge_runtime.serve_httptools import protocol

    calls = []

    async def app(scope, receive, send):
        more = True
        while more:
            msg = await receive()
            more = msg.get("more_body", False)
        calls.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def run():
        cls = protocol(10.0, 64 * 1024)
        config = Config(app=app, http=cls, lifespan="off", log_level="warning")
        config.load()
        proto = cls(config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop())
        tr = _Transport()
        proto.connection_made(tr)
        for chunk in chunks:
            proto.data_received(chunk)
            await asyncio.sleep(0)
        end = time.monotonic() + 10
        while bytes(tr.out).count(b"HTTP/1.1 ") < want and not tr.closed and time.monotonic() < end:
            await asyncio.sleep(0.005)
        closed = tr.closed
        proto.connection_lost(None)
        return bytes(tr.out), closed, len(calls)

    return asyncio.run(run())


def test_httptools_guard_counts_head_bytes_only_not_a_body_in_the_same_read():
    body = b"x" * 150_000
    req = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 150000\r\n\r\n" + body
    out, closed, calls = _feed_httptools([req], 1)
    assert out.startswith(b"HTTP/1.1 200"), out[:200]
    assert b" 431 " not in out and calls == 1 and not closed


def test_httptools_guard_counts_head_bytes_only_not_pipelined_requests_in_one_read():
    one = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 150 + b"\r\n\r\n"
    n = 400
    out, closed, calls = _feed_httptools([one * n], n)
    assert b" 431 " not in out and not closed, out[-300:]
    assert out.count(b"HTTP/1.1 200") == n and calls == n


def test_httptools_guard_still_refuses_a_head_over_the_cap():
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (40 * 1024)
    out, closed, calls = _feed_httptools([head, b"a" * (40 * 1024)], 1)      # never ends, over 64 KiB
    assert out.startswith(b"HTTP/1.1 431") and closed and calls == 0, out[:200]
    # a request, then a next head in the same read that grows past the cap over later reads (the
    # read in which a head ended is not counted: at most the cap plus one read is held)
    req = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
    out, closed, calls = _feed_httptools([req + head, b"a" * (40 * 1024), b"a" * (40 * 1024)], 2)
    assert out.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 431" in out and closed and calls == 1, out[:400]
    # a whole head over the cap in one read (it ends there): measured when it ends, never dispatched
    big = b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 1000) for i in range(80))
    out, closed, calls = _feed_httptools([big + b"\r\n"], 1)
    assert out.startswith(b"HTTP/1.1 431") and out.count(b"HTTP/1.1 ") == 1 and closed and calls == 0, out[:300]
    out, closed, calls = _feed_httptools([b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (70 * 1024) + b"\r\n\r\n"], 1)
    assert out.startswith(b"HTTP/1.1 431") and calls == 0, out[:300]


# -- 4: readiness and metadata while loading ---------------------------------------------------------
def test_model_ready_and_metadata_while_loading_are_not_ready_not_404(digits_artifact):
    from edge_runtime.serve_core import ServeCore

    c = ServeCore([digits_artifact])
    try:
        assert c.loading and not c.ready
        for name in (MODEL, "nope"):                   # any name may still come while loading
            assert c.model_ready(name, None) is False
            with pytest.raises(ServeError) as e:
                c.model_metadata(name, None)
            assert (e.value.status, e.value.code) == ("unavailable", ec.SERVE_NOT_READY), e.value
        c.load_all()
        assert c.model_ready(MODEL, None) and c.model_metadata(MODEL, "1")["name"] == MODEL
        with pytest.raises(ServeError) as e:           # loaded: an unknown name is final
            c.model_ready("nope", None)
        assert e.value.status == "not_found"
    finally:
        c.close()


# -- 6: binary flags are booleans ------------------------------------------------------------------
@pytest.mark.parametrize("doc_params, out_params", [
    ({"binary_data_output": "false"}, None), ({"binary_data_output": "no"}, None),
    ({"binary_data_output": 0}, None), (None, {"binary_data": "false"}), (None, {"binary_data": 1}),
])
def test_binary_flags_that_are_not_booleans_are_refused(doc_params, out_params):
    from edge_runtime.serve_wire import decode_request

    doc: dict = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}
    if doc_params is not None:
        doc["parameters"] = doc_params
    if out_params is not None:
        doc["outputs"] = [{"name": "label", "parameters": out_params}]
    with pytest.raises(ServeError) as e:
        decode_request(json.dumps(doc).encode(), None, "m", None)
    assert (e.value.status, e.value.code) == ("bad_request", ec.SERVE_REQUEST_MALFORMED)
    assert "true or false" in e.value.message


def test_binary_flags_as_booleans_still_work():
    from edge_runtime.serve_wire import decode_request

    doc = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}],
           "parameters": {"binary_data_output": False},
           "outputs": [{"name": "label", "parameters": {"binary_data": True}}, {"name": "score"}]}
    _, binary_all, named = decode_request(json.dumps(doc).encode(), None, "m", None)
    assert binary_all is False and named == {"label": True}
    doc["parameters"] = {"binary_data_output": True}
    assert decode_request(json.dumps(doc).encode(), None, "m", None)[1] is True


# -- 3, 7: a real server on httptools, with a token --------------------------------------------------
@pytest.fixture(scope="module")
def server(digits_artifact):
    pytest.importorskip("httptools")
    pytest.importorskip("uvicorn")
    with ServerProc(digits_artifact, args=("--http-parser", "httptools"), grpc=_has_grpc(),
                    env={"EDGE_INFER_TOKEN": TOKEN}) as srv:
        assert "http_parser=httptools" in srv.ready_line, srv.ready_line
        yield srv


def _has_grpc() -> bool:
    try:
        import grpc  # noqa: F401
    except ImportError:
        return False
    return True


def _read_responses(s: socket.socket, want: int, timeout: float = 20.0) -> bytes:
    """Read until ``want`` responses (status lines) came, the peer closed, or ``timeout``."""
    s.settimeout(timeout)
    end = time.monotonic() + timeout
    data = b""
    while data.count(b"HTTP/1.1 ") < want and time.monotonic() < end:
        try:
            chunk = s.recv(1 << 20)
        except socket.timeout:
            break
        if not chunk:
            break
        data += chunk
    if data.count(b"HTTP/1.1 ") >= want:             # the last response's body too
        head, _, rest = data.rpartition(b"HTTP/1.1 ")[2].partition(b"\r\n\r\n")
        n = int(next((ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")),
                     b"0"))
        while len(rest) < n and time.monotonic() < end:
            try:
                chunk = s.recv(1 << 20)
            except socket.timeout:
                break
            if not chunk:
                break
            rest += chunk
            data += chunk
    return data


def test_a_large_body_in_one_read_is_not_a_large_head(server):
    """A 150 KB request in one write (one read on the server): 200, never 431."""
    img, labels = digit_images(1)
    framed = struct.pack("<I", len(img[0])) + img[0]
    head_json = json.dumps({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1],
                                        "parameters": {"binary_data_size": len(framed)}}]}).encode()
    head_json += b" " * 150_000                      # JSON allows trailing whitespace
    body = head_json + framed
    req = (f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
           f"Content-Length: {len(body)}\r\nInference-Header-Content-Length: {len(head_json)}\r\n\r\n").encode() + body
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
        s.sendall(req)
        data = _read_responses(s, 1)
    assert data.startswith(b"HTTP/1.1 200"), data[:300]
    assert labels[0].encode() in data


def test_many_pipelined_requests_in_one_read_are_not_a_large_head(server):
    n = 400
    one = (b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 150 + b"\r\n\r\n")
    assert n * len(one) > 64 * 1024
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
        s.sendall(one * n)
        data = _read_responses(s, n)
    assert b" 431 " not in data, data[-400:]
    assert data.count(b"HTTP/1.1 200") == n, data.count(b"HTTP/1.1 ")


def test_an_oversized_head_is_still_refused(server):
    head = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + b"X-Big: " + b"a" * (100 * 1024) + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
        s.sendall(head)
        data = _read_responses(s, 1)
    assert data.startswith(b"HTTP/1.1 431"), data[:200]


def _http(port: int, method: str, path: str, headers: dict, body: bytes = b"") -> tuple[int, dict, bytes]:
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        c.request(method, path, body=body or None, headers=headers)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def test_401_names_the_bearer_scheme_and_the_scheme_is_case_insensitive(server):
    infer = json.dumps({"inputs": [{"name": "image", "datatype": "UINT8", "shape": [8, 8],
                                    "data": [0] * 64}]}).encode()
    for method, path, body in (("GET", "/v2", b""), ("GET", f"/v2/models/{MODEL}", b""),
                               ("POST", f"/v2/models/{MODEL}/infer", infer)):
        for auth in (None, "Bearer wrong", f"Basic {TOKEN}"):
            status, headers, raw = _http(server.port, method, path, {} if auth is None else {"Authorization": auth},
                                         body)
            assert status == 401 and headers.get("www-authenticate") == "Bearer", (path, auth, status, headers)
            assert json.loads(raw)["code"] == ec.SERVE_UNAUTHORIZED
        for auth in (f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER {TOKEN}"):
            status, _, raw = _http(server.port, method, path, {"Authorization": auth}, body)
            assert status == 200, (path, auth, status, raw[:200])


def test_grpc_bearer_scheme_is_case_insensitive(server):
    if server.grpc is None:
        pytest.skip("gRPC is not served here")
    import grpc

    from edge_runtime import serve_proto as sp

    ch = grpc.insecure_channel(server.grpc)
    try:
        call = ch.unary_unary(sp.method_path("ModelReady"), request_serializer=lambda x: x.SerializeToString(),
                              response_deserializer=sp.message_class("ModelReadyResponse").FromString)
        msg = sp.message_class("ModelReadyRequest")(name=MODEL)
        for auth in (f"Bearer {TOKEN}", f"bearer {TOKEN}"):
            assert call(msg, metadata=(("authorization", auth),), timeout=10).ready
        with pytest.raises(grpc.RpcError) as e:
            call(msg, metadata=(("authorization", "Bearer wrong"),), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        ch.close()


# -- 5, 7: the CLI's refusals ------------------------------------------------------------------------
def _serve(*args, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge_runtime", "serve", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("which", ["http", "grpc"])
def test_a_port_in_use_is_device_unavailable_for_http_and_grpc_alike(which, digits_artifact):
    if which == "grpc" and not _has_grpc():
        pytest.skip("grpcio is not installed")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        ports = ["--port", port, "--no-grpc"] if which == "http" else ["--port", 0, "--grpc-port", port]
        r = _serve(digits_artifact, *ports, "--no-verify")
    assert r.returncode == 4, (r.returncode, r.stderr[-2000:])
    assert f"[{ec.DEVICE_UNAVAILABLE}]" in r.stderr and f"127.0.0.1:{port}" in r.stderr, r.stderr[-2000:]
    assert "RuntimeError" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("token", [" ", "  \t"])
def test_a_blank_token_is_refused(token, digits_artifact):
    r = _serve(digits_artifact, "--host", "0.0.0.0", "--port", 0, "--no-grpc", "--token", token, timeout=60)
    assert r.returncode == 2 and f"[{ec.INPUT_INVALID}]" in r.stderr and "blank" in r.stderr, r.stderr[-2000:]


def test_a_bad_repository_folder_is_named(digits_artifact, tmp_path):
    import shutil

    from edge_runtime.errors import EdgeRuntimeError
    from edge_runtime.serve_core import ServeCore, artifacts_in

    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copytree(digits_artifact, repo / "a-good")
    (repo / "b-broken").mkdir()
    (repo / "b-broken" / "manifest.json").write_text("{nope")
    c = ServeCore(artifacts_in(repo))
    with pytest.raises(EdgeRuntimeError) as e:
        c.load_all()
    assert str(repo / "b-broken") in e.value.message and str(repo / "b-broken") in str(e.value), e.value.message
