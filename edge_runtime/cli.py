"""``edge-infer``: convert, infer, eval, inspect, import, check, devices, doctor.

Exit codes: 0 ok, 1 unexpected, 2 input (the caller's), 3 artifact,
4 device, 5 timeout, 6 runtime failure, 7 parity under budget. Errors print
one line without a traceback unless ``--debug`` (before or after the
subcommand); under ``--json`` the error is also printed on stdout as
``{"error": {type, code, message, details}}`` (see ``cli_common``).

``infer`` takes text from ``--text S``, ``--text-file F`` or stdin (``--text -``,
``--text-file -``), an image, or ``--input`` as JSON, ``.npz`` (named arrays) or
``.npy`` (one array); ``--limit KEY=VALUE`` lowers a per-call limit (never above
the artifact's own). Vision results print as tables (detections: label, score,
box; keypoints: name, x, y, score; a segmentation: each class's pixel share);
``--draw OUT.png`` (with ``--image``) writes the image with the result drawn
on it (``draw.py``). Under ``--json`` a segmentation mask is summarised (shape
and per-class pixel counts), not listed pixel by pixel.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .cli_common import LazyGroup, _guard, device_flags, device_options, emit
from . import error_codes as ec
from .errors import InputError
from .limits import DEFAULT_LIMITS, Limits, json_depth


# every subcommand but infer and inspect lives in its own module, imported when it is used
COMMANDS = {"convert": ".cli_convert:convert", "import": ".cli_import:import_cmd", "check": ".cli_check:check",
            "devices": ".cli_devices:devices", "doctor": ".cli_devices:doctor", "score": ".cli_score:score_cmd",
            "bench": ".cli_bench:bench_cmd", "eval": ".cli_eval:eval_cmd", "verify": ".cli_verify:verify",
            "tune": ".cli_verify:tune", "diff": ".cli_shadow:diff_cmd", "shadow": ".cli_shadow:shadow_cmd",
            "serve": ".cli_serve:serve"}


@click.group(cls=LazyGroup, lazy=COMMANDS)
@click.option("--debug", is_flag=True, help="Show tracebacks (accepted before or after the subcommand).")
@click.version_option(package_name="edge-runtime")
def main(debug):
    """Int8 edge inference: convert models, verify artifacts, run them."""
    import logging

    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def _limit_overrides(pairs) -> dict:
    """``--limit KEY=VALUE`` (repeatable): per-call limits, checked for syntax and known
    keys here and, once the artifact is loaded, never above its own limits."""
    out = {}
    known = sorted(Limits().to_dict())
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InputError(f"--limit wants KEY=VALUE, got {pair!r} (valid keys: {', '.join(known)})",
                             code=ec.INPUT_INVALID)
        if key not in known:
            raise InputError(f"unknown limit {key!r} (valid keys: {', '.join(known)})", code=ec.LIMIT_UNKNOWN)
        try:
            out[key] = int(value.strip())
        except ValueError:
            raise InputError(f"limit {key} must be a positive integer, got {value!r}", code=ec.LIMIT_INVALID) from None
    Limits().merged(out)            # positive integers only
    return out


def _file_size(path: str, lim: Limits) -> int:
    try:
        size = Path(path).stat().st_size
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}", code=ec.INPUT_FILE_UNREADABLE) from None
    if size > lim.max_request_bytes:
        raise InputError(f"{path} is {size} bytes, over the request limit of {lim.max_request_bytes}",
                         code=ec.INPUT_TOO_LARGE, limit=lim.max_request_bytes)
    return size


def _read_text(source: str, lim: Limits) -> str:
    """``--text-file F`` or ``-`` (stdin): UTF-8, at most the request limit read (a longer
    stream is refused without reading the rest); one trailing newline is dropped. The
    character limit is the runtime's, as for ``--text``."""
    name = "stdin" if source == "-" else source
    cap = lim.max_request_bytes
    try:
        if source == "-":
            data = sys.stdin.buffer.read(cap + 1)
        else:
            with open(source, "rb") as fh:
                data = fh.read(cap + 1)
    except OSError as exc:
        raise InputError(f"cannot read {name}: {exc.strerror or exc}", code=ec.INPUT_FILE_UNREADABLE) from None
    if len(data) > cap:
        raise InputError(f"text from {name} is over the request limit of {cap} bytes", code=ec.INPUT_TOO_LARGE,
                         limit=cap)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"text from {name} is not UTF-8: {exc}", code=ec.INPUT_BAD_ENCODING) from None
    text = text.removeprefix("\ufeff")
    return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text


