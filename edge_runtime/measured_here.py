"""What the runtime reports about measurements on this machine: the ISA note at load (where
the recorded parity came from against where this runs, and whether a verify ran here) and
the cached tune decision beside the static choice (``rt.info()["isa"]``, ``["tuned"]``)."""

from __future__ import annotations

import logging

from . import host
from . import tune_cache as tuning

log = logging.getLogger("edge_runtime")
_logged_isa: set[str] = set()


def tuned_summary(entry: dict | None, choice) -> dict | None:
    """The measured choice beside the static one, with the figures (``rt.info()["tuned"]``)."""
    if not entry:
        return None
    rows = entry.get("rows", [])
    return {"decided_by": choice.decided_by, "static": entry.get("static"), "decision": entry.get("decision"),
            "measured": [{k: r.get(k) for k in ("target", "backend", "device_options", "metric", "value", "budget",
                                                "passed", "not_judged", "latency_ms_median", "batch_items_per_s")
                          if k in r} | ({"error": _error_code(r["error"])} if r.get("error") else {}) for r in rows],
            "created": entry.get("created"), "cache_file": entry.get("cache_file")}


def _error_code(err) -> str | None:
    """A measured row's error code: tune writes the error's dict, and the cache check also takes a
    code string (before, ``info()`` failed with a TypeError on one)."""
    return err if isinstance(err, str) else err.get("code") if isinstance(err, dict) else None


def isa_note(manifest, hardware, device: str, target: str | None = None, device_options: dict | None = None) -> dict:
    """Where the recorded parity was measured against where this runs: the int8 class of the
    build host and of this device, and whether a verify of this path (device, variant, options)
    has been run here, and its verdict."""
    built = ((manifest.get("build") or {}).get("host_info") or {})
    here = host.int8_class(hardware, device)
    verified = tuning.lookup_verify(manifest.get("manifest_sha256"), hardware, device, target, device_options)
    note = {"built_on": built.get("int8_class"), "built_on_cpu": built.get("cpu"), "here": here,
            "verified_here": verified}
    if not built:
        note["note"] = "the artifact does not record its build host"
        note["same"] = None
        return note
    note["same"] = built.get("int8_class") == here
    if not note["same"]:
        text = (f"the recorded parity was measured on {built.get('int8_class')} ({built.get('cpu')}); "
                        f"this runs on {here}: " + ("verified here: " + _verified_text(verified) if verified else
                                                     "not verified here (edge-infer verify, or load(verify=True))"))
        note["note"] = text
        if text not in _logged_isa:
            _logged_isa.add(text)
            log.warning("%s", text)
    return note


_VERDICT = {True: "pass", False: "UNDER BUDGET", None: "no budget recorded"}


def _verified_text(v: dict) -> str:
    missed = v.get("unverified_buckets")
    verdict = "not judged" if v.get("not_judged") else _VERDICT.get(v.get("passed"), "no budget recorded")
    return (f"{v.get('metric')} {v.get('value')} against budget {v.get('budget')}: {verdict}, on {v.get('created')}"
            + (f" (no probe reached bucket {', '.join(missed)}: not verified)" if missed else ""))
