"""``edge-infer devices`` and ``edge-infer doctor``.

- ``devices [--json] [--artifact DIR] [--device D]``: the hardware found, the
  backend packages present, every backend's score per target and, for an
  artifact, the full candidate table: which variant and device would be
  chosen and why (nothing is loaded or run); without an artifact, ``--device``
  places that device for each target of its backend.
- ``doctor [--json]``: for the hardware found, what is missing and the exact
  install step (printed, never run). ``devices`` exits 4 when the artifact could not
  run with the device asked for. ``doctor`` exits 1 when something is missing (an accelerator
  or a backend here unused for want of something installable), else 0 (warnings alone: 0).
"""

from __future__ import annotations

import json
import sys

import click

from . import hardware as hw_probe
from .cli_common import _guard, device_flags
from .errors import DeviceError, EdgeRuntimeError


def hardware_lines(hw: dict) -> list[str]:
    cpu = hw["cpu"]
    lines = [f"system: {hw['system']} {hw['machine']}" + (" (Apple Silicon)" if hw.get("apple_silicon") else ""),
             f"cpu: {cpu['model'] or '?'} ({cpu['vendor'] or '?'}), {cpu['cores']} cores; int8-relevant features: "
             f"{', '.join(cpu['features']) or 'none'}; int8 dot product (VNNI/AMX/dotprod): "
             f"{'yes' if cpu['int8_dot'] else 'no'}"]
    if cpu.get("usable_limited_by"):          # a container's quota or an affinity mask: what this process gets
        why = cpu["usable_limited_by"]        # a list (affinity, quotas): printed as Python's list repr before
        why = "; ".join(map(str, why)) if isinstance(why, (list, tuple)) else str(why)
        lines.append(f"cpu usable by this process: {cpu.get('usable')} of {cpu['cores']} ({why})")
    if cpu.get("features_not_on_every_core"):
        lines.append(f"cpu features on some cores only (not counted): {', '.join(cpu['features_not_on_every_core'])}")
    for name, why in (hw.get("probe_errors") or {}).items() if isinstance(hw.get("probe_errors"), dict) else ():
        lines.append(f"probe failed: {name}: {why}")
    if hw.get("apple"):
        lines.append(f"apple: {hw['apple']['chip'] or '?'}" + (" (this Python runs under Rosetta)"
                                                              if hw["apple"]["rosetta"] else ""))
    if hw.get("board"):
        lines.append(f"board: {hw['board']['model']} ({hw['board']['kind']})")
    j = hw.get("jetson")
    if j:
        lines.append(f"jetson: {j['model']}, L4T {j['l4t'] or '?'} (JetPack {j['jetpack'] or '?'}), SoC "
                     f"{j['soc'] or '?'}; onnxruntime: {j['onnxruntime'] or 'not installed'}"
                     f"{' with CUDA/TensorRT' if j['onnxruntime_gpu'] else ' (CPU only: the GPU is unused)'}")
    nv = hw.get("nvidia")
    if nv and not nv["integrated"]:
        lines.append(f"nvidia: {', '.join(nv['gpus']) or ', '.join(nv['device_nodes'])}; driver {nv['driver'] or '?'}")
    tpus = hw.get("edgetpus") or []
    coral = hw.get("coral") or {}
    usb = {d["path"]: d for d in coral.get("usb") or []}
    desc = []
    for t in tpus:
        d = usb.get(t["path"], {})
        extra = [x for x in (d.get("state"), f"{d['speed_mbps']} Mb/s" if d.get("speed_mbps") else None) if x]
        desc.append(f"{t['type']} {t.get('id', '')} {t['path']}".replace("  ", " ") + (f" ({', '.join(extra)})"
                                                                                       if extra else ""))
    desc += [f"pci {a} (no driver: no /dev/apex_N)" for a in coral.get("pcie_without_driver") or []]
    lines.append(f"edge tpus: {'; '.join(desc) or 'none'}")
    ort = hw.get("onnxruntime")
    pk = hw["packages"]
    lines.append("packages: " + ", ".join(
        (f"onnxruntime ({ort['distribution']} {ort['version']}: {', '.join(ort['providers'])})"
         if name == "onnxruntime" and ort else name) for name, ok in pk.items() if ok)
        + "; absent: " + (", ".join(name for name, ok in pk.items() if not ok) or "none"))
    libs = hw.get("libraries") or {}
    lines.append("vendor libraries: " + ", ".join(f"{k} {v or 'absent'}" for k, v in libs.items()))
    return lines


