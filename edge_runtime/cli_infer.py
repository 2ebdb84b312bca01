"""``edge-infer infer``: one input through an artifact, its result as text, tables or JSON.

``infer`` takes text from ``--text S``, ``--text-file F`` or stdin (``--text -``,
``--text-file -``), an image, or ``--input`` as JSON, ``.npz`` (named arrays) or
``.npy`` (one array); ``--limit KEY=VALUE`` lowers a per-call limit (never above
the artifact's own). Vision results print as tables (detections: label, score,
box; keypoints: name, x, y, score; a segmentation: each class's pixel share);
``--draw OUT.png`` (with ``--image``) writes the image with the result drawn
on it (``draw.py``). Under ``--json`` a segmentation mask is summarised (shape
and per-class pixel counts), not listed pixel by pixel. The input readers are
``cli_inputs``.
"""

from __future__ import annotations

import os
from typing import Any

import click

from .cli_common import _guard, device_flags, device_options, emit
from .cli_inputs import _limit_overrides, _read_arrays, _read_image_stdin, _read_json_input, _read_text, ms_value
from . import error_codes as ec
from .errors import InputError
from .limits import Limits


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


@click.command()
@click.argument("artifact", type=click.Path())
@click.option("--text", help="Text input ('-' reads it from stdin).")
@click.option("--text-file", type=click.Path(allow_dash=True), help="Text input from a UTF-8 file ('-': stdin).")
@click.option("--image", type=click.Path(), help="Image file (PNG/JPEG/BMP; '-' reads it from stdin).")
@click.option("--input", "input_file", type=click.Path(),
              help="FILE.json ({\"text\": ...} or named tensors), FILE.npz (named arrays) or FILE.npy "
                   "(one array, single-input models).")
@device_flags()
@click.option("--deadline-ms", help="Per-call deadline in ms: a positive number (2.5 too), at most a day.")
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
    deadline_ms = None if deadline_ms is None else ms_value(deadline_ms, "--deadline-ms")
    if deadline_ms is not None and overrides.get("deadline_ms", deadline_ms) != deadline_ms:
        # the call's deadline_ms replaces the limits' one: `--limit deadline_ms=50 --deadline-ms 3000` ran
        # under 3000 ms, exit 0, the lowered limit dropped silently (before 2026-12-07)
        raise InputError(f"--deadline-ms {deadline_ms} and --limit deadline_ms={overrides['deadline_ms']} disagree: "
                         "give the deadline once", code=ec.INPUT_INVALID)
    if draw_path is not None:
        _check_draw(draw_path, flag, value)
    from .runtime import load

    # no warm-up: a one-shot call would run every bucket once more only to then run one of them
    # (its latency_ms is a cold call's, honestly); the artifact is verified all the same
    with load(artifact, device=device, strict=require_device, device_options=device_options(device_option),
              warmup=False) as rt:
        kind = type(rt.task).input_kind       # the task declares the raw input it takes
        fits = _FLAGS_FOR_KIND.get(kind, ("--input",))
        if flag not in fits:
            raise InputError(f"{flag} does not fit this {rt.artifact.task} artifact (it takes {', '.join(fits)})",
                             code=ec.INPUT_WRONG_TYPE)
        lim = rt.limits.lowered(overrides, what="--limit")
        raw: Any
        if flag == "--text-file" or (flag == "--text" and value == "-"):
            raw = _read_text(value, lim)
        elif flag == "--input" and value.lower().endswith((".npy", ".npz")):
            raw = _read_arrays(value, lim, [t["name"] for t in rt.variant["buckets"][0]["inputs"]])
        elif flag == "--input":
            raw = _read_json_input(value, lim)
        elif flag == "--image" and value == "-":
            raw = _read_image_stdin(lim)
        else:
            raw = value
        res = rt.infer(raw, deadline_ms=deadline_ms, limits=overrides or None)
        if draw_path is not None:
            _draw(raw if isinstance(raw, bytes) else value, res, draw_path, lim, getattr(rt.task, "background", 0))

    def human(d):
        if _show_vision(d):               # detections, keypoints, a mask: tables instead of the scores
            pass
        else:
            if d["prediction"] is not None:     # an embedding or a tensors result has none to show
                click.echo(f"prediction: {d['prediction']}")
            if d.get("outputs") is not None:
                _show_outputs(d["outputs"])
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


def _check_draw(path: str, flag: str, image: str) -> None:
    """``--draw``: refused before any work when it cannot be done (not an image input, a path
    that cannot be written, the input image itself: drawing would destroy it)."""
    if flag != "--image":
        raise InputError(f"--draw needs --image (it draws onto the image), not {flag}", code=ec.INPUT_INVALID)
    try:
        same = os.path.samefile(path, image)
    except OSError:         # either one absent or unreadable: not the same file
        same = False
    if same:
        raise InputError(f"--draw {path} is the input image: drawing onto it would destroy it; choose another "
                         "path", code=ec.INPUT_INVALID)
    from .draw import check_out_path

    try:
        check_out_path(path)
    except ValueError as exc:
        raise InputError(f"--draw: {exc}", code=ec.INPUT_INVALID) from None


def _draw(image: str | bytes, res, path: str, lim: Limits, background: int | None = 0) -> None:
    from .draw import draw

    try:
        draw(image, res, path, limits=lim, background=background)
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
