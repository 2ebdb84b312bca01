"""``edge-infer eval``: labelled accuracy and latency of an artifact."""

from __future__ import annotations

import sys

import click

from .cli_common import _guard


@click.command("eval")
@click.argument("artifact", type=click.Path())
@click.argument("data", type=click.Path())
@click.option("--device", default="auto", show_default=True)
@click.option("--require-device", is_flag=True, help="Fail instead of falling back to another device.")
@click.option("--device-option", "device_option", multiple=True, help="Backend option KEY=VALUE, repeatable.")
@click.option("--limit", type=int, help="Use the first N samples only.")
@click.option("--min-accuracy", type=float, help="Exit 1 when accuracy is below this.")
@click.option("--json", "as_json", is_flag=True)
@_guard
def eval_cmd(artifact, data, device, require_device, device_option, limit, min_accuracy, as_json):
    """Accuracy and latency of ARTIFACT on labelled DATA (image folder or TSV)."""
    from .cli import _device_options, _emit
    from .evaluate import evaluate
    from .runtime import load

    with load(artifact, device=device, strict=require_device, device_options=_device_options(device_option)) as rt:
        rep = evaluate(rt, data, limit=limit)

    def human(d):
        p = d["parity"]
        click.echo(f"accuracy {d['accuracy']:.4f} ({d['correct']}/{d['samples']}) on {d['device']} ({d['target']})")
        click.echo(f"latency p50 {d['latency_ms']['p50']:.3f} ms, p95 {d['latency_ms']['p95']:.3f} ms")
        click.echo(f"parity vs fp32 (from the manifest): {p.get('metric')} {p.get('value')} on {p.get('samples')} "
                   f"samples (budget {p.get('budget')})")
        if d["errors"]:
            click.echo(f"errors: {d['errors']}")

    _emit(rep, as_json, human)
    if min_accuracy is not None and (rep["accuracy"] or 0) < min_accuracy:
        sys.exit(1)
