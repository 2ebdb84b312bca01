"""Three serving seams (2026-12-07), each failing before its fix:

1. a ``tensors`` model's output that a device returns WIDER than the manifest declares (float64 for
   FP32, int64 for INT32) went out in its own datatype (FP64 / INT64) against the model's metadata, on
   HTTP JSON, HTTP binary and gRPC alike: a client that preallocates the metadata's FP32 misread the
   bytes. Now it goes out in the declared datatype: a wider float rounded to it (what the manifest
   promises), a wider integer only where every value fits; a value that does not fit (an integer out
   of range, a finite float that would overflow to infinity) is a 500 ``inference_failed`` naming the
   output and both datatypes, never a wrapped value;
2. over gRPC, a ModelInfer refused before it is parsed (UNAUTHENTICATED, over the message cap,
   unparsable) was counted under ``model=""`` while HTTP counts it under the path's model. Now it is
   counted under the model its leading ``model_name`` / ``model_version`` fields name (a bounded read
   of the raw bytes, never a parse), a name not served here under ``""`` as over HTTP;
3. README's errors table said a slow-drip body is DEADLINE_EXCEEDED ``serve_request_timeout`` over
   gRPC: gRPC has no read timeout. What happens instead is checked here on the raw HTTP/2 wire: grpcio
   itself ends a call whose message is still arriving at the call's own deadline (grpc-status 4,
   without our ``error-code``, no handler run), and holds one without a deadline.

Servers run in a loop thread (``grpc_harness.LoopServer``, as the other gRPC tests); every test is
bounded by an alarm, and every wait in it by its own timeout.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from edge_runtime import error_codes as ec
from edge_runtime.errors import InferenceRuntimeError
from edge_runtime.serve_output_kinds import tensors_outputs
from edge_runtime.serve_outputs import ServedOutputs
from edge_runtime.serve_types import InferRequest, InferResponse, ServeError, Tensor
from edge_runtime.serve_wire import encode_response

README = Path(__file__).resolve().parent.parent / "README.md"
TEST_TIMEOUT_S = 120


@pytest.fixture(autouse=True)
def _alarm():
    """Every test of this file ends within TEST_TIMEOUT_S (no pytest-timeout here)."""
    def expire(signum, frame):
        raise TimeoutError(f"test over {TEST_TIMEOUT_S} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TEST_TIMEOUT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


class _Result:
    def __init__(self, **outputs):
        self.outputs = outputs


def _served(*declared) -> ServedOutputs:
    return ServedOutputs(tensors_outputs(list(declared)))


# -- 1: a wider device output is answered in the declared datatype --------------------------------

@pytest.mark.parametrize("declared,got,values", [
    ("FP32", np.float64, [[0.1, -2.5, 3e38], [1e-50, np.inf, np.nan]]),   # rounded, as float32 holds them
    ("FP16", np.float32, [[0.1, 65504.0, -1.0], [2.0, -np.inf, 0.0]]),
    ("INT32", np.int64, [[1, -(2 ** 31), 2 ** 31 - 1], [0, 5, -7]]),
    ("INT64", np.uint64, [[1, 2, 2 ** 63 - 1], [0, 0, 0]]),
    ("UINT8", np.int32, [[0, 255, 7], [1, 2, 3]]),
    ("INT32", np.float64, [[1.0, -3.0, 2.0 ** 31 - 1], [0.0, 4.0, -(2.0 ** 31)]]),   # integral floats
    ("BOOL", np.uint8, [[0, 1, 1], [0, 0, 1]]),
])
def test_a_wider_output_is_answered_in_the_declared_datatype(declared, got, values):
    from edge_runtime.serve_types import DATATYPES

    served = _served(("y", declared, [1, 3]))
    assert served.metadata()[0]["datatype"] == declared
    with np.errstate(over="ignore"):
        arrays = [np.array([row], dtype=got) for row in values]
    (t,) = served.build([_Result(y=a) for a in arrays], None)
    assert t.datatype == declared, t.datatype                  # before: FP64 / FP32 / INT64 / UINT64 / INT32
    data = np.asarray(t.data)
    assert data.dtype == np.dtype(DATATYPES[declared]) and data.shape == (2, 3)
    with np.errstate(over="ignore"):
        want = np.concatenate(arrays).astype(DATATYPES[declared])
    np.testing.assert_array_equal(data, want)


@pytest.mark.parametrize("declared,got,values", [
    ("INT32", np.int64, [2 ** 31, 0, 1]),            # would wrap to -2**31
    ("INT32", np.int64, [-(2 ** 31) - 1, 0, 1]),
    ("UINT8", np.int16, [-1, 0, 1]),                 # would wrap to 255
    ("INT64", np.uint64, [2 ** 63, 0, 1]),           # would wrap to -2**63
    ("FP32", np.float64, [1e39, 0.0, 1.0]),          # a finite value would become infinity
    ("FP16", np.float32, [0.5, -70000.0, 1.0]),
    ("INT32", np.float64, [1.5, 0.0, 1.0]),          # would be truncated
    ("INT32", np.float64, [np.nan, 0.0, 1.0]),
    ("BOOL", np.int32, [2, 0, 1]),
])
def test_a_wider_output_that_the_declared_datatype_cannot_hold_is_a_typed_error(declared, got, values):
    served = _served(("y", declared, [1, 3]))
    with pytest.raises(InferenceRuntimeError) as ei:           # before: sent in its own datatype, a 200
        served.build([_Result(y=np.array([values], dtype=got))], None)
    err = ei.value
    assert err.code == ec.INFERENCE_FAILED
    assert "'y'" in err.message and declared in err.message and str(np.dtype(got)) in err.message, err.message
    assert {k: err.details.get(k) for k in ("output", "declared", "returned")} == \
        {"output": "y", "declared": declared, "returned": str(np.dtype(got))}


class _Wider:
    """A result whose outputs are the device's, widened (or replaced) to ``outputs``."""

    def __init__(self, result, outputs):
        self._r, self.outputs = result, outputs

    def __getattr__(self, name):
        return getattr(self._r, name)


