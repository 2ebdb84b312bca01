"""``Runtime.infer_batch``'s grouped path, for sessions whose capabilities say
``batched`` (the ``BatchSession`` protocol: ``run_many``; OpenVINO's
AsyncInferQueue): items prepared first, grouped per bucket, each group run at
once."""

from __future__ import annotations

import time
from collections.abc import Mapping

from . import error_codes as ec
from .errors import EdgeRuntimeError, InputError


def run_grouped(rt, items: list, lim, deadline, options: dict | None = None) -> list:
    """Batch path for batched sessions (``run_many``: OpenVINO's AsyncInferQueue).

    Items are prepared first (an input error stays that item's result),
    grouped per bucket and run together; each group may take at most
    ``deadline`` per item, as the one-by-one loop would. ``latency_ms`` is
    the time from the batch start until the item's bucket group finished
    (items of one group complete together). A ``run_many`` that answers
    with another number of results than it was given inputs (or not a
    list), or an item's outputs that are not a dict, fails each item it
    concerns with ``inference_failed``: outputs are never paired by guess.
    """
    t0 = time.perf_counter()
    out: list = [None] * len(items)
    groups: dict[int, list] = {}
    for i, prepared in enumerate(rt._prepare_batch(items, lim, options)):   # the task's batch prepare
        if prepared is None:        # a task's prepare_batch that answered for fewer inputs than it got
            prepared = InputError("input could not be prepared: the task's prepare_batch gave no result for it",
                                  code=ec.INPUT_INVALID)
        if isinstance(prepared, EdgeRuntimeError):
            out[i] = prepared
            continue
        groups.setdefault(prepared.bucket, []).append((i, prepared))
    for bucket, members in groups.items():
        budget = deadline / 1000 * len(members)
        try:
            sess = rt._sessions[bucket]     # IndexError once close() emptied the list: runtime_closed (rt._fail)
            raw_outs = sess.run_many([p.feeds for _, p in members], timeout_s=budget)
            if not isinstance(raw_outs, (list, tuple)) or len(raw_outs) != len(members):
                got = f"{len(raw_outs)} results" if isinstance(raw_outs, (list, tuple)) else type(raw_outs).__name__
                raise TypeError(f"run_many returned {got} for {len(members)} inputs")
        except Exception as exc:
            raw_outs = [exc] * len(members)
        for (i, prepared), res in zip(members, raw_outs):
            if isinstance(res, TimeoutError):
                out[i] = rt._timeout(deadline)
            elif isinstance(res, BaseException):
                out[i] = rt._fail(res, prepared)
            elif not isinstance(res, Mapping):
                out[i] = rt._fail(TypeError(f"run_many returned {type(res).__name__} for an input, not its "
                                            "outputs by name"), prepared)
            else:
                try:
                    out[i] = rt._result(rt._finish(res, prepared), prepared, t0, None)
                except EdgeRuntimeError as exc:
                    out[i] = exc
            if isinstance(out[i], EdgeRuntimeError):     # prepared, failed on the device: counted as infer() does
                rt._metrics.length(prepared.length)
    return out
