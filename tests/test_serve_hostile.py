"""Hostile HTTP against a real ``edge-infer serve``: each request gets a 4xx with ``{"error", "code"}``
and the server keeps serving. Raw sockets, so nothing a client library would tidy up is tidied up."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import pytest

from serve_proc import ServerProc

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from edge_runtime import error_codes as ec  # noqa: E402

from test_serve_http import digit_images  # noqa: E402

CAP = 1_000_000
READ_TIMEOUT_S = 1.0
PATH = "/v2/models/digits-cnn/infer"


@pytest.fixture(scope="module", params=["httptools", "h11"])
def server(digits_artifact, request):
    """Both HTTP parsers the server runs on (httptools where installed, h11 otherwise): each must
    answer every hostile request the same way."""
    with ServerProc(digits_artifact, args=("--max-body-bytes", str(CAP), "--read-timeout", str(READ_TIMEOUT_S),
                                           "--http-parser", request.param)) as srv:
        assert f"http_parser={request.param}" in srv.ready_line, srv.ready_line
        yield srv


def send(port: int, body: bytes = b"", headers: dict | None = None, *, raw_head: bytes | None = None,
         drip: tuple[bytes, float] | None = None, timeout: float = 20.0) -> tuple[int, dict, float]:
    """One request on a fresh connection: (status, JSON body or {}, seconds to the answer)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    t0 = time.monotonic()
    try:
        if raw_head is None:
            h = {"Host": "x", "Content-Length": str(len(body)), **(headers or {})}
            raw_head = (f"POST {PATH} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items() if v is not None)
                        + "\r\n").encode()
        s.sendall(raw_head)
        if drip is not None:
            chunk, every = drip
            end = time.monotonic() + timeout
            s.setblocking(False)
            while time.monotonic() < end:       # drip until the server answers or closes
                try:
                    data = s.recv(65536)
                    if data or data == b"":
                        s.setblocking(True)
                        return _parse(data + _rest(s), t0)
                except BlockingIOError:
                    pass
                try:
                    s.send(chunk)
                except OSError:
                    break
                time.sleep(every)
            s.setblocking(True)
        else:
            try:
                s.sendall(body)
            except OSError:           # the server answered and closed before reading it all: fine
                pass
        return _parse(_rest(s), t0)
    finally:
        s.close()


def _rest(s: socket.socket) -> bytes:
    data = b""
    try:
        while True:
            head, sep, tail = data.partition(b"\r\n\r\n")
            if sep:
                m = [ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")]
                if m and len(tail) >= int(m[0].split(b":")[1]):
                    return data
            chunk = s.recv(65536)
            if not chunk:
                return data
            data += chunk
    except (ConnectionResetError, socket.timeout):
        return data


def _parse(data: bytes, t0: float) -> tuple[int, dict, float]:
    elapsed = time.monotonic() - t0
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), f"no HTTP answer: {data[:200]!r}"
    status = int(head.split()[1])
    try:
        doc = json.loads(body) if body else {}
    except ValueError:
        doc = {"raw": body[:200].decode("latin-1")}
    return status, doc, elapsed


def image_request(img: bytes, *, size: int | None = None, shape=None, datatype="BYTES", extra: bytes = b"",
                  header_len_delta: int = 0) -> tuple[bytes, dict]:
    payload = struct.pack("<I", len(img)) + img if datatype == "BYTES" else img
    head = json.dumps({"inputs": [{"name": "image", "datatype": datatype, "shape": shape or [1],
                                   "parameters": {"binary_data_size": len(payload) if size is None else size}}]}).encode()
    return head + payload + extra, {"Inference-Header-Content-Length": str(len(head) + header_len_delta)}


def _raw_binary(datatype: str, shape: list, payload: bytes) -> tuple[bytes, dict]:
    head = json.dumps({"inputs": [{"name": "image", "datatype": datatype, "shape": shape,
                                   "parameters": {"binary_data_size": len(payload)}}]}).encode()
    return head + payload, {"Inference-Header-Content-Length": str(len(head))}