@pytest.fixture
def tensors_core(make_artifact):
    from edge_runtime.serve_core import ServeCore

    core = ServeCore([make_artifact("tensors")], verify=False, batch_delay_ms=0)
    core.load_all()
    yield core
    core.close()


def _tensors_request(name: str, n: int = 1) -> InferRequest:
    x = Tensor("x", "FP32", [n, 4], np.arange(4 * n, dtype=np.float32).reshape(n, 4) / 7)
    k = Tensor("k", "INT32", [n, 2], np.ones((n, 2), np.int32))
    return InferRequest(name, None, [x, k])


def _widen(monkeypatch, make):
    import edge_runtime.serve_core as sc

    real = sc._infer_items

    def widened(rt, items, deadline_ms, options):
        return [r if isinstance(r, BaseException) else _Wider(r, {"y": make(np.asarray(r.outputs["y"]))})
                for r in real(rt, items, deadline_ms, options)]

    monkeypatch.setattr(sc, "_infer_items", widened)


def test_a_float64_output_goes_out_as_fp32_on_json_binary_and_grpc(tensors_core, monkeypatch):
    pytest.importorskip("grpc")
    th = pytest.importorskip("tritonclient.http")
    from tritonclient.grpc import InferResult as GrpcResult, service_pb2

    from edge_runtime.serve_grpc_wire import to_message

    core = tensors_core
    (name, _), = core.models
    _widen(monkeypatch, lambda y: y.astype(np.float64) + 1e-12)      # float64 values no float32 holds exactly
    resp = asyncio.run(core.infer(_tensors_request(name, 2)))
    meta = {o["name"]: o for o in core.model_metadata(name, None)["outputs"]}
    assert meta["y"]["datatype"] == "FP32"
    (t,) = resp.outputs
    assert t.datatype == "FP32"                                 # before: FP64 against the metadata's FP32
    want = np.asarray(t.data)
    assert want.dtype == np.float32 and want.shape == (2, 3)

    body, json_len = encode_response(resp, False, {})           # HTTP JSON
    (out,) = json.loads(body)["outputs"]
    assert out["datatype"] == "FP32" and out["shape"] == [2, 3]
    np.testing.assert_array_equal(np.asarray(out["data"], np.float32).reshape(2, 3), want)

    body, json_len = encode_response(resp, True, {})            # HTTP binary, as tritonclient reads it
    got = th.InferResult.from_response_body(body, header_length=json_len).as_numpy("y")
    assert got.dtype == np.float32 and len(body) - json_len == 2 * 3 * 4
    np.testing.assert_array_equal(got, want)

    msg = service_pb2.ModelInferResponse.FromString(to_message(resp).SerializeToString())   # gRPC
    assert msg.outputs[0].datatype == "FP32" and len(msg.raw_output_contents[0]) == 2 * 3 * 4
    np.testing.assert_array_equal(GrpcResult(msg).as_numpy("y"), want)


