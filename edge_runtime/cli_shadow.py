"""``edge-infer diff`` and ``edge-infer shadow``: two inference versions side by side."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click

from .cli_common import Fraction, _guard, emit
from .cli_score import _fields_read, error_json, exit_with


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
    emit(json_text_floats(report) if as_json else report, as_json,
         lambda r: click.echo(render_text(r, timings=not no_timings)))
    sys.exit(0 if report["same"] else 1)


def json_text_floats(value):
    """``value`` with each NaN or infinite float as its JSON text (``"NaN"``, ``"Infinity"``): a manifest
    may hold one (a parity figure), and ``--json`` must stay strict JSON (``jq`` refuses a bare NaN)."""
    import math

    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)
    if isinstance(value, dict):
        return {k: json_text_floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_text_floats(v) for v in value]
    return value


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
@click.option("--min-agreement", type=Fraction(),
              help="Exit 7 (shadow_agreement_below) when agreement is under this fraction.")
@click.option("--agree-at", type=Fraction(),
              help="Where a continuous figure counts as agreement: cosine for embeddings and tensors (0.99), "
                   "detection F1 (0.9), pixel agreement (0.97), keypoint PCK (0.95). Classifiers: top-1.")
@click.option("--report", "report", type=click.Path(),
              help="Write a static HTML report (no server). An existing file is refused without --force "
                   "(--resume replaces only a report shadow wrote).")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv", "text", "images"]),
              help="Input format (default: from the suffix; a folder is images).")
@click.option("--field", help="JSONL field / CSV column holding the input (default: text, image or inputs by task); "
                               "refused for a text input or an image folder.")
@click.option("--id-field", help="JSONL field / CSV column holding the record id (default: id).")
@click.option("--label-field", default="label", show_default=True,
              help="JSONL field / CSV column holding the true label (an image folder: <label>/<image>).")
@click.option("--worst", "worst_n", default=10, show_default=True, type=click.IntRange(0, 1000),
              help="How many worst items the summary lists.")
@click.option("--resume", is_flag=True, help="Continue an interrupted run after its last complete line.")
@click.option("--force", is_flag=True, help="Overwrite an existing output and --report.")
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
    variants and devices). Exit codes: 0; 7 under --min-agreement (or asked of a run where
    neither side found anything in any input); 2 a bad input, an empty one or two artifacts
    of different tasks; 3 an artifact that does not verify; a side that answered no input at
    all ends the run with its most frequent error's exit code, as `score` does.
    """
    from .runtime import load
    from .score import Progress
    from .score_inputs import count_records, read_records
    from .shadow import shadow, verdict

    to_stdout = output == "-"
    _fields_read(input_path, fmt, field, id_field)      # a text input or image folder has none: refused, as score
    _label_field_read(input_path, fmt, label_field, click.get_current_context())
    replace = False
    if report:
        replace = check_report_path(report, input_path, output, (a, b), force=force, resume=resume)
    with load(a, device=device_a, strict=require_device) as rt_a, \
            load(b, device=device_b, strict=require_device) as rt_b:
        # the larger side's cap: a line only B's limit refuses is still read, so A answers it and B refuses it
        # itself (a disagreement); under the smaller cap both "failed" and it left the agreement unseen
        cap = 4 * max(rt_a.limits.max_request_bytes, rt_b.limits.max_request_bytes) + 65536
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

        data["report"] = str(write_report(report, summary, meta, replace=replace))
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


def _label_field_read(input_path, fmt, label_field: str, ctx) -> None:
    """Refuse a ``--label-field`` given where no field is read (``score``'s ``_fields_read`` for ``--field``):
    a text input has no labels, an image folder's label is its first folder; ``data.txt --label-field
    sentiment`` ran unlabelled, no accuracy and no word of why, exit 0."""
    from click.core import ParameterSource

    from . import error_codes as ec
    from .errors import InputError
    from .score_inputs import detect_format

    if ctx.get_parameter_source("label_field") != ParameterSource.COMMANDLINE:
        return
    kind = fmt or detect_format(Path(input_path))
    if kind in ("text", "images"):
        how = ("one input a line, no label" if kind == "text"
               else "a folder of images, each labelled by its first folder (<label>/<image>)")
        raise InputError(f"--label-field {label_field}: the input {input_path} is read as {kind} ({how}), which has "
                         f"no fields; name its format (--format jsonl or csv) or drop the option",
                         code=ec.INPUT_INVALID)


