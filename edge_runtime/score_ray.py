"""``edge-infer score --engine ray``: the same scoring contract as local ``score``, on Ray Data.

The driver (this module, in the ``edge-infer`` process):

1. loads the artifact once, as local ``score`` does: the seal and every file are
   verified, the variant and device are chosen; the job record (``OUT.job.json``,
   local score's form plus ``"engine": "ray"``) is made from it, then the runtime
   is closed. Its ``manifest_sha256`` travels to the actors as the expected seal;
2. reads the records with local score's readers (JSONL, CSV, text, an image
   folder: ids, line numbers and typed bad records exactly as local) or a Parquet
   file / folder (``ray_io``), skips what ``--resume`` finds already written
   (checked as local: job record, last line's id and input line), and hands the
   rest to Ray Data (``from_items``: index + the record as JSON; an image is its
   path, so images, like the artifact, live on storage every node reads);
3. runs ``map_batches(EdgeScorer, compute=ActorPoolStrategy(size=actors),
   num_cpus=cpus_per_actor)``, ``preserve_order`` on, the actors given the driver's
   device by name and its tune decision's options (``_actor_options``); on its own local
   Ray an actor no node has the CPUs for is refused (``input_invalid``), not waited for.
   ``info["ran_on"]`` counts the written lines by the actor that answered them
   (``"NODE:PID DEVICE verify=..."``); lines from another device than the job's are a
   summary warning;
4. writes the lines itself, **in index order, each index once**: a line whose index
   is already written (a retried task's second answer) is dropped, one that comes
   early waits in a buffer. One write and a flush per block, fsync at most once a
   second, so a ``kill -9`` of the driver leaves complete lines plus at most one
   partial line, which ``--resume`` cuts. An actor killed mid-run is restarted by
   Ray (``max_restarts=-1``) and its task retried, at most ``RAY_TASK_RETRIES`` times
   (Ray Data's default, -1, retried a record that kills its process every time
   forever: the job never ended): its rows arrive once more, and are written once.
   A record that kills its actor every time gets a ``backend_crashed`` line and the
   job goes on (``ray_poison``: marks in Ray's key-value store); without the store,
   a block whose tries all die ends the job, typed, naming the first record not written.

Artifact distribution: a **shared path**. Every node opens ``ARTIFACT`` at the same
path (NFS, a mounted bucket, a baked image); each actor verifies it there and a
copy whose seal is not the driver's fails its rows (``artifact_copy_differs``)
instead of scoring with another version.

``ray.init`` happens here, inside the command: ``address=None`` starts a local Ray
with its object store capped at 200 MB (``OBJECT_STORE_BYTES``); ``"auto"`` or a
GCS ``HOST:PORT`` joins a cluster; ``ray://`` (Ray Client) is refused: Ray Data needs a
core worker in the driver.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Callable

from . import error_codes as ec
from .errors import EdgeRuntimeError, InferenceRuntimeError, InputError
from .score import Progress, Summary, _append_to, _jsonable, _start_output, job_identity, prepare_output
from .score_job import check_output, check_resume_options, overwrite

OBJECT_STORE_BYTES = 200_000_000
POISON_GUARD = True         # ray_poison's marks: a record that kills every actor gets a backend_crashed line


def start_ray(address: str | None = None, *, num_cpus: int | None = None) -> float:
    """Start or join Ray (not when this process already did); return the seconds it took."""
    try:
        import ray
    except ImportError:
        raise EdgeRuntimeError("--engine ray needs Ray Data: pip install 'edge-runtime[ray]'",
                               code=ec.DEPENDENCY_MISSING) from None
    if ray.is_initialized():
        return 0.0
    t0 = time.perf_counter()
    kw: dict = {"logging_level": "WARNING", "log_to_driver": False, "configure_logging": True}
    if address:
        ray.init(address=address, **kw)
    else:
        # "local": a new Ray of this command's own, never a cluster some `ray start` left on the box
        ray.init(address="local", num_cpus=num_cpus, object_store_memory=OBJECT_STORE_BYTES,
                 include_dashboard=False, **kw)
    return time.perf_counter() - t0


def _ray_running() -> bool:
    import sys

    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


class OrderedWriter:
    """Writes lines in index order from ``start``, each index once (see the module doc)."""

    def __init__(self, fh, start: int, summary: Summary, *, owned: bool, progress: Progress | None = None,
                 on_progress: Callable[[int], None] | None = None):
        self.fh, self.next, self.summary, self.owned = fh, start, summary, owned
        self.pending: dict[int, tuple[str, str | None]] = {}
        self.duplicates = 0
        self.ran_on: dict[str, int] = {}      # what answered the written lines (EdgeScorer.where) -> lines
        self.progress, self.on_progress = progress, on_progress
        self.last_sync = time.perf_counter()
        self.first: tuple[float, int] | None = None     # (when, lines) of the first write: the steady rate's start

    def steady_per_s(self) -> float | None:
        """Lines per second after the first write (actor start-up excluded); None before two writes."""
        if self.first is None or self.summary.scored <= self.first[1]:
            return None
        dt = time.perf_counter() - self.first[0]
        return round((self.summary.scored - self.first[1]) / dt, 2) if dt > 0 else None

    def add(self, indexes, texts, where=None) -> None:
        out = []
        for n, (i, text) in enumerate(zip(indexes, texts)):
            i = int(i)
            if i < self.next or i in self.pending:
                self.duplicates += 1
                continue
            self.pending[i] = (str(text), None if where is None else str(where[n]))
        while self.next in self.pending:
            text, by = self.pending.pop(self.next)
            if by is not None:
                self.ran_on[by] = self.ran_on.get(by, 0) + 1
            line = json.loads(text)
            self.summary.count(line)
            self.summary.scored += 1
            if line.get("ok"):
                self.summary.latencies_ms.append(line["result"]["latency_ms"])
            out.append(text)
            self.next += 1
        if not out:
            return
        if self.first is None:
            self.first = (time.perf_counter(), self.summary.scored)
        self.fh.write(("\n".join(out) + "\n").encode("utf-8", "surrogateescape"))
        self.fh.flush()
        if self.owned and time.perf_counter() - self.last_sync >= 1.0:
            os.fsync(self.fh.fileno())
            self.last_sync = time.perf_counter()
        if self.progress:
            self.progress.update(self.summary.total, self.summary.scored)
        if self.on_progress:
            self.on_progress(self.summary.total)


def _records(input_path, fmt, field, id_field, cap, images: bool = False):
    from .ray_io import absolute_paths, is_parquet, read_parquet_records
    from .score_inputs import RecordStream, read_records

    if fmt == "parquet" or (fmt is None and Path(input_path).exists() and is_parquet(input_path)):
        stream = read_parquet_records(input_path, field=field, id_field=id_field)
    else:
        stream = read_records(input_path, fmt, field=field, id_field=id_field, cap=cap)
    return RecordStream(absolute_paths(stream), stream.source) if images else stream


def _count(input_path, fmt, source_fmt) -> int | None:
    from .score_inputs import count_records

    if source_fmt == "parquet":
        from .ray_io import count_parquet

        return count_parquet(input_path)
    return count_records(input_path, fmt)


def _todo(records, skip: int, summary: Summary, out) -> list:
    """The records past ``skip``, after local score's check of the resumed output's last line."""
    todo, seen = [], 0
    for record in records:
        seen = record.index + 1
        if record.index < skip:
            if record.index == skip - 1 and (_jsonable(record.id), getattr(record, "line", None)) != \
                    (summary.last_id, summary.last_line):
                raise InputError(f"{out} does not belong to this input: its line {skip} is id {summary.last_id!r} "
                                 f"(input line {summary.last_line}), input {skip} is id {_jsonable(record.id)!r} "
                                 f"(input line {record.line})", code=ec.SCORE_OUTPUT_MISMATCH)
            continue
        todo.append(record)
    if seen < skip:
        raise InputError(f"{out} does not belong to this input: it holds {skip} lines, the input only {seen} records",
                         code=ec.SCORE_OUTPUT_MISMATCH)
    return todo


RAY_BATCH_MS = 100.0       # a Ray batch should hold about this much model time
RAY_BATCH_MIN, RAY_BATCH_MAX = 32, 512


def auto_batch_size(rt) -> tuple[int, str]:
    """(batch size, why) for Ray: each batch costs Ray ~7 ms (object store, Arrow, the actor call;
    measured on 2 cores), so a batch should hold ~``RAY_BATCH_MS`` of model time. The per-item time
    is the median of 3 calls on the task's warm-up sample after one unmeasured call; without a
    sample, 32. Digits (~0.3 ms): 32 -> 334: Ray's steady rate went from 0.72 to 1.21 x local score."""
    sample = rt.task.warmup_sample()
    if sample is None:
        return RAY_BATCH_MIN, "default (the task has no sample to time)"
    try:
        rt.infer(sample)
        times = []
        for _ in range(3):
            t = time.perf_counter()
            rt.infer(sample)
            times.append((time.perf_counter() - t) * 1000)
    except EdgeRuntimeError as exc:
        return RAY_BATCH_MIN, f"default (timing the warm-up sample failed: {exc.message})"
    per_item = sorted(times)[1]
    size = max(RAY_BATCH_MIN, min(RAY_BATCH_MAX, int(RAY_BATCH_MS / max(per_item, 1e-3))))
    return size, f"measured: {per_item:.3f} ms per item here, ~{RAY_BATCH_MS:g} ms of model time per batch"


