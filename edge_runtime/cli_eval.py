"""``edge-infer eval``: labelled accuracy and latency of an artifact."""

from __future__ import annotations

import click

from .cli_common import _guard, device_flags, device_options, emit
from . import error_codes as ec
from .errors import EdgeRuntimeError, InputError


@click.command("eval")
@click.argument("artifact", type=click.Path())
@click.argument("data", type=click.Path())
@device_flags()
@click.option("--limit", type=click.IntRange(min=1), help="Use the first N evaluable samples only (a TSV header and "
                                                          "skipped rows do not count).")
@click.option("--min-accuracy", type=float, callback=lambda ctx, param, v: _fraction(v),
              help="Exit 1 when accuracy is below this fraction (0.97; the figure and the threshold on stderr).")
@click.option("--fail-on-skip", is_flag=True, help="Exit 2 when any row was skipped (after the report).")
@click.option("--json", "as_json", is_flag=True)
@_guard
def eval_cmd(artifact, data, device, require_device, device_option, limit, min_accuracy, fail_on_skip, as_json):
    """Accuracy and latency of a classifier ARTIFACT on labelled DATA (image folder or TSV).

    DATA: a folder of <label>/<image> files, or a TSV of text<TAB>label lines
    (label: a name or an index into the artifact's labels; a first line whose
    label is no label is the header). A row is right when the predicted class
    id is the one its label names; a label text the labels file repeats
    (ImageNet's "crane": 135 and 518) names no one class and is refused: use
    the index (a folder 518/). Only classifier tasks (image-classification,
    text-classification) are evaluated; any other task is refused (exit 2).

    \b
    Examples:
      edge-infer eval out/digits-int8 models/zoo/digits-cnn/held_out
      edge-infer eval ART ../shared/data/text/sst2/dev.tsv --limit 100 --json
      edge-infer eval ART held_out --min-accuracy 0.97 --fail-on-skip

    \b
    Rows that cannot be evaluated (no tab, an unknown label, an image in a
    folder that is no label, an image reached a second time through a
    symlink, a dangling symlink, an image in a dot-folder such as .cache/,
    ...) are skipped, counted by reason and shown
    with their line number or path; accuracy is over the evaluated rows
    (an inference error counts as wrong), the skipped ones are reported
    beside it.

    \b
    Exit codes: 0 ok; 1 accuracy under --min-accuracy (eval_below_min_accuracy);
    2 nothing could be evaluated (eval_nothing_evaluated, eval_data_empty),
    the data is an image folder for a text classifier (input_invalid);
    every evaluated sample failed: the errors' class (eval_nothing_succeeded);
    the artifact is no classifier or a label names several classes
    (input_invalid) or, with --fail-on-skip, a row was skipped
    (eval_rows_skipped); 3/4/5/6 the artifact's, device's, timeout's,
    runtime's errors.
    """
    from .cli_score import error_json, exit_with
    from .evaluate import evaluate
    from .runtime import load

    with load(artifact, device=device, strict=require_device, device_options=device_options(device_option)) as rt:
        rep = evaluate(rt, data, limit=limit)
    sk = rep["skipped"]
    problem: EdgeRuntimeError | None = None
    failed = sum(rep["errors"].values())
    if failed and failed == rep["samples"]:     # an accuracy of 0 that measures no prediction at all
        from .score_summary import _dominant_type

        counts = ", ".join(f"{k} {v}" for k, v in sorted(rep["errors"].items(), key=lambda kv: -kv[1]))
        problem = _dominant_type(rep.get("error_types") or {})(
            f"all {failed} evaluated samples failed ({counts}): the accuracy measures no prediction",
            code=ec.EVAL_NOTHING_SUCCEEDED)
    elif fail_on_skip and sk["count"]:
        problem = InputError(f"{sk['count']} rows skipped ({', '.join(f'{k} {v}' for k, v in sk['by_reason'].items())})"
                             f" and --fail-on-skip was given", code=ec.EVAL_ROWS_SKIPPED)
    elif min_accuracy is not None and rep["accuracy"] < min_accuracy:
        problem = EdgeRuntimeError(f"accuracy {rep['accuracy']:.4f} ({rep['correct']}/{rep['samples']}) is below "
                                   f"--min-accuracy {min_accuracy:g}", code=ec.EVAL_BELOW_MIN_ACCURACY)
    if as_json:
        rep["error"] = None if problem is None else error_json(problem)
    emit(rep, as_json, _human)
    if problem is not None:
        exit_with(problem)


def _fraction(v: float | None) -> float | None:
    """--min-accuracy NaN: no accuracy is below it, so the gate would pass whatever was measured."""
    if v is not None and not 0 <= v <= 1:      # NaN fails this too; -1 passed every run, 97 failed every one
        raise click.BadParameter(f"{v} is no accuracy: give a fraction in [0, 1] such as 0.97")
    return v


def _where(ex: dict) -> str:
    return ex["path"] if "path" in ex else f"line {ex.get('line')}"


def _parity_text(p: dict) -> str:
    """The manifest's parity in words (``inspect``'s): a figure with its samples and budget, or
    why there is none. Before 2026-12-07 an unmeasured one read "not_measured None on 0 samples
    (budget None)", and a figure measured on a stand-in did not say so."""
    value, metric = p.get("value"), p.get("metric")
    if value is None and p.get("not_judged"):      # measured, but it compared nothing
        return f"{metric} not judged ({p['not_judged']})"
    if value is None or metric in (None, "none", "not_measured"):
        why = p.get("not_measured") or p.get("note") or p.get("reason") or "no parity value recorded"
        return f"not measured ({why})"
    budget = p.get("budget")
    text = (f"{metric} {value}" + (f" on {p['samples']} samples" if p.get("samples") else "")
            + (f" (budget {budget})" if budget is not None else " (no budget recorded)"))
    on = p.get("measured_on")       # a stand-in (Core ML's fake-quantized torch model): not the target
    if isinstance(on, str) and on:
        text += f", measured on {on if on.startswith('the ') else 'the ' + on}; not on the target"
    return text


def _human(d: dict) -> None:
    p, sk, lat = d["parity"], d["skipped"], d["latency_ms"]
    click.echo(f"accuracy {d['accuracy']:.4f} ({d['correct']}/{d['samples']}) on {d['device']} ({d['target']})"
               + (f"; {sk['count']} rows skipped, not in it" if sk["count"] else ""))
    if lat["p50"] is None:
        click.echo("latency: none (every sample failed)")
    else:
        click.echo(f"latency p50 {lat['p50']:.3f} ms, p95 {lat['p95']:.3f} ms")
    click.echo(f"parity vs fp32 (from the manifest): {_parity_text(p)}")
    if d["errors"]:
        click.echo("errors (counted as wrong): " + ", ".join(f"{k} {v}" for k, v in d["errors"].items()))
        for ex in d.get("error_examples", []):
            click.echo(f"  {_where(ex)}: {ex['code']}: {ex['message']}")
    if sk["count"]:
        click.echo(f"skipped {sk['count']} rows: " + ", ".join(f"{k} {v}" for k, v in sk["by_reason"].items()))
        for ex in sk["examples"]:
            click.echo(f"  {_where(ex)}: {ex['reason']}" + (f": {ex['detail']}" if ex["detail"] else ""))
    if d.get("header"):
        click.echo(f"header: line {d['header']['line']} {d['header']['text']!r} (not a sample)")