def check_report_path(report, input_path, output, artifacts, *, force: bool = False, resume: bool = False) -> bool:
    """Refuse (``InputError``, exit 2, before anything runs) a ``--report`` that would overwrite what
    the run reads or writes: the input (the page replaced a user's data with HTML, exit 0), the
    ``-o`` output or its job record (the lines "nothing lost" promises), or a file of either artifact;
    one that is no regular file (a folder, a FIFO the write would block on, a link to nothing), even
    with ``--force``; and an existing file without ``--force`` (``score_output_exists``, as ``-o``: it
    was silently replaced), except under ``--resume`` a page ``shadow`` wrote (the run's own report,
    rewritten over all its lines). Returns whether ``write_report`` may replace an existing file."""
    import os

    from .errors import InputError
    from . import error_codes as ec
    from .score_job import _not_regular, _system_path, job_path
    from .shadow_report import is_report

    def same(x, y) -> bool:
        try:
            if os.path.samefile(x, y):
                return True
        except OSError:
            pass
        return Path(x).resolve() == Path(y).resolve()

    target = Path(report)
    if _system_path(target):    # /dev/stdout: with -o - > pairs.jsonl the page truncated every line, exit 0
        raise InputError(f"--report {report} is under /dev or /proc: the report is written as a regular file; "
                         f"choose another --report", code=ec.INPUT_INVALID, path=str(report))
    if output == "-" and _is_stdout(target):
        raise InputError(f"--report {report} is the file stdout writes the -o - lines to: writing the page would "
                         f"destroy them; choose another --report", code=ec.INPUT_INVALID, path=str(report))
    named = [(input_path, "the input")]
    if output and output != "-":
        named += [(output, "the output"), (job_path(Path(output)), "the output's job record")]
    for path, what in named:
        if same(target, path):
            raise InputError(f"--report {report} is {what} {path}: writing the page would destroy it; choose "
                             f"another --report", code=ec.INPUT_INVALID, path=str(report))
    where = target.resolve()
    for art in artifacts:
        root = Path(art).resolve()
        if root.is_dir() and where.is_relative_to(root):
            raise InputError(f"--report {report} is inside the artifact {art}: writing the page would change a "
                             f"sealed artifact; choose another --report", code=ec.INPUT_INVALID, path=str(report))
    why = _not_regular(target)
    if why is not None:
        raise InputError(f"--report {report} is {why}: the report is written as a regular file; choose another "
                         f"--report", code=ec.INPUT_INVALID, path=str(report))
    if force or not os.path.lexists(target):
        return force
    if resume and is_report(target):
        return True             # the interrupted run's own page: rewritten over the whole output
    raise InputError(f"--report {report} exists: pass --force to overwrite it (--resume replaces only a report "
                     f"edge-infer shadow wrote)", code=ec.SCORE_OUTPUT_EXISTS, path=str(report))


def _is_stdout(path: Path) -> bool:
    """Whether ``path`` is the regular file this process's stdout writes to (``-o - > pairs.jsonl``)."""
    import os
    import stat

    try:
        here, there = os.fstat(sys.stdout.fileno()), os.stat(path)
    except (AttributeError, OSError, ValueError):     # no descriptor (a test's buffer), or no such file
        return False
    return stat.S_ISREG(here.st_mode) and (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _f(v, digits=4, up: bool = False):
    """A figure as text, cut to ``digits`` decimals toward its worse side, never rounded past it: a cosine
    min of 0.989999 (one input under ``--agree-at 0.99``) read "min 0.9900", a margin of -0.00004 (B
    flipped) "-0.0000". ``up``: a figure where lower is better (``score_diff``'s p95 and max): rounded up."""
    import math
    from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

    if v is None:
        return "-"
    if not isinstance(v, float):
        return str(v)
    if not math.isfinite(v):
        return f"{v:.{digits}f}"
    cut = Decimal(repr(v)).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_CEILING if up else ROUND_FLOOR)
    return f"{cut:.{digits}f}"


