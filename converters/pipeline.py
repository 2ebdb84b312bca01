"""``convert()``: one source model → one artifact with one variant per target.

Steps: fix static shapes per bucket → load and split samples → build each
target's int8 bucket models with the calibration data (through the task's
pre-processing) and measure their parity against the fp32 source on held-out
samples (``build_variant``) → write the hashed manifest → move into place. The
artifact is assembled in a temporary directory and moved into place only when
every target meets its parity budget, so a failed convert never leaves
something that looks valid.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from edge_runtime.artifact import ArtifactWriter
from edge_runtime.devices import registry
from edge_runtime.errors import ArtifactError, InputError, ParityError
from edge_runtime.hardware import detect_cached
from edge_runtime.host import host_record
from edge_runtime.manifest import FORMAT, FORMAT_VERSION

from .build_variant import Job, artifact_limits, build_variant
from .convert_inputs import detector_preprocess, fix_static_shapes, record_source, split_samples, upgrade_source
from .onnx_io import io_specs, read_source
from .parity_trials import Reference
from .request import ConvertRequest, available_targets, check_recipe, check_request, task_of


def convert(req: ConvertRequest, progress=lambda step: None) -> dict:
    check_request(req)
    artifact_limits(task_of(req), req.limits)   # a limit its runtime would refuse: the caller's, before any work
    source_info = read_source(req.source)   # a TFLite, unparsable or already-quantized source: InputError
    check_recipe(req)
    targets, skipped = available_targets(req.targets, progress, allow_skip=req.allow_skip)
    import onnxruntime  # noqa: F401  (the fp32 reference runs on it)

    task_cls = task_of(req)
    if task_cls.sequence_buckets:
        req.buckets = sorted(set(req.buckets or task_cls.default_buckets))
    out = Path(req.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    work = Path(tempfile.mkdtemp(prefix="edge-infer-convert-"))
    t_start = time.perf_counter()
    try:
        job = Job(req, task_cls, tmp, work, ArtifactWriter(tmp))
        src_inputs, src_outputs = io_specs(req.source)
        source = upgrade_source(req, source_info["opset"], work, progress)
        job.fp32 = fix_static_shapes(req, source, src_inputs, work, progress)
        job.req = req = detector_preprocess(req, job.fp32[0].spec["inputs"], src_outputs, progress)
        pre, post = _sections(task_cls, req, job.writer, src_outputs)
        if post.get("family"):      # a detector's head read as another family's: parity is blind to it
            from .onnx_head import check_source_head

            check_source_head(source, post)
        job.draft = {"preprocess": pre, "postprocess": post}
        task_ref = _reference_task(job)
        samples = split_samples(job, task_ref, progress)
        source_record = record_source(job, source_info, source, src_inputs, src_outputs, samples)
        with reference_sessions(job) as sessions:
            reference = Reference(task_ref, sessions, samples.held, samples.data, req.min_parity, job.limits,
                                  req.min_parity_samples, req.allow_few_samples)
            probe = write_probe(job, reference, progress)
            variants = [build_variant(job, target, samples, reference, progress) for target in targets]
        manifest = _manifest(req, source_record, pre, post, variants, skipped, t_start)
        if probe is not None:
            manifest["probe"] = probe
        job.writer.write_manifest(manifest)
        _parity_gate(variants)
        _move_into_place(tmp, out)
        return manifest
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _sections(task_cls, req: ConvertRequest, writer: ArtifactWriter, outputs: list[dict]) -> tuple[dict, dict]:
    """The artifact's ``preprocess`` and ``postprocess``: the task's own (``Task.build_sections``)."""
    from edge_runtime.models import TaskInvalid

    built = task_cls.build_sections(req, writer, outputs)
    if not (isinstance(built, tuple) and len(built) == 2 and all(isinstance(s, dict) for s in built)):
        raise TaskInvalid(f"task {task_cls.name!r}: {task_cls.__name__}.build_sections returned {built!r:.200}, "
                          "not (preprocess, postprocess) dicts", task=task_cls.name)
    return built


def _reference_task(job: Job):
    """The task over the fp32 buckets; a contract that refuses what the caller gave is theirs."""
    try:
        return job.task([b.spec for b in job.fp32])
    except ArtifactError as exc:   # labels, preprocess
        raise InputError(f"{exc.message} (from --labels / --preprocess and the source model)",
                         code=exc.code) from None


@contextlib.contextmanager
def reference_sessions(job: Job):
    """The fp32 buckets on onnxruntime:cpu, the reference every target's parity is measured against."""
    backend = registry.get_backend("onnxruntime")
    sessions = []
    try:
        for b in job.fp32:
            sessions.append(backend.load(b.path, b.spec, "cpu", {}))
        yield sessions
    finally:
        for s in sessions:
            s.close()


