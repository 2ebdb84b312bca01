"""``edge-infer convert``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from .cli_common import _guard
from .errors import InputError


def _json_arg(value, what):
    if value is None:
        return None
    p = Path(value)
    try:
        text = p.read_text(encoding="utf-8") if p.is_file() else value
        return json.loads(text)
    except (OSError, ValueError) as exc:
        raise InputError(f"{what}: not a JSON file or JSON text: {exc}", code="input_bad_json") from None


@click.command()
@click.argument("source", type=click.Path())
@click.option("-o", "--out", required=True, type=click.Path(), help="Artifact directory to write.")
@click.option("--task", required=True, type=click.Choice(["text-classification", "text-embedding",
                                                          "image-classification", "tensors"]))
@click.option("--target", "targets", multiple=True, default=["onnx-int8"], show_default=True)
@click.option("--calibration", required=True, type=click.Path(), help="txt/JSONL (text), image folder/.npy, .npz.")
@click.option("--labels", type=click.Path(), help="labels.txt, one label a line.")
@click.option("--tokenizer", type=click.Path(), help="tokenizer.json (text tasks).")
@click.option("--buckets", default="64,128", show_default=True, help="Sequence-length buckets (text tasks).")
@click.option("--min-parity", type=float, help="Parity budget (default 0.99 top-1 agreement / mean cosine).")
@click.option("--parity-data", type=click.Path(), help="Held-out samples for parity (default: a split of --calibration).")
@click.option("--preprocess", help="Image pre-processing JSON (file or text): size, channels, mean, std, layout.")
@click.option("--recipe", help="Quantization recipe (cnn, transformer, ...).")
@click.option("--recipe-override", "recipe_overrides", help="JSON object overriding recipe keys.")
@click.option("--torch-source", type=click.Path(),
              help="PyTorch twin of SOURCE: TorchScript or a torch.export program (.pt2); coreml converts from it.")
@click.option("--name", help="Model name (default: source file stem).")
@click.option("--model-version", default="1", show_default=True)
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest summary as JSON.")
@_guard
def convert(source, out, task, targets, calibration, labels, tokenizer, buckets, min_parity, parity_data,
            preprocess, recipe, recipe_overrides, torch_source, name, model_version, force, as_json):
    """Convert SOURCE (ONNX) to an int8 static-shape artifact."""
    from edge_runtime.converters.pipeline import ConvertRequest, convert as run_convert
    from edge_runtime.errors import ParityError

    try:
        bucket_list = [int(b) for b in buckets.split(",") if b.strip()]
    except ValueError:
        raise InputError(f"--buckets must be integers, got {buckets!r}", code="input_invalid") from None
    req = ConvertRequest(
        source=Path(source), out=Path(out), task=task, targets=list(targets), calibration=Path(calibration),
        labels=Path(labels) if labels else None, tokenizer=Path(tokenizer) if tokenizer else None,
        buckets=bucket_list, min_parity=min_parity, parity_data=Path(parity_data) if parity_data else None,
        preprocess=_json_arg(preprocess, "--preprocess"), name=name, version=model_version, recipe=recipe,
        recipe_overrides=_json_arg(recipe_overrides, "--recipe-override"), force=force,
        torch_source=Path(torch_source) if torch_source else None)
    t0 = time.perf_counter()
    quiet = as_json

    def progress(step):
        if not quiet:
            click.echo(f"[{time.perf_counter() - t0:6.1f}s] {step}", err=True)

    try:
        manifest = run_convert(req, progress)
    except ParityError as exc:
        for v in exc.details.get("variants", []):
            p = v["parity"]
            click.echo(f"{v['target']}: parity {p['metric']} = {p['value']:.4f} (budget {p['budget']}, "
                       f"{p['samples']} samples)", err=True)
        raise
    summary = {"artifact": str(out), "model": manifest["model"]["name"],
               "variants": [{"target": v["target"], "buckets": [b["name"] for b in v["buckets"]],
                             "parity": {k: v["parity"].get(k) for k in ("metric", "value", "min", "samples", "budget")}}
                            for v in manifest["variants"]],
               "skipped_targets": manifest.get("skipped_targets", []),
               "seconds": round(time.perf_counter() - t0, 1)}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        for v in summary["variants"]:
            p = v["parity"]
            extra = f", min {p['min']:.4f}" if p.get("min") is not None else ""
            if p.get("value") is None:   # recorded as not measured (coreml off macOS): never a figure
                click.echo(f"{v['target']}: buckets {', '.join(v['buckets'])}; parity not measured: "
                           f"{manifest_parity(manifest, v['target']).get('not_measured', '?')}")
                continue
            on = manifest_parity(manifest, v["target"]).get("measured_on")
            click.echo(f"{v['target']}: buckets {', '.join(v['buckets'])}; parity {p['metric']} {p['value']:.4f}"
                       f"{extra} on {p['samples']} held-out samples (budget {p['budget']})"
                       + (f", measured on the {on}" if on else ""))
        for skip in manifest.get("skipped_targets", []):
            click.echo(f"{skip['target']}: skipped: {skip['reason']}")
        click.echo(f"wrote {out} in {summary['seconds']} s")
    sys.stdout.flush()


def manifest_parity(manifest: dict, target: str) -> dict:
    return next((v["parity"] for v in manifest["variants"] if v["target"] == target), {})