def _read_json_input(path: str, lim: Limits = DEFAULT_LIMITS):
    _file_size(path, lim)
    text = Path(path).read_bytes()
    # refuse deep nesting before json builds it (json recursion would crash)
    depth = cur = 0
    for ch in text:
        if ch in b"[{":
            cur += 1
            depth = max(depth, cur)
            if depth > lim.max_json_depth:
                raise InputError(f"JSON nested deeper than {lim.max_json_depth} levels", code=ec.INPUT_TOO_DEEP)
        elif ch in b"]}":
            cur -= 1
    try:
        data = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path} is not valid JSON: {exc}", code=ec.INPUT_BAD_JSON) from None
    json_depth(data, lim.max_json_depth)
    if isinstance(data, dict) and set(data) == {"inputs"}:
        data = data["inputs"]
    return data


def _npy_header(fh, what: str):
    """(shape, dtype) from a ``.npy`` header, before any data is read."""
    from numpy.lib import format as npf

    version = npf.read_magic(fh)
    if version == (1, 0):
        shape, _, dtype = npf.read_array_header_1_0(fh)
    elif version == (2, 0):
        shape, _, dtype = npf.read_array_header_2_0(fh)
    else:
        raise ValueError(f"unsupported .npy format version {version}")
    if dtype.hasobject:
        raise InputError(f"{what} holds Python objects; only plain numeric arrays are loaded (never pickles)",
                         code=ec.INPUT_BAD_FILE)
    return shape, dtype


def _read_arrays(path: str, lim: Limits, input_names: list[str]):
    """``.npy`` (one array, single-input models) or ``.npz`` (named arrays). The file
    size and every array's declared size (from its header, so a compressed member
    cannot expand past the limit) are checked before loading; ``allow_pickle=False``."""
    import math
    import zipfile

    import numpy as np

    _file_size(path, lim)
    npz = path.lower().endswith(".npz")
    if not npz and len(input_names) != 1:
        raise InputError(f"{path} holds one array but the model has {len(input_names)} inputs "
                         f"({', '.join(input_names)}): give a .npz with one named array each",
                         code=ec.INPUT_WRONG_NAMES)
    total = 0
    try:
        if npz:
            with zipfile.ZipFile(path) as zf:
                for info in zf.infolist():
                    if not info.filename.endswith(".npy"):
                        raise InputError(f"{path}: member {info.filename!r} is not an array (.npy)",
                                         code=ec.INPUT_BAD_FILE)
                    with zf.open(info) as fh:
                        shape, dtype = _npy_header(fh, f"{path}:{info.filename}")
                    total += math.prod(shape) * dtype.itemsize
        else:
            with open(path, "rb") as fh:
                shape, dtype = _npy_header(fh, path)
            total = math.prod(shape) * dtype.itemsize
        if total > lim.max_request_bytes:
            raise InputError(f"{path} holds {total} bytes of arrays, over the request limit of "
                             f"{lim.max_request_bytes}", code=ec.INPUT_TOO_LARGE, limit=lim.max_request_bytes)
        if npz:
            with np.load(path, allow_pickle=False) as data:
                return {name: data[name] for name in data.files}
        return np.load(path, allow_pickle=False)
    except InputError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path} is not a readable {'.npz' if npz else '.npy'} file: {exc}",
                         code=ec.INPUT_BAD_FILE) from None


def _fmt_num(x) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def _show_outputs(outputs: dict) -> None:
    """Each output of a tensors result: name, dtype, shape and its first values."""
    import numpy as np

    for name, o in outputs.items():
        flat = np.asarray(o.get("data", []), dtype=object).ravel()
        vals = ", ".join(_fmt_num(x) for x in flat[:6]) + (", ..." if flat.size > 6 else "")
        click.echo(f"output {name}: {o.get('dtype')} {o.get('shape')} [{vals}]")


