"""One target's variant: its bucket models built by the target's converter, then
their parity measured against the fp32 reference. What ``convert()`` shares
between its steps (:class:`Job`, :class:`Samples`) is declared here too."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from edge_runtime.artifact import ArtifactWriter
from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError, InputError
from edge_runtime.limits import DEFAULT_LIMITS, Limits

from . import parity
from .base import BucketBuild, BucketIO, BuildContext, Converter
from .parity_trials import Measured, Reference, measure_target
from .registry import ConversionFailed, ConverterInvalid, get_converter
from .request import AUTO, ConvertRequest, data_name, fingerprint, recipe_for, toolchain

if TYPE_CHECKING:
    from edge_runtime.models.base import Task


@dataclass(frozen=True)
class Fp32Bucket:
    """One static-shape bucket of the fp32 source."""
    name: str       # "static", "seq64", ...
    path: Path      # the fp32 ONNX with this bucket's static dims (in the work dir)
    spec: dict      # the bucket as a task reads it: name, inputs, outputs


@dataclass(frozen=True)
class Samples:
    calib: list     # calibration samples (raw, as loaded)
    held: list      # held-out parity samples
    data: str       # what the held-out samples are, for the parity record
    policy: dict    # the sample-count policy record (request.sample_policy)
    left_out: str = ""  # what of --calibration was left out (unusable, repeated inputs), for the record


@dataclass
class Job:
    """One convert in progress: the request, where the artifact is assembled, the fp32 buckets."""
    req: ConvertRequest
    task_cls: type[Task]
    root: Path                      # the artifact's temporary directory
    work: Path                      # scratch, deleted after the convert
    writer: ArtifactWriter
    fp32: list[Fp32Bucket] = field(default_factory=list)
    draft: dict = field(default_factory=dict)   # preprocess / postprocess sections

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()

    def task(self, buckets: list[dict]):
        """The task contract over ``buckets`` (its pre/post-processing, as the runtime will run it)."""
        return self.task_cls(self.draft, self.read, buckets)

    @property
    def limits(self) -> Limits:
        """The input limits the artifact's runtime prepares under (:func:`artifact_limits`)."""
        return artifact_limits(self.task_cls, self.req.limits)


def artifact_limits(task_cls, limits: dict | None) -> Limits:
    """The limits the artifact's runtime applies before any caller's: the defaults, the task
    kind's, then the manifest's (the request's ``limits``), as ``Runtime`` merges them. Calibration,
    parity and the probe set prepare every sample under them: under the defaults, a sample the
    artifact refuses (a text over its ``max_text_chars``) was calibrated on, measured and written
    into the probe set, which ``verify`` then refused, and a detector's ``max_detections`` cap was
    not the runtime's. A limit the runtime would refuse is the caller's ``limit_invalid``/
    ``limit_unknown`` here, not an artifact that cannot load."""
    return DEFAULT_LIMITS.merged(task_cls.default_limits, source="manifest").merged(limits or None)


def policy_fields(policy: dict, side: str) -> dict:
    """The sample-count policy as recorded next to the count it judged."""
    rec = policy[side]
    out = {"min_samples": rec["min_samples"], "warn_below_samples": rec["warn_below"]}
    if "warning" in rec:
        out["warning"] = rec["warning"]
    if rec.get("allow_few_samples"):
        out["allow_few_samples"] = True
    return out


@dataclass(frozen=True)
class Built:
    """One target built with one recipe and measured: what its variant record is made of."""
    buckets: list       # the manifest's bucket records
    quant: dict         # the quantization record (the first bucket's, with the calibration record)
    measured: Measured


def build_variant(job: Job, target: str, samples: Samples, reference: Reference, progress) -> dict:
    """The manifest's variant record for ``target``, its files written into the artifact."""
    converter = get_converter(target)
    recipe = recipe_for(job.req.recipe, target, converter)
    budget = parity.budget_for(job.task_cls.parity_metric, job.req.min_parity)
    if recipe == AUTO:
        from .recipe_auto import build_auto

        return build_auto(job, target, converter, samples, reference, budget, progress)
    built = build_target(job, converter, target, samples, reference, recipe, job.req.recipe_overrides, budget,
                         progress)
    return variant_record(target, converter, built, samples)


