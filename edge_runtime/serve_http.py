"""The HTTP/REST front end of ``edge-infer serve`` (KServe v2 / Open Inference Protocol) on Starlette.

It only translates: the body to an ``InferRequest`` (``serve_wire``), the
``ServeCore``'s answer or ``ServeError`` back. Before any parsing:

- a bearer token, when set, is compared in constant time (``/v2/health/*``
  stays open for probes);
- a ``Content-Length`` over ``max_body_bytes`` is refused (413) before a byte
  of the body is read; a body without one is read in chunks and refused as
  soon as it passes the cap;
- the whole body must arrive within ``read_timeout_s`` (408): a slow-drip
  client cannot hold a request open.

No Content-Type is required (tritonclient sends none). Errors are
``{"error": message, "code": code}`` with the status of ``HTTP_STATUS``.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from . import error_codes as ec
from .serve_core import ServeCore, serve_error
from .serve_types import HTTP_STATUS, ServeError
from .serve_wire import HEADER_LENGTH, decode_request, encode_response

_OPEN_PATHS = ("/v2/health/live", "/v2/health/ready")
INLINE_DECODE_BYTES = 64 * 1024      # larger bodies are decoded on a worker thread


def error_response(err: ServeError, *, close: bool = False) -> JSONResponse:
    headers = {"Connection": "close"} if close else None
    return JSONResponse(err.body(), status_code=HTTP_STATUS[err.status], headers=headers)


async def read_body(request: Request, cap: int, timeout_s: float) -> bytes:
    """The body, at most ``cap`` bytes, all of it within ``timeout_s`` (``ServeError`` otherwise)."""
    claimed = request.headers.get("content-length")
    if claimed is not None:
        try:
            n = int(claimed)
        except ValueError:
            raise ServeError("bad_request", f"Content-Length is not an integer: {claimed[:40]!r}",
                             ec.SERVE_REQUEST_MALFORMED) from None
        if n > cap:
            raise ServeError("too_large", f"the body is {n} bytes, over the server's cap of {cap}",
                             ec.SERVE_REQUEST_TOO_LARGE)
    chunks, total = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                total += len(chunk)
                if total > cap:
                    raise ServeError("too_large", f"the body passed the server's cap of {cap} bytes",
                                     ec.SERVE_REQUEST_TOO_LARGE)
                chunks.append(chunk)
    except TimeoutError:
        raise ServeError("request_timeout", f"the body did not arrive within {timeout_s:g} s",
                         ec.SERVE_REQUEST_TIMEOUT) from None
    return b"".join(chunks)


def create_app(core: ServeCore, *, token: str | None = None, read_timeout_s: float = 10.0) -> Starlette:
    expected = f"Bearer {token}".encode() if token else None

    def refused(request: Request) -> JSONResponse | None:
        if expected is None or request.url.path in _OPEN_PATHS:
            return None
        given = request.headers.get("authorization", "").encode("utf-8", "replace")
        if hmac.compare_digest(given, expected):
            return None
        core.count_rejection("unauthorized")
        return error_response(ServeError("unauthorized", "missing or wrong bearer token", ec.SERVE_UNAUTHORIZED))

    def guarded(fn):
        async def endpoint(request: Request) -> Response:
            denied = refused(request)
            if denied is not None:
                return denied
            try:
                return await fn(request)
            except ServeError as err:
                return error_response(err)

        return endpoint

    def model_of(request: Request) -> tuple[str, str | None]:
        return request.path_params["model"], request.path_params.get("version")

    async def live(request: Request) -> Response:
        return Response(status_code=200 if core.live else 503)

    async def ready(request: Request) -> Response:
        return Response(status_code=200 if core.ready else 503)

    async def server_metadata(request: Request) -> Response:
        return JSONResponse(core.server_metadata())

    async def model_metadata(request: Request) -> Response:
        return JSONResponse(core.model_metadata(*model_of(request)))

    async def model_ready(request: Request) -> Response:
        return Response(status_code=200 if core.model_ready(*model_of(request)) else 503)

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(core.metrics_text(), media_type="text/plain; version=0.0.4")

    async def infer(request: Request) -> Response:
        model, version = model_of(request)
        try:
            body = await read_body(request, core.max_body_bytes, read_timeout_s)
        except ClientDisconnect:
            core.count_rejection("disconnected")
            return Response(status_code=400)
        except ServeError as err:      # the rest of the body is never read: the connection closes after it
            core.count_rejection({"too_large": "too_large", "request_timeout": "read_timeout"}.get(err.status,
                                                                                                  "malformed"))
            return error_response(err, close=True)
        try:
            header_length = request.headers.get(HEADER_LENGTH)
            if len(body) <= INLINE_DECODE_BYTES:
                req, binary_all, binary_named = decode_request(body, header_length, model, version)
            else:       # parsing megabytes of JSON would stall every other connection: off the event loop
                req, binary_all, binary_named = await asyncio.get_running_loop().run_in_executor(
                    None, decode_request, body, header_length, model, version)
        except ServeError as err:
            core.count_rejection("malformed")
            return error_response(err)
        try:
            resp = await core.infer(req)
            payload, json_len = encode_response(resp, binary_all, binary_named)
        except Exception as exc:       # ServeError from the core, or a bug while encoding
            return error_response(serve_error(exc))
        if json_len is None:
            return Response(payload, media_type="application/json")
        return Response(payload, media_type="application/octet-stream",
                        headers={"Inference-Header-Content-Length": str(json_len)})

    routes: list[Any] = [
        Route("/v2/health/live", guarded(live), methods=["GET"]),
        Route("/v2/health/ready", guarded(ready), methods=["GET"]),
        Route("/v2", guarded(server_metadata), methods=["GET"]),
        Route("/v2/models/{model}", guarded(model_metadata), methods=["GET"]),
        Route("/v2/models/{model}/versions/{version}", guarded(model_metadata), methods=["GET"]),
        Route("/v2/models/{model}/ready", guarded(model_ready), methods=["GET"]),
        Route("/v2/models/{model}/versions/{version}/ready", guarded(model_ready), methods=["GET"]),
        Route("/v2/models/{model}/infer", guarded(infer), methods=["POST"]),
        Route("/v2/models/{model}/versions/{version}/infer", guarded(infer), methods=["POST"]),
        Route("/metrics", guarded(metrics), methods=["GET"]),
    ]
    async def no_route(request: Request, exc: Exception) -> Response:   # unknown path or method: our body too
        status = getattr(exc, "status_code", 404)
        return JSONResponse({"error": f"no {request.method} {request.url.path} here (KServe v2 endpoints under /v2)",
                             "code": ec.SERVE_REQUEST_MALFORMED}, status_code=status)

    return Starlette(routes=routes, exception_handlers={404: no_route, 405: no_route})
