"""``edge-infer score``: offline batch scoring of a file or a folder into JSONL."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click

from .cli_common import Fraction, _guard, device_flags, device_options
from . import error_codes as ec
from .errors import InputError



@click.command("score")
@click.argument("artifact", type=click.Path())
@click.argument("input_path", metavar="INPUT", type=click.Path())
@click.option("-o", "--output", "output", required=True, type=click.Path(allow_dash=True),
              help="Output JSONL, one line per input; '-' writes the lines to stdout (the summary then goes to "
                   "stderr). A job record OUTPUT.job.json is written beside a file before its first line.")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv", "text", "images", "parquet"]),
              help="Input format (default: from the suffix; a folder is images). parquet: --engine ray only.")
@click.option("--field", help="JSONL field / CSV column holding the input (default: text, image or inputs by task); "
                               "refused for a text input or an image folder.")
@click.option("--id-field", help="JSONL field / CSV column holding the record id (default: id). A record without "
                                 "one gets id null; every line carries its input line number in 'line'.")
@click.option("--batch-size", type=int, help="Items per batch [default: 32; with --engine ray, sized so a batch "
                                             "holds ~100 ms of model time, measured at start (32-512)].")
@click.option("--concurrency", default=2, show_default=True, type=int, help="Batches in flight.")
@click.option("--resume", is_flag=True, help="Continue an interrupted run after its last complete line; refused "
                                             "unless the output's job record matches this job.")
@click.option("--force", is_flag=True, help="Overwrite an existing output (not with --resume).")
@click.option("--max-error-rate", type=Fraction(),
              help="Fail when (rejected + failed) / total is above this fraction (0..1).")
@device_flags()
@click.option("--deadline-ms", type=int, help="Per-input deadline.")
@click.option("--quiet", is_flag=True, help="No progress output.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (stdout; stderr with -o -).")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: this process. ray: actors on Ray Data (pip install 'edge-runtime[ray]'); the artifact "
                   "and image inputs must be at the same path on every node.")
@click.option("--address", help="--engine ray: 'auto' (the cluster this machine belongs to) or a cluster's GCS "
                                "HOST:PORT (default: start a local Ray, object store capped at 200 MB). Not ray:// "
                                "(Ray Data does not run through Ray Client): use `ray job submit`.")
@click.option("--actors", type=int, default=2, show_default=True, help="--engine ray: scoring actors.")
@click.option("--cpus-per-actor", type=float, default=1, show_default=True,
              help="--engine ray: CPUs per actor; the backend's threads are sized to it.")
@_guard
def score_cmd(artifact, input_path, output, fmt, field, id_field, batch_size, concurrency, resume, force,
              max_error_rate, device, require_device, device_option, deadline_ms, quiet, as_json,
              engine, address, actors, cpus_per_actor):
    """Score every input of INPUT with ARTIFACT into a JSONL file (exactly one line per input, in order).

    Each line: {"index", "id", "line", "ok": true, "result"} or {"index", "id", "line", "ok": false,
    "error": {"type", "code", "message"}}.

    \b
    Examples:
      edge-infer score out/digits-int8 models/zoo/digits-cnn/held_out -o scores.jsonl
      edge-infer score ART reviews.csv --field review -o scores.jsonl --max-error-rate 0.01
      edge-infer score ART texts.txt -o - --quiet | jq .result.prediction
      edge-infer score ART texts.txt -o scores.jsonl --resume     # after a crash or kill -9

    \b
    --resume checks the job record OUTPUT.job.json: same input content, artifact
    (manifest_sha256), variant, device, format, field, id field, deadline and
    device options, or it refuses (exit 2, score_output_mismatch, the
    differences named). An output without a job record is not resumed
    (score_resume_unverifiable): start over with --force.

    \b
    Exit codes: 0 when at least one input succeeded (and the error rate is
    within --max-error-rate). No input succeeded (score_nothing_succeeded) or
    the error rate is over --max-error-rate (score_error_rate_exceeded): the
    exit code of the most frequent error's layer (2 input, 4 device,
    5 timeout, 6 runtime). An empty input: 2 (score_input_empty).
    """
    from .runtime import load
    from .score import Progress, job_identity, score
    from .score_inputs import count_records, read_records
    from .score_job import check_resume_options

    to_stdout = output == "-"
    check_resume_options(resume, force, output)
    if engine == "ray":
        from .ray_io import is_parquet
        from .score_ray import score_ray

        if fmt != "parquet" and not (Path(input_path).exists() and is_parquet(input_path)):   # Parquet has fields
            _fields_read(input_path, fmt, field, id_field)

        progress = Progress(None, sys.stderr, enabled=not quiet)
        summary, info = score_ray(artifact, input_path, "-" if to_stdout else Path(output), fmt=fmt, field=field,
                                  id_field=id_field, batch_size=batch_size, actors=actors,
                                  cpus_per_actor=cpus_per_actor, address=address, device=device,
                                  strict=require_device, device_options=device_options(device_option),
                                  deadline_ms=deadline_ms, resume=resume, force=force, progress=progress,
                                  stream=sys.stdout.buffer if to_stdout else None)
        data = dict(summary.to_dict(), device=info["device"], target=info["target"], output=str(output),
                    ray=info)
        _finish(data, summary, max_error_rate, to_stdout, as_json)
        return
    if fmt == "parquet":
        raise InputError("--format parquet needs --engine ray", code=ec.INPUT_INVALID)
    _fields_read(input_path, fmt, field, id_field)
    # a tune's throughput decision (batches are throughput work), the policy without one
    with load(artifact, device=device, strict=require_device, device_options=device_options(device_option),
              tuned_for="throughput") as rt:
        cap = 4 * rt.limits.max_request_bytes + 65536       # a JSON line may escape its text
        records = read_records(input_path, fmt, field=field or type(rt.task).score_field,
                               id_field=id_field, cap=cap)
        job = None if to_stdout else job_identity(rt, records.source, deadline_ms=deadline_ms)
        total = None if quiet else count_records(input_path, fmt, cap=cap)    # None for a pipe: read once
        progress = Progress(total, sys.stderr, enabled=not quiet)
        summary = score(rt, records, "-" if to_stdout else Path(output), batch_size=32 if batch_size is None else batch_size,
                        concurrency=concurrency, resume=resume, force=force, deadline_ms=deadline_ms,
                        progress=progress, job=job,
                        stream=sys.stdout.buffer if to_stdout else None)
        data = dict(summary.to_dict(), device=rt.device, target=rt.variant["target"], output=str(output))
    _finish(data, summary, max_error_rate, to_stdout, as_json)


def _fields_read(input_path, fmt, field, id_field) -> None:
    """Refuse ``--field`` / ``--id-field`` where the input has no fields (text: one input a line, id its
    number; an image folder): ``data.txt --field review`` scored the CSV header and every row whole,
    ids the line numbers, exit 0."""
    from .score_inputs import detect_format

    given = [f"{flag} {v}" for flag, v in (("--field", field), ("--id-field", id_field)) if v is not None]
    kind = fmt or detect_format(Path(input_path))
    if given and kind in ("text", "images"):
        how = "one input a line, id its line number" if kind == "text" else "a folder of images, id the relative path"
        raise InputError(f"{' and '.join(given)}: the input {input_path} is read as {kind} ({how}), which has no "
                         f"fields; name its format (--format jsonl or csv) or drop the option", code=ec.INPUT_INVALID)


def _finish(data: dict, summary, max_error_rate, to_stdout: bool, as_json: bool) -> None:
    """Print the summary (human or --json) and exit with the run's verdict."""
    from .score import verdict

    problem = verdict(summary, max_error_rate)
    data["error"] = None if problem is None else error_json(problem)
    echo = functools.partial(click.echo, err=to_stdout)
    if as_json:
        echo(json.dumps(data, indent=2))
    else:
        _human(data, echo)
        for w in data["warnings"]:
            click.echo(f"warning: {w}", err=True)
    if problem is not None:
        exit_with(problem)