def test_an_output_out_of_the_declared_range_is_a_500_naming_it(tensors_core, monkeypatch):
    core = tensors_core
    (name, _), = core.models
    _widen(monkeypatch, lambda y: np.full(y.shape, 1e300))
    with pytest.raises(ServeError) as ei:                       # before: a 200 with FP64 1e300
        asyncio.run(core.infer(_tensors_request(name)))
    err = ei.value
    assert (err.status, err.code) == ("internal", ec.INFERENCE_FAILED), err
    assert "'y'" in err.message and "FP32" in err.message and "float64" in err.message, err.message
    assert f'edge_serve_requests_total{{model="{name}",status="internal"}} 1' in core.metrics_text()


# -- 2: a gRPC refusal counts under the model its message names -----------------------------------

def _message(model: str = "", version: str = "", raw_len: int = 0, **kw) -> bytes:
    from edge_runtime import serve_proto as sp

    msg = sp.message_class("ModelInferRequest")(model_name=model, model_version=version, **kw)
    if raw_len:
        msg.inputs.add(name="x", datatype="UINT8", shape=[raw_len])
        msg.raw_input_contents.append(b"\x01" * raw_len)
    return msg.SerializeToString()


def test_the_leading_model_name_is_read_from_the_raw_bytes_only():
    from edge_runtime.serve_grpc_wire import named_model

    assert named_model(_message("digits", "2", raw_len=1000)) == ("digits", "2")
    assert named_model(_message("digits", raw_len=10)) == ("digits", None)
    assert named_model(_message(raw_len=10)) == ("", None)
    assert named_model(b"") == ("", None)
    # only where the name leads: after another field (a hand-made order), it is not looked for
    assert named_model(b"\x1a\x01i" + _message("digits")) == ("", None)
    # cut inside the name, a varint over 10 bytes, a name that is not UTF-8, a name over 1 KiB
    assert named_model(_message("digits")[:4]) == ("", None)
    assert named_model(b"\x0a" + b"\xff" * 11) == ("", None)
    assert named_model(b"\x0a\x02\xff\xfe") == ("", None)
    assert named_model(_message("m" * 2000)) == ("", None)
    # bounded whatever the message's size: 64 MiB of raw contents after the name read as fast as none
    big = _message("digits", raw_len=64 * 1024 * 1024)
    t = time.perf_counter()
    assert named_model(big) == ("digits", None)
    assert time.perf_counter() - t < 0.05


TOKEN = "h41-token"
CAP = 64 * 1024


@pytest.fixture
def grpc_served(make_artifact):
    """A real ServeCore (the tiny text classifier, version 3) behind the gRPC front end with a token."""
    pytest.importorskip("grpc")
    from grpc_harness import LoopServer

    from edge_runtime.serve_core import ServeCore

    core = ServeCore([make_artifact("text-classification")], verify=False)
    srv = LoopServer(core, token=TOKEN, max_message_bytes=CAP)
    yield core, srv
    srv.close()
    core.close()