def _manifest(req: ConvertRequest, source_record: dict, pre: dict, post: dict, variants: list, skipped: list,
              t_start: float) -> dict:
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": {"name": req.name or Path(req.source).stem, "version": req.version, "source": source_record},
        "task": req.task,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": {},
        "preprocess": pre,
        "postprocess": post,
        "limits": dict(req.limits),
        "variants": variants,
        **({"skipped_targets": skipped} if skipped else {}),
        "build": {"seconds": round(time.perf_counter() - t_start, 1), "host": platform.machine(),
                  "host_info": host_record(detect_cached())},
    }


def write_probe(job: Job, ref: Reference, progress) -> dict | None:
    """The probe set (``edge_runtime.probe``): held-out samples covering every bucket
    (``probe_select``), with the fp32 source's results for them, written into the artifact;
    its manifest section."""
    from edge_runtime import probe

    from .probe_select import PER_BUCKET, pick, spread

    want = job.req.probe_samples
    if want <= 0:
        return None

    def source(n: int) -> str:    # of the count kept: the byte cap's 2 probes were recorded as "at least 4 per bucket"
        return (f"held-out parity samples ({ref.data}), at least {min(n // max(len(ref.task.buckets), 1), PER_BUCKET)}"
                " per bucket where they reach it, then spread evenly over the held-out order")

    count = want
    for _ in range(4):
        # the byte cap keeps a prefix of the list: a list spread for 32 cut to its first 4 held 4
        # probes of one or two classes (digits: 0, 0, 0, 1); spread again over what the cap admits
        picked = pick(ref.task, spread(list(ref.held), count), count, ref.limits)
        results = []
        for raw in picked.raws:
            prepared = ref.task.prepare(raw, ref.limits)
            results.append(ref.task.finish(ref.sessions[prepared.bucket].run(prepared.feeds), prepared))
        inputs, reference, section = probe.build(picked.raws, results, count=count,
                                                 max_bytes=job.req.probe_max_bytes, source=source(count))
        if section["samples"] >= len(picked.raws):
            break
        count = section["samples"]
    section["max_samples"] = want
    section["source"] = source(section["samples"])
    names = [b["name"] for b in ref.task.buckets]
    kept = picked.buckets[:section["samples"]]          # the byte cap may have cut the list short
    section["buckets"] = {n: kept.count(i) for i, n in enumerate(names)}
    if picked.composed:
        section["joined"] = {names[b]: n for b, n in picked.composed.items()}
    unreached = [n for n, k in section["buckets"].items() if k == 0]
    if unreached:
        section["unreached_buckets"] = unreached
    job.writer.add_file(probe.INPUTS, data=inputs)
    job.writer.add_file(probe.REFERENCE, data=reference)
    progress(f"probe set: {section['samples']} held-out samples with their fp32 results, per bucket "
             + ", ".join(f"{n} {k}" for n, k in section["buckets"].items())
             + (f" ({', '.join(f'{n}: {k} joined from consecutive held-out samples' for n, k in section['joined'].items())})"
                if "joined" in section else "")
             + (f"; no probe reaches {', '.join(unreached)}" if unreached else "")
             + f" ({section['bytes']} bytes, cap {section['max_bytes']})")
    return section


def _parity_gate(variants: list[dict]) -> None:
    failures = [f"{v['target']}: {p['metric']} {p['value']:.4f} < budget {p['budget']}"
                for v in variants for p in [v["parity"]] if p["passed"] is False]
    if failures:
        raise ParityError("parity under budget: " + "; ".join(failures), variants=[
            {"target": v["target"], "parity": v["parity"], "recipe_trials": v.get("recipe_trials")} for v in variants])


def _move_into_place(tmp: Path, out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    os.chmod(tmp, 0o755)  # mkdtemp makes it owner-only
    os.replace(tmp, out)