_FLAGS_FOR_KIND = {"text": ("--text", "--text-file", "--input"), "image": ("--image",)}
_INFER_SOURCES = ("--text", "--text-file", "--image", "--input")


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--text", help="Text input ('-' reads it from stdin).")
@click.option("--text-file", type=click.Path(allow_dash=True), help="Text input from a UTF-8 file ('-': stdin).")
@click.option("--image", type=click.Path(), help="Image file (PNG/JPEG/BMP).")
@click.option("--input", "input_file", type=click.Path(),
              help="FILE.json ({\"text\": ...} or named tensors), FILE.npz (named arrays) or FILE.npy "
                   "(one array, single-input models).")
@device_flags()
@click.option("--deadline-ms", type=int, help="Per-call deadline.")
@click.option("--limit", "limit", multiple=True,
              help="Lower a per-call limit KEY=VALUE, repeatable (max_text_chars, max_request_bytes, "
                   "max_image_bytes, max_image_pixels, deadline_ms, ...); never above the artifact's.")
@click.option("--json", "as_json", is_flag=True, help="Print the result (or the error) as JSON.")
@click.option("--draw", "draw_path", type=click.Path(),
              help="With --image: write the image with the result drawn on it (boxes, keypoints, mask) to OUT.png "
                   "(.png, .jpg, .bmp).")
@_guard
def infer(artifact, text, text_file, image, input_file, device, require_device, device_option, deadline_ms, limit,
          as_json, draw_path):
    """Run one input through ARTIFACT.

    \b
    Examples:
      edge-infer infer out/digits-int8 --image models/zoo/digits-cnn/held_out/3/0013.png
      edge-infer infer out/minilm --text-file review.txt --json
      cat review.txt | edge-infer infer out/minilm --text - --limit max_text_chars=2000
      edge-infer infer out/tensors-model --input feeds.npz
      edge-infer infer out/yolo-int8 --image street.jpg --draw street-boxes.png
    """
    given = dict(x for x in zip(_INFER_SOURCES, (text, text_file, image, input_file)) if x[1] is not None)
    if len(given) != 1:
        raise InputError("give exactly one of --text, --text-file, --image, --input", code=ec.INPUT_MISSING)
    (flag, value), = given.items()
    overrides = _limit_overrides(limit)
    if draw_path is not None:
        _check_draw(draw_path, flag)
    from .runtime import load

    # no warm-up: a one-shot call would run every bucket once more only to then run one of them
    # (its latency_ms is a cold call's, honestly); the artifact is verified all the same
    with load(artifact, device=device, strict=require_device, device_options=device_options(device_option),
              warmup=False) as rt:
        kind = type(rt.task).input_kind       # the task declares the raw input it takes
        fits = _FLAGS_FOR_KIND.get(kind, ("--input",))
        if flag not in fits:
            raise InputError(f"{flag} does not fit a {rt.artifact.task} artifact (it takes {', '.join(fits)})",
                             code=ec.INPUT_WRONG_TYPE)
        lim = rt.limits.lowered(overrides, what="--limit")
        if flag == "--text-file" or (flag == "--text" and value == "-"):
            raw = _read_text(value, lim)
        elif flag == "--input" and value.lower().endswith((".npy", ".npz")):
            raw = _read_arrays(value, lim, [t["name"] for t in rt.variant["buckets"][0]["inputs"]])
        elif flag == "--input":
            raw = _read_json_input(value, lim)
        else:
            raw = value
        res = rt.infer(raw, deadline_ms=deadline_ms, limits=overrides or None)
        if draw_path is not None:
            _draw(value, res, draw_path, lim)

    def human(d):
        if _show_vision(d):               # detections, keypoints, a mask: tables instead of the scores
            pass
        else:
            if d.get("outputs") is not None:
                if d["prediction"] is not None:
                    click.echo(f"prediction: {d['prediction']}")
                _show_outputs(d["outputs"])
            else:
                click.echo(f"prediction: {d['prediction']}")
            for k, v in list(d["scores"].items())[:5]:
                click.echo(f"  {k}: {v:.4f}")
        if d["embedding"] is not None:
            click.echo(f"embedding: dim {len(d['embedding'])}, first {[round(x, 4) for x in d['embedding'][:4]]}")
        click.echo(f"latency {d['latency_ms']:.2f} ms on {d['device']} ({d['target']}, bucket {d['bucket']}"
                   f"{', truncated' if d['truncated'] else ''}) model {d['model']} v{d['version']} "
                   f"trace {d['trace_id']}")
        if d.get("drawn"):
            click.echo(f"drawn: {d['drawn']}")

    from .draw import summarize

    data = summarize(res.to_dict())
    if draw_path is not None:
        data["drawn"] = str(draw_path)
    emit(data, as_json, human)


