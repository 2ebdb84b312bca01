"""Dynamic batching in ``edge-infer serve``, and each request's own deadline, a mixin of
``serve_core.ServeCore``.

For backends with a batch path (``capabilities.batched``) a request to an idle model runs at
once; while a batch runs, requests arriving within ``batch_delay_ms`` of the first waiting one
are merged into one ``infer_batch``. ``ServeCore._run`` sends a request here; each batch runs
through ``ServeCore._call`` under the model's slots.

A merged batch is never a request of its own: each request keeps its own limits and deadline.

- size: the requests of one flush are packed into batches that ``rt.infer_batch`` accepts as a
  whole (at most ``max_batch_items`` items, the runtime's ``max_batch_items`` and
  ``max_request_bytes`` in total); a request over a limit by itself runs alone and gets its own
  refusal. Should the runtime still refuse a merged batch as a whole (an ``InputError``), each
  of its requests is run alone, so a refusal reaches only the request that caused it;
- deadline: a request whose deadline passed while it queued is dropped before the merge (504,
  "while it was queued"); the batch runs under the latest deadline of its requests, and each
  request waits for its answer only until its own deadline (504 then; the others get their
  results).

A request that is not merged (call options, an inline call, ``max_batch_items`` items, a backend
without a batch path: ``_alone``) is held to its own deadline the same way: queued for a slot past
it, it leaves the queue (504); running past it on the pool, it gets its 504 at its deadline (an
inline call blocks the loop: the runtime's deadline bounds it) (before 2026-12-07
it waited for a slot however long, and a request of several items on a backend without a batch
path, where the runtime's deadline is per item, was answered 200 long after its own deadline).
A model call whose caller has gone (late, or cancelled) keeps its slot until the model thread
returns, and ``drain`` waits for it, as for a merged batch whose callers have all gone.
"""

from __future__ import annotations

import asyncio
import logging
import time

from . import error_codes as ec
from .errors import EdgeRuntimeError, InferenceTimeout, InputError
from .serve_model import _Job, _Model

log = logging.getLogger("edge_runtime.serve")


def _late(queued: bool) -> InferenceTimeout:
    where = "while it was queued" if queued else "while its model call ran"
    return InferenceTimeout(f"the request's deadline passed {where}", code=ec.INFERENCE_TIMEOUT)


def _loop_time(t_end: float) -> float:
    """The event loop's clock at ``t_end`` (a ``time.perf_counter`` deadline)."""
    return asyncio.get_running_loop().time() + (t_end - time.perf_counter())


