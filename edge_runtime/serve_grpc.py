"""The gRPC front end of ``edge-infer serve``: KServe v2 ``inference.GRPCInferenceService``.

Serves ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata and
ModelInfer on a ``grpc.aio`` server in the caller's asyncio loop (the same
loop as uvicorn), with the message classes of ``serve_proto`` (a private
descriptor pool, so ``tritonclient.grpc`` can live in the same process).
Every other RPC of the service answers UNIMPLEMENTED.

It only translates: wire message -> ``InferRequest`` -> ``ServeCore.infer``
-> ``InferResponse`` -> wire message. Limits, backpressure, deadlines and the
model run are the core's. ``ServeError.status`` maps to a gRPC status through
``serve_types.GRPC_STATUS``; the error's ``code`` travels in the trailing
metadata key ``error-code``.

Wire format, as Triton's:
- inputs come in ``raw_input_contents`` (one entry per input, in order) or in
  each input's typed ``contents``; outputs go out in ``raw_output_contents``;
- a BYTES tensor's raw form is its elements, each a 4-byte little-endian
  length then the bytes;
- request ``parameters`` (e.g. ``timeout``, in microseconds as tritonclient
  sends it) pass through to the core as Python values; a call with a gRPC
  deadline and no ``timeout`` parameter gets ``timeout`` = the time left, so
  the core stops work the client no longer waits for; the response's
  parameters are the core's scalar fields (lists and dicts as JSON text).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

from . import error_codes as ec
from . import serve_proto as sp
from .errors import DeviceError
# the messages <-> records (re-exported: their old import path)
from .serve_grpc_wire import (_bad, join_bytes as join_bytes, named_model, split_bytes as split_bytes,
                              to_message as to_message, to_request)
from .serve_types import BYTES, GRPC_STATUS, InferRequest, InferResponse, ServeError, bearer_matches

log = logging.getLogger("edge_runtime.serve.grpc")

DEFAULT_MAX_MESSAGE_BYTES: Final = 2 * 1024 * 1024   # README: request <= 2 MiB (the runtime's default)
# grpcio's own receive limit is this many times the cap: a message over the cap and within it is read
# and refused by the handler, with our code; a bigger one grpcio refuses from its length prefix, unread
# (no handler runs, so no code: reading every message whole first would let one call hold gigabytes)
GRPC_READ_FACTOR: Final = 2
GRPC_MAX_LENGTH: Final = 2 ** 31 - 1                 # grpcio's channel args are C ints
ERROR_CODE_KEY: Final = "error-code"                # trailing metadata key carrying ServeError.code
OPEN_METHODS: Final = frozenset({"ServerLive", "ServerReady"})   # health answers need no token
# -- the service -------------------------------------------------------------------------------------

class _Service:
    def __init__(self, core: Any, token: str | None, cap: int):
        self.core = core
        self._token = token.encode() if token else None
        self._cap = cap

    async def _abort(self, context: Any, err: ServeError) -> None:
        import grpc

        await context.abort(grpc.StatusCode[GRPC_STATUS.get(err.status, "INTERNAL")], err.message,
                            trailing_metadata=((ERROR_CODE_KEY, err.code),))

    def _authorized(self, context: Any) -> bool:
        if self._token is None:
            return True
        given = b""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else bytes(value)
                break
        return bearer_matches(given, self._token)      # the scheme in any case (RFC 7235)

    def handler(self, method: str) -> Any:
        """The async unary handler of ``method``: auth, parse, call, and the typed error mapping."""
        req_cls = sp.message_class(sp.METHODS[method][0])
        call = getattr(self, "_" + method)

        async def handle(raw: bytes, context: Any) -> Any:
            try:
                if method not in OPEN_METHODS and not self._authorized(context):
                    self._count("unauthorized")
                    if method == "ModelInfer":
                        self._refused(*named_model(raw), "unauthorized", len(raw))
                    raise ServeError("unauthorized", "missing or wrong bearer token", ec.SERVE_UNAUTHORIZED)
                if len(raw) > self._cap:   # as HTTP's 413 for a body over --max-body-bytes: never parsed
                    self._count("too_large")
                    if method == "ModelInfer":
                        self._refused(*named_model(raw), "too_large", len(raw))
                    raise ServeError("too_large", f"the message is {len(raw)} bytes, over the server's cap of "
                                     f"{self._cap}", ec.SERVE_REQUEST_TOO_LARGE)
                try:
                    msg = req_cls.FromString(raw)
                except Exception as e:      # protobuf's DecodeError: the caller's bytes, not our bug
                    self._count("malformed")
                    if method == "ModelInfer":
                        self._refused(*named_model(raw), "bad_request", len(raw))
                    raise _bad(f"{method}: the message does not parse ({e})") from None
                return await call(msg, len(raw), context)
            except ServeError as e:
                await self._abort(context, e)
            except Exception as e:         # ours: never a bare INTERNAL without the code
                if _is_abort(e):
                    raise
                log.exception("gRPC %s failed", method)
                await self._abort(context, ServeError("internal", f"{type(e).__name__}: {e}", ec.UNEXPECTED))

        return handle

    def _count(self, reason: str) -> None:
        count = getattr(self.core, "count_rejection", None)
        if count is not None:
            count(reason)

    def _refused(self, model: str, version: str | None, status: str, received_bytes: int) -> None:
        """A ModelInfer answered before the core: counted once in the requests and received bytes, under
        the model it names (refused unparsed: ``named_model``'s bounded read; the core keeps only a served one)."""
        count = getattr(self.core, "count_refused", None)
        if count is not None:
            count(model, version, status, received_bytes)

    async def _ServerLive(self, msg: Any, n: int, context: Any) -> Any:
        return sp.message_class("ServerLiveResponse")(live=bool(self.core.live))

    async def _ServerReady(self, msg: Any, n: int, context: Any) -> Any:
        return sp.message_class("ServerReadyResponse")(ready=bool(self.core.ready))

    async def _ModelReady(self, msg: Any, n: int, context: Any) -> Any:
        ready = self.core.model_ready(msg.name, msg.version or None)
        return sp.message_class("ModelReadyResponse")(ready=bool(ready))

    async def _ServerMetadata(self, msg: Any, n: int, context: Any) -> Any:
        md = self.core.server_metadata()
        return sp.message_class("ServerMetadataResponse")(
            name=str(md.get("name", "")), version=str(md.get("version", "")),
            extensions=[str(x) for x in md.get("extensions", [])])

    async def _ModelMetadata(self, msg: Any, n: int, context: Any) -> Any:
        md = self.core.model_metadata(msg.name, msg.version or None)
        out = sp.message_class("ModelMetadataResponse")(
            name=str(md.get("name", msg.name)), versions=[str(v) for v in md.get("versions", [])],
            platform=str(md.get("platform", "")))
        for kind in ("inputs", "outputs"):
            for t in md.get(kind, []):
                getattr(out, kind).add(name=str(t["name"]), datatype=str(t["datatype"]),
                                       shape=[int(d) for d in t["shape"]])
        return out

    async def _ModelInfer(self, msg: Any, n: int, context: Any) -> Any:
        try:
            req = to_request(msg, n)
        except ServeError as err:
            self._count("malformed")            # refused before the core: counted as the core counts its own
            self._refused(msg.model_name, msg.model_version or None, err.status, n)
            raise
        remaining = context.time_remaining()
        if remaining is not None and "timeout" not in req.parameters:
            # the call's gRPC deadline, when it sets no timeout parameter (µs, as tritonclient's)
            req.parameters["timeout"] = max(1, int(remaining * 1_000_000))
        # shielded: a client that cancels (or whose deadline passes) does not cancel the core's
        # request mid-run. The model call runs on a worker thread that cannot be stopped, so the
        # core's in-flight slot must stay held until it returns; the core's own deadline (the
        # timeout parameter above) bounds it, and the core counts its outcome as usual.
        task = asyncio.ensure_future(self.core.infer(req))
        try:
            resp = await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(_consume)
            raise
        return to_message(resp)


def _consume(task: asyncio.Future) -> None:
    """Retrieve an abandoned request's outcome (no 'exception was never retrieved')."""
    if not task.cancelled():
        task.exception()


def _is_abort(e: BaseException) -> bool:
    """``context.abort`` raises grpc's AbortError: let it through."""
    return type(e).__name__ == "AbortError"


def check_port_free(host: str, port: int) -> None:
    """Bind ``host:port`` once with a plain socket (the options grpc binds with: SO_REUSEADDR, no
    SO_REUSEPORT) and let it go: a port in use is the ``device_unavailable`` error the HTTP listener
    gives (``cli_serve._bind``), said before grpc tries and logs its own. Port 0 needs no check."""
    import socket

    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            raise DeviceError(f"cannot listen on {host}:{port} (gRPC): {exc}", code=ec.DEVICE_UNAVAILABLE) from None


async def start_grpc(core: Any, host: str, port: int, token: str | None = None, *,
                     max_message_bytes: int | None = None) -> Any:
    """Start the KServe v2 gRPC service for ``core`` on ``host:port`` in the running loop.

    Returns the started ``grpc.aio.Server`` (stop it with ``await server.stop(grace)``);
    its bound port (``port=0`` picks a free one) is ``server.edge_port``.
    ``max_message_bytes`` caps a request message (default: the core's body cap,
    ``core.max_body_bytes``, else 2 MiB); a bigger one is RESOURCE_EXHAUSTED with the code
    ``serve_request_too_large`` (HTTP's 413), counted as a ``too_large`` rejection, up to
    ``GRPC_READ_FACTOR`` times the cap; past that grpcio refuses it unread, without the code.
    """
    import grpc

    cap = int(max_message_bytes or getattr(core, "max_body_bytes", 0) or DEFAULT_MAX_MESSAGE_BYTES)
    service = _Service(core, token, cap)
    handlers = {
        method: grpc.unary_unary_rpc_method_handler(
            service.handler(method), request_deserializer=None,        # bytes: parsed in the handler
            response_serializer=lambda m: m.SerializeToString())
        for method in sp.METHODS
    }
    server = grpc.aio.server(options=[
        ("grpc.max_receive_message_length", min(cap * GRPC_READ_FACTOR, GRPC_MAX_LENGTH)),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", 0),
    ])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(sp.SERVICE_FULL_NAME, handlers),))
    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    check_port_free(host, port)       # a port in use: our typed error, not grpc's RuntimeError and native log
    why = "the port cannot be bound"
    try:
        bound = server.add_insecure_port(address)
    except (RuntimeError, OSError) as exc:       # grpc raises RuntimeError('Failed to bind ...')
        bound, why = 0, str(exc)
    if not bound:
        raise DeviceError(f"cannot listen on {host}:{port} (gRPC): {why}", code=ec.DEVICE_UNAVAILABLE)
    await server.start()
    try:
        server.edge_port = bound
    except AttributeError:                     # a server class with slots: the caller passed the port
        pass
    log.info("gRPC KServe v2 on %s (port %d, message cap %d bytes, token %s)",
             address, bound, cap, "required" if token else "off")
    return server