def backend_scores(hw: dict) -> dict:
    """Per backend: its targets, its facts per target placed by the policy (score, tier,
    device, reason, policy row) and its declared options."""
    from .devices import registry
    from .selection import place

    out = {}
    for name in registry.available_backends():
        try:
            b = registry.get_backend(name)
            out[name] = {"targets": list(b.targets), "family": b.family,
                         "suitability": {t: vars(place(b.family, b.suitability(t, hw), hw, t)) for t in b.targets},
                         "options": [o.describe() for o in b.options]}
        except EdgeRuntimeError as exc:
            out[name] = {"error": exc.message}
    return out


def forced_device(hw: dict, device: str) -> dict:
    """Without an artifact: the device asked for, placed for each target of its backend (device_unknown
    when it is no device at all). Before, ``devices --device X`` ignored X and exited 0."""
    from .devices import registry
    from .selection import known_device, place

    name, sub = known_device(device)
    if name is None:        # "auto" is no one device: the backends' table above places every one
        return {"device": device, "backend": None, "suitability": {}, "runs": True}
    b = registry.get_backend(name)
    rows = {t: vars(place(b.family, b.suitability(t, hw, sub), hw, t)) for t in b.targets}
    return {"device": device, "backend": name, "suitability": rows, "runs": any(r["score"] for r in rows.values())}


def artifact_choice(path, hw: dict, device: str = "auto", strict: bool = False) -> dict:
    """Which variant and device ``load(path, device)`` would pick here, and the full candidate table."""
    from .artifact import load_artifact
    from .selection import choose, rank, table

    art = load_artifact(path)       # hashed as load() would: a corrupt artifact is no choice (exit 3)
    out = {"path": str(path), "model": art.name, "version": art.version, "targets": art.targets(),
           "device": device, "strict": strict, "chosen": None, "fallback": None, "error": None}
    from . import tune_cache as tune

    rows = rank(art.variants, hw, device)
    entry = tune.lookup(art.manifest.get("manifest_sha256"), hw) if device in (None, "auto") else None
    try:
        c = choose(art.variants, hw, device=device, strict=strict, measured=tune.measured_choice(entry))
        static = choose(art.variants, hw, device=device, strict=strict) if entry else c
    except DeviceError as exc:
        out.update(error=exc.to_dict(), candidates=table(rows))
        return out
    out.update(chosen=_choice_row(c), fallback=c.fallback, candidates=c.candidates,
               static=_choice_row(static), measured=_measured(entry, c))
    return out


def _choice_row(c) -> dict:
    return {"target": c.variant["target"], "backend": c.backend_name, "device": c.suitability.device,
            "score": c.suitability.score, "tier": c.suitability.tier, "reason": c.suitability.reason,
            "policy": c.suitability.policy, "decided_by": c.decided_by, "measured": c.measured}


def _measured(entry: dict | None, c) -> dict | None:
    """The cached tune decision and its figures (None: never tuned here)."""
    from .measured_here import tuned_summary

    return tuned_summary(entry, c)


def _print_devices(d: dict) -> None:
    for line in hardware_lines(d["hardware"]):
        click.echo(line)
    click.echo("backends (policy score per target, edge_runtime/selection.py; 0 = cannot run here):")
    for name, b in d["backends"].items():
        if "error" in b:
            click.echo(f"  {name}: {b['error']}")
        for t, s in b.get("suitability", {}).items():
            click.echo(f"  {name:<14} {t:<12} {s['score']:>3}  {s['device']}: {s['reason']}")
    f = d.get("device")
    if f:
        click.echo(f"device {f['device']}: " + ("can run here" if f["runs"] else "cannot run here"))
        for t, s in f["suitability"].items():
            click.echo(f"  {t:<12} {s['score']:>3}  {s['device']}: {s['reason']}")
    a = d.get("artifact")
    if a:
        click.echo(f"artifact {a['path']} ({a['model']} v{a['version']}; variants {', '.join(a['targets'])}), "
                   f"device {a['device']}{' (strict)' if a['strict'] else ''}:")
        if a["chosen"]:
            c = a["chosen"]
            click.echo(f"  would run: {c['target']} on {c['device']} (score {c['score']}, {c['decided_by']}): "
                       f"{c['reason']}" + (f"; policy: {c['policy']}" if c.get("policy") else ""))
        else:
            click.echo(f"  would fail: [{a['error']['code']}] {a['error']['message']}")
        if a.get("measured"):
            m, st = a["measured"], a["static"]
            why = a["chosen"]["measured"] or ("the measured path cannot run here now: the static policy decides"
                                              if m.get("decision") else
                                              "no candidate met the parity budget here: the static policy decides")
            click.echo(f"  static policy would run: {st['target']} on {st['device']}; measured here "
                       f"({m['created']}): {why}")
            for r in m["measured"]:
                click.echo("    " + tune_row_text(r))
        elif a["chosen"] and a["device"] in (None, "auto"):
            click.echo("  not tuned here (edge-infer tune ARTIFACT measures every candidate on its probe set)")
        if a["fallback"]:
            click.echo(f"  fallback: {a['fallback']}")
        click.echo("  candidates:")
        for r in sorted(a["candidates"], key=lambda r: -r["score"]):
            mark = "*" if r["chosen"] else ("!" if r["forced"] else " ")
            # README: "the whole table ... with every score, tier, reason and policy row" (tier and row were --json only)
            click.echo(f"  {mark} {r['target']:<12} {r['backend']:<14} {r['score']:>3}  {r['tier'] or '-':<11} "
                       f"{r['device']}: {r['reason']}" + (f" [policy: {r['policy']}]" if r.get("policy") else ""))


