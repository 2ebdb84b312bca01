"""``edge-infer import``: wrap an existing quantized TFLite model into an artifact."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .cli_common import _guard


@click.command("import")
@click.argument("model", type=click.Path())
@click.option("-o", "--out", required=True, type=click.Path(), help="Artifact directory to write.")
@click.option("--task", default="image-classification", show_default=True,
              type=click.Choice(["image-classification", "tensors"]))
@click.option("--labels", type=click.Path(), help="labels.txt, one label a line.")
@click.option("--label-offset", type=int, default=0, show_default=True,
              help="Outputs before the first label (a background class missing from the file).")
@click.option("--resize", default="bilinear-half-pixel", show_default=True,
              type=click.Choice(["bilinear-half-pixel", "bilinear", "nearest", "bicubic"]))
@click.option("--name", help="Model name (default: file stem).")
@click.option("--model-version", default="1", show_default=True)
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@click.option("--json", "as_json", is_flag=True)
@_guard
def import_cmd(model, out, task, labels, label_offset, resize, name, model_version, force, as_json):
    """Wrap MODEL (.tflite, quantized) into an artifact: hashed, I/O and pre-processing recorded."""
    from edge_runtime.converters.tflite_import import import_tflite

    man = import_tflite(Path(model), Path(out), task=task, labels=Path(labels) if labels else None,
                        label_offset=label_offset, name=name, version=model_version, force=force, resize=resize)
    v = man["variants"][0]
    b = v["buckets"][0]
    summary = {"artifact": str(out), "target": v["target"], "input": b["inputs"][0], "outputs": b["outputs"],
               "preprocess": man["preprocess"], "postprocess": man["postprocess"]}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        i = b["inputs"][0]
        click.echo(f"{v['target']}: input {i['name']} {i['dtype']}{i['shape']}"
                   f"{' (+%d more)' % (len(b['inputs']) - 1) if len(b['inputs']) > 1 else ''}, "
                   f"{len(b['outputs'])} output(s); wrote {out}")