def assert_serving(port: int) -> None:
    img = digit_images(1)[0][0]
    body, headers = image_request(img)
    status, doc, _ = send(port, body, headers)
    assert status == 200 and doc["outputs"], doc


def test_hostile_requests_each_get_a_4xx(server):
    img = digit_images(1)[0][0]
    js = lambda d: json.dumps(d).encode()  # noqa: E731
    cases = {
        "malformed json": (b'{"inputs": [', {}),
        "not an object": (b"[1, 2, 3]", {}),
        "not utf-8": (b'{"inputs": "\xff\xfe"}', {}),
        "deep nesting": (b"[" * 100_000 + b"]" * 100_000, {}),
        "no inputs": (b"{}", {}),
        "header length beyond the body": image_request(img, header_len_delta=10_000),
        "header length not a number": (b"{}", {"Inference-Header-Content-Length": "ten"}),
        "binary_data_size beyond the body": image_request(img, size=len(img) + 1000),
        "binary_data_size short of the body": image_request(img, extra=b"trailing"),
        "BYTES element length cut": image_request(img, size=3),
        "BYTES count != shape": image_request(img, shape=[2]),
        "shape x dtype != bytes": image_request(bytes(63), shape=[8, 8], datatype="UINT8"),
        "negative shape": (js({"inputs": [{"name": "image", "datatype": "UINT8", "shape": [-1, 8], "data": [0] * 8}]}),
                           {}),
        "huge shape": (js({"inputs": [{"name": "image", "datatype": "UINT8", "shape": [2 ** 40, 2 ** 40],
                                       "data": [0]}]}), {}),
        "non-integer shape": (js({"inputs": [{"name": "image", "datatype": "UINT8", "shape": [8.5, 8],
                                              "data": [0]}]}), {}),
        "unknown datatype": (js({"inputs": [{"name": "image", "datatype": "FP128", "shape": [1], "data": [0]}]}), {}),
        "JSON data of the wrong type": (js({"inputs": [{"name": "image", "datatype": "UINT8", "shape": [2],
                                                        "data": ["a", "b"]}]}), {}),
        "JSON values out of range": (js({"inputs": [{"name": "image", "datatype": "UINT8", "shape": [2],
                                                     "data": [1, 300]}]}), {}),
        "negative binary_data_size": image_request(img, size=-4),
        "200,000 empty BYTES elements": _raw_binary("BYTES", [200_000], bytes(800_000)),
        "data and shape disagree": (js({"inputs": [{"name": "image", "datatype": "UINT8", "shape": [8, 8],
                                                    "data": [0] * 10}]}), {}),
    }
    for what, (body, headers) in cases.items():
        status, doc, _ = send(server.port, body, headers)
        assert status == 400, (what, status, doc)
        assert doc.get("code") == ec.SERVE_REQUEST_MALFORMED and doc.get("error"), (what, doc)
    assert_serving(server.port)


def test_claimed_gigabyte_is_refused_unread(server):
    status, doc, elapsed = send(server.port, b'{"inputs": []}', {"Content-Length": str(1 << 30)})
    assert status == 413 and doc["code"] == ec.SERVE_REQUEST_TOO_LARGE and elapsed < 5
    assert_serving(server.port)


