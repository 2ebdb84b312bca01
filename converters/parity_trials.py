"""Parity of one built target against the fp32 reference: on this host's best
backend for the target (one trial per runtime option set the converter offers,
the fastest within budget kept), on a labelled stand-in where the target cannot
run here, or recorded as not measured with the reason. Never a figure that was
not measured."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from edge_runtime.devices import registry
from edge_runtime import error_codes as ec
from edge_runtime.errors import DeviceError, EdgeRuntimeError, InputError
from edge_runtime.hardware import detect_cached
from edge_runtime.limits import DEFAULT_LIMITS, Limits
from edge_runtime.selection import choose
from edge_runtime.verify import compares_nothing

from . import parity
from .base import Converter
from .request import WARN_PARITY_SAMPLES

if TYPE_CHECKING:
    from edge_runtime.models.base import Task


@dataclass
class Reference:
    """The fp32 side every target is measured against."""
    task: Task              # the task over the fp32 buckets (same pre/post-processing)
    sessions: list          # fp32 sessions on onnxruntime:cpu, one per bucket
    held: list              # held-out samples
    data: str               # what the held-out samples are, for the record
    min_parity: float | None
    limits: Limits = DEFAULT_LIMITS   # what the artifact's runtime prepares under (build_variant.artifact_limits)
    min_samples: int = 0              # --min-parity-samples: also of the samples a figure compares (compared_samples)
    allow_few_samples: bool = False


@dataclass(frozen=True)
class Measured:
    """One built target's parity record and the runtime options chosen by measurement."""
    parity: dict                  # the variant's parity record
    options: dict                 # the runtime option set kept (empty: the backend's defaults)
    why: str | None = None        # why those options (several trials only): provenance, not an option
    trials: list = field(default_factory=list)   # (options, parity) per option set measured


def measure_target(ref: Reference, target: str, converter: Converter, root: Path, buckets: list[dict], task_cand,
                   quant: dict, parity_files: list, budget: float, progress) -> Measured:
    """Parity (and the runtime options kept) of one built target."""
    trials: list[tuple[dict, dict]] = []
    par_target, par_buckets = target, buckets
    if parity_files:
        assert converter.fallback_target, "build_variant refuses parity models without a fallback target"
        par_target = converter.fallback_target
        par_buckets = [dict(b, file=f) for b, f in zip(buckets, parity_files)]
    not_here = converter.parity_unavailable()
    if not_here:   # the target's model cannot run on this host
        trials.append(({}, _parity_elsewhere(converter, ref, task_cand, buckets, not_here, progress, target)))
    for opts in ([] if not_here else converter.runtime_candidates()):
        progress(f"{target}: measuring parity against fp32 on {len(ref.held)} samples"
                 + (f" with {opts}" if opts else "") + (f" (on the {par_target} model it was compiled from)"
                                                      if parity_files else ""))
        try:
            cand_sessions = _target_sessions(par_target, root, par_buckets, opts)
        except DeviceError as exc:
            if not opts or not trials:   # the backend's defaults must load: that is the artifact
                raise
            progress(f"warning: {target}: {opts} cannot be compiled here, not measured: {str(exc)[:200]}")
            continue
        try:
            trials.append((opts, _judgeable(parity.measure(ref.task, ref.sessions, task_cand, cand_sessions,
                                                           ref.held, ref.limits))))
        except EdgeRuntimeError:
            raise
        except Exception as exc:  # the toolchain built a model that does not run (TF's int8 DIV, say)
            report = (quant or {}).get("edgetpu_report", {}).get("verdict")
            raise InputError(f"{target}: the built model fails when run for parity on "
                             f"{cand_sessions[0].device}: {type(exc).__name__}: {str(exc)[:300]}"
                             + (f" (static Edge TPU report of the built model: {report})" if report else ""),
                             code=ec.CONVERT_TARGET_FAILED) from None
        finally:
            for s in cand_sessions:
                s.close()
    runtime_opts, par, why = _pick_runtime(trials, budget)
    par["budget"] = parity.budget_for(par["metric"], ref.min_parity)
    par["reference"] = "fp32 source ONNX on onnxruntime:cpu, same pre/post-processing"
    if parity_files:
        par["measured_on"] = (f"the {par_target} model given to the compiler: the compiled model runs "
                              "only on an Edge TPU, absent at build time")
    par["data"] = ref.data
    par = _judgeable(par)
    if par.get("measured") is False or par.get("not_judged"):   # not measured / compares nothing: never a figure
        par["passed"] = None
    else:
        compared_samples(par, ref, target)
        if par.get("compared_warning"):
            progress(f"warning: {par['compared_warning']}")
        par["passed"] = par["value"] is not None and par["value"] >= par["budget"]
    return Measured(par, runtime_opts, why, trials)


