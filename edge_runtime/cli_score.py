"""``edge-infer score``: offline batch scoring of a file or a folder into JSONL."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .cli_common import _guard

DEFAULT_FIELD = {"text-classification": "text", "text-embedding": "text", "image-classification": "image",
                 "tensors": "inputs"}


@click.command("score")
@click.argument("artifact", type=click.Path())
@click.argument("input_path", metavar="INPUT", type=click.Path())
@click.option("-o", "--output", "output", required=True, type=click.Path(), help="Output JSONL, one line per input.")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv", "text", "images"]),
              help="Input format (default: from the suffix; a folder is images).")
@click.option("--field", help="JSONL field / CSV column holding the input (default: text, image or inputs by task).")
@click.option("--id-field", help="JSONL field / CSV column holding the record id (default: id, else line number).")
@click.option("--batch-size", default=32, show_default=True, type=int)
@click.option("--concurrency", default=2, show_default=True, type=int, help="Batches in flight.")
@click.option("--resume", is_flag=True, help="Continue an interrupted run after its last complete line.")
@click.option("--force", is_flag=True, help="Overwrite an existing output.")
@click.option("--device", default="auto", show_default=True)
@click.option("--require-device", is_flag=True, help="Fail instead of falling back to another device.")
@click.option("--device-option", "device_option", multiple=True, help="Backend option KEY=VALUE, repeatable.")
@click.option("--deadline-ms", type=int, help="Per-input deadline.")
@click.option("--quiet", is_flag=True, help="No progress output.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
@_guard
def score_cmd(artifact, input_path, output, fmt, field, id_field, batch_size, concurrency, resume, force, device,
              require_device, device_option, deadline_ms, quiet, as_json):
    """Score every input of INPUT with ARTIFACT into a JSONL file (exactly one line per input, in order)."""
    from .cli import _device_options
    from .runtime import load
    from .score import Progress, score
    from .score_inputs import count_records, read_records

    with load(artifact, device=device, strict=require_device, device_options=_device_options(device_option)) as rt:
        cap = 4 * rt.limits.max_request_bytes + 65536       # a JSON line may escape its text
        records = read_records(input_path, fmt, field=field or DEFAULT_FIELD.get(rt.artifact.task, "text"),
                               id_field=id_field, cap=cap)
        progress = Progress(count_records(input_path, fmt), sys.stderr, enabled=not quiet)
        summary = score(rt, records, Path(output), batch_size=batch_size, concurrency=concurrency, resume=resume,
                        force=force, deadline_ms=deadline_ms, progress=progress)
        data = dict(summary.to_dict(), device=rt.device, target=rt.variant["target"], output=str(output))
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    lat = data["latency_ms"]
    click.echo(f"{data['total']} inputs: {data['ok']} ok, {data['rejected']} rejected, {data['failed']} failed"
               + (f" (resumed after {data['resumed_from']})" if data["resumed_from"] else ""))
    if data["errors"]:
        click.echo("errors: " + ", ".join(f"{k} {v}" for k, v in data["errors"].items()))
    click.echo(f"scored {data['scored']} in {data['wall_s']:.2f} s ({data['throughput_per_s'] or 0:.1f}/s) on "
               f"{data['device']} ({data['target']}); latency p50 {lat['p50']} ms, p99 {lat['p99']} ms -> {output}")
