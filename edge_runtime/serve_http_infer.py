"""The infer endpoint of ``edge-infer serve`` over HTTP, as a bare ASGI handler (``serve_http``).

``POST /v2/models/{m}[/versions/{v}]/infer`` is the one path on which every
request does work; it is served here, without Starlette's middleware stack,
``Request`` and ``Response`` objects, which cost a small model more than its
own request parsing. Everything else (health, metadata, metrics, unknown
paths) goes to the Starlette app. The guards are the same as everywhere:

- a bearer token, when set, compared in constant time;
- a ``Content-Length`` over ``max_body_bytes`` refused (413) before a byte of
  the body is read; a body without one read in chunks and refused as soon as
  it passes the cap; the whole body within ``read_timeout_s`` (408); after
  such a refusal the connection closes (the rest of the body is never read);
- any method but POST on an infer path: 405 with ``Allow: POST``;
- errors are ``{"error": message, "code": code}`` with the status of ``HTTP_STATUS``.
"""

from __future__ import annotations

import asyncio
import re

from . import error_codes as ec
from . import serve_json
from .serve_core import ServeCore, serve_error
from .serve_types import HTTP_STATUS, ServeError, bearer_matches
from .serve_wire import decode_request, encode_response

INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
INLINE_DECODE_BYTES = 64 * 1024      # larger bodies are decoded on a worker thread
_REASON = {"too_large": "too_large", "request_timeout": "read_timeout"}
_JSON = b"application/json"


class _ClientGone(Exception):
    pass


# shared with the Starlette app (serve_http): one token check, one refusal, one unknown-route body
def bearer(token: str | None) -> bytes | None:
    """The Bearer credentials a request must carry, or None when no token is set."""
    return token.encode() if token else None


def authorized(given: bytes | None, expected: bytes | None) -> bool:
    """Whether the request's ``Authorization`` bytes are ``Bearer <token>`` (the scheme in any case,
    RFC 7235; the token compared in constant time)."""
    return bearer_matches(given, expected)


def unauthorized() -> ServeError:
    return ServeError("unauthorized", "missing or wrong bearer token", ec.SERVE_UNAUTHORIZED)


CHALLENGE = [(b"www-authenticate", b"Bearer")]     # a 401 says which scheme it wants (RFC 7235)


def no_route(method: str, path: str) -> dict:
    """The body of a 404 or 405: the request's method and path, and where the endpoints are."""
    return {"error": f"no {method} {path} here (KServe v2 endpoints under /v2)", "code": ec.SERVE_REQUEST_MALFORMED}


async def _send(send, status: int, body: bytes, content_type: bytes, extra: list | None = None) -> None:
    headers = [(b"content-length", str(len(body)).encode()), (b"content-type", content_type)]
    if extra:
        headers += extra
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(send, err: ServeError, *, close: bool = False) -> None:
    extra = [(b"connection", b"close")] if close else []
    if err.status == "unauthorized":
        extra += CHALLENGE
    await _send(send, HTTP_STATUS[err.status], serve_json.dumps(err.body()), _JSON, extra or None)


