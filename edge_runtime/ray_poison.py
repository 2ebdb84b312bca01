"""A record that kills its actor's process every time (a native crash in the backend, or its memory
calling the OOM killer) gets its own typed error line, and the rest of the job finishes.

Ray restarts a dead actor and retries its task on it (``max_task_retries``): the retry knows nothing of
the try before. So each try leaves marks in the cluster's key-value store (the GCS, which every node
reads), under a key of the job (``job``, made by the driver) in the ``edge-runtime`` namespace:

1. a block's first try marks the block (one RPC, which also says whether the mark was there), scores it
   whole, and clears the mark (a second RPC): about 1 ms per block, against ~100 ms of model time in one;
2. a try that finds the block's mark (a try of it died) scores its records one at a time, each marked
   with its deaths so far while it runs;
3. a record marked with ``POISON_DEATHS`` deaths is not run again: its line is ``backend_crashed``.

A block whose record kills the actor therefore costs ``1 + POISON_DEATHS`` deaths, well within
``RAY_TASK_RETRIES`` (the score command's bound on Ray's retries). Two deaths on the same record are asked for, so one
unrelated kill (a node drained, the OOM killer taking another process's memory) while a record runs does
not fail it. Without the store (an older Ray, ``job=None``) blocks are only retried, and a poison block
ends the job, typed, after its tries.
"""

from __future__ import annotations

from typing import Callable

from . import error_codes as ec
from .errors import InferenceRuntimeError

NAMESPACE = "edge-runtime"
POISON_DEATHS = 2
# Ray's retries of a task (score's bound): a death fails every task queued on the actor, not only the one
# running, and a task sent while the actor restarts fails too, so retries run out faster than deaths come.
# The marks need 1 + POISON_DEATHS deaths of the block; the rest is for the blocks beside it
RAY_TASK_RETRIES = 4 * (1 + POISON_DEATHS)


class Marks:
    """The job's marks in Ray's key-value store (``ray.experimental.internal_kv``)."""

    def __init__(self, job: str):
        from ray.experimental import internal_kv as kv

        if not kv._internal_kv_initialized():
            raise RuntimeError("Ray's key-value store is not reachable from this process")
        self._kv = kv
        self.job = job

    def _key(self, name: str) -> str:
        return f"{self.job}:{name}"

    # a store that fails (the GCS restarting) never fails a block: it is scored as a first try
    def claim(self, name: str) -> bool:
        """Mark ``name``; True when it was not marked, or the store did not answer (one RPC)."""
        try:
            return not self._kv._internal_kv_put(self._key(name), b"1", overwrite=False, namespace=NAMESPACE)
        except Exception:      # noqa: BLE001
            return True

    def deaths(self, name: str) -> int:
        try:
            return int(self._kv._internal_kv_get(self._key(name), namespace=NAMESPACE) or 0)
        except Exception:      # noqa: BLE001 - unreadable: no death known
            return 0

    def set(self, name: str, deaths: int) -> None:
        try:
            self._kv._internal_kv_put(self._key(name), str(deaths).encode(), overwrite=True, namespace=NAMESPACE)
        except Exception:      # noqa: BLE001
            pass

    def clear(self, name: str) -> None:
        try:
            self._kv._internal_kv_del(self._key(name), namespace=NAMESPACE)
        except Exception:      # noqa: BLE001
            pass

    def clear_job(self) -> None:
        """Every mark of the job (the driver, at its end)."""
        try:
            self._kv._internal_kv_del(f"{self.job}:", del_by_prefix=True, namespace=NAMESPACE)
        except Exception:      # noqa: BLE001 - a few bytes left in the GCS
            pass


def open_marks(job: str | None) -> Marks | None:
    """The job's marks, or None (no job key, no Ray, an internal API this Ray lacks): blocks only retried."""
    if not job:
        return None
    try:
        return Marks(job)
    except Exception:      # noqa: BLE001 - the guard is an addition; without it the retries still bound a job
        return None


def score_guarded(records: list, run: Callable[[list], list], marks: Marks | None, *, node: str,
                  device: str | None) -> list:
    """``run(records)``'s (record, outcome) pairs, a block whose try died before taken one record at a time,
    a record that killed ``POISON_DEATHS`` tries answered ``backend_crashed`` without running it."""
    if marks is None or not records:
        return run(records)
    block = f"b{records[0].index}-{records[-1].index}"
    if marks.claim(block):
        pairs = run(records)
        marks.clear(block)
        return pairs
    pairs = []
    for record in records:
        if record.error is not None:
            pairs.extend(run([record]))
            continue
        name = f"r{record.index}"
        deaths = marks.deaths(name)
        if deaths >= POISON_DEATHS:
            pairs.append((record, InferenceRuntimeError(
                f"the backend's process died on this record {deaths} times (Ray started a new actor each "
                f"time): not run again, so that the rest of the job could finish (answered on node {node})",
                device=device, code=ec.BACKEND_CRASHED, deaths=deaths)))
            continue
        marks.set(name, deaths + 1)
        pairs.extend(run([record]))
        marks.clear(name)
    marks.clear(block)
    return pairs


def ray_failure(exc, lines_written: int, first) -> InferenceRuntimeError:
    """Ray failing mid-run (``exc``: an object store or node out of memory, a lost object, a block whose
    every try killed its actor) as the error the job ends with: the lines the output keeps, and ``first``,
    the first record not written (a ``score_inputs.Record`` or None)."""
    import ray

    msg = str(exc).strip().splitlines()
    said = f"{type(exc).__name__}: {msg[0][:300] if msg else ''}"
    if isinstance(exc, ray.exceptions.RayActorError):
        # every try of one block killed its actor's process, and no mark isolated the record (no key-value
        # store): a record there crashes the backend (or its memory calls the OOM killer); --resume meets it
        named = "" if first is None else f" (id {first.id!r}, input line {first.line})"
        return InferenceRuntimeError(
            f"an actor's process died on the same block of records {RAY_TASK_RETRIES + 1} times, a fresh "
            f"actor each time ({said}): a record in it crashes the backend or exhausts its memory. The "
            f"first record not written is index {lines_written}{named}; the one that kills the actor is at "
            f"or after it. The output keeps its {lines_written} lines in input order; --resume scores the "
            f"rest, and meets the same crash while that record is in the input",
            code=ec.INFERENCE_FAILED, lines_written=lines_written)
    return InferenceRuntimeError(
        f"Ray failed mid-run ({said}): the output keeps its {lines_written} lines in input order; run again "
        f"with --resume to score the rest", code=ec.INFERENCE_FAILED, lines_written=lines_written)