def summary_lines(d: dict) -> list[str]:
    """The human summary of a shadow run (``d``: the ``--json`` document)."""
    from .shadow_summary import rate_text

    a, b = d["a"], d["b"]
    out = [f"A: {a['model']} v{a['version']} {a['target']} on {a['device']} (seal {str(a['manifest_sha256'])[:12]}…)",
           f"B: {b['model']} v{b['version']} {b['target']} on {b['device']} (seal {str(b['manifest_sha256'])[:12]}…)"]
    rule = "top-1" if d["kind"] == "classification" else f"{d['kind']}" + (
        f" >= {d['agree_at']}" if d.get("agree_at") is not None else "")
    if d["kind"] is None:       # no input answered on both sides: no comparison ran (it read "None")
        rule = "no input answered by both sides"
    out.append(f"{d['total']} inputs" + (f" (resumed after {d['resumed_from']})" if d["resumed_from"] else "")
               + f": agreement {rate_text(d['agree'], d['compared'])} ({d['agree']} of {d['compared']} compared, "
               f"{rule}); "
               f"failed only on A {d['only_a_failed']}, only on B {d['only_b_failed']}, on both {d['both_failed']}"
               + (f" ({d['both_failed_differently']} with another error on each side, not compared)"
                  if d.get("both_failed_differently") else ""))
    if d.get("labels_note"):
        out.append(f"  labels: {d['labels_note']}")
    if d.get("empty"):
        out.append(f"  {d['empty']} of the {d['compared']} compared inputs: nothing found on either side (an "
                   f"agreement over nothing, left out of the figures)")
    if d.get("mismatched"):
        out.append(f"  {d['mismatched']} of the {d['compared']} compared inputs could not be compared (sizes or "
                   f"shapes differ): disagreements")
    cut = d.get("truncated") or {}
    if cut.get("a") or cut.get("b"):
        out.append(f"  truncated (longer than the largest bucket): A {cut['a']}, B {cut['b']} inputs; "
                   f"{cut['one_side']} cut on one side only (the two answered different texts)")
    for name, fig in d["figures"].items():
        if fig.get("worst") == "max":       # a difference: its worst inputs are its largest
            out.append(f"  {name}: mean {_f(fig['mean'], up=True)}, p95 {_f(fig['p95'], up=True)}, "
                       f"max {_f(fig['max'], up=True)}")
        else:
            out.append(f"  {name}: mean {_f(fig['mean'])}, p5 {_f(fig['p5'])}, min {_f(fig['min'])}")
    if d["kind"] == "classification":
        flips = d["flips"]
        by_index = " by class index, A's label=B's" if d.get("labels_basis") == "index" else ""
        shown = ", ".join(f"{f['a']} -> {f['b']} x{f['count']}" for f in flips[:10])
        out.append(f"label flips (A -> B{by_index}): " + (shown + (f", ... ({len(flips)} kinds)" if len(flips) > 10
                                                                   else "") if flips else "none"))
    if d["accuracy"]:
        acc = d["accuracy"]
        out.append(f"accuracy over {acc['samples']} labelled inputs (class ids): A "
                   f"{rate_text(acc['correct_a'], acc['samples'])}, B {rate_text(acc['correct_b'], acc['samples'])}")
    if d.get("accuracy_note"):
        out.append(f"accuracy: {d['accuracy_note']}")
    if d.get("unknown_labels"):
        out.append(f"accuracy: {d['unknown_labels']['note']}")
    if d.get("eval_skipped"):
        out.append(f"accuracy: {d['eval_skipped']['note']}")
    la, lb = d["latency_ms"]["a"], d["latency_ms"]["b"]

    def pct(side: dict, p: str) -> str:       # a percentile from too few inputs is the slowest one: starred
        star = p in (side.get("few_samples_for") or ()) and side[p] is not None
        return _f(side[p], 3, up=True) + ("*" if star else "")
    out.append(f"latency per input (ms, infer()): A p50 {pct(la, 'p50')} p99 {pct(la, 'p99')} | "
               f"B p50 {pct(lb, 'p50')} p99 {pct(lb, 'p99')}  [{d['cpu']}]")
    few = sorted({p for s in (la, lb) if s["p50"] is not None for p in s.get("few_samples_for") or ()})
    if few:
        out.append(f"  * from A {la['n']}, B {lb['n']} answered inputs: a p50 needs 2, a p99 100; with fewer "
                   f"it is the slowest call")
    for k in ("a", "b"):
        if d["errors"][k]:
            out.append(f"errors {k.upper()}: " + ", ".join(f"{c} {n}" for c, n in d["errors"][k].items()))
    if d["worst"]:
        out.append(f"worst {len(d['worst'])}:")
        for e in d["worst"]:
            def side(s):        # an answer with no class (an embedding, tensors) is "ok", never "None"
                shown = "ok" if s.get("prediction") is None else s["prediction"]
                shown = f"{shown:.4g}" if isinstance(shown, float) else shown    # a pose's mean keypoint score
                return (f"{shown}" + (f" ({s['score']:.3f})" if isinstance(s.get("score"), float)
                                      else "")) if s.get("ok") else f"error {s.get('code')}"
            cmp = e.get("compare") or {}
            fig = next((f"{k} {_f(cmp[k])}" for k in ("margin", "cosine", "f1", "pixel_agreement", "pck")
                        if isinstance(cmp.get(k), (int, float))),
                       f"not comparable: {cmp['mismatch']}" if cmp.get("mismatch") else "")
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