def _raw_call(target: str, raw: bytes, token: str | None):
    import grpc

    from edge_runtime import serve_proto as sp

    ch = grpc.insecure_channel(target)
    try:
        call = ch.unary_unary(sp.method_path("ModelInfer"), request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as ei:
            call(raw, timeout=20, metadata=(("authorization", f"Bearer {token}"),) if token else None)
        return ei.value
    finally:
        ch.close()


def _requests_total(core) -> dict[tuple[str, str], int]:
    rows = re.findall(r'^edge_serve_requests_total\{model="([^"]*)",status="([^"]*)"\} (\d+)$',
                      core.metrics_text(), re.M)
    return {(m, s): int(c) for m, s, c in rows}


def test_a_grpc_refusal_before_parsing_counts_under_the_model_it_names_and_adds_no_label(grpc_served):
    import grpc

    from edge_runtime.serve_grpc import ERROR_CODE_KEY

    core, srv = grpc_served
    (name, version), = core.models
    cases = [   # (message, token, status code, error-code)
        (_message(name), None, grpc.StatusCode.UNAUTHENTICATED, ec.SERVE_UNAUTHORIZED),
        (_message(name, version), "wrong", grpc.StatusCode.UNAUTHENTICATED, ec.SERVE_UNAUTHORIZED),
        (_message(name, raw_len=CAP + 10), TOKEN, grpc.StatusCode.RESOURCE_EXHAUSTED, ec.SERVE_REQUEST_TOO_LARGE),
        (_message(name) + b"\xff\xff", TOKEN, grpc.StatusCode.INVALID_ARGUMENT, ec.SERVE_REQUEST_MALFORMED),
    ]
    for raw, token, status, code in cases:
        err = _raw_call(srv.target, raw, token)
        assert err.code() == status and dict(err.trailing_metadata())[ERROR_CODE_KEY] == code, err
    counts = _requests_total(core)
    # before: every one of them under model=""
    assert counts == {(name, "unauthorized"): 2, (name, "too_large"): 1, (name, "bad_request"): 1}, counts

    # a name (or version) not served here, or one that cannot be read so, adds no label: "", as over HTTP
    for raw in (_message("made-up-1"), _message("made-up-2", raw_len=CAP + 10), _message(name, "99"),
                _message("x" * 5000), b"\x0a\x05mad"):
        _raw_call(srv.target, raw, None)
    _raw_call(srv.target, _message("made-up-3", raw_len=CAP + 10), TOKEN)
    counts = _requests_total(core)
    assert counts == {(name, "unauthorized"): 2, (name, "too_large"): 1, (name, "bad_request"): 1,
                      ("", "unauthorized"): 5, ("", "too_large"): 1}, counts


# -- 3: gRPC has no read timeout: what README's errors table says instead ---------------------------

def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _header(name: str, value: str) -> bytes:
    """An HPACK literal header field without indexing, new name, no Huffman (RFC 7541 6.2.2)."""
    n, v = name.encode(), value.encode()
    return b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v


def _drip(port: int, grpc_timeout: str | None, listen_s: float) -> list[tuple[int, int, int, bytes]]:
    """Open a ModelInfer stream on a raw HTTP/2 connection, send 10 of the 100 bytes its message
    announces, and collect the frames the server sends for ``listen_s`` (answering its SETTINGS and
    PINGs, as a live client does)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0, b""))
        head = b"".join(_header(k, v) for k, v in (
            (":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
            (":authority", f"127.0.0.1:{port}"), ("content-type", "application/grpc"), ("te", "trailers")))
        if grpc_timeout:
            head += _header("grpc-timeout", grpc_timeout)
        sock.sendall(_frame(1, 4, 1, head))                                    # HEADERS, END_HEADERS
        sock.sendall(_frame(0, 0, 1, b"\x00" + struct.pack(">I", 100) + b"\x0a\x04echo" + b"\x00" * 4))
        frames, buf, end = [], b"", time.monotonic() + listen_s
        sock.settimeout(0.2)
        while time.monotonic() < end:
            try:
                data = sock.recv(65536)
            except socket.timeout:
                continue
            if not data:
                break
            buf += data
            while len(buf) >= 9 and len(buf) >= 9 + int.from_bytes(buf[:3], "big"):
                size = int.from_bytes(buf[:3], "big")
                kind, flags, stream = buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
                payload, buf = buf[9:9 + size], buf[9 + size:]
                frames.append((kind, flags, stream, payload))
                if kind == 4 and not flags & 1:
                    sock.sendall(_frame(4, 1, 0, b""))                         # SETTINGS ack
                elif kind == 6 and not flags & 1:
                    sock.sendall(_frame(6, 1, 0, payload))                     # PING ack
        return frames
    finally:
        sock.close()


def test_readme_says_what_grpc_does_with_a_slow_drip_and_it_holds():
    pytest.importorskip("grpc")
    from grpc_harness import FakeCore, LoopServer

    row = next(line for line in README.read_text().splitlines() if line.startswith("| body did not arrive within"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # before: DEADLINE_EXCEEDED, a status no gRPC call gets for it
    assert cells[1] == "408" and cells[2].startswith("none: gRPC has no read timeout"), cells
    assert "without `error-code`" in cells[2] and "deadline" in cells[2]

    core = FakeCore()
    srv = LoopServer(core)
    try:
        # with a deadline: grpcio itself ends the call at it (trailers grpc-status 4, DEADLINE_EXCEEDED),
        # without our error-code; no handler ran, nothing was counted
        frames = _drip(srv.port, "1S", 4.0)
        ends = [p for k, f, s, p in frames if k == 1 and s == 1]
        assert ends and b"grpc-status\x014" in ends[0] and b"error-code" not in ends[0], frames
        # without one: the stream is held, nothing answered on it in 2 s (no read timeout)
        frames = _drip(srv.port, None, 2.0)
        assert not [f for f in frames if f[2] == 1 and f[0] in (0, 1, 3)], frames   # no DATA, HEADERS, RST_STREAM
        assert core.requests == [] and core.rejections == []
    finally:
        srv.close()