def score_ray(artifact, input_path, out, *, fmt: str | None = None, field: str | None = None,
              id_field: str | None = None, batch_size: int | None = None, actors: int = 2, cpus_per_actor: float = 1,
              address: str | None = None, device: str = "auto", strict: bool = False,
              device_options: dict | None = None, deadline_ms: int | None = None, resume: bool = False,
              force: bool = False, progress: Progress | None = None, stream=None, verify: bool = True,
              num_cpus: int | None = None, on_progress: Callable[[int], None] | None = None) -> tuple[Summary, dict]:
    """Score ``input_path`` into ``out`` (JSONL, ``.parquet``, or ``"-"``) on Ray; return (summary, info).
    ``on_progress(lines_done)`` is called after each write (tests use it to kill an actor mid-run)."""
    from .runtime import load

    to_stream = str(out) == "-"
    check_resume_options(resume, force, out)
    if address and address.startswith("ray://"):
        # measured with Ray 2.60: Ray Data's streaming executor needs a core worker in the driver,
        # which a Ray Client driver does not have ('Worker' object has no attribute 'core_worker')
        raise InputError(f"--address {address}: Ray Data does not run through Ray Client (ray://); run the "
                         "command on the cluster instead: `ray job submit --address http://HEAD:8265 -- "
                         "edge-infer score ... --engine ray --address auto`, or on the head node with "
                         "--address auto", code=ec.INPUT_INVALID)
    if (batch_size is not None and batch_size < 1) or actors < 1 or not 0 < cpus_per_actor < float("inf"):
        # nan passed `<= 0` (and inf, with --address, the local fit check): Ray's own error, untyped
        raise InputError(f"--batch-size and --actors must be at least 1, --cpus-per-actor a number above 0 "
                         f"(got {cpus_per_actor!r})", code=ec.INPUT_INVALID)
    with load(artifact, device=device, strict=strict, device_options=device_options, warmup=False,
              tuned_for="throughput") as rt:
        cap = 4 * rt.limits.max_request_bytes + 65536
        field = field or type(rt.task).score_field
        batch_why = "given"
        if batch_size is None:
            batch_size, batch_why = auto_batch_size(rt)
        batch_size = min(batch_size, rt.limits.max_batch_items)
        records = _records(input_path, fmt, field, id_field, cap,
                           images=getattr(type(rt.task), "input_kind", None) == "image")
        source = dict(records.source)
        job = None
        if not to_stream:
            if source["format"] == "parquet":
                from .ray_io import parquet_fingerprint

                job = job_identity(rt, None, deadline_ms=deadline_ms)
                job["input"] = {"path": str(Path(input_path).resolve()), "format": "parquet", "field": field,
                                "id_field": source["id_field"], **{k: v for k, v in parquet_fingerprint(
                                    input_path).items() if k != "format"}}
            else:
                job = job_identity(rt, source, deadline_ms=deadline_ms)
            job["engine"] = "ray"
        seal = rt.artifact.manifest.get("manifest_sha256")
        actor_device, target = rt.device, rt.variant["target"]
        actor_options = _actor_options(rt, device_options)
        info = {"device": rt.device, "target": target, "engine": "ray", "actors": actors,
                "cpus_per_actor": cpus_per_actor, "address": address or "local", "batch_size": batch_size,
                "batch_size_why": batch_why}
    summary = Summary(batch_size=batch_size)
    parquet_out = not to_stream and Path(out).suffix.lower() in (".parquet", ".pq")
    final = Path(out) if not to_stream else None
    journal = final.with_name(final.name + ".journal.jsonl") if parquet_out and final else final
    skip = 0
    if journal is not None:
        if parquet_out and final is not None:
            # never a device, a folder or the input (-o in.parquet): --force would delete it, and the end of
            # any run (--resume too) replaces it with the output
            check_output(final, job)
            if final.exists() and not resume:
                overwrite(final, force, job)
        skip = prepare_output(journal, resume, force, summary, job)
        _start_output(journal, job if skip == 0 else None)     # a -o that cannot be created: an InputError naming it
    todo = _todo(records, skip, summary, out)
    if progress is not None and progress.total is None:
        progress.total = _count(input_path, fmt, source["format"])
    info["ray_init_s"] = 0.0
    if to_stream:
        import sys

        fh = stream if stream is not None else sys.stdout.buffer
    else:
        assert journal is not None
        fh = _append_to(journal)
    writer = OrderedWriter(fh, skip, summary, owned=not to_stream, progress=progress, on_progress=on_progress)
    t0 = time.perf_counter()
    started = False
    try:
        if todo:
            started = not _ray_running()
            info["ray_init_s"] = round(start_ray(address, num_cpus=num_cpus), 3)
            if not address:
                _check_fits(cpus_per_actor)
            t0 = time.perf_counter()
            if progress is not None:
                progress.t0 = t0          # the rate counts from Ray's start: actor start-up included
            _run(todo, writer, artifact=str(Path(artifact).resolve()), seal=seal, device=actor_device,
                 target=target, strict=strict, device_options=actor_options, deadline_ms=deadline_ms,
                 batch_size=batch_size, actors=actors, cpus_per_actor=cpus_per_actor, verify=verify)
            info["first_rows_s"] = None if writer.first is None else round(writer.first[0] - t0, 3)
            info["steady_per_s"] = writer.steady_per_s()
        if not to_stream:
            os.fsync(fh.fileno())
    finally:
        if not to_stream:
            fh.close()
        if started:         # this command's own Ray (or its connection): gone with the command
            import ray

            ray.shutdown()
    summary.wall_s = time.perf_counter() - t0
    info["duplicates_dropped"] = writer.duplicates
    info["ran_on"] = dict(sorted(writer.ran_on.items()))
    other = sorted(w for w in writer.ran_on if w.split(" ")[1:2] not in ([actor_device], ["load-failed"]))
    if other:
        summary.warnings.append(f"lines of this run were answered by actors not on the job's device {actor_device}: "
                                + ", ".join(f"{w} ({writer.ran_on[w]} lines)" for w in other))
    if writer.next != skip + len(todo):
        raise EdgeRuntimeError(f"Ray returned {writer.next - skip} of {len(todo)} inputs: the output stops at "
                               f"index {writer.next}; run again with --resume", code=ec.UNEXPECTED)
    if progress:
        progress.update(summary.total, summary.scored, final=True)
    if parquet_out and final is not None and journal is not None:
        from .ray_io import jsonl_to_parquet

        jsonl_to_parquet(journal, final)
        info["journal"] = str(journal)
    return summary, info


