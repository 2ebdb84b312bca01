"""Parity measured here: the artifact's probe set through a loaded runtime, beside
the figure the converter recorded and the budget.

``verify_runtime(rt)`` runs every probe input through ``rt.infer`` (the whole
path: limits, pre-processing, the device, the non-finite guard,
post-processing) and compares the results with the fp32 source's recorded
ones through the task's own ``compare``. ``verify_artifact`` does it for the
path ``load`` chooses here, or (``all_paths``) for every variant × backend ×
precision hint that can run here. The CLI (``edge-infer verify``) exits 7 when
the chosen path is under budget; ``load(verify=True)`` raises ``ParityError``.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import error_codes as ec
from . import host
from .artifact import _unreadable
from .errors import ArtifactError, EdgeRuntimeError, InputError, ParityError
from .probe import ProbeSet, read


def read_probe(art) -> ProbeSet:
    """``probe.read`` of ``art`` with each probe file read once, hashed, and those very bytes parsed: a
    probe file hashed at load and read again later was used unverified when it changed in between."""
    from types import SimpleNamespace

    return read(SimpleNamespace(manifest=art.manifest, read_bytes=lambda rel: _read_once(art, rel)))


def _read_once(art, rel: str) -> bytes:
    """A listed file's bytes, returned only once they match the manifest's size and sha256."""
    files = art.manifest["files"]
    if not isinstance(rel, str) or rel not in files:
        raise ArtifactError("file is not listed in the manifest (not pinned by a sha256)", file=str(rel),
                            code=ec.ARTIFACT_FILE_UNLISTED)
    entry, p = files[rel], art.path(rel)
    try:        # O_NONBLOCK: a FIFO in the file's place is refused below, never waited on
        with os.fdopen(os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)),
                       "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise ArtifactError("not a regular file", file=rel, code=ec.ARTIFACT_FILE_INVALID)
            data = fh.read(entry["bytes"] + 1)      # never more than one byte past the size pinned
    except FileNotFoundError:
        raise ArtifactError("file listed in the manifest is missing", file=rel, code=ec.ARTIFACT_FILE_MISSING) from None
    except OSError as exc:
        raise _unreadable(rel, exc) from None
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != entry["bytes"] or digest != entry["sha256"]:
        raise ArtifactError(f"sha256 or size mismatch: manifest {entry['sha256'][:12]}… ({entry['bytes']} bytes), "
                            f"file {digest[:12]}… ({len(data)} bytes read)", file=rel, code=ec.ARTIFACT_HASH_MISMATCH)
    return data


def _row_base(rt) -> dict:
    # fallback: the device asked for was not the one measured (None when it was)
    return {"target": rt.variant.target, "backend": rt.choice.backend_name, "device": rt.device,
            "device_options": dict(rt.device_options), "fallback": rt.choice.fallback}


def _run_probe(rt, probe: ProbeSet, i: int, raw):
    """One probe sample through ``infer``'s whole path: ``(result, task output)``. The probe set is
    the artifact's, not the caller's input: a sample the task refuses (not an image, over a limit)
    is a broken probe set."""
    try:
        return rt._probe_call(raw)
    except InputError as exc:
        raise ArtifactError(f"probe sample {i} of {len(probe.inputs)} is refused by the "
                            f"{rt.artifact.manifest.task} task's input path: {exc.message} [{exc.code}]",
                            file=probe.section.get("inputs"), code=ec.PROBE_INVALID, sample=i, cause=exc.code) from None


def verify_runtime(rt, probe: ProbeSet | None = None, *, rounds: int = 1) -> dict:
    """Parity and latency of ``rt`` on the probe set: ``metric``, ``value`` (and the
    compare's other figures), ``recorded``, ``budget``, ``passed``, ``samples``,
    ``latency_ms_median``, ``first_ms`` (the first call: at load it is the one that warms the
    pre/post-processing path), ``buckets`` (probes per bucket), ``unverified_buckets`` (the
    buckets no probe reached: their models did not run), ``ms`` (the whole verify)."""
    t0 = time.perf_counter()
    probe = probe if probe is not None else read_probe(rt.artifact)
    if not probe.inputs:        # read() refuses it; a ProbeSet built elsewhere may still be empty
        raise ArtifactError("the probe set holds no sample: nothing to verify with", file=probe.section.get("inputs"),
                            code=ec.PROBE_INVALID)
    results: list[Any] = []         # the task's outputs, compared as the converter compared them
    reached: list[str] = []
    lat: list[float] = []
    for r in range(max(1, rounds)):
        for i, raw in enumerate(probe.inputs):
            t = time.perf_counter()
            res, out = _run_probe(rt, probe, i, raw)
            lat.append((time.perf_counter() - t) * 1000)
            if r == 0:
                results.append(out)
                reached.append(res.bucket)
    figures = rt.task.compare(probe.reference, results)
    names = [b.name for b in rt.variant.buckets]
    per_bucket = {n: reached.count(n) for n in names}
    parity = rt.variant.parity
    budget = parity.get("budget")
    passed = holds(figures, budget)         # before the row is built: it may add disagreements, p_value
    row = {**_row_base(rt), **{k: v for k, v in figures.items() if k not in ("per_bucket",)},
           "recorded": _recorded(rt.variant, dict(rt.device_options)), "budget": budget, "passed": passed,
           "latency_ms_median": round(float(np.median(lat)), 3), "first_ms": round(lat[0], 3) if lat else None,
           "latency_ms_p90": round(float(np.percentile(lat, 90)), 3),
           "here": host.int8_class(rt.hardware, rt.device),
           # each bucket is its own compiled model: one no probe reached was not checked here
           "buckets": per_bucket, "unverified_buckets": [n for n, k in per_bucket.items() if k == 0],
           "ms": round((time.perf_counter() - t0) * 1000, 1)}
    nothing = compares_nothing(figures, "probe samples")
    if budget is None:
        row["passed"] = None      # nothing to hold it to (an imported artifact records no budget)
    elif nothing:               # F1 1.0 over no box: nothing was compared, so no verdict (was "pass")
        row.update(passed=None, not_judged=nothing)
    return row


def compares_nothing(figures: dict, samples: str = "held-out samples") -> str | None:
    """Why a measured figure compares nothing, or None. A detector's F1 over samples in which neither
    the fp32 reference nor the candidate detects anything is 1.0 by definition (no box, no miss): a
    passing figure with no evidence behind it (parity data without objects, a --preprocess that
    blinds the source, a too-high score threshold). Convert records it as not judged (no value,
    ``passed`` null) and verify gives no verdict on it (``passed`` null, ``not_judged``)."""
    if figures.get("metric") == "detection_f1" and figures.get("value") is not None:
        boxes = sum(int(figures.get(k) or 0) for k in ("matched", "unmatched_reference", "unmatched_candidate"))
        if boxes == 0:
            return (f"neither the fp32 source nor the candidate detects anything in the {figures.get('samples')} "
                    f"{samples}: an F1 over no box compares nothing (give parity data with objects the source "
                    "finds; check --preprocess and the score threshold)")
    return None


def _recorded(variant, options: dict):
    """The convert-time figure of the runtime option set this path runs with: ``runtime_trials`` has
    one per option set measured (OpenVINO's f32 and bf16 hints), ``parity.value`` is the kept one's.
    A ``verify --all`` row of the other hint showed the kept hint's figure as its own "recorded"."""
    trials = variant.get("runtime_trials")
    trials = [t for t in (trials if isinstance(trials, (list, tuple)) else ()) if isinstance(t, Mapping)
              and isinstance(t.get("options"), Mapping)]
    # compared on the options the trials vary (precision), not on the others a load adds: a cgroup
    # quota's threads, $EDGE_RUNTIME_THREADS, a caller's max_requests made every trial differ and the
    # bf16 row of ``verify --all`` showed the kept f32 hint's figure as its own "recorded"
    dims = {k for t in trials for k in t["options"]}
    here = {k: v for k, v in options.items() if k in dims}
    for t in trials:
        value = t.get("parity")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and same_options(dict(t["options"]), here):
            return value
    return variant.parity.get("value")


# parity metrics that are a share of trials, each one agreeing or not: on a few probes one
# disagreement moves them far (1 of 32 is 0.969), so they are judged by how likely that many
# disagreements are from a path that meets the budget. A detector's F1 is such a share too:
# 1 - F1 = (fp + fn) / (2 tp + fp + fn), the unmatched boxes among the boxes of both sides
PER_SAMPLE_SHARES = frozenset({"top1_agreement", "detection_f1"})
ALPHA = 0.05


def _share(figures: dict) -> tuple[int, int, str] | None:
    """(disagreements k, trials n, what they count) of a share metric's figures; None otherwise."""
    metric = figures.get("metric")
    if metric == "top1_agreement":
        n = figures.get("samples") or 0
        return round((1 - figures["value"]) * n), n, "probes disagree"
    tp, fn, fp = (figures.get(k) for k in ("matched", "unmatched_reference", "unmatched_candidate"))
    if metric == "detection_f1" and isinstance(tp, int) and isinstance(fn, int) and isinstance(fp, int) \
            and min(tp, fn, fp) >= 0:
        return fn + fp, 2 * tp + fn + fp, "detections unmatched (a matched pair counts once on each side)"
    return None


def _tail(n: int, k: int, q: float) -> float:
    """P(X >= k) for X ~ Binomial(n, q), in log space (a detector's thousands of boxes overflow floats)."""
    if k <= 0:
        return 1.0
    if q <= 0:
        return 0.0
    if q >= 1:
        return 1.0
    lq, lp = math.log(q), math.log1p(-q)
    lg = math.lgamma
    return min(1.0, sum(math.exp(lg(n + 1) - lg(i + 1) - lg(n - i + 1) + i * lq + (n - i) * lp)
                        for i in range(k, n + 1)))


def holds(figures: dict, budget: float | None) -> bool:
    """Whether the probe figures are consistent with the budget. A share metric under the budget
    (top-1 agreement over the probes, a detector's F1 over their boxes) still holds when a path
    exactly at the budget would show that many disagreements or more with probability >= ``ALPHA``
    (32 probes at 0.99: one disagreement holds, two do not); ``figures`` gains ``disagreements``,
    ``trials``, ``share_of`` and ``p_value`` then. Any other metric must reach the budget."""
    value = figures.get("value")
    if value is None or budget is None:
        return False
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False        # a NaN or infinite figure holds nothing (NaN crashed a share; inf passed any budget)
    if value >= budget:
        return True
    share = _share(figures) if figures.get("metric") in PER_SAMPLE_SHARES else None
    if share is None or share[1] <= 0:
        return False
    k, n, what = share
    p = _tail(n, k, 1 - budget)
    figures.update(disagreements=k, trials=n, share_of=what, p_value=round(p, 4))
    return p >= ALPHA


def share_text(row: dict) -> str:
    """"2 of 32 probes disagree" of a row judged by its sampling error."""
    return (f"{row['disagreements']} of {row.get('trials', row.get('samples'))} "
            f"{row.get('share_of', 'probes disagree')}")


def refuse(row: dict) -> ParityError:
    value = f"{row['value']:.4f}" if isinstance(row.get("value"), (int, float)) else "no figure"
    return ParityError(f"on {row['device']} the {row['target']} variant measures {row.get('metric')} "
                       f"{value} on the probe set, under its budget {row['budget']}"
                       + (f" ({share_text(row)}: p={row['p_value']:.3f} for a path at the budget)"
                          if row.get("p_value") is not None else "")
                       + f" (recorded at convert time: {row['recorded']})", code=ec.PARITY_BELOW_BUDGET_HERE,
                       device=row["device"], variant=row["target"], value=row["value"], budget=row["budget"])


def candidate_paths(art, hardware) -> list[dict]:
    """Every (variant target, backend, device options) that can run here: each usable
    candidate of the selection, once per precision hint its backend offers."""
    from edge_runtime.devices import registry

    from .selection import rank

    out = []
    for row in rank(art.manifest.variants, hardware):
        if not row["suitability"].ok:
            continue
        backend = registry.get_backend(row["backend"])
        for hint in backend.precision_hints(row["variant"]["target"], hardware):
            out.append({"target": row["variant"]["target"], "backend": row["backend"], "device_options": hint,
                        "score": row["suitability"].score})
    return out


def verify_artifact(path, *, device: str = "auto", all_paths: bool = False, hardware=None,
                    load_kw: dict | None = None) -> dict:
    """``{"chosen": row, "rows": [row, ...], "passed": bool | None, "verdict": str, ...}``: the path
    ``load`` picks here, and with ``all_paths`` every other one too (a row whose load or run fails
    carries ``error``). Each row has its ``verdict`` (:func:`verdict`); ``passed`` and ``verdict``
    are the chosen row's (``passed`` null: no budget recorded, or not judged).

    A device named here is never certified by another: its load is strict (``DeviceError``,
    exit 4, rather than a fallback). With ``all_paths`` a chosen path that does not load or run
    is an error row and the other paths are still measured (``chosen_error``: the error). Each
    measured row is kept for the ISA note at later loads (``tune.remember_verify``)."""
    from . import tune_cache as tuning

    kw = dict(load_kw or {})
    if device not in (None, "auto"):
        kw["strict"] = True
    failed: EdgeRuntimeError | None = None
    try:
        chosen, art, hw, info, probe = _verify_chosen(path, device, hardware, kw)
    except EdgeRuntimeError as exc:
        if not all_paths:
            raise
        failed = exc
        chosen, art, hw, info, probe = _chosen_failed(path, device, hardware, exc)
    seal = art.manifest.get("manifest_sha256")
    rows = [chosen]
    if all_paths:
        for cand in candidate_paths(art, hw):
            if "error" not in chosen and (cand["target"], cand["backend"]) == (chosen["target"], chosen["backend"]) \
                    and same_options(cand["device_options"], chosen["device_options"]):
                continue
            row = _verify_one(path, cand, hw, probe, kw)
            if not any(_same_row(r, row) for r in rows):
                rows.append(row)    # a hint resolving to a path already run (the recorded precision): not repeated
    for row in rows:
        if "error" not in row:
            tuning.remember_verify(seal, hw, row)
        row["verdict"] = verdict(row)
    # "passed" is the chosen row's: null where it has no verdict (no budget recorded, or not judged),
    # never true for a figure that was held to nothing
    out = {"artifact": info["artifact"], "model": info["model"], "version": info["version"], "seal": seal,
           "probe_samples": len(probe.inputs), "built_on": (info.get("isa") or {}).get("built_on"),
           "here": host.cpu_int8_class(hw), "rows": rows, "chosen": chosen,
           "passed": chosen["passed"], "verdict": chosen["verdict"]}
    if failed is not None:
        out["chosen_error"] = {**failed.to_dict(), "exit_code": failed.exit_code}
    return out


VERDICTS = ("pass", "under_budget", "no_budget", "not_judged", "failed")


def verdict(row: dict) -> str:
    """A verify row's verdict, one of ``VERDICTS``: ``failed`` (it did not load or run: ``error``),
    ``not_judged`` (a budget is recorded, but the probe set compares nothing: ``not_judged`` says
    why), ``no_budget`` (the artifact records no budget to hold the figure to), else ``pass`` or
    ``under_budget``. ``passed`` is null for the two without a verdict, and they differ: a row
    that is not judged has its budget."""
    if row.get("error"):
        return "failed"
    if row.get("not_judged"):
        return "not_judged"
    if row.get("passed") is None:
        return "no_budget"
    return "pass" if row["passed"] else "under_budget"


def _verify_chosen(path, device, hardware, kw):
    from .runtime import load

    rt = load(path, device=device, hardware=hardware, **kw)
    try:
        probe = read_probe(rt.artifact)
        chosen = verify_runtime(rt, probe)
        chosen.update(chosen=True, decided_by=rt.choice.decided_by)
        return chosen, rt.artifact, rt.hardware, rt.info(), probe
    finally:
        rt.close()


def _chosen_failed(path, device, hardware, exc: EdgeRuntimeError):
    """``verify --all`` when the chosen path does not load or run: an error row in its place (the
    error is raised by the CLI once the other rows are shown); the artifact, the hardware and
    the probe set read without a runtime."""
    from pathlib import Path

    from . import hardware as hw_probe
    from .artifact import load_artifact

    art = load_artifact(path, verify=False)
    hw = hardware if hardware is not None else hw_probe.detect_cached()
    probe = read_probe(art)         # each probe file read once: the bytes hashed are the bytes parsed
    chosen = {**_static_choice(art, hw, device), "device_options": {}, "fallback": None, "chosen": True,
              "error": exc.to_dict(), "passed": False}
    if device not in (None, "auto"):
        chosen["device"] = device           # the device asked for failed, not the one a fallback would take
    built = ((art.manifest.get("build") or {}).get("host_info") or {})
    info = {"artifact": str(Path(art.root).resolve()), "model": art.manifest.name,
            "version": art.manifest["model"]["version"], "isa": {"built_on": built.get("int8_class")}}
    return chosen, art, hw, info, probe


def _static_choice(art, hw, device) -> dict:
    """The path the policy picks for a row whose runtime never loaded (``?`` when none can)."""
    from .selection import choose

    try:        # strict for a named device: a fallback's path (one that runs) named as the one that failed
        c = choose(art.manifest["variants"], hw, device=device, strict=device not in (None, "auto"))
    except EdgeRuntimeError:
        return {"target": "?", "backend": "?", "device": device, "decided_by": "policy"}
    return {"target": c.variant["target"], "backend": c.backend_name, "device": c.suitability.device,
            "decided_by": c.decided_by}


def _same_row(a: dict, b: dict) -> bool:
    """One path (and, for error rows, one error) already in the table."""
    if (a["target"], a["backend"]) != (b["target"], b["backend"]) or \
            not same_options(a.get("device_options") or {}, b.get("device_options") or {}):
        return False
    if "error" in a or "error" in b:
        return ("error" in a) == ("error" in b) and a.get("error", {}).get("code") == b.get("error", {}).get("code")
    return True


def same_options(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if v not in (None, "auto")} == {k: v for k, v in b.items()
                                                                       if v not in (None, "auto")}


def _verify_one(path, cand: dict, hw, probe: ProbeSet, kw: dict) -> dict:
    from .runtime import load

    base = {"target": cand["target"], "backend": cand["backend"], "device_options": cand["device_options"],
            "fallback": None, "chosen": False}
    try:
        rest = {k: v for k, v in kw.items() if k not in ("device_options", "strict")}
        rt = load(path, device=cand["backend"], target=cand["target"], strict=True, hardware=hw,
                  device_options=cand["device_options"] or None, **rest)
    except EdgeRuntimeError as exc:
        return {**base, "error": exc.to_dict(), "passed": False}
    try:
        return {**verify_runtime(rt, probe), "chosen": False}
    except EdgeRuntimeError as exc:
        return {**base, "device": rt.device, "error": exc.to_dict(), "passed": False}
    finally:
        rt.close()
