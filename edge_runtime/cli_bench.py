"""``edge-infer bench``: runtime vs raw backend figures for one artifact, with ratios."""

from __future__ import annotations

import json

import click

from . import error_codes as ec
from .cli_common import _guard, device_flags, device_options


@click.command("bench")
@click.argument("artifact", type=click.Path())
@device_flags()
@click.option("--calls", default=50, show_default=True, type=int, help="Calls per round (latency, throughput).")
@click.option("--repeats", default=3, show_default=True, type=int, help="Rounds; figures are medians over them.")
@click.option("--batch-size", default=32, show_default=True, type=int)
@click.option("--concurrency", default=2, show_default=True, type=int)
@click.option("--no-cold", is_flag=True, help="Skip the cold-start child processes.")
@click.option("--json", "as_json", is_flag=True)
@_guard
def bench_cmd(artifact, device, require_device, device_option, calls, repeats, batch_size, concurrency, no_cold, as_json):
    """Cold start, warm latency per bucket, throughput and peak RSS: ours and the raw backend's.

    \b
    Examples:
      edge-infer bench out/digits-int8
      edge-infer bench out/digits-int8 --device openvino --calls 200 --no-cold --json
      edge-infer bench out/minilm --device-option threads=2 --repeats 5
    """
    from .benchmark import MIN_CALLS, run_bench
    from .errors import InputError

    if calls < 1 or repeats < 1 or batch_size < 1 or concurrency < 1:
        raise InputError("--calls, --repeats, --batch-size and --concurrency must be at least 1", code=ec.INPUT_INVALID)
    res = run_bench(artifact, device, calls=calls, repeats=repeats, batch=batch_size, concurrency=concurrency,
                    cold=not no_cold, device_options=device_options(device_option), strict=require_device)
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    threads = f", {res['threads']} thread{'s' if res['threads'] != 1 else ''}" if res.get("threads") else ""
    raw = f"{res['raw']} on {res.get('raw_device') or '?'}" if res["raw"] else "no raw runner"
    click.echo(f"{res['model']} on {res['device']} ({res['target']}{threads}); raw: {raw}; "
               f"medians of {res['repeats']} rounds x {res['calls']} calls")
    click.echo(f"CPU: {res['cpu']}")
    if res.get("fallback"):
        click.echo(f"note: {res['fallback']}; every figure is {res['device']}'s")
    if res.get("raw_device_differs"):
        click.echo(f"note: {res['raw_device_differs']}")
    click.echo(f"{'figure':<34}{'ours':>12}{'raw':>12}{'ours/raw':>10}")

    def row(name, ours, raw, ratio):
        fmt = lambda v: "-" if v is None else f"{v:.3f}"   # noqa: E731
        click.echo(f"{name:<34}{fmt(ours):>12}{fmt(raw):>12}{fmt(ratio):>10}")

    few: set[str] = set()
    for bucket, e in res["warm_latency"].items():
        for p in ("p50", "p95", "p99"):
            mark = "*" if p in e.get("few_calls_for", ()) else ""
            few.update(e.get("few_calls_for", ()))
            row(f"latency {bucket} {p} (ms){mark}", e["ours_ms"][p], e.get("raw_ms", {}).get(p),
                e.get("ratio", {}).get(p))
    t = res["throughput"]
    row(f"throughput sync ({t['bucket']}, items/s)", t["ours_sync_per_s"], t["raw_sync_per_s"], t["ratio_sync"])
    row(f"throughput async ({t['bucket']}, items/s)", t["ours_async_per_s"], t["raw_async_per_s"], t["ratio_async"])
    c = res.get("cold_start")
    if c and "ours_s" in c:
        row("cold start (s)", c["ours_s"], c.get("raw_s"), c.get("ratio_cold_start"))
        row("peak RSS (MiB)", c["ours_peak_rss_mb"], c.get("raw_peak_rss_mb"), c.get("ratio_peak_rss"))
        if c.get("device_differs"):
            click.echo(f"note: {c['device_differs']}")
    elif c and c.get("skipped"):
        click.echo(f"cold start: skipped ({c['skipped']})")
    if few:
        need = ", ".join(f"{p} >= {MIN_CALLS[p]}" for p in sorted(few))
        click.echo(f"* from {res['calls']} calls a round: too few for this percentile ({need} calls); it reads "
                   "the slowest calls")
    for k in ("ours_sync", "ours_async", "raw_sync", "raw_async"):
        if t.get(f"{k}_failed"):
            click.echo(f"note: throughput {k.replace('_', ' ')}: {t[k + '_failed']} of {t['items']} items failed "
                       "in a round; only the items done are counted")