def _actor_options(rt, device_options: dict | None) -> dict | None:
    """The device options the actors load with: the caller's over the driver's tune decision's, when that
    decision chose the path. The actors are given the driver's device by name (``auto`` on a node could
    choose another), and a named device takes no tune decision, so without this they ran without the
    measured options the job record names (a measured precision, say: other results than local score's).
    The decision's ``threads`` stays out: an actor sizes its threads to the CPUs Ray gave it."""
    opts = dict(device_options or {})
    if rt.tuned is not None and rt.choice.decided_by == "measurement" and not rt.tune_not_applied:
        tuned = dict((rt.tuned.get("decision") or {}).get("throughput", {}).get("device_options") or {})
        opts = {**{k: v for k, v in tuned.items() if k != "threads"}, **opts}
    return opts or None


def _check_fits(cpus_per_actor: float) -> None:
    """This command's own Ray cannot grow: an actor no node can hold would wait forever (Ray Data
    waits for the CPUs without a word); refuse it, typed, before anything is scheduled."""
    import ray

    most = max((float((n.get("Resources") or {}).get("CPU", 0)) for n in ray.nodes() if n.get("Alive")), default=0.0)
    if cpus_per_actor > most:
        raise InputError(f"--cpus-per-actor {cpus_per_actor:g}: the local Ray has {most:g} CPUs, so no actor could "
                         f"start (the run would wait forever); ask for at most {most:g}, or join a cluster with "
                         f"--address", code=ec.INPUT_INVALID)