def _check_draw(path: str, flag: str) -> None:
    """``--draw``: refused before any work when it cannot be done (not an image input, a path
    that cannot be written)."""
    if flag != "--image":
        raise InputError(f"--draw needs --image (it draws onto the image), not {flag}", code=ec.INPUT_INVALID)
    from .draw import check_out_path

    try:
        check_out_path(path)
    except ValueError as exc:
        raise InputError(f"--draw: {exc}", code=ec.INPUT_INVALID) from None


def _draw(image: str, res, path: str, lim: Limits) -> None:
    from .draw import draw

    try:
        draw(image, res, path, limits=lim)
    except OSError as exc:
        raise InputError(f"--draw: cannot write {path}: {exc.strerror or exc}", code=ec.INPUT_INVALID) from None
    except ValueError as exc:
        raise InputError(f"--draw: {exc}", code=ec.INPUT_INVALID) from None


def _table(headers: tuple[str, ...], rows: list[tuple], indent: str = "  ") -> None:
    """Rows under their headers, each column as wide as its widest cell (numbers right-aligned)."""
    cells = [tuple(str(c) for c in r) for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    right = [bool(rows) and all(isinstance(r[i], (int, float, _Num)) for r in rows) for i in range(len(headers))]

    def line(values):
        return indent + "  ".join(v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right)).rstrip()

    click.echo(line(headers))
    for r in cells:
        click.echo(line(r))


def _num(x, digits: int = 2) -> str:
    return f"{float(x):.{digits}f}"


def _show_vision(d: dict) -> bool:
    """Detections, keypoints or a segmentation mask as tables; False for any other result."""
    mask = (d.get("outputs") or {}).get("mask")
    if d.get("detections") is None and d.get("keypoints") is None and not isinstance(mask, dict):
        return False
    pred = d["prediction"]
    if pred is not None:              # pose: the mean keypoint score
        click.echo(f"prediction: {pred:.4f}" if isinstance(pred, float) else f"prediction: {pred}")
    if d.get("detections") is not None:
        dets = d["detections"]
        click.echo(f"detections: {len(dets) or 'none'}")
        if dets:
            _table(("label", "score", "x1", "y1", "x2", "y2"),
                   [(x["label"], _Num(_num(x["score"])), *(int(round(v)) for v in x["box"])) for x in dets])
    if d.get("keypoints") is not None:
        kps = d["keypoints"]
        click.echo(f"keypoints: {len(kps) or 'none'}")
        if kps:
            _table(("name", "x", "y", "score"),
                   [(k["name"], int(round(k["x"])), int(round(k["y"])), _Num(_num(k["score"]))) for k in kps])
    if isinstance(mask, dict):
        classes = mask.get("classes")
        h, w = (list(mask.get("shape") or []) + [None, None])[:2]
        click.echo(f"segmentation: {w}x{h} mask")
        if classes is not None:
            rows = [(c["label"], c["class_id"], _Num(f"{100 * c['share']:.1f}%"), c["pixels"])
                    for c in sorted(classes, key=lambda c: -c["pixels"])]
        else:
            rows = [(k, "", _Num(f"{100 * v:.1f}%"), "") for k, v in d["scores"].items()]
        _table(("class", "id", "share", "pixels"), rows)
    return True


class _Num(str):
    """A formatted number: right-aligned by ``_table``."""


def _r4(x):
    return round(x, 4) if isinstance(x, float) else x