def error_json(exc) -> dict:
    d = exc.to_dict()
    return {"type": d["type"], "code": d["code"], "message": d["message"], "details": d.get("details", {})}


def exit_with(problem) -> None:
    """End a command whose report is already printed with ``problem``: one line on stderr and its
    exit code (under ``--json`` the report carries it as ``"error"``, so stdout stays one document);
    ``--debug`` re-raises it."""
    if click.get_current_context().find_root().params.get("debug"):
        raise problem
    click.echo(f"error [{problem.code}]: {problem.message}", err=True)
    sys.exit(problem.exit_code)


def _human(data: dict, echo) -> None:
    dest = "stdout" if data["output"] == "-" else data["output"]
    echo(f"{data['total']} inputs: {data['ok']} ok, {data['rejected']} rejected, {data['failed']} failed"
         + (f" (resumed after {data['resumed_from']})" if data["resumed_from"] else ""))
    if data["errors"]:
        echo("errors: " + ", ".join(f"{k} {v}" for k, v in data["errors"].items()))
    rate = f"{data['throughput_per_s']:.1f}/s" if data["throughput_per_s"] is not None else "-/s"
    per = f", {data['wall_ms_per_input']:.3f} ms wall per input" if data["wall_ms_per_input"] is not None else ""
    echo(f"scored {data['scored']} in {data['wall_s']:.2f} s ({rate}{per}) on {data['device']} ({data['target']}) "
         f"-> {dest}")
    ray = data.get("ray")
    if ray:
        echo(f"ray: {ray['actors']} actors x {ray['cpus_per_actor']:g} CPU on {ray['address']}; start-up "
             f"{ray['ray_init_s']:.2f} s (not in the wall time), first lines after {ray.get('first_rows_s')} s "
             f"(actor load + verify + warm-up); {ray['duplicates_dropped']} retried lines dropped")
        if ray.get("ran_on"):       # what answered the lines, as the actors said
            echo("ray: lines by actor: " + "; ".join(f"{w}: {n}" for w, n in ray["ran_on"].items()))
    lat = data["latency_ms"]
    if lat["p50"] is None:
        echo("batch latency: none (no input of this run succeeded)")
    else:
        echo(f"batch latency (result latency_ms: from its batch's start, batches of up to {data['batch_size']}): "
             f"p50 {lat['p50']} ms, p99 {lat['p99']} ms")