class InferEndpoint:
    """ASGI: the infer path here, every other request to ``app``."""

    def __init__(self, core: ServeCore, app, *, token: str | None, read_timeout_s: float):
        self.core, self.app, self.read_timeout_s = core, app, read_timeout_s
        self.expected = bearer(token)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            route = INFER_PATH.fullmatch(scope["path"])
            if route is not None:
                return await self._infer(scope, receive, send, route.group(1), route.group(2))
        await self.app(scope, receive, send)

    async def _infer(self, scope, receive, send, model: str, version: str | None) -> None:
        core = self.core
        claimed = header_length = auth = None
        for name, value in scope["headers"]:        # the first of each, as Starlette's Headers.get
            if name == b"content-length":
                claimed = value if claimed is None else claimed
            elif name == b"inference-header-content-length":
                header_length = value.decode("latin-1") if header_length is None else header_length
            elif name == b"authorization":
                auth = value if auth is None else auth
        # every request answered here before the core is counted here, once (the core counts its own)
        if not authorized(auth, self.expected):
            core.count_rejection("unauthorized")
            core.count_refused(model, version, "unauthorized", 0)
            return await send_error(send, unauthorized())
        if scope["method"] != "POST":
            core.count_refused(model, version, "method_not_allowed", 0)
            return await _send(send, 405, serve_json.dumps(no_route(scope["method"], scope["path"])), _JSON,
                               [(b"allow", b"POST")])
        got = [0]                      # body bytes received, also when the body is refused part-read
        try:
            body = await self._body(receive, claimed, got)
        except _ClientGone:
            core.count_rejection("disconnected")
            core.count_refused(model, version, "cancelled", got[0])
            return await _send(send, 400, b"", b"text/plain")
        except ServeError as err:      # the rest of the body is never read: the connection closes after it
            core.count_rejection(_REASON.get(err.status, "malformed"))
            core.count_refused(model, version, err.status, got[0])
            return await send_error(send, err, close=True)
        try:
            if len(body) <= INLINE_DECODE_BYTES:
                req, binary_all, binary_named = decode_request(body, header_length, model, version)
            else:       # parsing megabytes of JSON would stall every other connection: off the event loop
                req, binary_all, binary_named = await asyncio.get_running_loop().run_in_executor(
                    None, decode_request, body, header_length, model, version)
        except ServeError as err:
            core.count_rejection("malformed")
            core.count_refused(model, version, err.status, len(body))
            return await send_error(send, err)
        try:
            resp = await core.infer(req)
        except Exception as exc:       # ServeError from the core (counted there)
            return await send_error(send, serve_error(exc))
        try:
            payload, json_len = encode_response(resp, binary_all, binary_named)
        except Exception as exc:       # an answer JSON cannot carry (a BYTES element not UTF-8), or a bug
            refusal = serve_error(exc)
            core.recount(req.model, req.version, refusal.status)     # counted "ok" by the core: it is not
            return await send_error(send, refusal)
        if json_len is None:
            return await _send(send, 200, payload, _JSON)
        await _send(send, 200, payload, b"application/octet-stream",
                    [(b"inference-header-content-length", str(json_len).encode())])

    async def _body(self, receive, claimed: bytes | None, got: list[int] | None = None) -> bytes:
        """The body, at most the core's ``max_body_bytes``, all of it within ``read_timeout_s``;
        ``got[0]``: the bytes received so far (for the metrics, also when it raises)."""
        cap = self.core.max_body_bytes
        if claimed is not None:
            try:
                n = int(claimed)
            except ValueError:
                raise ServeError("bad_request", f"Content-Length is not an integer: {claimed[:40].decode('latin-1')!r}",
                                 ec.SERVE_REQUEST_MALFORMED) from None
            if n > cap:
                raise ServeError("too_large", f"the body is {n} bytes, over the server's cap of {cap}",
                                 ec.SERVE_REQUEST_TOO_LARGE)
        chunks, total = [], 0
        got = [0] if got is None else got
        end = asyncio.get_running_loop().time() + self.read_timeout_s
        arrived = _arrived(receive)
        while True:
            if arrived is not None and arrived.is_set():
                msg = await receive()           # the server has the data: no wait, so no timer to arm
            else:
                try:
                    async with asyncio.timeout_at(end):      # the whole body within read_timeout_s
                        msg = await receive()
                except TimeoutError:
                    raise ServeError("request_timeout", f"the body did not arrive within {self.read_timeout_s:g} s",
                                     ec.SERVE_REQUEST_TIMEOUT) from None
            if msg["type"] == "http.disconnect":
                raise _ClientGone
            chunk = msg.get("body", b"")
            if chunk:
                total += len(chunk)
                got[0] = total
                if total > cap:
                    raise ServeError("too_large", f"the body passed the server's cap of {cap} bytes",
                                     ec.SERVE_REQUEST_TOO_LARGE)
                chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _arrived(receive) -> asyncio.Event | None:
    """uvicorn's per-request event, set while received body bytes wait to be read (its ``receive``
    then returns them without waiting: a small body usually arrives with its head), or None for a
    server that has none; ``_body`` arms its deadline only for a receive that may wait."""
    event = getattr(getattr(receive, "__self__", None), "message_event", None)
    return event if isinstance(event, asyncio.Event) else None
