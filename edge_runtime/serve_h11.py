"""uvicorn's h11 protocol with a deadline on the request head (``edge-infer serve``).

uvicorn times out an idle keep-alive connection, but not a request whose
line and headers arrive a byte at a time, nor a new connection that sends
nothing (slowloris: a few hundred such sockets hold a board's server). Here a
connection waiting for a request head (a new one, or a kept-alive one between
requests) must complete the head within ``head_timeout_s`` of its first byte
or of its opening; otherwise it gets a 408 and is closed. The body has its own
deadline (``serve_http_infer``); h11 caps the head's size
(``h11_max_incomplete_event_size``).
"""

from __future__ import annotations

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from . import error_codes as ec
from .serve_head import HeadDeadline


class HeadTimeoutH11(HeadDeadline, H11Protocol):
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            if self._head_timer is None and self.conn.trailing_data[0]:
                self._arm()                      # part of a head: it has head_timeout_s to complete
        else:
            self._disarm()                       # the head is in: the body has its own deadline

    def on_response_complete(self) -> None:
        super().on_response_complete()           # the keep-alive timer covers the idle wait
        self._disarm()

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return                               # a response is on its way (pipelining)
        self._refuse(b"408 Request Timeout", f"the request head did not arrive within {self.head_timeout_s:g} s",
                     ec.SERVE_REQUEST_TIMEOUT)


def protocol(head_timeout_s: float) -> type[HeadTimeoutH11]:
    """The protocol class for ``uvicorn.Config(http=...)`` with this head deadline."""
    return type("EdgeH11", (HeadTimeoutH11,), {"head_timeout_s": float(head_timeout_s)})
