"""The HTTP/REST front end of ``edge-infer serve`` (KServe v2 / Open Inference Protocol).

The infer path (``POST /v2/models/{m}[/versions/{v}]/infer``) is a bare ASGI
handler (``serve_http_infer``): the body to an ``InferRequest``
(``serve_wire``), the ``ServeCore``'s answer or ``ServeError`` back, with the
body's cap and deadline. Health, metadata, metrics and unknown paths are a
small Starlette app. On both, a bearer token, when set, is compared in
constant time (``/v2/health/*`` stays open for probes).

No Content-Type is required (tritonclient sends none). Errors are
``{"error": message, "code": code}`` with the status of ``HTTP_STATUS``.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from .serve_core import ServeCore
from .serve_http_infer import InferEndpoint, authorized, bearer, no_route, unauthorized
from .serve_types import HTTP_STATUS, ServeError

_OPEN_PATHS = ("/v2/health/live", "/v2/health/ready")


def error_response(err: ServeError, *, close: bool = False) -> JSONResponse:
    headers = {"Connection": "close"} if close else {}
    if err.status == "unauthorized":
        headers["WWW-Authenticate"] = "Bearer"       # RFC 7235: a 401 names the scheme it wants
    return JSONResponse(err.body(), status_code=HTTP_STATUS[err.status], headers=headers or None)


def create_app(core: ServeCore, *, token: str | None = None, read_timeout_s: float = 10.0) -> InferEndpoint:
    expected = bearer(token)

    def refused(request: Request) -> JSONResponse | None:
        if request.url.path in _OPEN_PATHS:
            return None
        given = next((v for k, v in request.scope["headers"] if k == b"authorization"), None)
        if authorized(given, expected):
            return None
        core.count_rejection("unauthorized")
        return error_response(unauthorized())

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

    routes: list[Any] = [
        Route("/v2/health/live", guarded(live), methods=["GET"]),
        Route("/v2/health/ready", guarded(ready), methods=["GET"]),
        Route("/v2", guarded(server_metadata), methods=["GET"]),
        Route("/v2/models/{model}", guarded(model_metadata), methods=["GET"]),
        Route("/v2/models/{model}/versions/{version}", guarded(model_metadata), methods=["GET"]),
        Route("/v2/models/{model}/ready", guarded(model_ready), methods=["GET"]),
        Route("/v2/models/{model}/versions/{version}/ready", guarded(model_ready), methods=["GET"]),
        Route("/metrics", guarded(metrics), methods=["GET"]),
    ]
    async def unrouted(request: Request, exc: Exception) -> Response:   # unknown path or method: our body too
        status = getattr(exc, "status_code", 404)
        headers = None
        if status == 405:          # RFC 9110: a 405 lists the methods the path takes (Starlette's, sorted)
            allow = (getattr(exc, "headers", None) or {}).get("Allow", "")
            headers = {"Allow": ", ".join(sorted(m.strip() for m in allow.split(",") if m.strip())) or "GET"}
        return JSONResponse(no_route(request.method, request.url.path), status_code=status, headers=headers)

    app = Starlette(routes=routes, exception_handlers={404: unrouted, 405: unrouted})
    return InferEndpoint(core, app, token=token, read_timeout_s=read_timeout_s)
