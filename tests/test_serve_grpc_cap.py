"""A gRPC request over the message cap (``--max-body-bytes``) is refused as HTTP refuses a body over
it: RESOURCE_EXHAUSTED with ``serve_request_too_large`` in the trailing metadata key ``error-code``
(HTTP's 413 code), counted as a ``too_large`` rejection. Before 2026-12-06 grpcio refused it itself
(its ``max_receive_message_length`` was the cap): no handler ran, so no code and no count.

A message more than ``GRPC_READ_FACTOR`` times the cap is still grpcio's own refusal, unread and
without the code (reading every message whole first would let one call hold gigabytes).

Driven by the real ``tritonclient.grpc`` (the code read from the ``grpc.RpcError`` it raises from),
against the scripted core of ``grpc_harness`` and against a real ``edge-infer serve`` process
beside tritonclient.http's 413.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("grpc")
tg = pytest.importorskip("tritonclient.grpc")

import grpc  # noqa: E402
from grpc_harness import FakeCore, LoopServer  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

from edge_runtime import error_codes as ec  # noqa: E402
from edge_runtime.serve_grpc import ERROR_CODE_KEY  # noqa: E402

CAP = 64 * 1024


def _uint8(n: int, value: int = 0):
    t = tg.InferInput("x", [n], "UINT8")
    t.set_data_from_numpy(np.full(n, value, np.uint8))
    return t


def _refusal(client, model: str, n: int) -> tuple[InferenceServerException, grpc.RpcError]:
    """tritonclient's exception for an ``n``-byte UINT8 input, and the gRPC error it was raised from."""
    with pytest.raises(InferenceServerException) as ei:
        client.infer(model, [_uint8(n)])
    rpc = ei.value.__context__
    assert isinstance(rpc, grpc.RpcError), repr(rpc)
    return ei.value, rpc


def _code(rpc: grpc.RpcError) -> str | None:
    return dict(rpc.trailing_metadata() or ()).get(ERROR_CODE_KEY)


@pytest.mark.parametrize("how", ["core", "argument"])
def test_a_message_over_the_cap_carries_serve_request_too_large(how):
    core = FakeCore()
    if how == "core":
        core.max_body_bytes = CAP
        srv = LoopServer(core)
    else:
        srv = LoopServer(core, max_message_bytes=CAP)
    client = tg.InferenceServerClient(srv.target)
    try:
        for n in (CAP + 1, int(CAP * 1.5)):
            exc, rpc = _refusal(client, "echo", n)
            assert exc.status() == "StatusCode.RESOURCE_EXHAUSTED", exc
            assert _code(rpc) == ec.SERVE_REQUEST_TOO_LARGE == "serve_request_too_large", rpc
            assert f"cap of {CAP}" in exc.message(), exc
        assert core.rejections == ["too_large", "too_large"] and core.requests == []   # never parsed nor run
        assert client.infer("echo", [_uint8(1000, 1)]).as_numpy("x_out").sum() == 1000   # within: served
    finally:
        client.close()
        srv.close()


def test_far_over_the_cap_grpcio_still_refuses_it_unread():
    from edge_runtime.serve_grpc import GRPC_READ_FACTOR

    core = FakeCore()
    srv = LoopServer(core, max_message_bytes=CAP)
    client = tg.InferenceServerClient(srv.target)
    try:
        exc, rpc = _refusal(client, "echo", CAP * GRPC_READ_FACTOR + 1024)
        assert exc.status() == "StatusCode.RESOURCE_EXHAUSTED", exc
        assert "larger than max" in exc.message() and _code(rpc) is None, (exc, rpc.trailing_metadata())
        assert core.rejections == [] and core.requests == []
    finally:
        client.close()
        srv.close()


def test_over_the_wire_grpc_and_http_refuse_an_over_cap_request_with_the_same_code(digits_artifact):
    """The real server: HTTP's 413 and tritonclient.grpc's RESOURCE_EXHAUSTED carry the same code,
    and both are counted as too_large requests and rejections."""
    import json
    import urllib.error
    import urllib.request

    from serve_proc import ServerProc

    model = json.loads((digits_artifact / "manifest.json").read_text())["model"]["name"]
    with ServerProc(digits_artifact, grpc=True, args=["--max-body-bytes", str(CAP)]) as srv:
        body = json.dumps({"inputs": [{"name": "image", "datatype": "UINT8", "shape": [CAP],
                                       "data": [0] * CAP}]}).encode()
        req = urllib.request.Request(f"http://{srv.http}/v2/models/{model}/infer", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as he:
            urllib.request.urlopen(req, timeout=30)
        assert he.value.code == 413
        http_code = json.loads(he.value.read())["code"]
        g = tg.InferenceServerClient(srv.grpc)
        try:
            exc, rpc = _refusal(g, model, CAP + 100)
        finally:
            g.close()
        assert exc.status() == "StatusCode.RESOURCE_EXHAUSTED", exc
        assert _code(rpc) == http_code == ec.SERVE_REQUEST_TOO_LARGE, (rpc.trailing_metadata(), http_code)
        with urllib.request.urlopen(f"http://{srv.http}/metrics", timeout=30) as r:
            metrics = r.read().decode()
        assert 'edge_serve_rejections_total{reason="too_large"} 2' in metrics, metrics
        # HTTP names the model from its path, gRPC from the message's leading model_name (read unparsed)
        assert f'edge_serve_requests_total{{model="{model}",status="too_large"}} 2' in metrics, metrics
        assert 'edge_serve_requests_total{model="",status="too_large"}' not in metrics, metrics