def test_chunked_body_over_the_cap_is_cut(server):
    head = (f"POST {PATH} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    chunk = b"x" * 65536
    body = b"".join(b"%x\r\n" % len(chunk) + chunk + b"\r\n" for _ in range(CAP // len(chunk) + 2)) + b"0\r\n\r\n"
    status, doc, _ = send(server.port, body, raw_head=head)
    assert status == 413 and doc["code"] == ec.SERVE_REQUEST_TOO_LARGE
    assert_serving(server.port)


def test_slow_drip_body_times_out_while_others_are_served(server):
    answers: list = []
    t = threading.Thread(target=lambda: answers.append(send(server.port, raw_head=(
        f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n").encode(), drip=(b"{", 0.2), timeout=15)))
    t.start()
    time.sleep(0.3)
    t_ok = time.monotonic()
    assert_serving(server.port)                     # the drip does not hold anyone else up
    assert time.monotonic() - t_ok < READ_TIMEOUT_S
    t.join(20)
    (status, doc, elapsed), = answers
    assert status == 408 and doc["code"] == ec.SERVE_REQUEST_TIMEOUT
    assert READ_TIMEOUT_S <= elapsed < READ_TIMEOUT_S + 5
    assert_serving(server.port)


def test_a_client_gone_mid_body_is_counted_and_nothing_else_happens(server):
    """A client that sends half its body and closes: no answer to write, the slot freed, counted
    as disconnected; the next request is served."""
    import urllib.request

    def disconnected() -> float:
        text = urllib.request.urlopen(f"http://{server.http}/metrics", timeout=30).read().decode()
        line = next((x for x in text.splitlines()
                     if x.startswith('edge_serve_rejections_total{reason="disconnected"}')), None)
        return float(line.split()[-1]) if line else 0.0

    before = disconnected()
    img = digit_images(1)[0][0]
    body, headers = image_request(img)
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    s.sendall(f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{head}\r\n".encode()
              + body[: len(body) // 2])
    s.close()
    deadline = time.monotonic() + 10
    while disconnected() == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert disconnected() == before + 1          # this client, counted once
    assert_serving(server.port)


def test_rejections_are_counted(server):
    import urllib.request

    text = urllib.request.urlopen(f"http://{server.http}/metrics", timeout=30).read().decode()
    for reason in ("malformed", "too_large", "read_timeout"):
        assert f'edge_serve_rejections_total{{reason="{reason}"}}' in text, reason
    assert server.proc.poll() is None


def _closed_within(s: socket.socket, limit: float) -> tuple[bytes, float]:
    """What the server sent before closing ``s``, and when it closed (seconds from now)."""
    t0, got = time.monotonic(), b""
    s.settimeout(limit)
    while True:
        try:
            chunk = s.recv(4096)
        except (ConnectionResetError, BrokenPipeError):
            break
        if not chunk:
            break
        got += chunk
    return got, time.monotonic() - t0


def test_slow_drip_head_and_silent_connection_are_closed(server):
    """Slowloris: a request head dripping a byte at a time, and a connection that sends nothing, are each
    answered 408 and closed after the read timeout, while other requests are served."""
    silent = socket.create_connection(("127.0.0.1", server.port))
    drip = socket.create_connection(("127.0.0.1", server.port))
    drip.sendall(f"POST {PATH} HTTP/1.1\r\nHost: x\r\n".encode())
    t0, closed, served = time.monotonic(), False, False
    while time.monotonic() - t0 < READ_TIMEOUT_S + 4:
        try:
            drip.sendall(b"X")                           # never completes a header line
        except (BrokenPipeError, ConnectionResetError):
            closed = True
            break
        time.sleep(0.1)
        if not served:
            assert_serving(server.port)                  # the drip holds no one else up
            served = True
    got, _ = _closed_within(drip, 5)
    assert closed or got, "the dripping head was never cut"
    assert time.monotonic() - t0 < READ_TIMEOUT_S + 5
    if got:
        assert got.startswith(b"HTTP/1.1 408") and b"serve_request_timeout" in got, got[:200]
    got, waited = _closed_within(silent, READ_TIMEOUT_S + 5)
    assert got.startswith(b"HTTP/1.1 408"), got[:200]
    assert_serving(server.port)


def test_oversized_head_is_refused(server):
    """A 4 MB header is never buffered whole: both parsers cap the head at 64 KiB (uvicorn's own
    httptools protocol took it whole) and answer 4xx (431 on httptools) and close."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: ")
    sent, got = 0, b""
    try:
        for _ in range(64):
            s.sendall(b"a" * 65536)
            sent += 65536
        s.sendall(b"\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        got = s.recv(200)
    except (ConnectionResetError, socket.timeout):
        pass
    assert sent < 4 * 1024 * 1024, "the server read a 4 MB head"
    if got:                       # a reset may beat the answer to the client; when it arrives it is a 4xx
        assert got.startswith(b"HTTP/1.1 4"), got
        if "http_parser=httptools" in server.ready_line:
            assert got.startswith(b"HTTP/1.1 431"), got
    assert_serving(server.port)
