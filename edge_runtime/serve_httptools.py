"""uvicorn's httptools protocol with a cap on the request head and a deadline on it (``edge-infer serve``).

httptools (llhttp, in C) parses a request in a fraction of h11's time: a
bare ASGI round trip on loopback took 0.19 ms with httptools + uvloop against
0.44 ms with h11 + asyncio (2-core Xeon, 2026-12-05). But uvicorn's httptools
protocol takes a request line and headers of any size (httptools joins a
header's pieces until it ends: a 4 MB header was buffered whole) and, like
its h11 protocol, has no deadline on a head arriving a byte at a time. Here:

- the head (request line and headers) is capped at ``max_head_bytes``, with a
  431 and the connection closed past it, counted two ways. A head that ends is
  measured by the parser's callbacks (the URL, each header's name and value,
  their separators) when it ends, and refused there, before the request is
  dispatched. A head that has not ended is counted by reads: a read that
  begins inside a head (or between requests) and ends with that head still
  incomplete counts whole; a read in which a head ended does not (its bytes
  are that head's end, bodies, whole pipelined requests, and at most one read
  of the next head, which the following reads then count). So at most the cap
  plus one read (256 KiB) of a head is ever held, and a large body or many
  pipelined requests arriving in one read are never taken for a head;
- a connection waiting for a request head (a new one, or a request begun but
  whose headers have not ended) must complete it within ``head_timeout_s`` of
  its opening or of the request's first byte, else it gets a 408 and is
  closed; the body has its own deadline (``serve_http_infer``), and an
  idle kept-alive connection uvicorn's ``timeout_keep_alive``.

The h11 protocol (``serve_h11``) does the same where httptools is absent.
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from . import error_codes as ec
from .serve_head import HeadDeadline


_LINE_BYTES = 32               # the request line's method, spaces, version and CRLF, and the head's last CRLF
_FIELD_BYTES = 4               # ": " and CRLF around a header's name and value


class _HeadTooLarge(Exception):
    """Raised from ``on_headers_complete`` to stop the parser at a refused head (no body, no dispatch)."""


class GuardedHttpTools(HeadDeadline, HttpToolsProtocol):
    max_head_bytes = 64 * 1024

    _in_head = True            # no request yet, or one begun whose headers have not ended
    _head_bytes = 0            # bytes of the current head counted so far
    _heads_ended = 0           # heads that ended so far on this connection
    _head_seen = 0             # the current head's size as its callbacks measured it
    _refused = False

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()                              # a connection that sends nothing gets a 408

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        counting = self._in_head                 # the chunk starts inside a head (or between requests)
        ended = self._heads_ended
        super().data_received(data)
        if counting and self._in_head and self._heads_ended == ended and not self._refused:
            self._head_bytes += len(data)        # no head ended in it: the whole chunk was head
            if self._head_bytes > self.max_head_bytes:
                self._refuse_head()

    def _refuse_head(self) -> None:
        self._refuse(b"431 Request Header Fields Too Large",
                     f"the request line and headers exceed {self.max_head_bytes} bytes", ec.SERVE_REQUEST_MALFORMED)

    # parser callbacks (httptools calls the protocol's own methods)
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0
        self._head_seen = _LINE_BYTES
        if self._head_timer is None:
            self._arm()                          # a head begun: it has head_timeout_s to end

    def on_url(self, url: bytes) -> None:
        self._head_seen += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_seen += len(name) + len(value) + _FIELD_BYTES
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads_ended += 1
        self._disarm()                           # the head is in: the body has its own deadline
        if self._head_seen > self.max_head_bytes:     # it ended within one read: measured, not counted
            self._refuse_head()
            raise _HeadTooLarge                  # the parser stops here: the request is never dispatched
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        if self._refused:                        # the parser stopped at our refusal (_HeadTooLarge): answered
            return
        super().send_400_response(msg)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True                     # what follows is the next request's head
        self._head_bytes = 0

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._in_head:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._arm()                          # a response is on its way (pipelining): after it
            return
        self._refuse(b"408 Request Timeout", f"the request head did not arrive within {self.head_timeout_s:g} s",
                     ec.SERVE_REQUEST_TIMEOUT)

    def _refuse(self, status: bytes, error: str, code: str) -> None:
        self._refused = True                     # what still arrives on this connection is dropped
        super()._refuse(status, error, code)


def protocol(head_timeout_s: float, max_head_bytes: int) -> type[GuardedHttpTools]:
    """The protocol class for ``uvicorn.Config(http=...)`` with this head deadline and cap."""
    return type("EdgeHttpTools", (GuardedHttpTools,),
                {"head_timeout_s": float(head_timeout_s), "max_head_bytes": int(max_head_bytes)})