@click.command()
@click.option("--artifact", type=click.Path(), help="Also show which variant and device this artifact would use, and why.")
@device_flags(options=False)
@click.option("--json", "as_json", is_flag=True)
@_guard
def devices(artifact, device, require_device, as_json):
    """Hardware found, backend packages present, and (with --artifact) the device choice and why.

    Nothing is loaded or run; the artifact's files are checked (sha256) as load would check them.
    Exit 4 when the artifact could not run on the device asked for, 3 when it is corrupt. Without
    --artifact, --device places that device for each target of its backend (exit 4 for a name that is
    no device, and with --require-device when it runs none here).

    \b
    Examples:
      edge-infer devices
      edge-infer devices --artifact out/digits-int8 --device onnxruntime:cuda --require-device
      edge-infer devices --json
    """
    hw = hw_probe.detect()
    data = {"hardware": hw, "backends": backend_scores(hw)}
    if artifact:
        data["artifact"] = artifact_choice(artifact, hw, device, require_device)
    elif device != "auto":
        data["device"] = forced_device(hw, device)
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        _print_devices(data)
    if (artifact and data["artifact"]["error"]) or \
            (require_device and "device" in data and not data["device"]["runs"]):    # as `infer` would: exit 4
        sys.stdout.flush()
        click.get_current_context().exit(DeviceError.exit_code)


def _print_doctor(hw: dict, rep: dict) -> None:
    for line in hardware_lines(hw):
        click.echo(line)
    if not rep["findings"]:
        click.echo("doctor: nothing missing for the hardware found")
    for f in rep["findings"]:
        click.echo(f"\n{f['level'].upper()}: {f['found']}: {f['problem']}")
        if f["fix"]:
            click.echo("  install (not run; copy and run it yourself):")
            for line in f["fix"].splitlines():
                click.echo(f"    {line}")
        if f["docs"]:
            click.echo(f"  docs: {f['docs']}")


@click.command()
@click.option("--json", "as_json", is_flag=True)
@_guard
def doctor(as_json):
    """What is missing for the hardware found, with the exact install step (printed, never run).

    Exit 1 when something is missing (an accelerator or a backend here unused for want of something
    installable: onnxruntime, openvino on Intel, a TFLite interpreter...), else 0; warnings alone exit 0.

    \b
    Examples:
      edge-infer doctor
      edge-infer doctor --json
    """
    from .doctor import diagnose

    hw = hw_probe.detect()
    rep = diagnose(hw)
    if as_json:
        click.echo(json.dumps({"hardware": hw, **rep}, indent=2, default=str))
    else:
        _print_doctor(hw, rep)
    sys.stdout.flush()
    if not rep["ok"]:
        click.get_current_context().exit(1)


def tune_row_text(r: dict) -> str:
    """One measured candidate in a line: path, parity against budget, latency, throughput."""
    opts = "".join(f" {k}={v}" for k, v in (r.get("device_options") or {}).items())
    head = f"{r['target']:<12} {r['backend']:<12}{opts}"
    if r.get("error"):
        code = r["error"] if isinstance(r["error"], str) else r["error"].get("code")
        return f"{head} failed [{code}]"
    verdict = ("not judged" if r.get("not_judged") else "no budget" if r.get("passed") is None
               else "pass" if r["passed"] else "UNDER")        # not judged: it has a budget, nothing compared
    if r.get("p_value") is not None:     # a share of a few probes: judged by its sampling error
        from .verify import share_text

        verdict += (f": {share_text(r)}, p={r['p_value']:.3f} at the budget"
                    + (" (within sampling error)" if r.get("passed") else ""))
    par = (f"{r.get('metric')} {r['value']:.4f} (budget {r.get('budget')}, {verdict})"
           if r.get("value") is not None else "parity ?")
    lat = f"{r['latency_ms_median']:.2f} ms/call" if r.get("latency_ms_median") is not None else ""
    thr = f", {r['batch_items_per_s']:.1f} items/s batched" if r.get("batch_items_per_s") else ""
    missed = r.get("unverified_buckets")
    gap = f"; no probe reached bucket {', '.join(missed)}: not verified" if missed else ""
    return f"{head} {par}  {lat}{thr}{gap}"
