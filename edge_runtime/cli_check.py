"""``edge-infer check``: static pre-flight of a ``.tflite`` model for a target (no compiler, no interpreter).

- ``--target edgetpu``: per-op Edge TPU compatibility, the TPU/CPU split, the
  first unsupported op, parameter size against the on-chip memory.
- ``--target tflite-int8``: the inspection summary and whether the graph is all-int8; a model LiteRT
  cannot run on a CPU at all (compiled for the Edge TPU, a custom op with no LiteRT kernel, Flex ops)
  is not, whatever its dtypes.

Exit codes: 0 fully mappable / all-int8 (and loadable), 1 not (the report is still printed),
3 unreadable or malformed model (``ArtifactError``).
"""

from __future__ import annotations

import json
import sys

import click

from .cli_common import _guard


# custom ops LiteRT's built-in resolver has kernels for (tensorflow/lite/kernels/register.cc)
LITERT_CUSTOM_OPS = frozenset({"TFLite_Detection_PostProcess", "Mfcc", "AudioSpectrogram"})


def cpu_blockers(summary: dict) -> list[str]:
    """Why LiteRT on a CPU (the ``tflite-int8`` target) cannot run the model at all, whatever its dtypes:
    an Edge TPU compiled model (its ``edgetpu-custom-op`` runs only through libedgetpu), a custom op
    with no LiteRT kernel, a Flex op (TensorFlow kernels: no Flex delegate in LiteRT)."""
    out = []
    if summary.get("edgetpu_compiled"):
        out.append("compiled for the Edge TPU: its edgetpu-custom-op runs only through libedgetpu on an Edge TPU, "
                   "never on the CPU (check it with --target edgetpu; use the uncompiled model for tflite-int8)")
    other = [c for c in summary.get("custom_ops") or () if c != "edgetpu-custom-op" and c not in LITERT_CUSTOM_OPS]
    if other:
        out.append(f"custom op(s) with no LiteRT kernel: {', '.join(other)}")
    if summary.get("flex_ops"):
        out.append(f"Flex (TensorFlow) op(s), which LiteRT cannot run: {', '.join(summary['flex_ops'])}")
    return out


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:.2f} MiB"


def _print_edgetpu(model: str, ins: dict, rep: dict) -> None:
    s = ins["summary"]
    click.echo(f"model: {model} ({_mib(ins['size_bytes'])}, {ins['subgraph_count']} subgraph(s), "
               f"{rep['op_count']} ops)")
    width = max([len(k) for k in rep["split"]] + [2])
    click.echo(f"  {'op':<{width}}  count    tpu    cpu")
    for name, c in rep["split"].items():
        click.echo(f"  {name:<{width}}  {c['tpu'] + c['cpu']:5d}  {c['tpu']:5d}  {c['cpu']:5d}")
    click.echo(f"split: {rep['tpu_ops']} op(s) on the Edge TPU, {rep['cpu_ops']} on the CPU"
               + (f" ({rep['boundary_ops']} float I/O conversion)" if rep["boundary_ops"] else ""))
    f = rep["first_unsupported"]
    click.echo("first unsupported: " + (f"#{f['index']} {f['op']}: {f['reason']}" if f else "none"))
    label = "compiled payload" if rep["edgetpu_compiled"] else "parameters on the Edge TPU"
    click.echo(f"{label}: {_mib(rep['tpu_parameter_bytes'])} (model constants {_mib(s['parameter_bytes'])}; "
               f"on-chip {_mib(rep['on_chip_bytes'])}{', EXCEEDED' if rep['exceeds_on_chip_memory'] else ''})")
    for w in rep["warnings"]:
        click.echo(f"warning: {w}")
    click.echo(f"verdict: {rep['verdict']}")


def _print_int8(model: str, ins: dict, blockers: list[str]) -> None:
    s = ins["summary"]
    click.echo(f"model: {model} ({_mib(ins['size_bytes'])}, {ins['subgraph_count']} subgraph(s), {s['op_count']} ops)")
    for name, n in s["op_counts"].items():
        click.echo(f"  {name:<32} {n:5d}")
    for sg in ins["subgraphs"][:1]:
        for kind in ("inputs", "outputs"):
            for t in sg[kind]:
                q = t.get("quantization")
                qs = f" scale {q['scale'][0]:.6g} zero_point {q['zero_point'][0]}" if q and q["scale"] else ""
                dyn = f" signature {t['shape_signature']}" if t["dynamic"] else ""
                click.echo(f"{kind[:-1]}: {t['name']} {t['dtype']} {t['shape']}{dyn}{qs}")
    click.echo(f"activation dtypes: {', '.join(s['activation_dtypes']) or '-'}; "
               f"constant dtypes: {', '.join(s['constant_dtypes']) or '-'}")
    click.echo(f"parameters: {_mib(s['parameter_bytes'])}")
    if s["dynamic"]:
        click.echo(f"warning: dynamic dims in {len(s['dynamic_tensors'])} tensor(s), e.g. "
                   f"{s['dynamic_tensors'][0]['name']} {s['dynamic_tensors'][0]['shape_signature']}")
    for e in s["quantization_errors"][:3]:
        click.echo(f"error: tensor {e['name'] or '#' + str(e['tensor'])}: {e['reason']} (TFLite refuses to load this)")
    if s["custom_ops"] or s["flex_ops"]:
        click.echo(f"custom ops: {', '.join(s['custom_ops'] + s['flex_ops'])}")
    bad = s["non_int8_tensors"]
    extra = ""
    if bad:
        kind = "variable state " if bad[0].get("variable") else ("constant " if bad[0]["constant"] else "")
        extra = f" (e.g. {kind}{bad[0]['name'] or '#' + str(bad[0]['tensor'])} is {bad[0]['dtype']})"
    click.echo(f"all-int8: {'yes' if s['all_int8'] else 'no'}{extra}")
    for b in blockers:
        click.echo(f"error: {b}")
    if blockers:
        click.echo("verdict: cannot run on the tflite-int8 target (LiteRT on a CPU)")


@click.command()
@click.argument("model", type=click.Path())
@click.option("--target", type=click.Choice(["edgetpu", "tflite-int8"]), default="edgetpu", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@_guard
def check(model, target, as_json):
    """Statically check MODEL (.tflite) for TARGET without a compiler or interpreter.

    Exit 0 when the model maps fully (edgetpu) or is all-int8 (tflite-int8), 1 when
    not (the report is still printed), 3 when it cannot be read.

    \b
    Examples:
      edge-infer check --target edgetpu mobilenet_v2_1.0_224_quant.tflite
      edge-infer check --target tflite-int8 model.tflite --json
    """
    from edge_runtime.converters.tflite_inspect import inspect_tflite

    ins = inspect_tflite(model)
    if target == "edgetpu":
        from edge_runtime.converters.edgetpu_report import edgetpu_report

        rep = edgetpu_report(ins)
        ok = rep["fully_mappable"]
        if as_json:
            click.echo(json.dumps({"model": model, "target": target, "summary": ins["summary"], "report": rep},
                                  indent=2))
        else:
            _print_edgetpu(model, ins, rep)
    else:
        blockers = cpu_blockers(ins["summary"])
        ok = ins["summary"]["all_int8"] and not ins["summary"]["quantization_errors"] and not blockers
        if as_json:
            click.echo(json.dumps({"model": model, "target": target, "ok": bool(ok), "blockers": blockers,
                                   "inspection": ins}, indent=2))
        else:
            _print_int8(model, ins, blockers)
    sys.stdout.flush()
    if not ok:
        click.get_current_context().exit(1)