def _parity_text(p: dict) -> str:
    value = p.get("value")
    if value is None or p.get("metric") in (None, "none", "not_measured"):
        why = p.get("not_measured") or p.get("note") or p.get("reason") or "no parity value recorded"
        return f"parity not measured ({why})"
    parts = [f"min {_r4(p['min'])}" if p.get("min") is not None else None,
             f"{p['samples']} samples" if p.get("samples") else None,
             f"budget {_r4(p['budget'])}" if p.get("budget") is not None else None]
    extra = [x for x in parts if x]
    return f"parity {p['metric']} {_r4(value)}" + (f" ({', '.join(extra)})" if extra else "")


def _tensor_text(t: dict) -> str:
    return f"{t['name']} {t['dtype']}{list(t['shape'])}"


def _pre_text(pre: dict) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.6g}"
        if isinstance(v, list):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        return str(v)

    return ", ".join(f"{k}={fmt(v)}" for k, v in pre.items()) or "none"


def _edgetpu_lines(rep: dict) -> list[str]:
    lines = [f"edge tpu: {rep.get('tpu_ops', '?')} op(s) on the Edge TPU, {rep.get('cpu_ops', '?')} on the CPU"
             + (" (compiled)" if rep.get("edgetpu_compiled") else "")]
    f = rep.get("first_unsupported")
    lines.append("first unsupported: " + (f"#{f.get('index')} {f.get('op')}: {f.get('reason')}" if f else "none"))
    split = rep.get("split") or {}
    if split:
        lines.append("split (tpu/cpu): " + ", ".join(f"{k} {c.get('tpu', 0)}/{c.get('cpu', 0)}"
                                                     for k, c in split.items()))
    if rep.get("verdict"):
        lines.append(f"verdict: {rep['verdict']}")
    return lines


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--json", "as_json", is_flag=True)
@_guard
def inspect(artifact, as_json):
    """Manifest summary, verification result and parity.

    Shows each variant's buckets and input shapes, quantization, parity (or why it
    was not measured) and, for TFLite variants, the Edge TPU split; the labels and
    the pre-processing.

    \b
    Examples:
      edge-infer inspect out/digits-int8
      edge-infer inspect out/coral-mnv2 --json
    """
    from .artifact import load_artifact
    from .selection import check_targets

    art = load_artifact(artifact)
    check_targets(art.targets())
    man = art.manifest
    labels = None
    if man["postprocess"].get("labels"):
        names = [x.strip() for x in art.read_text(man["postprocess"]["labels"]).splitlines() if x.strip()]
        labels = {"file": man["postprocess"]["labels"], "count": len(names), "first": names[:5]}
    data = {"verified": art.verified, "files": len(man["files"]), "model": man["model"], "task": man["task"],
            "variants": [{"target": v["target"], "buckets": [b["name"] for b in v["buckets"]],
                          "inputs": {b["name"]: [{k: t[k] for k in ("name", "dtype", "shape")} for t in b["inputs"]]
                                     for b in v["buckets"]},
                          "quantization": v["quantization"], "parity": v["parity"], "toolchain": v["toolchain"],
                          **({"edgetpu_report": v["edgetpu_report"]} if v.get("edgetpu_report") else {})}
                         for v in man["variants"]],
            "labels": labels, "preprocess": man["preprocess"], "postprocess": man["postprocess"],
            "limits": man["limits"]}

    def human(d):
        m = d["model"]
        click.echo(f"{m['name']} v{m['version']} ({d['task']}): {d['files']} files, all sha256 verified")
        click.echo(f"  preprocess: {_pre_text(d['preprocess'])}")
        if d["labels"]:
            lb = d["labels"]
            first = ", ".join(repr(x) for x in lb["first"])
            click.echo(f"  labels: {lb['count']} ({first}{', ...' if lb['count'] > len(lb['first']) else ''})")
        for v in d["variants"]:
            q = v["quantization"]
            click.echo(f"  {v['target']}: buckets {', '.join(v['buckets'])}; {q['scheme']} w:{q['weights']} "
                       f"a:{q['activations']}; {_parity_text(v['parity'])}")
            for bucket, ins in v["inputs"].items():
                click.echo(f"    {bucket} inputs: {', '.join(_tensor_text(t) for t in ins)}")
            for line in _edgetpu_lines(v["edgetpu_report"]) if v.get("edgetpu_report") else ():
                click.echo(f"    {line}")

    emit(data, as_json, human)


if __name__ == "__main__":
    main()