def build_target(job: Job, converter: Converter, target: str, samples: Samples, reference: Reference,
                 recipe: str | None, overrides: dict | None, budget: float, progress) -> Built:
    """Every bucket of ``target`` built with ``recipe``, then its parity measured."""
    buckets, builds, used = [], [], {}
    for fb in job.fp32:
        build, used[fb.name] = _build_bucket(job, converter, target, fb, samples.calib, recipe, overrides, budget,
                                             progress)
        buckets.append(_bucket_record(job, converter, target, fb.name, build))
        builds.append(build)
    quant = dict(next((b.quantization for b in builds if b.quantization), {}))   # the first bucket's
    quant["calibration"] = calibration_record(job, target, samples, used, quant.get("scheme"), progress)
    parity_files = [str(b.parity_model) for b in builds if b.parity_model is not None]
    if parity_files and (len(parity_files) != len(builds) or not converter.fallback_target):
        raise ConverterInvalid(f"{target}: a parity_model needs one per bucket and the converter's "
                               f"fallback_target (the target it is a model of)")
    measured = measure_target(reference, target, converter, job.root, buckets, job.task(buckets), quant,
                              parity_files, budget, progress)
    return Built(buckets, quant, measured)


def variant_record(target: str, converter: Converter, built: Built, samples: Samples) -> dict:
    measured = built.measured
    par = {**measured.parity, **policy_fields(samples.policy, "parity")}
    variant = {"target": target, "buckets": built.buckets, "quantization": built.quant, "parity": par,
               "toolchain": toolchain(converter)}
    if len(measured.trials) > 1 or measured.options:
        variant["runtime"] = runtime_record(measured)
        variant["runtime_trials"] = [{"options": o, "parity": p["value"], "min": p.get("min"),
                                      "device_ms_median": p["device_ms_median"]} for o, p in measured.trials]
    return variant


def runtime_record(measured: Measured) -> dict:
    """The variant's ``runtime``: the options kept, and why under ``"why"``. The why is provenance,
    not an option (``Measured`` keeps them apart), but the manifest keeps it in ``runtime``: that is
    where the runtime reads it, for artifacts built before this and after. It splits it off from
    the options at load (dropped when a caller's device options override the record), and the
    OpenVINO backend reports it as the precision's reason (absent, it would say "requested")."""
    return {**measured.options, "why": measured.why} if measured.why else dict(measured.options)


@dataclass(frozen=True)
class BucketCalibration:
    """What one bucket's build calibrated on."""
    used: tuple          # indices into Samples.calib of the samples the toolchain calibrated on
    unprepared: int = 0  # samples this bucket's task could not prepare (never given to the toolchain)
    why: str = ""        # the first one's reason


def calibration_record(job: Job, target: str, samples: Samples, used: dict, scheme, progress) -> dict:
    """The variant's ``quantization.calibration``: what was calibrated on, never only what was given.
    ``samples`` and ``fingerprint`` are of the samples some bucket's toolchain calibrated on; where
    that is not every sample given, ``given`` and ``not_used`` say what and why; ``per_bucket`` where
    the buckets calibrated on different counts. A variant that calibrated nothing (a float target, a
    data-free weight compression) records ``samples: 0`` and ``used: false`` with the reason: its
    record named the convert's calibration samples as if they had made it."""
    given = len(samples.calib)
    union = sorted(set().union(*(set(c.used) for c in used.values()))) if used else []
    if not union:
        return {"samples": 0, "used": False,
                "not_used": f"{target} ({scheme or 'not quantized'}) calibrated on no sample: "
                            f"none of the {given} calibration samples of the convert was used"}
    rec = {"samples": len(union), "fingerprint": fingerprint([samples.calib[i] for i in union]),
           "source": data_name(job.req.calibration), **policy_fields(samples.policy, "calibration"),
           **({"left_out": samples.left_out} if samples.left_out else {})}
    notes = []
    for name, c in used.items():
        if c.unprepared:
            notes.append(f"bucket {name}: {c.unprepared} its task cannot prepare (the first: {c.why[:200]})")
        if len(c.used) < given - c.unprepared:
            notes.append(f"bucket {name}: the toolchain calibrated on the first {len(c.used)} of the "
                         f"{given - c.unprepared} it was given")
    if not notes:
        return rec
    rec.update(given=given, not_used="; ".join(notes))
    counts = {name: len(c.used) for name, c in used.items()}
    if len(set(counts.values())) > 1:
        rec["per_bucket"] = counts
    for note in notes:
        progress(f"warning: {target}: calibration: {note}")
    fewest, policy = min(counts.values()), samples.policy["calibration"]
    if fewest < policy["min_samples"] and not job.req.allow_few_samples:
        raise InputError(f"too few samples: {target} calibrated on {fewest} calibration samples ({rec['not_used']}), "
                         f"under the minimum of {policy['min_samples']}. Give more, lower --min-calibration-samples, "
                         "or pass --allow-few-samples", code=ec.CONVERT_TOO_FEW_SAMPLES)
    if fewest < policy["warn_below"]:      # judged on what was used, not on what was given
        rec["warning"] = (f"only {fewest} calibration samples used" + (
            f", under the minimum of {policy['min_samples']} (allowed by --allow-few-samples)"
            if fewest < policy["min_samples"] else f" (fewer than {policy['warn_below']})"))
        if fewest < policy["min_samples"]:
            rec["allow_few_samples"] = True
        progress(f"warning: {target}: {rec['warning']}")
    return rec


