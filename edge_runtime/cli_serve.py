"""``edge-infer serve``: the Open Inference Protocol (KServe v2) over HTTP, and gRPC when grpcio is installed.

One asyncio loop runs uvicorn (``uvicorn.Server``) and the gRPC server
(``serve_grpc.start_grpc``) over one ``ServeCore``. Both listen first (live,
not ready); the artifacts load, verify and warm on a thread; then one line
``ready http=HOST:PORT grpc=HOST:PORT models=NAME/VERSION,...`` goes to stdout.
SIGTERM or SIGINT: readiness turns false, the listeners close, the requests
in flight finish within ``--drain-timeout``, one line ``stopped ...`` goes to
stdout and the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import signal
import socket
import sys
import time
from pathlib import Path

import click

from . import error_codes as ec
from .cli_common import PORT, Finite, _guard, device_flags, device_options
from .errors import DeviceError, InputError


MAX_HEAD_BYTES = 64 * 1024     # the request line and headers, either parser


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)   # IPPROTO_TCP: asyncio then sets TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise DeviceError(f"cannot listen on {host}:{port}: {exc}", code=ec.DEVICE_UNAVAILABLE) from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def _say(line: str) -> None:
    click.echo(line)
    sys.stdout.flush()


@click.command("serve")
@click.argument("artifacts", nargs=-1, type=click.Path())
@click.option("--repository", type=click.Path(), help="Serve every artifact folder under DIR (a subfolder holding a "
                                                      "manifest.json), instead of ARTIFACT...")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. Anything but loopback needs --token (or --insecure).")
@click.option("--port", default=8000, show_default=True, type=PORT, help="HTTP port (0: a free one).")
@click.option("--grpc-port", type=PORT, default=8001, show_default=True,
              help="gRPC port (0: a free one); served when grpcio is installed.")
@click.option("--no-grpc", is_flag=True, help="Serve HTTP only.")
@click.option("--token", envvar="EDGE_INFER_TOKEN", help="Require 'Authorization: Bearer TOKEN' (also from "
                                                         "$EDGE_INFER_TOKEN, which keeps it out of ps).")
@click.option("--insecure", is_flag=True, help="Allow a non-loopback bind without a token.")
@device_flags()
@click.option("--max-in-flight", default=4, show_default=True, type=click.IntRange(1),
              help="Requests running at once per model (a model that batches: merged batches, up to 32 "
                   "requests each).")
@click.option("--max-queue", default=64, show_default=True, type=click.IntRange(0),
              help="Requests waiting per model; beyond in-flight (x 32 for a model that batches) + queue the "
                   "answer is 429.")
@click.option("--batch-delay-ms", default=1.0, show_default=True, type=Finite(0),
              help="Dynamic batching window for backends with a batch path (OpenVINO); 0 turns it off.")
@click.option("--max-body-bytes", default=8 * 1024 * 1024, show_default=True, type=click.IntRange(1),
              help="Largest HTTP request body, and gRPC message; a larger Content-Length is refused (413) "
                   "unread, a larger gRPC message RESOURCE_EXHAUSTED.")
@click.option("--read-timeout", default=10.0, show_default=True, type=Finite(0.01),
              help="Seconds the request head (line and headers), and then its whole body, may each take "
                   "to arrive (408 after).")
@click.option("--drain-timeout", default=30.0, show_default=True, type=Finite(0),
              help="Seconds in-flight requests may take to finish after SIGTERM/SIGINT.")
@click.option("--no-verify", is_flag=True, help="Skip the probe-set check on this machine at load.")
@click.option("--no-inline", is_flag=True, help="Run every model call on the thread pool (by default a model "
              "measured at <= 1 ms per call runs on the event loop, saving the hand-off).")
@click.option("--http-parser", type=click.Choice(["auto", "httptools", "h11"]), default="auto", show_default=True,
              help="HTTP/1.1 parser: httptools (C; auto takes it when installed) or h11 (pure Python). Both cap "
                   "the request head at 64 KiB and time it out after --read-timeout.")
@click.option("--loop", "loop_name", type=click.Choice(["auto", "uvloop", "asyncio"]), default="auto",
              show_default=True, help="Event loop: uvloop (auto takes it when installed) or asyncio's own.")
@_guard
def serve(artifacts, repository, host, port, grpc_port, no_grpc, token, insecure, device, require_device,
          device_option, max_in_flight, max_queue, batch_delay_ms, max_body_bytes, read_timeout, drain_timeout, no_verify,
          no_inline, http_parser, loop_name):
    """Serve ARTIFACT... over the Open Inference Protocol (KServe v2): HTTP (and gRPC), tritonclient works as is.

    \b
    Examples:
      edge-infer serve out/digits-int8
      edge-infer serve --repository models/ --port 8000 --grpc-port 8001
      EDGE_INFER_TOKEN=s3cret edge-infer serve ART --host 0.0.0.0
      curl -s localhost:8000/v2/models/digits-cnn
    """
    from .serve_core import ServeCore, artifacts_in

    if bool(artifacts) == bool(repository):
        raise InputError("give ARTIFACT... or --repository DIR (one of them)", code=ec.INPUT_MISSING)
    if token is not None and token != "" and (not token.strip() or token != token.strip()):
        # a blank token would guard nothing (a non-loopback bind would be open), and one with
        # spaces around it cannot be sent: HTTP trims header values
        raise InputError("--token (or $EDGE_INFER_TOKEN) is blank or has spaces around it: give the token itself",
                         code=ec.INPUT_INVALID)
    if not is_loopback(host) and not token and not insecure:
        raise InputError(f"--host {host} is not loopback: set --token (or $EDGE_INFER_TOKEN), or pass --insecure "
                         f"to serve without one", code=ec.INPUT_INVALID)
    paths: list[str | Path] = list(artifacts) if artifacts else list(artifacts_in(repository))
    core = ServeCore(paths, device=device, strict=require_device,
                     device_options=device_options(device_option) or None, max_in_flight=max_in_flight,
                     max_queue=max_queue, batch_delay_ms=batch_delay_ms, max_body_bytes=max_body_bytes,
                     verify=not no_verify, inline=not no_inline)
    parser, loop_factory = http_stack(http_parser, loop_name)
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(_run(core, host, port, None if no_grpc else grpc_port, token, read_timeout, drain_timeout,
                            parser))
    finally:
        core.close()


def _installed(module: str) -> bool:
    from .hardware_packages import find_spec

    return find_spec(module, None) is not None


def http_stack(parser: str, loop: str):
    """(parser name, event loop factory or None for asyncio's own). ``auto`` takes httptools and uvloop
    when installed (the ``serve`` extra installs both): digits over HTTP, p50 round trip of a bare ASGI
    app 0.19 ms with both against 0.44 ms with h11 on asyncio (2-core Xeon). Asking for one that is not
    installed is a ``DeviceError`` naming the extra."""
    for name, wanted in (("httptools", parser), ("uvloop", loop)):
        if wanted == name and not _installed(name):
            raise DeviceError(f"--{'http-parser' if name == 'httptools' else 'loop'} {name}: {name} is not installed "
                              f"(pip install 'edge-runtime[serve]')", code=ec.DEVICE_UNAVAILABLE)
    if parser == "auto":
        parser = "httptools" if _installed("httptools") else "h11"
    factory = None
    if loop == "uvloop" or (loop == "auto" and _installed("uvloop")):
        import uvloop

        factory = uvloop.new_event_loop
    return parser, factory


def _grpc_starter():
    """``serve_grpc.start_grpc``, or None with the reason when gRPC cannot be served here."""
    try:
        import grpc  # noqa: F401
    except ImportError:
        return None, "grpcio is not installed (pip install 'edge-runtime[grpc]')"
    try:
        from .serve_grpc import start_grpc
    except ImportError as exc:
        return None, f"the gRPC front end cannot be imported: {exc}"
    return start_grpc, None


async def _run(core, host: str, port: int, grpc_port: int | None, token: str | None, read_timeout: float,
               drain_timeout: float, parser: str = "h11") -> None:
    import uvicorn

    from .serve_http import create_app

    if parser == "httptools":
        from .serve_httptools import protocol as guarded

        http_protocol: type = guarded(read_timeout, MAX_HEAD_BYTES)
    else:
        from .serve_h11 import protocol

        http_protocol = protocol(read_timeout)

    class Server(uvicorn.Server):       # our signal handlers, not uvicorn's (it re-raises the signal on exit)
        @contextlib.contextmanager
        def capture_signals(self):
            yield

    t0 = time.perf_counter()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sock = _bind(host, port)
    # our protocol classes, never uvicorn's own: both cap the request line and headers (uvicorn's
    # httptools protocol takes a header of any size, 4 MB measured) and put a deadline on the request
    # head (serve_h11, serve_httptools)
    config = uvicorn.Config(create_app(core, token=token, read_timeout_s=read_timeout), log_level="warning",
                            http=http_protocol, access_log=False, lifespan="off", timeout_keep_alive=5,
                            proxy_headers=False,   # no X-Forwarded-* rewriting: nothing here reads the client address
                            timeout_graceful_shutdown=max(1, int(drain_timeout + 0.999)),
                            h11_max_incomplete_event_size=MAX_HEAD_BYTES)
    server = Server(config)
    http_task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not http_task.done():
        await asyncio.sleep(0.01)
    if http_task.done():
        http_task.result()
    grpc_server, grpc_where = None, "off"
    load: asyncio.Future | None = None
    try:
        if grpc_port is not None:
            start_grpc, why = _grpc_starter()
            if start_grpc is None:
                click.echo(f"serving HTTP only: {why}", err=True)
            else:
                grpc_server = await start_grpc(core, host, grpc_port, token)
                grpc_where = f"{host}:{getattr(grpc_server, 'edge_port', grpc_port)}"
        load = asyncio.ensure_future(loop.run_in_executor(None, core.load_all))
        await asyncio.wait([load, asyncio.ensure_future(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
        if load.done():
            load.result()            # a load error: stop the listeners, then the CLI reports it
            http = f"{host}:{sock.getsockname()[1]}"
            models = ",".join(f"{n}/{v}" for n, v in core.models)
            loop_kind = "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
            _say(f"ready http={http} grpc={grpc_where} models={models} load_s={core.load_s:.2f} "
                 f"start_s={time.perf_counter() - t0:.2f} http_parser={parser} loop={loop_kind}")
            await stop.wait()
    finally:
        await _shutdown(core, server, http_task, grpc_server, drain_timeout)
    _say(f"stopped requests={core.accepted} answered={core.answered} cancelled={core.cancelled} "
         f"unanswered={core.accepted - core.answered - core.cancelled}"
         + ("" if load is not None and load.done() else " (before the models finished loading)"))


async def _shutdown(core, server, http_task, grpc_server, drain_timeout: float) -> None:
    """Readiness false and the listeners closed at once; in-flight requests get ``drain_timeout``."""
    server.should_exit = True
    waits = [core.drain(drain_timeout), asyncio.wait_for(asyncio.shield(http_task), drain_timeout + 5)]
    if grpc_server is not None:
        waits.append(grpc_server.stop(drain_timeout))
    results = await asyncio.gather(*waits, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, (asyncio.TimeoutError, asyncio.CancelledError)):
            click.echo(f"shutdown: {type(r).__name__}: {r}", err=True)
