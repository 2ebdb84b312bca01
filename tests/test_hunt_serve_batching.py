"""Hunt: ``edge-infer serve``'s dynamic batching and each request's own deadline (``serve_batch``).

In-process ``ServeCore`` on a tiny fake text classifier (``factories.make_artifact``), inline off;
its batch path switched on where a test says so (``_batched_fake``: OpenVINO's ``run_many``
contract, as ``test_hunt_batch_metrics``). The model calls are slowed or gated by wrapping the
runtime's ``infer`` / ``infer_batch``; answers are compared with a plain runtime's ``rt.infer``.

- a request that is not merged (call options, ``max_batch_items`` items, a backend without a batch
  path) waited for a slot past its own deadline, and a request of several items on such a backend
  was answered 200 long after its deadline (the runtime's deadline is per item): now its 504 comes
  at its deadline, queued or running, while the call keeps its slot until the model thread returns;
- ``drain`` returned while a merged batch whose callers had all gone (504) still ran;
- a batched request whose deadline passed in the queue was told "before its batch finished".
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import pytest

import edge_runtime as er
from edge_runtime import error_codes as ec
from edge_runtime.serve_types import InferRequest, ServeError, Tensor

from test_hunt_batch_metrics import _batched_fake  # noqa: E402

WORDS = ["good", "bad", "great", "awful", "stock", "market", "crashes", "rises", "the", "a", "is", "movie"]


@pytest.fixture
def art(make_artifact):
    return make_artifact("text-classification")


def _core(art, *, batched: bool):
    from edge_runtime.serve_core import ServeCore

    c = ServeCore([art], device="fake", max_in_flight=1, max_queue=64, batch_delay_ms=5, inline=False,
                  verify=False)
    c.load_all()
    (m,) = c.models.values()
    if batched:
        _batched_fake(m.rt)
        m.batched = True
    assert c._batches_on(m) == batched and m.inline is None
    return c, m


@pytest.fixture
def core(art):
    c, m = _core(art, batched=False)
    yield c, m
    c.close()


@pytest.fixture
def bcore(art):
    c, m = _core(art, batched=True)
    yield c, m
    c.close()


def _req(m, texts, **params) -> InferRequest:
    return InferRequest(m.name, None, [Tensor("text", "BYTES", [len(texts)], list(texts))], parameters=params,
                        outputs=["result"])


def _slow(monkeypatch, m, seconds: float, calls: list | None = None, gate: threading.Event | None = None):
    """Every model call of ``m`` takes ``seconds`` (after ``gate`` opens, where one is given)."""
    real_one, real_many = m.rt.infer, m.rt.infer_batch

    def wait(n):
        if calls is not None:
            calls.append(n)
        if gate is not None:
            assert gate.wait(20)
        time.sleep(seconds)

    def one(raw, **kw):
        wait(1)
        return real_one(raw, **kw)

    def many(items, **kw):
        wait(len(items))
        return real_many(items, **kw)

    monkeypatch.setattr(m.rt, "infer", one)
    monkeypatch.setattr(m.rt, "infer_batch", many)


async def _timed(coro, stamps: dict, key):
    try:
        return await coro
    finally:
        stamps[key] = time.perf_counter()


async def _idle(m, within: float = 10.0) -> None:
    end = time.perf_counter() + within
    while (m.running or m.waiting or m.batches_out) and time.perf_counter() < end:
        await asyncio.sleep(0.01)


def _late(x) -> bool:
    return isinstance(x, ServeError) and (x.status, x.code) == ("timeout", ec.INFERENCE_TIMEOUT)


# -- merged requests: each its own answers; a lone one beside them keeps its own deadline ---------------
def test_merged_requests_get_their_own_answers_and_a_lone_one_its_own_deadline(bcore, art, monkeypatch):
    """32 concurrent requests with distinct texts (some of several items, one with an empty text, one
    cancelled while its batch runs) are merged; each gets exactly its own answers in its own order,
    as ``rt.infer`` of each text. A request of ``max_batch_items`` items (run alone) with a 250 ms
    ``timeout`` queued behind them gets its 504 at its deadline: before, it waited for the slot
    (the first call alone takes 0.5 s) and was answered when the slot came, long after it."""
    c, m = bcore
    ref = er.load(art, device="fake")
    rng = random.Random(7)
    reqs = [[" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9))).encode()
             for _ in range(rng.choice([1, 1, 2, 3]))] for _ in range(32)]
    reqs[5] = [b"good movie", b"", b"bad"]                       # its own bad item: its own 400
    calls: list = []
    _slow(monkeypatch, m, 0.5, calls)
    stamps: dict = {}

    async def scenario():
        tasks = [asyncio.ensure_future(c.infer(_req(m, texts))) for texts in reqs]
        await asyncio.sleep(0.1)                                  # the first runs; the rest are merged
        t0 = time.perf_counter()
        lone = asyncio.ensure_future(_timed(c.infer(_req(m, [b"good"] * c.max_batch_items, timeout=250_000)),
                                            stamps, "lone"))
        await asyncio.sleep(0.6)                                  # the merged batch runs
        tasks[9].cancel()                                         # its caller leaves mid-batch
        got = await asyncio.wait_for(asyncio.gather(*tasks, lone, return_exceptions=True), 30)
        await _idle(m)
        return t0, got

    t0, got = asyncio.run(scenario())
    *answers, lone = got
    assert _late(lone), lone
    assert stamps["lone"] - t0 < 0.45, f"the lone request's 504 came {stamps['lone'] - t0:.2f} s after it"
    assert len(calls) >= 2 and max(calls) > 3, calls                # merged: not one call per request
    for i, (texts, ans) in enumerate(zip(reqs, answers)):
        if i == 5:
            assert isinstance(ans, ServeError) and ans.code == ec.INPUT_EMPTY and "item 1" in str(ans), ans
            continue
        if i == 9:
            assert isinstance(ans, asyncio.CancelledError), ans
            continue
        assert not isinstance(ans, BaseException), (i, ans)
        (out,) = ans.outputs
        mine = [json.loads(v) for v in out.data]
        want = [ref.infer(t).to_dict() for t in texts]
        assert [(d["prediction"], d["scores"]) for d in mine] == [(w["prediction"], w["scores"]) for w in want], i
    counts = dict(c._requests)
    assert counts == {(m.name, "ok"): 30, (m.name, "bad_request"): 1, (m.name, "cancelled"): 1,
                      (m.name, "timeout"): 1}, counts
    assert m.running == m.waiting == m.batches_out == 0 and c._active == 0
    ref.close()


# -- a request run alone: its own deadline, queued or running ----------------------------------------------
def test_a_request_queued_for_a_slot_gets_its_504_at_its_own_deadline(core, monkeypatch):
    """A backend without a batch path, one slot held by a long call: a request with a 100 ms
    ``timeout`` behind it got its 504 only when the slot came free (the old code waited on the
    slot without a deadline); the long call is answered as always."""
    c, m = core
    gate = threading.Event()
    _slow(monkeypatch, m, 0.0, gate=gate)
    stamps: dict = {}

    async def scenario():
        first = asyncio.ensure_future(c.infer(_req(m, [b"good movie"])))
        await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        late = asyncio.ensure_future(_timed(c.infer(_req(m, [b"bad"], timeout=100_000)), stamps, "late"))
        await asyncio.sleep(0.6)
        done_early = late.done()
        gate.set()
        got = await asyncio.wait_for(asyncio.gather(first, late, return_exceptions=True), 20)
        return t0, done_early, got

    t0, done_early, (first, late) = asyncio.run(scenario())
    assert done_early and _late(late), late
    assert "queued" in str(late) and stamps["late"] - t0 < 0.5
    assert not isinstance(first, BaseException), first
    assert m.running == m.waiting == 0


def test_a_multi_item_request_gets_its_504_at_its_own_deadline_not_a_late_200(core, monkeypatch):
    """A backend without a batch path runs a request's items one by one, each under the deadline it
    is given: a 3-item request with a 150 ms ``timeout`` whose call takes 0.6 s was answered 200
    after 0.6 s. Now its 504 comes at its deadline; its call keeps the slot until the model thread
    returns (a request behind it waits), and ``drain`` waits for that call too."""
    c, m = core
    _slow(monkeypatch, m, 0.6)
    stamps: dict = {}

    async def scenario():
        t0 = time.perf_counter()
        got = await asyncio.gather(_timed(c.infer(_req(m, [b"good", b"bad movie", b"the market"],
                                                      timeout=150_000)), stamps, "late"),
                                   return_exceptions=True)
        held = (m.running, c._active)
        drain = asyncio.ensure_future(c.drain(10))
        await asyncio.sleep(0.1)
        drained_early = drain.done()
        await asyncio.wait_for(drain, 10)
        return t0, got[0], held, drained_early, time.perf_counter()

    t0, late, held, drained_early, t_drained = asyncio.run(scenario())
    assert _late(late), f"a 150 ms request answered after {stamps['late'] - t0:.2f} s: {late!r}"
    assert stamps["late"] - t0 < 0.45
    assert held == (1, 1), held                       # the slot stays held, and drain waits for the call
    assert not drained_early and t_drained - t0 >= 0.55
    assert m.running == m.waiting == 0 and c._active == 0


# -- merged batches: drain, and the queued request's 504 -------------------------------------------------
def test_drain_waits_for_a_merged_batch_whose_callers_have_gone(bcore, monkeypatch):
    """A batch runs on after its callers' 504: ``drain`` returned at once (no request in flight),
    and the server closed the runtime under the running batch. Now it waits for the batch."""
    c, m = bcore
    gate = threading.Event()
    _slow(monkeypatch, m, 0.0, gate=gate)

    async def scenario():
        got = await asyncio.gather(c.infer(_req(m, [b"good"], timeout=100_000)), return_exceptions=True)
        running = m.running
        drain = asyncio.ensure_future(c.drain(10))
        await asyncio.sleep(0.2)
        drained_early = drain.done()
        gate.set()
        await asyncio.wait_for(drain, 10)
        return got[0], running, drained_early

    late, running, drained_early = asyncio.run(scenario())
    assert _late(late), late
    assert running == 1 and not drained_early
    assert m.running == m.waiting == m.batches_out == 0 and c._active == 0


def test_a_batched_request_late_in_the_queue_is_told_it_was_queued(bcore, monkeypatch):
    """Queued behind a busy model past its deadline, a batched request's 504 said "before its batch
    finished": its batch had never started. Now it says it was queued."""
    c, m = bcore
    gate = threading.Event()
    _slow(monkeypatch, m, 0.0, gate=gate)

    async def scenario():
        first = asyncio.ensure_future(c.infer(_req(m, [b"good movie"])))
        await asyncio.sleep(0.05)
        late = asyncio.ensure_future(c.infer(_req(m, [b"bad"], timeout=100_000)))
        other = asyncio.ensure_future(c.infer(_req(m, [b"the market"])))
        await asyncio.sleep(0.4)
        gate.set()
        got = await asyncio.wait_for(asyncio.gather(first, late, other, return_exceptions=True), 20)
        await _idle(m)
        return got

    first, late, other = asyncio.run(scenario())
    assert _late(late) and "queued" in str(late), late
    assert not isinstance(first, BaseException) and not isinstance(other, BaseException), (first, other)
    assert m.running == m.waiting == m.batches_out == 0