class DynamicBatching:
    """``_batched``, ``_flush``, ``_run_jobs`` and ``_alone`` of ``ServeCore``, over the attributes it sets."""

    max_batch_items: int
    batch_delay_s: float
    _tasks: set[asyncio.Task]
    _batches: int
    _batched_requests: int

    async def _call(self, m: _Model, items: list, t_end: float, options: dict | None,
                    largest: list[int] | None = None) -> list:
        raise NotImplementedError        # ServeCore's: the model call, within the deadline

    def _enter(self) -> None:
        raise NotImplementedError        # ServeCore's: one more request (or model call) for drain to wait for

    def _leave(self) -> None:
        raise NotImplementedError

    # -- the bounds of one infer_batch --------------------------------------------------------
    def _batch_bounds(self, m: _Model) -> tuple[int, int]:
        """(items, bytes) one merged ``infer_batch`` may hold: what the runtime accepts as a whole."""
        lim = m.rt.limits
        return min(self.max_batch_items, int(lim.max_batch_items)), int(lim.max_request_bytes)

    @staticmethod
    def _bytes_of(m: _Model, items: list, largest: list[int] | None = None) -> int:
        """The runtime's own measure of the items (``task.request_bytes``, as ``infer_batch`` sums it);
        one item already measured for the inline check (``largest``) is not measured again."""
        if largest and len(items) == 1:
            return largest[0]
        size = m.rt.task.request_bytes
        return sum(int(size(x)) for x in items)

    def _chunks(self, m: _Model, jobs: list[_Job]) -> list[list[_Job]]:
        """``jobs`` in arrival order, cut into batches within the runtime's bounds (a job over
        them by itself is a batch of its own: its refusal is its own)."""
        max_items, max_bytes = self._batch_bounds(m)
        chunks: list[list[_Job]] = []
        cur: list[_Job] = []
        n = size = 0
        for j in jobs:
            if cur and (n + len(j.items) > max_items or size + j.nbytes > max_bytes):
                chunks.append(cur)
                cur, n, size = [], 0, 0
            cur.append(j)
            n += len(j.items)
            size += j.nbytes
        if cur:
            chunks.append(cur)
        return chunks

    # -- joining, flushing, running -----------------------------------------------------------
    async def _batched(self, m: _Model, items: list, t_end: float, largest: list[int] | None = None) -> list:
        """Join the model's pending batch; the first request of a batch schedules its flush.
        The answer is awaited until this request's own deadline, whatever its batch's."""
        loop = asyncio.get_running_loop()
        job = _Job(items, loop.create_future(), t_end, self._bytes_of(m, items, largest))
        m.pending.append(job)
        m.waiting += 1
        max_items, max_bytes = self._batch_bounds(m)
        if m.batches_out == 0 or sum(len(j.items) for j in m.pending) >= max_items \
                or sum(j.nbytes for j in m.pending) >= max_bytes:
            self._flush(m)          # an idle model never makes a request wait for company
        elif m.flush_handle is None:
            m.flush_handle = loop.call_later(self.batch_delay_s, self._flush, m)
        deadline = asyncio.timeout_at(_loop_time(t_end))
        try:
            # past its deadline the future is cancelled: a batch not yet started drops the job
            async with deadline:
                return await job.future
        except TimeoutError:
            if not deadline.expired():
                raise                   # a TimeoutError of the call itself, not this deadline
            raise _late(queued=not job.started) from None

    def _flush(self, m: _Model) -> None:
        if m.flush_handle is not None:
            m.flush_handle.cancel()
            m.flush_handle = None
        jobs, m.pending = m.pending, []
        for chunk in self._chunks(m, jobs) if jobs else ():
            # the task is kept until done: the loop holds only a weak reference to it
            m.batches_out += 1
            task = asyncio.get_running_loop().create_task(self._run_jobs(m, chunk))
            self._keep(task)

    async def _run_jobs(self, m: _Model, jobs: list[_Job]) -> None:
        assert m.sem is not None
        try:
            await m.sem.acquire()
        except BaseException:
            m.waiting -= len(jobs)
            m.batches_out -= 1
            for j in jobs:
                j.future.cancel()
            raise
        m.waiting -= len(jobs)
        now = time.perf_counter()
        live = []
        for j in jobs:                  # a caller gone, or a deadline passed in the queue: not merged
            if j.future.done():
                continue
            if j.t_end <= now:
                j.future.set_exception(_late(queued=True))
                continue
            j.started = True
            live.append(j)
        m.running += len(live)
        try:
            if live:
                self._batches += 1
                self._batched_requests += len(live)
                await self._run_live(m, live)
        finally:
            m.running -= len(live)
            m.batches_out -= 1
            m.sem.release()

    async def _run_live(self, m: _Model, jobs: list[_Job]) -> None:
        """One ``infer_batch`` for ``jobs`` under the latest of their deadlines; each job its slice."""
        items = [x for j in jobs for x in j.items]
        try:
            results = await self._call(m, items, max(j.t_end for j in jobs), None)
        except asyncio.CancelledError:
            for j in jobs:
                j.future.cancel()
            raise
        except InputError as exc:
            if len(jobs) == 1:
                _fail(jobs, exc)
                return
            # the runtime refused the merged batch as a whole: each job alone, its own verdict
            for j in jobs:
                if j.future.done():
                    continue
                try:
                    _answer(j, await self._call(m, j.items, j.t_end, None))
                except asyncio.CancelledError:
                    _fail(jobs, None)
                    raise
                except BaseException as e:
                    _fail([j], e)
            return
        except BaseException as exc:      # the model, the device, the runtime: the same for every job
            _fail(jobs, exc)
            return
        at = 0
        for j in jobs:
            _answer(j, results[at:at + len(j.items)])
            at += len(j.items)

    # -- a request run by itself --------------------------------------------------------------
    async def _alone(self, m: _Model, items: list, t_end: float, options: dict | None,
                     largest: list[int] | None = None) -> list:
        """The model call of a request that is not merged, held to the request's own deadline:
        queued for a slot past it, it leaves the queue (504); running past it, its 504 comes at
        its deadline while the call keeps the slot until the model thread returns. An inline call
        runs at once on the loop: nothing answers before it returns (the runtime's watchdog bounds it)."""
        assert m.sem is not None
        m.waiting += 1
        try:
            if m.sem.locked():
                deadline = asyncio.timeout_at(_loop_time(t_end))
                try:
                    async with deadline:
                        await m.sem.acquire()
                except TimeoutError:
                    if not deadline.expired():
                        raise
                    raise _late(queued=True) from None
            else:
                await m.sem.acquire()           # a free slot: no wait, no timer
        finally:
            m.waiting -= 1
        m.running += 1
        if m.runs_inline(items, largest):
            try:
                return await self._call(m, items, t_end, options, largest)
            finally:
                m.running -= 1
                m.sem.release()
        call = asyncio.get_running_loop().create_task(self._call(m, items, t_end, options, largest))
        waiting = [True]                # its caller still waits for it
        call.add_done_callback(lambda t: _free(m, t, waiting[0]))
        self._keep(call)
        deadline = asyncio.timeout_at(_loop_time(t_end))
        try:
            async with deadline:
                return await asyncio.shield(call)   # a caller gone or late: the call keeps its slot
        except TimeoutError:
            if not deadline.expired():
                raise
            raise _late(queued=False) from None
        finally:
            waiting[0] = False

    def _keep(self, task: asyncio.Task) -> None:
        """Hold ``task`` until done (the loop keeps only a weak reference to it), and have ``drain``
        wait for it: a model call runs on whether or not its callers still wait."""
        self._tasks.add(task)
        self._enter()
        task.add_done_callback(self._kept_done)

    def _kept_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._leave()


def _free(m: _Model, call: asyncio.Task, waited: bool) -> None:
    """A lone model call is done: its slot is free. Its outcome is read here, where its caller is
    gone (late or cancelled): a typed error was the call's answer, anything else a bug, logged."""
    m.running -= 1
    assert m.sem is not None
    m.sem.release()
    exc = None if call.cancelled() else call.exception()
    if exc is not None and not waited and not isinstance(exc, EdgeRuntimeError):
        log.error("serve: model %s: a call whose caller had gone failed", m.name, exc_info=exc)


def _answer(j: _Job, results: list) -> None:
    if not j.future.done():
        j.future.set_result(results)


def _fail(jobs: list[_Job], exc: BaseException | None) -> None:
    for j in jobs:
        if not j.future.done():
            if exc is None:
                j.future.cancel()
            else:
                j.future.set_exception(exc)
