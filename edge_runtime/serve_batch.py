"""Dynamic batching in ``edge-infer serve``, a mixin of ``serve_core.ServeCore``.

For backends with a batch path (``capabilities.batched``) a request to an idle model runs at
once; while a batch runs, requests arriving within ``batch_delay_ms`` of the first waiting one
are merged into one ``infer_batch`` (at most ``max_batch_items``). ``ServeCore._run`` sends a
request here; each batch runs through ``ServeCore._call`` under the model's slots.
"""

from __future__ import annotations

import asyncio

from .serve_model import _Job, _Model


class DynamicBatching:
    """``_batched``, ``_flush`` and ``_run_jobs`` of ``ServeCore``, over the attributes it sets."""

    max_batch_items: int
    batch_delay_s: float
    _tasks: set[asyncio.Task]
    _batches: int
    _batched_requests: int

    async def _call(self, m: _Model, items: list, t_end: float, options: dict | None) -> list:
        raise NotImplementedError        # ServeCore's: the model call, within the deadline

    async def _batched(self, m: _Model, items: list, t_end: float) -> list:
        """Join the model's pending batch; the first request of a batch schedules its flush."""
        job = _Job(items, asyncio.get_running_loop().create_future(), t_end)
        m.pending.append(job)
        m.waiting += 1
        if m.batches_out == 0 or sum(len(j.items) for j in m.pending) >= self.max_batch_items:
            self._flush(m)          # an idle model never makes a request wait for company
        elif m.flush_handle is None:
            m.flush_handle = asyncio.get_running_loop().call_later(self.batch_delay_s, self._flush, m)
        return await job.future

    def _flush(self, m: _Model) -> None:
        if m.flush_handle is not None:
            m.flush_handle.cancel()
            m.flush_handle = None
        jobs, m.pending = m.pending, []
        if jobs:      # the task is kept until done: the loop holds only a weak reference to it
            m.batches_out += 1
            task = asyncio.get_running_loop().create_task(self._run_jobs(m, jobs))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run_jobs(self, m: _Model, jobs: list[_Job]) -> None:
        assert m.sem is not None
        try:
            await m.sem.acquire()
        finally:
            m.waiting -= len(jobs)
        m.running += len(jobs)
        try:
            items = [x for j in jobs for x in j.items]
            self._batches += 1
            self._batched_requests += len(jobs)
            results = await self._call(m, items, min(j.t_end for j in jobs), None)
            at = 0
            for j in jobs:
                if not j.future.done():
                    j.future.set_result(results[at:at + len(j.items)])
                at += len(j.items)
        except BaseException as exc:
            for j in jobs:
                if not j.future.done():
                    j.future.set_exception(exc)
        finally:
            m.running -= len(jobs)
            m.batches_out -= 1
            m.sem.release()