def _build_bucket(job: Job, converter: Converter, target: str, fb: Fp32Bucket, calib: list, recipe,
                  overrides: dict | None, budget, progress) -> tuple[BucketBuild, BucketCalibration]:
    progress(f"{target}: quantizing bucket {fb.name} with {len(calib)} calibration samples" if converter.quantizes
             else f"{target}: building bucket {fb.name} (float, not quantized)")
    try:
        one = job.task([fb.spec])
    except ArtifactError as exc:   # the contract over every bucket took it, this bucket's alone cannot be one
        raise InputError(f"{target}: bucket {fb.name}: {exc.message} (drop it from --buckets)",
                         code=ec.CONVERT_BUCKETS_INVALID) from None
    # split_samples kept only what the task over every bucket prepares. The built-in tasks' one-bucket
    # contract takes each of them too (image and tensors convert to one bucket; a text task truncates
    # to a short bucket, keeping a token of text), but a plug-in task over buckets that refuses what
    # does not fit one can refuse some: counted, said in the record and warned of, never dropped
    # without a word (it was `except InputError: continue`). A float target is given none.
    prepared, index, unprepared, why = [], [], 0, ""
    limits = job.limits
    for k, s in enumerate(calib if converter.quantizes else ()):
        try:
            prepared.append(one.prepare(s, limits))
            index.append(k)
        except InputError as exc:
            unprepared += 1
            why = why or exc.message
    if converter.quantizes and not prepared:
        raise InputError(f"{target}: bucket {fb.name}: none of the {len(calib)} calibration samples can be prepared "
                         f"for it: {why}", code=ec.CONVERT_CALIBRATION_INVALID)
    dst = job.root / _rel(converter, target, fb.name)
    dst.parent.mkdir(parents=True, exist_ok=True)
    ctx = BuildContext(task=job.req.task, work=job.work, recipe=recipe, overrides=overrides,
                       task_obj=one, prepared=tuple(prepared), budget=budget, torch_source=job.req.torch_source)
    try:
        build = converter.build_bucket(fb.path, dst, [p.feeds for p in prepared], ctx)
    except ConversionFailed as exc:  # the toolchain cannot build this source
        raise InputError(f"{target}: {exc}", code=ec.CONVERT_TARGET_FAILED) from None
    except ValueError as exc:  # a bad recipe/override or unusable calibration data
        raise InputError(f"{target}: {exc}", code=ec.CONVERT_RECIPE_INVALID) from None
    if not isinstance(build, BucketBuild):
        raise ConverterInvalid(f"{target}: {type(converter).__name__}.build_bucket returned "
                               f"{type(build).__name__}, not a BucketBuild")
    # a converter says how many of the feeds (the first ones) it calibrated on: ``calibration_samples``
    n = (build.quantization or {}).get("calibration_samples", len(prepared))
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= len(prepared):
        raise ConverterInvalid(f"{target}: {type(converter).__name__}.build_bucket records calibration_samples "
                               f"{n!r} of the {len(prepared)} feeds it was given")
    return build, BucketCalibration(tuple(index[:n]), unprepared, why)


def _rel(converter: Converter, target: str, bucket: str) -> str:
    return f"{target}/{bucket}{converter.suffix}"


def _bucket_record(job: Job, converter: Converter, target: str, name: str, build: BucketBuild) -> dict:
    """The manifest's bucket record; the bucket's files hashed into the artifact."""
    rel = _rel(converter, target, name)
    dst = job.root / rel
    bucket: dict = {"name": name, "file": rel}
    if dst.is_dir():   # a package directory (.mlpackage): every file inside hashed
        tree = job.writer.add_tree(rel)
        entry = f"{rel}/{build.entry or ''}"
        if entry not in tree:
            raise InputError(f"{target}: package {rel} has no entry file {entry}", code=ec.CONVERT_TARGET_FAILED)
        bucket.update(file=entry, package=rel, extra_files=[f for f in tree if f != entry])
    else:
        job.writer.add_file(rel)
    if build.inputs is not None and build.outputs is not None:
        io = BucketIO(build.inputs, build.outputs)
    else:
        io = converter.describe(dst)
    extra = list(dict.fromkeys(Path(e).name for e in (*build.extra_files, *io.extra_files)))
    if extra:   # companion files beside the model (OpenVINO's .bin)
        bucket["extra_files"] = bucket.get("extra_files", []) + [job.writer.add_file(f"{target}/{e}") for e in extra]
    bucket.update(build.fields)
    bucket.update(inputs=io.inputs, outputs=io.outputs)
    return bucket
