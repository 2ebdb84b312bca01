"""``edge-infer verify`` and ``edge-infer tune``: the artifact measured on this machine.

- ``verify ARTIFACT [--device D] [--all] [--json]``: the probe set through the
  path ``load`` picks here (with ``--all`` every variant × backend × precision
  hint that can run here), each one's parity beside the recorded figure and the
  budget, and its latency. Exit 7 when the chosen path is under budget (the
  table is printed first; stderr gets the one ``error [code]`` line).
- ``tune ARTIFACT [--rounds N] [--json]``: every candidate measured (parity,
  per-call latency in alternating rounds, batch throughput); the fastest
  within budget is cached for ``device="auto"`` on this machine. A decision
  that could not be cached (a read-only cache dir) is exit 4 ``tune_not_cached``
  after the table (``--json``: the whole entry, ``cache_error`` and ``error``
  in it), unless ``--no-save`` asked for no entry.
"""

from __future__ import annotations

import json
import math
import sys

import click

from .cli_common import _guard, device_flags, device_options, emit, error_dict, one_line
from .cli_devices import tune_row_text


@click.command()
@click.argument("artifact", type=click.Path())
@device_flags()
@click.option("--all", "all_paths", is_flag=True,
              help="Also run every other variant x backend x precision hint that can run here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_guard
def verify(artifact, device, require_device, device_option, all_paths, as_json):
    """Run the artifact's probe set here and compare with the fp32 results it keeps.

    Exit 7 when the path chosen here measures parity under the artifact's budget. A device
    named with --device is verified there or not at all (exit 4, never a fallback).

    \b
    Examples:
      edge-infer verify out/minilm
      edge-infer verify out/minilm --all --json
    """
    from .verify import refuse, verify_artifact

    rep = verify_artifact(artifact, device=device, all_paths=all_paths,
                          load_kw={"strict": require_device, "device_options": device_options(device_option) or None})
    code = line = None
    if rep.get("chosen_error"):         # --all: the chosen path did not load or run; the others are shown
        e = rep["chosen_error"]
        code, line = e["exit_code"], f"error [{e['code']}]: {one_line(e['message'])}"
        rep["error"] = {k: e.get(k) for k in ("type", "code", "message", "details")}
    elif rep["chosen"]["passed"] is False:
        err = refuse(rep["chosen"])
        code, line = err.exit_code, f"error [{err.code}]: {one_line(err.message)}"
        rep["error"] = error_dict(err)
    # under --json the one document on stdout carries the failure too ("error", as every command's
    # --json names one): a script reading stdout alone tells a pass from exit 7 without the status
    emit(json_safe(rep), as_json, _print_verify)
    if code is not None:
        click.echo(line, err=True)
        sys.exit(code)


def _print_verify(rep: dict) -> None:
    click.echo(f"verify {rep['artifact']} ({rep['model']} v{rep['version']}): {rep['probe_samples']} probe samples; "
               f"built on {rep['built_on'] or 'an unrecorded host'}, here {rep['here']}")
    for r in rep["rows"]:
        mark = "*" if r.get("chosen") else " "
        rec = f", recorded {r['recorded']:.4f}" if isinstance(r.get("recorded"), (int, float)) else ""
        click.echo(f"{mark} {tune_row_text(r)}{rec}" + (f"  on {r['device']}" if r.get("device") else ""))
        if r.get("fallback"):
            click.echo(f"    fallback: {r['fallback']} (measured on {r.get('device')})")
        if r.get("not_judged"):
            click.echo(f"    not judged: {r['not_judged']}")
    if rep.get("chosen_error"):
        click.echo(f"chosen path: failed [{rep['chosen_error']['code']}]")
        return
    verdict = _VERDICT_TEXT[rep["chosen"].get("verdict") or _verdict(rep["chosen"])]
    on = f" on {rep['chosen']['device']}, after a fallback" if rep["chosen"].get("fallback") else ""
    click.echo(f"chosen path ({rep['chosen']['decided_by']}): {verdict}{on}")


_VERDICT_TEXT = {"pass": "pass", "under_budget": "UNDER BUDGET", "no_budget": "no budget recorded",
                 "not_judged": "not judged (the probe set compares nothing)", "failed": "failed"}


def _verdict(row: dict) -> str:
    from .verify import verdict

    return verdict(row)


def json_safe(value):
    """The report with every non-finite float as null: ``--json`` is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


@click.command()
@click.argument("artifact", type=click.Path())
@click.option("--rounds", type=click.IntRange(1, 50), default=3, show_default=True,
              help="Alternating rounds over the probe set per candidate.")
@click.option("--no-batch", is_flag=True, help="Skip the batch-throughput measurement (for score).")
@click.option("--no-save", is_flag=True, help="Measure and print, but keep no cache entry.")
@click.option("--json", "as_json", is_flag=True, help="Print the tune entry as JSON.")
@_guard
def tune(artifact, rounds, no_batch, no_save, as_json):
    """Measure every path that can run the artifact here; cache the fastest within budget.

    Later loads with device auto on this machine (same artifact, same backend
    versions) use the cached decision; `edge-infer devices --artifact` shows it.
    A decision that cannot be cached (a read-only cache dir) exits 4 unless --no-save.

    \b
    Examples:
      edge-infer tune out/digits-int8
      edge-infer tune out/minilm --rounds 5 --no-batch --json
      edge-infer tune out/digits-int8 --no-save
    """
    from .tune import tune as run_tune

    progress = (lambda m: None) if as_json else (lambda m: click.echo(m, err=True))
    entry = run_tune(artifact, rounds=rounds, batch=not no_batch, save=not no_save, progress=progress)
    err = _no_decision(entry) if not entry["decision"] else None if no_save else _not_cached(entry)
    if err is not None:
        entry = {**entry, "error": error_dict(err)}     # as verify's: the JSON document names its failure
    emit(json_safe(entry), as_json, _print_tune)
    if err is not None:
        click.echo(f"error [{err.code}]: {one_line(err.message)}", err=True)
        sys.exit(err.exit_code)


def _no_decision(entry: dict):
    """Why tune kept nothing: a candidate measured under budget (exit 7), every path that ran judged
    nothing (its probes compared nothing: the probe set's fault, exit 3), or none ran (exit 4)."""
    from . import error_codes as ec
    from .errors import ArtifactError, DeviceError, ParityError
    from .tune_cache import rows_text

    text = rows_text(entry)
    ran = [r for r in entry["rows"] if not r.get("error")]
    if any(r.get("passed") is False for r in ran):
        return ParityError(f"no candidate path met the parity budget on the probe set here ({text}): device auto "
                           "keeps the static policy", code=ec.PARITY_BELOW_BUDGET_HERE)
    if ran and all(r.get("not_judged") for r in ran):
        # before 2026-12-07: "no candidate path ran the probe set here", exit 4, of paths that had run
        return ArtifactError(f"every candidate path ran the probe set here, but its probes compared nothing the "
                             f"parity budget can judge ({text}): re-convert with probe samples the task can compare "
                             "(a detector's with objects in them); device auto keeps the static policy",
                             file="probe", code=ec.PROBE_INVALID)
    return DeviceError(f"no candidate path ran the probe set here ({text})", code=ec.DEVICE_LOAD_FAILED)


def _not_cached(entry: dict):
    """A decision measured but not kept (a read-only or full cache dir): the tune's purpose, later loads
    with device auto taking the measured path, is not met, so the run fails (exit 4, the operator's
    environment, as serve's port that cannot be bound); ``--no-save`` asks for no entry. None: cached."""
    from . import error_codes as ec
    from .errors import DeviceError
    from .tune_cache import cache_root

    if entry.get("cache_file"):
        return None
    why = entry.get("cache_error") or "no cache entry was written"
    return DeviceError(f"the tune decision was not cached ({why}): later loads with device auto on this machine "
                       f"keep the static policy; make {cache_root()} writable (or set $EDGE_RUNTIME_CACHE_DIR), "
                       "or pass --no-save to measure without keeping", code=ec.TUNE_NOT_CACHED,
                       cache_dir=str(cache_root()))


def _print_tune(e: dict) -> None:
    here = e["here"]
    click.echo(f"tune {e['artifact']} ({e['model']} v{e['version']}) on {here.get('cpu')} ({here['int8_class']}): "
               f"{e['probe_samples']} probe samples x {e['rounds']} rounds, {e['seconds']} s")
    for r in e["rows"]:
        click.echo("  " + tune_row_text(r))
    st = e["static"]
    click.echo(f"static policy: {st['target']} on {st['backend']}")
    for purpose, d in e["decision"].items():
        opts = f" {json.dumps(d['device_options'])}" if d["device_options"] else ""
        click.echo(f"measured ({purpose}): {d['target']} on {d['backend']}{opts}")
    if not e["decision"]:
        ran = [r for r in e["rows"] if not r.get("error")]
        why = ("no candidate's probes compared anything its budget can judge here" if ran and all(
            r.get("not_judged") for r in ran) else "no candidate met the parity budget here")
        click.echo(f"{why}: auto keeps the static policy")
    if e.get("cache_file"):
        click.echo(f"cached: {e['cache_file']}")
    elif e.get("cache_error"):
        click.echo(f"not cached: {e['cache_error']}")
