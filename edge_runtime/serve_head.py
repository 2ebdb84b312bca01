"""The request-head deadline both HTTP protocols of ``edge-infer serve`` share (``serve_h11``,
``serve_httptools``): one timer per connection while a request head is awaited, and the
JSON refusal (408 on the deadline, 431 past the head cap) written before the connection closes.
Each protocol decides when a head is awaited and what its timer does when it fires."""

from __future__ import annotations

import asyncio
import json
from typing import Any


def json_refusal(status: bytes, error: str, code: str) -> bytes:
    """A whole HTTP/1.1 response with the ``{"error", "code"}`` body, closing the connection."""
    body = json.dumps({"error": error, "code": code}).encode()
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class HeadDeadline:
    """Mixed into a uvicorn protocol (``loop``, ``transport``): ``_arm`` starts the head's
    ``head_timeout_s`` timer (calling ``_head_timeout``), ``_disarm`` stops it, a lost
    connection stops it, ``_refuse`` answers and closes."""

    head_timeout_s = 10.0
    loop: asyncio.AbstractEventLoop
    transport: Any

    _head_timer: asyncio.TimerHandle | None = None

    def _head_timeout(self) -> None:
        raise NotImplementedError

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timeout)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)         # type: ignore[misc]

    def _refuse(self, status: bytes, error: str, code: str) -> None:
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(json_refusal(status, error, code))
            self.transport.close()
