"""``edge-infer convert``."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import click

from .cli_common import _guard
from . import error_codes as ec
from .errors import InputError

from edge_runtime.converters.request import (MIN_CALIBRATION_SAMPLES, MIN_PARITY_SAMPLES,  # stdlib-only imports
                                             WARN_CALIBRATION_SAMPLES, WARN_PARITY_SAMPLES)


class TaskName(click.ParamType):
    """A task name, checked against the task registry when the command runs (so a task that a
    plug-in registers through the ``edge_runtime.tasks`` entry points is one), not a fixed
    Choice; ``where`` keeps the tasks a command supports (import: ``Task.importable``)."""

    name = "task"

    def __init__(self, where=None):
        self.where = where

    def names(self) -> list[str]:
        from edge_runtime.models import task_names, tasks_where

        return tasks_where(self.where) if self.where is not None else task_names()

    def get_metavar(self, param, ctx=None) -> str:
        return "[" + "|".join(self.names()) + "]"

    def convert(self, value, param, ctx):
        names = self.names()
        if value in names:
            return value
        self.fail(f"{value!r} is not one of {', '.join(map(repr, names))}.", param, ctx)

    def shell_complete(self, ctx, param, incomplete):
        from click.shell_completion import CompletionItem

        return [CompletionItem(n) for n in self.names() if n.startswith(incomplete)]


def _json_arg(value, what):
    if value is None:
        return None
    p = Path(value)
    try:
        text = p.read_text(encoding="utf-8") if p.is_file() else value
        return json.loads(text)
    except (OSError, ValueError) as exc:
        raise InputError(f"{what}: not a JSON file or JSON text: {exc}", code=ec.INPUT_BAD_JSON) from None


@click.command()
@click.argument("source", type=click.Path())
@click.option("-o", "--out", required=True, type=click.Path(), help="Artifact directory to write.")
@click.option("--task", required=True, type=TaskName(),
              help="The task: a registered one (the built-ins, and any a plug-in adds).")
@click.option("--target", "targets", multiple=True, default=["onnx-int8"], show_default=True,
              help="onnx-int8, openvino, tflite-int8, edgetpu, coreml, onnx-fp32 (repeatable: one variant each).")
@click.option("--with-fp32", is_flag=True, help="Also an onnx-fp32 variant (the float model, static shapes): never "
              "chosen by policy, only by `edge-infer tune` where int8 is slower than float on the CPU it measures.")
@click.option("--calibration", required=True, type=click.Path(), help="txt/JSONL (text), image folder/.npy, .npz.")
@click.option("--labels", type=click.Path(), help="labels.txt, one label a line.")
@click.option("--tokenizer", type=click.Path(), help="tokenizer.json (text tasks).")
@click.option("--buckets", help="Sequence-length buckets, for tasks with sequence buckets only: text (default 64,128).")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=D1,D2,...",
              help="Static shape for an input with dynamic dims beyond the batch (repeatable).")
@click.option("--min-parity", type=float, help="Parity budget in (0, 1] (default 0.99 top-1 agreement / mean cosine).")
@click.option("--parity-data", type=click.Path(), help="Held-out samples for parity (default: a split of --calibration).")
@click.option("--min-calibration-samples", type=int, default=MIN_CALIBRATION_SAMPLES, show_default=True,
              help=f"Refuse fewer usable calibration samples (warns under {WARN_CALIBRATION_SAMPLES}).")
@click.option("--min-parity-samples", type=int, default=MIN_PARITY_SAMPLES, show_default=True,
              help=f"Refuse fewer usable held-out parity samples (warns under {WARN_PARITY_SAMPLES}).")
@click.option("--allow-few-samples", is_flag=True, help="Under those minimums: warn and convert anyway (recorded).")
@click.option("--probe-samples", type=click.IntRange(0, 10000), default=32, show_default=True,
              help="Held-out inputs kept in the artifact with their fp32 results, for `edge-infer verify` and "
                   "`tune` on the target (0: none).")
@click.option("--probe-max-bytes", type=click.IntRange(1, 1 << 30), default=4 * 1024 * 1024, show_default=True,
              help="Cap on the probe set's size (fewer samples are kept when they are big).")
@click.option("--allow-skip", is_flag=True,
              help="A target whose toolchain is missing here (edgetpu without edgetpu_compiler): skip it and build "
                   "its fallback (tflite-int8), recorded in skipped_targets, instead of failing.")
@click.option("--preprocess", help="Image pre-processing JSON (file or text): size, channels, scale, mean, std, "
                                   "layout, resize, input. An object detector's defaults to its family's usual "
                                   "input (as import's), each key stated here winning.")
@click.option("--postprocess", help="Post-processing JSON (file or text), for tasks that decode outputs: an "
                                    "object detector's family and parameters, thresholds ({\"family\": \"yolox\", "
                                    "\"score_threshold\": 0.3}); a text embedder's pooling ({\"pooling\": "
                                    "\"cls\", \"normalize\": false}: mean, cls or none; normalised by default).")
@click.option("--family", help="Object detection: the decode family (yolo, yolox, gfl, ssd-postprocess); "
                               "the same as --postprocess '{\"family\": ...}'.")
@click.option("--recipe", help="Quantization recipe (cnn, transformer, ...), target=recipe pairs, or auto: each "
                               "target's recipes tried fastest first, the first that meets the budget kept.")
@click.option("--recipe-override", "recipe_overrides", help="JSON object overriding recipe keys.")
@click.option("--torch-source", type=click.Path(),
              help="PyTorch twin of SOURCE: TorchScript or a torch.export program (.pt2); coreml converts from it.")
@click.option("--name", help="Model name (default: source file stem).")
@click.option("--model-version", default="1", show_default=True)
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest summary as JSON.")
@_guard
def convert(source, out, task, targets, calibration, labels, tokenizer, buckets, input_shapes, min_parity,
            parity_data, min_calibration_samples, min_parity_samples, allow_few_samples, probe_samples,
            probe_max_bytes, allow_skip, preprocess, postprocess, family, recipe, recipe_overrides, torch_source, name, model_version,
            force, as_json, with_fp32=False):
    """Convert SOURCE (a float ONNX model) to an int8 static-shape artifact.

    Parity against the fp32 source is measured on held-out samples and gated:
    under the budget the convert fails (exit 7) and writes nothing. Bad
    requests exit 2 with one line naming what to do. A source at opset < 13 is
    upgraded (recorded in the manifest); an already-quantized ONNX or a TFLite
    model is refused (`edge-infer import` takes quantized .tflite models).

    \b
    Examples:
      edge-infer convert models/zoo/digits-cnn/model.onnx -o out/digits-int8 \\
          --task image-classification --target onnx-int8 --target openvino \\
          --calibration models/zoo/digits-cnn/calibration \\
          --parity-data models/zoo/digits-cnn/held_out \\
          --labels models/zoo/digits-cnn/labels.txt \\
          --preprocess models/zoo/digits-cnn/preprocess.json
      edge-infer convert model.onnx -o out/t --task tensors --calibration feeds.npz
          (feeds.npz: numpy.savez(F, input_name=array[N, ...]), one array per input)
    """
    from edge_runtime.converters.convert_inputs import defaults_line
    from edge_runtime.converters.pipeline import convert as run_convert
    from edge_runtime.converters.request import ConvertRequest
    from edge_runtime.errors import ParityError

    bucket_list = None
    if buckets is not None:
        try:
            bucket_list = [int(b) for b in buckets.split(",") if b.strip()]
        except ValueError:
            raise InputError(f"--buckets must be integers, got {buckets!r}", code=ec.CONVERT_BUCKETS_INVALID) from None
    post = _json_arg(postprocess, "--postprocess")
    if post is not None and not isinstance(post, dict):
        raise InputError(f"--postprocess must be a JSON object, got {type(post).__name__}",
                         code=ec.CONVERT_REQUEST_INVALID)
    if family:
        post = {**(post or {}), "family": family}
    if with_fp32 and "onnx-fp32" not in targets:
        targets = (*targets, "onnx-fp32")
    req = ConvertRequest(
        source=Path(source), out=Path(out), task=task, targets=list(targets), calibration=Path(calibration),
        labels=Path(labels) if labels else None, tokenizer=Path(tokenizer) if tokenizer else None,
        buckets=bucket_list, min_parity=min_parity, parity_data=Path(parity_data) if parity_data else None,
        preprocess=_json_arg(preprocess, "--preprocess"), postprocess=post, name=name, version=model_version, recipe=recipe,
        recipe_overrides=_json_arg(recipe_overrides, "--recipe-override"), force=force,
        torch_source=Path(torch_source) if torch_source else None, input_shapes=_shapes(input_shapes),
        min_calibration_samples=min_calibration_samples, min_parity_samples=min_parity_samples,
        allow_few_samples=allow_few_samples, allow_skip=allow_skip, probe_samples=probe_samples,
        probe_max_bytes=probe_max_bytes)
    t0 = time.perf_counter()
    quiet = as_json

    def progress(step):
        if not quiet or step.startswith("warning:"):
            click.echo(f"[{time.perf_counter() - t0:6.1f}s] {step}", err=True)

    try:
        with contextlib.redirect_stdout(sys.stderr):   # toolchains print (ORT's calibrators): stdout stays ours
            manifest = run_convert(req, progress)
    except ParityError as exc:
        for v in exc.details.get("variants", []):
            p = v["parity"]
            if p.get("value") is None:      # not measured (coreml off macOS) or not judged: never a figure
                click.echo(f"{v['target']}: parity {p['metric']} "
                           f"{_no_figure(p)}", err=True)
            else:
                click.echo(f"{v['target']}: parity {p['metric']} = {p['value']:.4f} (budget {p['budget']}, "
                           f"{p['samples']} samples{_compared(p)})", err=True)
            for line in trial_lines(v.get("recipe_trials") or []):
                click.echo(line, err=True)
        raise
    summary = {"artifact": str(out), "model": manifest["model"]["name"],
               "variants": [{"target": v["target"], "buckets": [b["name"] for b in v["buckets"]],
                             "recipe": v["quantization"].get("recipe"),
                             "parity": {**{k: v["parity"].get(k) for k in ("metric", "value", "min", "samples", "budget")},
                                        **{k: v["parity"][k] for k in ("samples_compared",) if k in v["parity"]}},
                             # a figure from few samples says so wherever it is shown, as the manifest does
                             **({"parity_warning": "; ".join(v["parity"][k] for k in ("warning", "compared_warning")
                                                             if v["parity"].get(k))}
                                if v["parity"].get("warning") or v["parity"].get("compared_warning") else {}),
                             **({"recipe_trials": v["recipe_trials"]} if v.get("recipe_trials") else {})}
                            for v in manifest["variants"]],
               "skipped_targets": manifest.get("skipped_targets", []),
               "probe": {k: manifest.get("probe", {}).get(k) for k in ("samples", "bytes", "max_bytes")},
               **({"preprocess_defaults": manifest["preprocess"]["defaults"]}
                  if isinstance((manifest.get("preprocess") or {}).get("defaults"), dict) else {}),
               "seconds": round(time.perf_counter() - t0, 1)}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        filled = defaults_line(manifest.get("preprocess") or {})
        if filled:        # a detector's family defaults, what calibration and parity ran on
            click.echo(filled)
        for v in summary["variants"]:
            p = v["parity"]
            extra = f", min {p['min']:.4f}" if p.get("min") is not None else ""
            if p.get("value") is None:   # recorded as not measured (coreml off macOS) or not judged: never a figure
                click.echo(f"{v['target']}: buckets {', '.join(v['buckets'])}; parity "
                           f"{_no_figure(manifest_parity(manifest, v['target']))}")
                continue
            on = manifest_parity(manifest, v["target"]).get("measured_on")
            click.echo(f"{v['target']}: buckets {', '.join(v['buckets'])}; parity {p['metric']} {p['value']:.4f}"
                       f"{extra} on {p['samples']} held-out samples" + _compared(p) + f" (budget {p['budget']})"
                       + (f", measured on {on if on.startswith('the ') else 'the ' + on}" if on else "")
                       + (f"; warning: {v['parity_warning']}" if v.get("parity_warning") else ""))
            for line in trial_lines(v.get("recipe_trials") or []):
                click.echo(line)
        for skip in manifest.get("skipped_targets", []):
            click.echo(f"{skip['target']}: skipped: {skip['reason']}")
        if manifest.get("probe"):
            pr = manifest["probe"]
            click.echo(f"probe set: {pr['samples']} held-out samples with their fp32 results ({pr['bytes']} bytes): "
                       f"`edge-infer verify {out}` measures parity on the target")
        click.echo(f"wrote {out} in {summary['seconds']} s")
    sys.stdout.flush()


def _shapes(pairs) -> dict | None:
    out = {}
    for pair in pairs:
        name, sep, dims = pair.partition("=")
        try:
            shape = [int(d) for d in dims.split(",")]
        except ValueError:
            shape = None
        if not sep or not name.strip() or not shape or min(shape) < 1:
            raise InputError(f"--input-shape {pair!r}: expected NAME=D1,D2,... (positive integers)",
                             code=ec.CONVERT_SHAPE_INVALID)
        out[name.strip()] = shape
    return out or None


def trial_lines(trials: list[dict]) -> list[str]:
    """One line per ``--recipe auto`` trial: its recipe, figures and fate."""
    out = []
    for k, t in enumerate(trials, 1):
        opts = "".join(f" {key}={val}" for key, val in (t.get("overrides") or {}).items())
        head = f"  recipe auto {k}/{len(trials)}: {t.get('recipe') or 'default'}{opts}"
        if "error" in t:
            out.append(f"{head}: not built: {t['error']}")
            continue
        value = ("not judged" if t.get("not_judged") else "not measured") if t.get("parity") is None \
            else f"{t['parity']:.4f}"
        fate = ("kept" if t.get("kept") else "") + ("" if t.get("passed") is not False else
                                                   (" (under budget)" if t.get("kept") else f"under budget {t['budget']}"))
        ms = f", {t['device_ms_median']} ms" if t.get("device_ms_median") is not None else ""
        out.append(f"{head}: parity {value}{ms}, {t.get('seconds')} s: {fate.strip() or 'passed'}")
    return out


def _compared(parity: dict) -> str:
    """", N with a detection" where a detector's F1 is over fewer held-out samples than it was given."""
    n = parity.get("samples_compared")
    return f", {n} with a detection" if isinstance(n, int) and n != parity.get("samples") else ""


def _no_figure(parity: dict) -> str:
    """A parity record without a figure, said: not measured here, or measured and not judged (a
    detector's F1 over no box)."""
    if parity.get("not_judged"):
        return f"not judged: {parity['not_judged']}"
    return f"not measured: {parity.get('not_measured', '?')}"


def manifest_parity(manifest: dict, target: str) -> dict:
    return next((v["parity"] for v in manifest["variants"] if v["target"] == target), {})
