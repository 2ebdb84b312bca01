"""``edge-infer inspect``: an artifact's manifest summary, verification result and parity."""

from __future__ import annotations

import click

from .cli_common import _guard, emit


def _r4(x):
    return round(x, 4) if isinstance(x, float) else x


def _parity_text(p: dict) -> str:
    value = p.get("value")
    if value is None and p.get("not_judged"):      # measured, but it compared nothing (a detector's F1 over no box)
        return f"parity {p.get('metric')} not judged ({p['not_judged']})"
    if value is None or p.get("metric") in (None, "none", "not_measured"):
        why = p.get("not_measured") or p.get("note") or p.get("reason") or "no parity value recorded"
        return f"parity not measured ({why})"
    parts = [f"min {_r4(p['min'])}" if p.get("min") is not None else None,
             f"{p['samples']} samples" if p.get("samples") else None,
             f"budget {_r4(p['budget'])}" if p.get("budget") is not None else None]
    extra = [x for x in parts if x]
    on = p.get("measured_on")   # a stand-in (Core ML's fake-quantized torch model, the Edge TPU compiler's input)
    if isinstance(on, str) and not on.startswith("the "):
        on = f"the {on}"
    return (f"parity {p['metric']} {_r4(value)}" + (f" ({', '.join(extra)})" if extra else "")
            + (f", measured on {on}; not on the target" if on else ""))


def _tensor_text(t: dict) -> str:
    return f"{t['name']} {t['dtype']}{list(t['shape'])}"


def _pre_text(pre: dict) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.6g}"
        if isinstance(v, list):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        return str(v)

    return ", ".join(f"{k}={fmt(v)}" for k, v in pre.items()) or "none"


def _edgetpu_lines(rep: dict, target: str = "edgetpu") -> list[str]:
    # an uncompiled model's report is a static check of what the compiler could map: as it is,
    # this variant runs on the CPU (its target's backend), none of it on an Edge TPU
    compiled = rep.get("edgetpu_compiled")
    lines = [f"edge tpu: {rep.get('tpu_ops', '?')} op(s) on the Edge TPU, {rep.get('cpu_ops', '?')} on the CPU"
             + (" (compiled)" if compiled else
                f" once compiled (static check: this {target} model is not compiled for the Edge TPU and "
                "runs none of its ops there as it is)")]
    f = rep.get("first_unsupported")
    lines.append("first unsupported: " + (f"#{f.get('index')} {f.get('op')}: {f.get('reason')}" if f else "none"))
    split = rep.get("split") or {}
    if split:
        lines.append("split (tpu/cpu): " + ", ".join(f"{k} {c.get('tpu', 0)}/{c.get('cpu', 0)}"
                                                     for k, c in split.items()))
    if rep.get("verdict"):
        lines.append(f"verdict: {rep['verdict']}")
    return lines


@click.command()
@click.argument("artifact", type=click.Path())
@click.option("--json", "as_json", is_flag=True)
@_guard
def inspect(artifact, as_json):
    """Manifest summary, verification result and parity.

    Shows each variant's buckets and input shapes, quantization, parity (or why it
    was not measured) and, for TFLite variants, the Edge TPU split; the labels and
    the pre-processing.

    \b
    Examples:
      edge-infer inspect out/digits-int8
      edge-infer inspect out/coral-mnv2 --json
    """
    from .artifact import load_artifact
    from .selection import check_targets

    art = load_artifact(artifact)
    check_targets(art.targets())
    man = art.manifest
    _check_as_loaded(art)
    labels = None
    if man["postprocess"].get("labels"):
        names = [x.strip() for x in art.read_text(man["postprocess"]["labels"]).splitlines() if x.strip()]
        labels = {"file": man["postprocess"]["labels"], "count": len(names), "first": names[:5]}
    data = {"verified": art.verified, "files": len(man["files"]), "model": man["model"], "task": man["task"],
            "variants": [{"target": v["target"], "buckets": [b["name"] for b in v["buckets"]],
                          "inputs": {b["name"]: [{k: t[k] for k in ("name", "dtype", "shape")} for t in b["inputs"]]
                                     for b in v["buckets"]},
                          "quantization": v["quantization"], "parity": v["parity"], "toolchain": v["toolchain"],
                          **({"edgetpu_report": v["edgetpu_report"]} if v.get("edgetpu_report") else {})}
                         for v in man["variants"]],
            "labels": labels, "preprocess": man["preprocess"], "postprocess": man["postprocess"],
            "limits": man["limits"], "probe": man.get("probe")}

    def human(d):
        m = d["model"]
        click.echo(f"{m['name']} v{m['version']} ({d['task']}): {d['files']} files, all sha256 verified")
        click.echo(f"  preprocess: {_pre_text(d['preprocess'])}")
        if d["labels"]:
            lb = d["labels"]
            first = ", ".join(repr(x) for x in lb["first"])
            click.echo(f"  labels: {lb['count']} ({first}{', ...' if lb['count'] > len(lb['first']) else ''})")
        for v in d["variants"]:
            q = v["quantization"]
            click.echo(f"  {v['target']}: buckets {', '.join(v['buckets'])}; {q['scheme']} w:{q['weights']} "
                       f"a:{q['activations']}; {_parity_text(v['parity'])}")
            for bucket, ins in v["inputs"].items():
                click.echo(f"    {bucket} inputs: {', '.join(_tensor_text(t) for t in ins)}")
            for line in _edgetpu_lines(v["edgetpu_report"], v["target"]) if v.get("edgetpu_report") else ():
                click.echo(f"    {line}")
        click.echo(f"  {_probe_text(d['probe'], imported=bool((m.get('source') or {}).get('imported')))}")

    emit(data, as_json, human)


def _check_as_loaded(art) -> None:
    """What a load checks past the manifest, without a device: the limits as the runtime merges them
    and each variant's task as it is built (its labels against the model's classes, its tokenizer).
    inspect said "all sha256 verified", exit 0, of an artifact every load refuses."""
    from edge_runtime.models import get_task

    from .limits import DEFAULT_LIMITS

    man = art.manifest
    task = get_task(man["task"])
    DEFAULT_LIMITS.merged(task.default_limits, source="manifest").merged(man["limits"], source="manifest")
    for variant in man["variants"]:
        task(man, art.read_bytes, variant["buckets"])


def _probe_text(probe: dict | None, imported: bool = False) -> str:
    """The probe set in a line: its size, probes per bucket, joined ones, buckets it cannot verify."""
    if not probe and imported:
        return ("probe set: none (an imported model has no fp32 source to keep reference results from: "
                "edge-infer verify cannot check it on any machine; convert its float source with "
                "`edge-infer convert` for one)")
    if not probe:
        return "probe set: none (edge-infer verify cannot check this artifact here; re-convert it)"
    per = probe.get("buckets")
    joined = probe.get("joined") or {}
    text = f"probe set: {probe['samples']} samples, {probe.get('bytes', '?')} bytes"
    if per:
        text += "; per bucket " + ", ".join(f"{n} {k}" + (f" ({joined[n]} joined)" if n in joined else "")
                                            for n, k in per.items())
    else:
        text += " (built before per-bucket coverage: verify says which buckets it reached)"
    if probe.get("unreached_buckets"):
        text += f"; no probe reaches {', '.join(probe['unreached_buckets'])}"
    return text