def compared_samples(par: dict, ref: Reference, target: str) -> None:
    """The sample policy (``--min-parity-samples``) held to the samples a figure compares: a detector's F1
    is over the held-out images with a detection on either side (``samples_compared``), and an image with no
    box on either side adds nothing to it. 8 held-out images, one with objects, read "detection_f1 1.0000 on
    8 held-out samples", passed, exit 0: a figure from one image. Under the minimum it is refused as too few
    samples are (``--allow-few-samples``: recorded with ``compared_warning``)."""
    n = par.get("samples_compared")
    if isinstance(n, bool) or not isinstance(n, int) or n >= par.get("samples", 0) or par.get("value") is None:
        return
    what = (f"{target}: only {n} of the {par.get('samples')} held-out samples {'has' if n == 1 else 'have'} a "
            f"detection on either side (fp32 or {target}); the others compare nothing")
    if n < ref.min_samples:
        if not ref.allow_few_samples:
            raise InputError(f"too few samples: {what}, under the minimum of {ref.min_samples} parity samples. Give "
                             "--parity-data with objects the source finds (check --preprocess and the score "
                             "threshold), lower --min-parity-samples, or pass --allow-few-samples",
                             code=ec.CONVERT_TOO_FEW_SAMPLES)
        par["compared_warning"] = f"{what}, under the minimum of {ref.min_samples} (allowed by --allow-few-samples)"
    elif n < WARN_PARITY_SAMPLES:
        par["compared_warning"] = f"{what}: the figure is a rough one"


def _judgeable(par: dict) -> dict:
    """``par`` with no figure where it compares nothing (F1 1.0 over no box). Done per trial, before
    the runtime options are picked: such a trial's 1.0 counted as "within budget" in the pick (the
    fastest of them kept on no evidence) and stood in ``runtime_trials`` as a measured figure that
    verify read back as the recorded one, while ``parity.value`` said none."""
    nothing = compares_nothing(par) if par.get("value") is not None else None
    if nothing:
        par.update(value=None, passed=None, not_judged=nothing, **({"min": None} if "min" in par else {}))
    for name, figures in (par.get("per_bucket") or {}).items():   # a bucket's 1.0 over no box: no figure either
        bucket_nothing = compares_nothing(figures) if isinstance(figures, dict) else None
        if bucket_nothing:
            par["per_bucket"][name] = {**figures, "value": None, "min": None, "not_judged": bucket_nothing}
    return par


def _parity_elsewhere(converter: Converter, ref: Reference, task_cand, buckets, why, progress, target) -> dict:
    """Parity of a target that cannot run here: measured on the converter's labelled
    stand-in (``parity_stand_in``: the fake-quantized torch model of coreml w8a8), else
    recorded as not measured with the reason."""
    stand_in = converter.parity_stand_in(buckets)
    if stand_in is None:
        progress(f"{target}: parity not measured: {why}")
        return {"metric": ref.task.parity_metric, "value": None, "samples": 0, "measured": False,
                "not_measured": why}
    sessions, label = stand_in.sessions, stand_in.label
    progress(f"{target}: {why}; measuring parity on the {label} instead")
    try:
        par = parity.measure(ref.task, ref.sessions, task_cand, sessions, ref.held, ref.limits)
    finally:
        for s in sessions:
            s.close()
    par.update(measured="stand-in", measured_on=label, not_measured_on_target=why)
    return par


def _pick_runtime(trials: list, budget: float) -> tuple[dict, dict, str | None]:
    """The fastest runtime option set whose parity meets the budget (else the first): (options,
    parity, why those options where there was a choice)."""
    passing = [(o, p) for o, p in trials if p["value"] is not None and p["value"] >= budget]
    if not passing:
        return (*trials[0], None)
    # the first option set (the most exact) unless another is clearly (>10%) faster: timing noise
    # must not flip an artifact's precision from one build to the next
    opts, par = passing[0]
    fastest = min(passing, key=lambda t: t[1]["device_ms_median"])
    if fastest[1]["device_ms_median"] < 0.9 * par["device_ms_median"]:
        opts, par = fastest
    why = None
    if len(trials) > 1 and opts:
        others = ", ".join(f"{o}: {p['device_ms_median']} ms, parity "
                           + (f"{p['value']:.4f}" if p.get("value") is not None else "not judged") for o, p in trials)
        why = f"fastest within the parity budget at convert time ({others})"
    return opts, par, why


def _target_sessions(target: str, root: Path, buckets: list[dict], options: dict | None = None):
    """Load the built variant on the best local backend for its target."""
    choice = choose([{"target": target, "buckets": buckets}], detect_cached())
    backend = registry.get_backend(choice.backend_name)
    sub = choice.suitability.device.partition(":")[2] or None
    try:
        return [backend.load(root / b["file"], b, sub, dict(options or {})) for b in buckets]
    except Exception as exc:
        raise DeviceError(f"cannot load the built {target} variant for parity: {exc}") from exc