def _run(todo, writer: OrderedWriter, *, artifact, seal, device, target, strict, device_options, deadline_ms,
         batch_size, actors, cpus_per_actor, verify) -> None:
    import ray

    from .ray import EdgeScorer, to_rows
    from .ray_poison import RAY_TASK_RETRIES, open_marks, ray_failure

    for name in ("ray.data", "ray.data._internal.execution.streaming_executor"):
        logging.getLogger(name).setLevel(logging.WARNING)       # no per-dataset INFO lines on stderr
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    rows = to_rows(todo)
    job = f"score-{uuid.uuid4().hex}" if POISON_GUARD else None
    marks = open_marks(job)
    per_block = max(batch_size, min(4 * batch_size, -(-len(rows) // (4 * actors))))
    ds = ray.data.from_items(rows, override_num_blocks=max(1, -(-len(rows) // per_block)))
    ds = ds.map_batches(EdgeScorer, fn_constructor_kwargs={
        "artifact": artifact, "expect_seal": seal, "device": device, "target": target, "strict": strict,
        "device_options": device_options, "deadline_ms": deadline_ms, "verify": verify,
        "job": job if marks is not None else None},
        compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=cpus_per_actor, batch_size=batch_size,
        batch_format="numpy", max_restarts=-1, max_task_retries=RAY_TASK_RETRIES)
    try:
        for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
            writer.add(batch["index"], batch["text"], batch.get("where"))
    except ray.exceptions.RayError as exc:
        # Ray itself failed (an object store or node out of memory, an actor past its restarts, a lost
        # object): typed, with what is kept, not an "unexpected" bug report
        first = next((r for r in todo if r.index == writer.next), None)
        raise ray_failure(exc, writer.next, first) from exc
    finally:
        if marks is not None:
            marks.clear_job()
