"""``edge-infer``: convert, infer, eval, inspect, import, check, devices, doctor.

Exit codes: 0 ok, 1 unexpected, 2 input (the caller's), 3 artifact,
4 device, 5 timeout, 6 runtime failure, 7 parity under budget. Errors print
one line without a traceback unless ``--debug``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .cli_common import _guard
from .errors import InputError
from .limits import DEFAULT_LIMITS, json_depth


def _device_options(pairs) -> dict:
    """``--device-option KEY=VALUE`` (repeatable); values parse as JSON when they can."""
    out = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--device-option wants KEY=VALUE, got {pair!r}", code="input_invalid")
        try:
            out[key.strip()] = json.loads(value)
        except ValueError:
            out[key.strip()] = value
    return out


_DEVICE_OPTION_HELP = "Backend option KEY=VALUE, repeatable (openvino: precision=f32|bf16, cache=false, threads=N)."


def _emit(data, as_json: bool, human):
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        human(data)


@click.group()
@click.option("--debug", is_flag=True, help="Show tracebacks.")
@click.version_option(package_name="edge-runtime")
def main(debug):
    """Int8 edge inference: convert models, verify artifacts, run them."""
    import logging

    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def _read_json_input(path: str):
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}", code="input_file_unreadable") from None
    if size > DEFAULT_LIMITS.max_request_bytes:
        raise InputError(f"{path} is {size} bytes, over the request limit of {DEFAULT_LIMITS.max_request_bytes}",
                         code="input_too_large")
    text = p.read_bytes()
    # refuse deep nesting before json builds it (json recursion would crash)
    depth = cur = 0
    for ch in text:
        if ch in b"[{":
            cur += 1
            depth = max(depth, cur)
            if depth > DEFAULT_LIMITS.max_json_depth:
                raise InputError(f"JSON nested deeper than {DEFAULT_LIMITS.max_json_depth} levels",
                                 code="input_too_deep")
        elif ch in b"]}":
            cur -= 1
    try:
        data = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path} is not valid JSON: {exc}", code="input_bad_json") from None
    json_depth(data, DEFAULT_LIMITS.max_json_depth)
    if isinstance(data, dict) and set(data) == {"inputs"}:
        data = data["inputs"]
    return data


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--text", help="Text input.")
@click.option("--image", type=click.Path(), help="Image file (PNG/JPEG/BMP).")
@click.option("--input", "input_file", type=click.Path(), help="JSON file: {\"text\": ...} or named tensors.")
@click.option("--device", default="auto", show_default=True, help="auto, onnxruntime, onnxruntime:cuda, ...")
@click.option("--require-device", is_flag=True, help="Fail instead of falling back to another device.")
@click.option("--device-option", "device_option", multiple=True, help=_DEVICE_OPTION_HELP)
@click.option("--deadline-ms", type=int, help="Per-call deadline.")
@click.option("--json", "as_json", is_flag=True)
@_guard
def infer(artifact, text, image, input_file, device, require_device, device_option, deadline_ms, as_json):
    """Run one input through ARTIFACT."""
    given = [x for x in (text, image, input_file) if x is not None]
    if len(given) != 1:
        raise InputError("give exactly one of --text, --image, --input", code="input_missing")
    if text is not None:
        raw = text
    elif image is not None:
        raw = image
    else:
        raw = _read_json_input(input_file)
    from .runtime import load

    with load(artifact, device=device, strict=require_device, device_options=_device_options(device_option)) as rt:
        task = rt.artifact.task
        if (text is not None) != task.startswith("text-") or (image is not None) != (task == "image-classification"):
            flag = "--text" if text is not None else ("--image" if image is not None else "--input")
            if flag != "--input" or task == "image-classification":
                raise InputError(f"{flag} does not fit a {task} artifact", code="input_wrong_type")
        res = rt.infer(raw, deadline_ms=deadline_ms)

    def human(d):
        click.echo(f"prediction: {d['prediction']}")
        for k, v in list(d["scores"].items())[:5]:
            click.echo(f"  {k}: {v:.4f}")
        if d["embedding"] is not None:
            click.echo(f"embedding: dim {len(d['embedding'])}, first {[round(x, 4) for x in d['embedding'][:4]]}")
        click.echo(f"latency {d['latency_ms']:.2f} ms on {d['device']} ({d['target']}, bucket {d['bucket']}"
                   f"{', truncated' if d['truncated'] else ''}) model {d['model']} v{d['version']} "
                   f"trace {d['trace_id']}")

    _emit(res.to_dict(), as_json, human)


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--json", "as_json", is_flag=True)
@_guard
def inspect(artifact, as_json):
    """Manifest summary, verification result and parity."""
    from .artifact import load_artifact
    from .selection import check_targets

    art = load_artifact(artifact)
    check_targets(art.targets())
    man = art.manifest
    data = {"verified": art.verified, "files": len(man["files"]), "model": man["model"], "task": man["task"],
            "variants": [{"target": v["target"], "buckets": [b["name"] for b in v["buckets"]],
                          "quantization": v["quantization"], "parity": v["parity"], "toolchain": v["toolchain"]}
                         for v in man["variants"]],
            "preprocess": man["preprocess"], "postprocess": man["postprocess"], "limits": man["limits"]}

    def human(d):
        m = d["model"]
        click.echo(f"{m['name']} v{m['version']} ({d['task']}): {d['files']} files, all sha256 verified")
        for v in d["variants"]:
            q, p = v["quantization"], v["parity"]
            click.echo(f"  {v['target']}: buckets {', '.join(v['buckets'])}; {q['scheme']} w:{q['weights']} "
                       f"a:{q['activations']}; parity {p['metric']} {p['value']} "
                       f"(min {p.get('min', '-')}, {p['samples']} samples, budget {p.get('budget', '-')})")

    _emit(data, as_json, human)


from .cli_convert import convert  # noqa: E402  (registers the command)

main.add_command(convert)
from .cli_import import import_cmd  # noqa: E402
main.add_command(import_cmd)
from .cli_check import check  # noqa: E402
main.add_command(check)
from .cli_devices import devices, doctor  # noqa: E402
main.add_command(devices)
main.add_command(doctor)
from .cli_score import score_cmd  # noqa: E402
main.add_command(score_cmd)
from .cli_bench import bench_cmd  # noqa: E402
main.add_command(bench_cmd)
from .cli_eval import eval_cmd  # noqa: E402
main.add_command(eval_cmd)

if __name__ == "__main__":
    main()
