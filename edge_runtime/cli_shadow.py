"""``edge-infer diff`` and ``edge-infer shadow``: two inference versions side by side."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click

from .cli_common import _guard, emit
from .cli_score import error_json, exit_with


@click.command("diff")
@click.argument("a", type=click.Path())
@click.argument("b", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--no-timings", is_flag=True, help="Leave the build timings (never counted) out of the text report.")
@_guard
def diff_cmd(a, b, as_json, no_timings):
    """Every difference between artifacts A and B's sealed manifests, grouped as prediction
    side (weights, pre/post-processing, quantization, parity) and inference side (limits,
    variants, buckets, runtime options, toolchain, build host).

    Exit 0 when they are the same, 1 when they differ (build timings never count);
    3 when either artifact does not verify.

    \b
    Examples:
      edge-infer diff out/digits-int8 out/digits-int8-v2
      edge-infer diff out/minilm-a out/minilm-b --json | jq '.differences[] | select(.side=="prediction")'
    """
    from .diff import diff_artifacts, render_text

    report = diff_artifacts(a, b)
    emit(report, as_json, lambda r: click.echo(render_text(r, timings=not no_timings)))
    sys.exit(0 if report["same"] else 1)


def _side_meta(rt) -> dict:
    return {"model": rt.artifact.name, "version": rt.artifact.version, "target": rt.variant["target"],
            "device": rt.device, "manifest_sha256": rt.artifact.manifest.get("manifest_sha256"),
            "path": str(Path(rt.artifact.root).resolve())}


def host_cpu() -> str:
    """The CPU the latencies were measured on, in words (model, cores, int8 features)."""
    from .hardware import detect

    cpu = detect().get("cpu") or {}
    feats = [f for f in cpu.get("features") or () if f in ("avx2", "avx512_vnni", "avx_vnni", "amx_int8", "dotprod")]
    return f"{cpu.get('model') or 'unknown CPU'}, {cpu.get('cores') or '?'} cores" + (f" ({', '.join(feats)})"
                                                                                       if feats else "")


@click.command("shadow")
@click.argument("a", type=click.Path())
@click.argument("b", type=click.Path())
@click.argument("input_path", metavar="INPUT", type=click.Path())
@click.option("-o", "--output", "output", type=click.Path(allow_dash=True),
              help="Output JSONL, one line per input (both results, agree, the comparison); '-' writes to stdout. "
                   "A job record OUTPUT.job.json is written beside a file before its first line.")
@click.option("--device-a", default="auto", show_default=True, help="Device (and so variant) of A.")
@click.option("--device-b", default="auto", show_default=True, help="Device (and so variant) of B.")
@click.option("--require-device", is_flag=True, help="Fail (exit 4) instead of falling back to another device.")
@click.option("--min-agreement", type=click.FloatRange(0, 1),
              help="Exit 7 (shadow_agreement_below) when agreement is under this fraction.")
@click.option("--agree-at", type=click.FloatRange(0, 1),
              help="Where a continuous figure counts as agreement: cosine for embeddings and tensors (0.99), "
                   "detection F1 (0.9), pixel agreement (0.97), keypoint PCK (0.95). Classifiers: top-1.")
@click.option("--report", "report", type=click.Path(), help="Write a static HTML report (no server).")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv", "text", "images"]),
              help="Input format (default: from the suffix; a folder is images).")
@click.option("--field", help="JSONL field / CSV column holding the input (default: text, image or inputs by task).")
@click.option("--id-field", help="JSONL field / CSV column holding the record id (default: id).")
@click.option("--label-field", default="label", show_default=True,
              help="JSONL field / CSV column holding the true label (an image folder: <label>/<image>).")
@click.option("--worst", "worst_n", default=10, show_default=True, type=click.IntRange(0, 1000),
              help="How many worst items the summary lists.")
@click.option("--resume", is_flag=True, help="Continue an interrupted run after its last complete line.")
@click.option("--force", is_flag=True, help="Overwrite an existing output.")
@click.option("--quiet", is_flag=True, help="No progress output.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (stderr with -o -).")
@_guard
def shadow_cmd(a, b, input_path, output, device_a, device_b, require_device, min_agreement, agree_at, report, fmt,
               field, id_field, label_field, worst_n, resume, force, quiet, as_json):
    """Run every input of INPUT through A and B (two artifacts, or one artifact on two devices)
    and compare: one JSONL line per input, a summary, optionally an HTML report.

    \b
    Examples:
      edge-infer shadow out/digits-v1 out/digits-v2 models/zoo/digits-cnn/held_out --report shadow.html
      edge-infer shadow ART ART held_out --device-a onnxruntime --device-b openvino -o pairs.jsonl
      edge-infer shadow OLD NEW ../shared/data/text/sst2/dev.tsv --min-agreement 0.99 --json

    \b
    The summary: agreement (agreeing / compared inputs), the flip matrix of labels,
    the worst items, each side's accuracy when INPUT is labelled (a text<TAB>label
    TSV, a --label-field column, or a <label>/<image> folder), p50/p99 latency per side.
    --resume checks the job record as `score` does (same input, both artifacts,
    variants and devices). Exit codes: 0; 7 under --min-agreement; 2 a bad input,
    an empty one or two artifacts of different tasks; 3 an artifact that does not verify.
    """
    from .runtime import load
    from .score import Progress
    from .score_inputs import count_records, read_records
    from .shadow import shadow, verdict

    to_stdout = output == "-"
    with load(a, device=device_a, strict=require_device) as rt_a, \
            load(b, device=device_b, strict=require_device) as rt_b:
        cap = 4 * min(rt_a.limits.max_request_bytes, rt_b.limits.max_request_bytes) + 65536
        records = read_records(input_path, fmt, field=field or type(rt_a.task).score_field, id_field=id_field,
                               cap=cap)
        progress = Progress(count_records(input_path, fmt), sys.stderr, enabled=not quiet)
        summary = shadow(rt_a, rt_b, records, output, resume=resume, force=force, agree_at=agree_at,
                         label_field=label_field, worst_n=worst_n, progress=progress,
                         stream=sys.stdout.buffer if to_stdout else None)
        meta = {"a": _side_meta(rt_a), "b": _side_meta(rt_b), "input": str(input_path), "cpu": host_cpu(),
                "output": output}
    data = dict(summary.to_dict(), a=meta["a"], b=meta["b"], input=meta["input"], cpu=meta["cpu"], output=output)
    if report:
        from .shadow_report import write_report

        data["report"] = str(write_report(report, summary, meta))
    problem = verdict(summary, min_agreement)
    data["min_agreement"] = min_agreement
    data["error"] = None if problem is None else error_json(problem)
    echo = functools.partial(click.echo, err=to_stdout)
    if as_json:
        echo(json.dumps(data, indent=2, default=str))
    else:
        for line in summary_lines(data):
            echo(line)
    if problem is not None:
        exit_with(problem)



def _f(v, digits=4):
    return "-" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def summary_lines(d: dict) -> list[str]:
    """The human summary of a shadow run (``d``: the ``--json`` document)."""
    a, b = d["a"], d["b"]
    out = [f"A: {a['model']} v{a['version']} {a['target']} on {a['device']} (seal {str(a['manifest_sha256'])[:12]}…)",
           f"B: {b['model']} v{b['version']} {b['target']} on {b['device']} (seal {str(b['manifest_sha256'])[:12]}…)"]
    rule = "top-1" if d["kind"] == "classification" else f"{d['kind']}" + (
        f" >= {d['agree_at']}" if d.get("agree_at") is not None else "")
    out.append(f"{d['total']} inputs" + (f" (resumed after {d['resumed_from']})" if d["resumed_from"] else "")
               + f": agreement {_f(d['agreement'])} ({d['agree']} of {d['compared']} compared, {rule}); "
               f"failed only on A {d['only_a_failed']}, only on B {d['only_b_failed']}, on both {d['both_failed']}")
    for name, fig in d["figures"].items():
        out.append(f"  {name}: mean {_f(fig['mean'])}, p5 {_f(fig['p5'])}, min {_f(fig['min'])}")
    if d["kind"] == "classification":
        flips = d["flips"]
        out.append("label flips (A -> B): " + (", ".join(f"{f['a']} -> {f['b']} x{f['count']}" for f in flips[:10])
                                               + (f", ... ({len(flips)} kinds)" if len(flips) > 10 else "")
                                               if flips else "none"))
    if d["accuracy"]:
        acc = d["accuracy"]
        out.append(f"accuracy over {acc['samples']} labelled inputs (class ids): A {_f(acc['a'])}, B {_f(acc['b'])}")
    if d.get("accuracy_note"):
        out.append(f"accuracy: {d['accuracy_note']}")
    la, lb = d["latency_ms"]["a"], d["latency_ms"]["b"]
    out.append(f"latency per input (ms, infer()): A p50 {_f(la['p50'], 3)} p99 {_f(la['p99'], 3)} | "
               f"B p50 {_f(lb['p50'], 3)} p99 {_f(lb['p99'], 3)}  [{d['cpu']}]")
    for k in ("a", "b"):
        if d["errors"][k]:
            out.append(f"errors {k.upper()}: " + ", ".join(f"{c} {n}" for c, n in d["errors"][k].items()))
    if d["worst"]:
        out.append(f"worst {len(d['worst'])}:")
        for e in d["worst"]:
            def side(s):
                return (f"{s.get('prediction')}" + (f" ({s['score']:.3f})" if isinstance(s.get("score"), float)
                                                    else "")) if s.get("ok") else f"error {s.get('code')}"
            cmp = e.get("compare") or {}
            fig = next((f"{k} {_f(cmp[k])}" for k in ("margin", "cosine", "f1", "pixel_agreement", "pck")
                        if isinstance(cmp.get(k), (int, float))), "")
            out.append(f"  [{e['index']}] {str(e['id'])[:40]}: A {side(e['a'])} | B {side(e['b'])}"
                       + (f" | truth {e['truth']}" if e.get("truth") is not None else "")
                       + (f" (#{e['truth_id']})" if e.get("truth_id") is not None else "")
                       + (f" | {fig}" if fig else ""))
    if d.get("output") and d["output"] != "-":
        out.append(f"-> {d['output']}")
    if d.get("report"):
        out.append(f"report -> {d['report']}")
    from .score_lines import _utf8_safe

    return [_utf8_safe(x) for x in out]     # an id with a lone surrogate: its \uXXXX escape, not a crash of echo
