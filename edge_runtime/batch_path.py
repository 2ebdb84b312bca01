"""``Runtime.infer_batch``'s grouped path, for sessions whose capabilities say
``batched`` (the ``BatchSession`` protocol: ``run_many``; OpenVINO's
AsyncInferQueue): items prepared first, grouped per bucket, each group run at
once."""

from __future__ import annotations

import time

from .errors import EdgeRuntimeError


def run_grouped(rt, items: list, lim, deadline, options: dict | None = None) -> list:
    """Batch path for batched sessions (``run_many``: OpenVINO's AsyncInferQueue).

    Items are prepared first (an input error stays that item's result),
    grouped per bucket and run together; each group may take at most
    ``deadline`` per item, as the one-by-one loop would. ``latency_ms`` is
    the time from the batch start until the item's bucket group finished
    (items of one group complete together).
    """
    t0 = time.perf_counter()
    out: list = [None] * len(items)
    groups: dict[int, list] = {}
    for i, prepared in enumerate(rt._prepare_batch(items, lim, options)):   # the task's batch prepare
        if isinstance(prepared, EdgeRuntimeError):
            out[i] = prepared
            continue
        groups.setdefault(prepared.bucket, []).append((i, prepared))
    for bucket, members in groups.items():
        budget = deadline / 1000 * len(members)
        try:
            sess = rt._sessions[bucket]     # IndexError once close() emptied the list: runtime_closed (rt._fail)
            raw_outs = sess.run_many([p.feeds for _, p in members], timeout_s=budget)
        except Exception as exc:
            raw_outs = [exc] * len(members)
        for (i, prepared), res in zip(members, raw_outs):
            if isinstance(res, TimeoutError):
                out[i] = rt._timeout(deadline)
            elif isinstance(res, BaseException):
                out[i] = rt._fail(res, prepared)
            else:
                try:
                    out[i] = rt._result(rt._finish(res, prepared), prepared, t0, None)
                except EdgeRuntimeError as exc:
                    out[i] = exc
    return out
