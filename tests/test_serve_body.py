"""The infer endpoint's body read (``serve_http_infer.InferEndpoint._body``): the deadline timer is
armed only for a ``receive`` that may wait; a body uvicorn already holds is read without one."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from edge_runtime import serve_http_infer as shi
from edge_runtime.serve_types import ServeError


class _Cycle:
    """uvicorn's RequestResponseCycle as ``receive`` sees it: ``message_event`` set while body bytes wait."""

    def __init__(self, parts: list[tuple[float, bytes, bool]]):
        self.message_event = asyncio.Event()
        self.parts = list(parts)                # (seconds until it arrives, bytes, more_body)
        self._feed()

    def _feed(self) -> None:
        if self.parts:
            delay, _, _ = self.parts[0]
            if delay == 0:
                self.message_event.set()
            else:
                asyncio.get_running_loop().call_later(delay, self.message_event.set)

    async def receive(self):
        await self.message_event.wait()
        self.message_event.clear()
        _, body, more = self.parts.pop(0)
        self._feed()
        return {"type": "http.request", "body": body, "more_body": more}


def _endpoint(timeout_s: float = 0.3):
    core = SimpleNamespace(max_body_bytes=1 << 20)
    return shi.InferEndpoint(core, None, token=None, read_timeout_s=timeout_s)


def _timers(monkeypatch) -> list:
    armed: list = []
    real = asyncio.timeout_at

    def counting(when):
        armed.append(when)
        return real(when)

    monkeypatch.setattr(shi.asyncio, "timeout_at", counting)
    return armed


def test_a_body_that_has_arrived_is_read_without_a_timer(monkeypatch):
    armed = _timers(monkeypatch)

    async def go():
        cycle = _Cycle([(0, b"abc", False)])
        return await _endpoint()._body(cycle.receive, b"3")

    assert asyncio.run(go()) == b"abc" and armed == []


def test_a_body_still_coming_is_read_under_the_deadline_and_refused_past_it(monkeypatch):
    armed = _timers(monkeypatch)

    async def go(late: float):
        cycle = _Cycle([(0, b"ab", True), (late, b"c", False)])
        return await _endpoint(0.3)._body(cycle.receive, None)

    assert asyncio.run(go(0.05)) == b"abc" and len(armed) == 1         # the first part had arrived: one timer
    with pytest.raises(ServeError) as e:
        asyncio.run(go(1.0))
    assert e.value.status == "request_timeout"


def test_a_receive_without_an_event_always_has_a_deadline(monkeypatch):
    armed = _timers(monkeypatch)

    async def receive():
        await asyncio.sleep(1.0)
        return {"type": "http.request", "body": b"x", "more_body": False}

    with pytest.raises(ServeError) as e:
        asyncio.run(_endpoint(0.1)._body(receive, None))
    assert e.value.status == "request_timeout" and len(armed) == 1


def test_uvicorns_cycle_has_the_event_the_fast_path_reads():
    """If uvicorn renamed it, the fast path would go quietly unused: this says so instead."""
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    cycle = object.__new__(RequestResponseCycle)
    cycle.message_event = asyncio.Event()
    assert shi._arrived(cycle.receive) is cycle.message_event
    assert shi._arrived(lambda: None) is None
