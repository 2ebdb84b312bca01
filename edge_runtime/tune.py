"""Measured device choice: every candidate path that can run here, measured on the
artifact's probe set (parity, per-call latency, batch throughput), the fastest
one within the parity budget kept, and the decision cached.

The cache (``tune_cache``) lives in the user cache dir (``$EDGE_RUNTIME_CACHE_DIR``, else
``$XDG_CACHE_HOME/edge-runtime``, else ``~/.cache/edge-runtime``), one JSON
file per key under ``tune/``. The key is the artifact's seal, this machine's
hardware fingerprint and the installed backend versions: another artifact,
another machine or an upgraded backend never reuses a decision. A lookup is
one small file read. Without an entry, ``device="auto"`` keeps the static
policy (``selection.POLICY``).

Latency is measured in alternating rounds (every candidate once per round, the
order rotated each round), each round the whole probe set; a candidate's
figure is its median per-call latency over all rounds, so a noisy moment hits
every candidate alike.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from . import host
from .errors import ArtifactError, EdgeRuntimeError
# the cache itself (lookup, store, the verify records) lives in tune_cache; its names stay importable here
from .tune_cache import (PURPOSES, _opts, cache_key, cache_root, lookup, lookup_verify, measured_choice,
                         options_refused, remember_verify, rows_text, store, verify_key)

__all__ = ["PURPOSES", "cache_key", "cache_root", "lookup", "lookup_verify", "measured_choice", "options_refused",
           "remember_verify", "rows_text", "store", "tune", "verify_key"]


# -- the measurement -------------------------------------------------------------
def tune(path, *, hardware=None, rounds: int = 3, batch: bool = True, progress=lambda msg: None,
         save: bool = True, load_kw: dict | None = None) -> dict:
    """Measure every candidate here; the entry (decision per purpose and every row), cached."""
    # imported here: every load() of device="auto" reads this module for its cache lookup, and a
    # process that only looks up should not import the probe reader and verify (zipfile, ~5 ms)
    from . import hardware as hw_probe
    from .artifact import load_artifact
    from .runtime import load
    from .selection import choose
    from .verify import candidate_paths, read_probe, same_options, verify_runtime

    t0 = time.perf_counter()
    kw = dict(load_kw or {})
    kw.pop("device_options", None)
    hw = hardware if hardware is not None else hw_probe.detect_cached()
    # the static policy's choice as the policy makes it (as ``devices --artifact`` does), never a
    # load(device="auto"): that applies a cached decision, and a second tune would record the first
    # one's measured path as "the static policy"
    c = choose(load_artifact(path, verify=False).variants, hw, device="auto")
    static = {"target": c.variant["target"], "backend": c.backend_name}
    # the artifact checked (every file hashed) and the static path loaded once, as a load would: a
    # tune never depends on the cached path it may be about to replace
    first = load(path, device=c.backend_name, target=c.variant["target"], hardware=hw, tune=False, **kw)
    art, hw = first.artifact, first.hardware
    seal = art.manifest.get("manifest_sha256")
    first.close()
    probe = read_probe(art)        # the bytes hashed are the bytes parsed (the load's hash came before)
    cands = candidate_paths(art, hw)
    progress(f"tune: up to {len(cands)} candidate path(s) (a hint resolving to a path already measured "
             f"runs once), {len(probe.inputs)} probe samples, {rounds} rounds")
    rows: list[dict] = []
    live: list[tuple[dict, Any, list[float]]] = []
    for cand in cands:
        row = {**cand}
        try:
            rt = load(path, device=cand["backend"], target=cand["target"], strict=True, hardware=hw,
                      device_options=cand["device_options"] or None, tune=False, **kw)
        except EdgeRuntimeError as exc:
            row.update(error=exc.to_dict(), passed=False)
            rows.append(row)
            continue
        row["device"] = rt.device
        if any((r["target"], r["backend"]) == (cand["target"], cand["backend"])
               and same_options(dict(r_rt.device_options), dict(rt.device_options)) for r, r_rt, _ in live):
            rt.close()      # the hint resolved to a path already measured (the recorded precision)
            continue
        try:
            row.update(verify_runtime(rt, probe))      # parity (and a first latency figure)
        except ArtifactError:       # the probe set's fault (a sample its task refuses), not this candidate's
            for _, other, _ in [*live, (row, rt, [])]:
                other.close()
            raise
        except EdgeRuntimeError as exc:
            row.update(error=exc.to_dict(), passed=False)
            rt.close()
            rows.append(row)
            continue
        rows.append(row)
        live.append((row, rt, []))
    try:
        out: set[int] = set()      # candidates whose timing call failed: out of the measurement, said in their row
        for r in range(rounds):
            order = live[r % len(live):] + live[:r % len(live)] if live else []
            for row, rt, lat in order:
                if id(row) in out:
                    continue
                try:
                    for raw in probe.inputs:
                        t = time.perf_counter()
                        rt.infer(raw)
                        lat.append((time.perf_counter() - t) * 1000)
                except EdgeRuntimeError as exc:
                    # one candidate's failure (a device fault, a timeout) ended the whole tune: now that
                    # candidate is out, with its error, and the others are measured
                    row.update(error=exc.to_dict(), passed=False)
                    out.add(id(row))
        for row, rt, lat in live:
            if id(row) in out:
                continue
            row["latency_ms_median"] = round(float(np.median(lat)), 3)
            row["latency_ms_p90"] = round(float(np.percentile(lat, 90)), 3)
            row["calls"] = len(lat)
            if batch and len(probe.inputs) > 1:
                try:
                    row["batch_items_per_s"] = _throughput(rt, probe.inputs)
                except EdgeRuntimeError as exc:     # its latency stands; no throughput figure to choose it by
                    row["batch_error"] = exc.to_dict()
    finally:
        for _, rt, _ in live:
            rt.close()
    decision = {}
    for purpose in PURPOSES:
        best = _best(rows, purpose)
        if best is not None:
            decision[purpose] = {"target": best["target"], "backend": best["backend"],
                                 "device_options": best["device_options"], "why": _why(best, rows, purpose)}
    if not decision:
        progress("tune: NO candidate met the parity budget here: device auto keeps the static policy "
                 f"({rows_text({'rows': rows})})")
    entry = {"artifact": str(Path(path).resolve()), "model": art.name, "version": art.version, "seal": seal,
             "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "here": host.host_record(hw),
             "static": static, "decision": decision, "rows": rows, "rounds": rounds,
             "probe_samples": len(probe.inputs), "seconds": round(time.perf_counter() - t0, 1)}
    if save and not seal:       # no seal, no key: said, never a save that silently did not happen
        entry["cache_error"] = "the artifact's manifest carries no seal (the cache key)"
    elif save:
        try:
            entry["cache_file"] = str(store(seal, hw, entry))
        except OSError as exc:      # a read-only cache dir: the decision is returned, not kept (the CLI exits 4)
            entry["cache_error"] = f"{type(exc).__name__}: {exc}"
    return entry


def _throughput(rt, inputs: list) -> float:
    """Items per second of one ``infer_batch`` over the probe inputs; an item that failed is this path's
    failure (``infer_batch`` returns errors in place: counted as items, a path failing every one was the
    fastest), raised."""
    rt.warm_batch()
    t = time.perf_counter()
    results = rt.infer_batch(list(inputs))
    elapsed = time.perf_counter() - t
    failed = next((r for r in results if isinstance(r, BaseException)), None)
    if failed is not None:
        raise failed
    return round(len(inputs) / elapsed, 2)


def _best(rows: list[dict], purpose: str) -> dict | None:
    """The fastest (or highest-throughput) row that meets the budget; where no row has a budget to meet
    (an artifact without one), the fastest of those. A row whose probes compared nothing against a
    recorded budget (``not_judged``: a detector with no box either side) has unknown parity here and
    is never chosen (it was, with a reason saying "within the parity budget")."""
    ok = [r for r in rows if r.get("passed") is not False and "error" not in r and not r.get("not_judged")]
    if any(r.get("passed") is True for r in ok):
        ok = [r for r in ok if r.get("passed") is True]
    if purpose == "latency":
        ok = [r for r in ok if "latency_ms_median" in r]
        return min(ok, key=lambda r: r["latency_ms_median"], default=None)
    ok = [r for r in ok if "batch_items_per_s" in r]
    return max(ok, key=lambda r: r["batch_items_per_s"], default=None)


def _why(best: dict, rows: list[dict], purpose: str) -> str:
    field, unit = ("latency_ms_median", "ms") if purpose == "latency" else ("batch_items_per_s", "items/s")
    shown = "; ".join(f"{r['target']} on {r['backend']}{_opts(r)}: "
                      + (f"failed ({_code(r['error'])})" if "error" in r else     # first: a row timed, then failed
                         f"{r[field]} {unit}, {r.get('metric', 'parity')} {r['value']:.4f}"
                         + (", under budget" if r.get("passed") is False else
                            ", not judged (its probes compared nothing)" if r.get("not_judged") else "")
                         if field in r and r.get("value") is not None else
                         "not judged (its probes compared nothing)" if r.get("not_judged") else
                         f"under budget ({r.get('value')})")
                      for r in rows)
    within = "within the parity budget" if best.get("passed") is True else "with no parity budget recorded to meet"
    return f"measured here, the {'fastest' if purpose == 'latency' else 'highest throughput'} {within} " \
           f"(every candidate: {shown})"


def _code(error) -> str:
    """A row's error code (a dict from ``to_dict()``, or a code string in an older cache entry)."""
    return str(error.get("code")) if isinstance(error, dict) else str(error)
