"""``edge-infer shadow --report OUT.html``: one static HTML file, no server, no external URL.

Everything is inline: CSS, the charts as SVG (each side's latency distribution on a
log axis with its p50/p99 marked, the task figure's distribution), the flip matrix
as a table, the worst items with their images as base64 ``data:`` URLs (image inputs
up to ``MAX_INLINE_IMAGE_BYTES``), and the host CPU the latencies were measured on.
No script runs: the page is the same in any browser, printed or offline.
"""

from __future__ import annotations

import base64
import html
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import numpy as np

MAX_INLINE_IMAGE_BYTES = 1 << 20
GENERATOR = '<meta name="generator" content="edge-infer shadow">'     # what ``is_report`` knows its pages by
MAX_MATRIX_LABELS = 20
COLORS = {"a": "#1f77b4", "b": "#ff7f0e"}
_MIME = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".bmp": "image/bmp", ".gif": "image/gif",
         ".webp": "image/webp"}

CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:4px 0} td,th{border:1px solid #ddd;padding:3px 7px;text-align:left;
vertical-align:top} th{background:#f4f4f4} .num{text-align:right;font-variant-numeric:tabular-nums}
.cards{display:flex;gap:12px;flex-wrap:wrap} .card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;
min-width:150px} .card b{display:block;font-size:20px} .bad{color:#b00020} .ok{color:#1b7f3b}
.a{color:#1f77b4} .b{color:#ff7f0e} .diag{background:#eef} img.in{image-rendering:pixelated;width:64px;
height:auto;max-height:96px;object-fit:contain;background:#000} .muted{color:#777} svg{display:block}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _fmt(value: Any, digits: int = 4, *, one: bool = False) -> str:
    """A number as text: ``digits`` fixed decimals, except where they would show a non-zero value as
    zero (a latency of 0.0004 ms as "0.000", a score diff of 4e-7 as "0.0000"): its significant digits
    then ("0.0004", "4e-07"). ``one``: a figure whose 1 means "the same" (cosine, F1, agreement), where
    0.99996 is never shown "1.0000" either (its own digits: "0.99996")."""
    if value is None:
        return "–"
    if isinstance(value, float):
        text = f"{value:.{digits}f}"
        if value and math.isfinite(value) and float(text) != value:
            if float(text) == 0.0:
                return f"{value:.{digits}g}"
            if one and abs(float(text)) == 1.0:
                return repr(value)
        return text
    return str(value)


def histogram_svg(series: list[tuple[str, Sequence[Any], str]], *, title: str, unit: str, log: bool = True,
                  width: int = 760, height: int = 240, bins: int = 48, marks: bool = True) -> str:
    """Overlaid histograms of ``series`` ``[(name, values, colour)]`` as one inline SVG, with each
    series' p50 (dashed) and p99 (dotted) as vertical lines."""
    values = [v for _, vals, _ in series for v in vals if v is not None and math.isfinite(v)]
    pad_l, pad_r, pad_t, pad_b = 44, 12, 40, 36
    w, h = width - pad_l - pad_r, height - pad_t - pad_b
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{_e(title)}">',
           f'<text x="{pad_l}" y="15" font-size="12" font-weight="bold">{_e(title)}</text>']
    if not values:
        out.append(f'<text x="{pad_l}" y="{pad_t + h / 2}" font-size="12">no values</text></svg>')
        return "".join(out)
    lo, hi = min(values), max(values)
    log = log and lo > 0
    f = (math.log10 if log else (lambda x: x))
    a, b = f(lo), f(hi)
    if b - a < 1e-9:
        a, b = a - 0.5, b + 0.5
    edges = np.linspace(a, b, bins + 1)
    counts = [np.histogram([f(v) for v in vals if v is not None and math.isfinite(v)], bins=edges)[0]
              for _, vals, _ in series]
    top = max(1, max(int(c.max()) for c in counts))

    def x(v: float) -> float:
        return pad_l + (v - a) / (b - a) * w

    def y(c: float) -> float:
        return pad_t + h - c / top * h

    out.append(f'<rect x="{pad_l}" y="{pad_t}" width="{w}" height="{h}" fill="#fafafa" stroke="#ccc"/>')
    bw = w / bins
    for (name, vals, colour), cnt in zip(series, counts):
        for i, c in enumerate(cnt):
            if c:
                out.append(f'<rect class="bar" x="{x(edges[i]):.1f}" y="{y(c):.1f}" width="{max(bw - 1, 1):.1f}" '
                           f'height="{pad_t + h - y(c):.1f}" fill="{colour}" fill-opacity="0.55">'
                           f'<title>{_e(name)}: {int(c)}</title></rect>')
        if marks and vals:
            for q, dash in ((50, "5,3"), (99, "2,2")):
                p = float(np.percentile(vals, q))
                xp = x(f(p)) if (not log or p > 0) else pad_l
                out.append(f'<line x1="{xp:.1f}" x2="{xp:.1f}" y1="{pad_t}" y2="{pad_t + h}" stroke="{colour}" '
                           f'stroke-width="1.5" stroke-dasharray="{dash}"><title>{_e(name)} p{q} {p:.3f} {unit}'
                           f'</title></line>')
    for t in np.linspace(a, b, 5):         # x ticks
        v = 10 ** t if log else t
        out.append(f'<text x="{x(t):.1f}" y="{pad_t + h + 14}" font-size="10" text-anchor="middle">'
                   f'{v:.3g}</text>')
    out.append(f'<text x="{pad_l + w / 2}" y="{height - 4}" font-size="11" text-anchor="middle">{_e(unit)}'
               f'{" (log scale)" if log else ""}</text>')
    out.append(f'<text x="{pad_l - 6}" y="{pad_t + 8}" font-size="10" text-anchor="end">{top}</text>'
               f'<text x="{pad_l - 6}" y="{pad_t + h}" font-size="10" text-anchor="end">0</text>')
    lx = float(pad_l)
    for name, vals, colour in series:        # the legend: one row above the plot
        label = name
        if marks and vals:
            label += f" (p50 {np.percentile(vals, 50):.3g}, p99 {np.percentile(vals, 99):.3g} {unit})"
        out.append(f'<rect x="{lx:.0f}" y="22" width="10" height="10" fill="{colour}" fill-opacity="0.7"/>'
                   f'<text class="legend" x="{lx + 14:.0f}" y="31" font-size="11">{_e(label)}</text>')
        lx += 14 + 6.2 * len(label) + 18
    out.append("</svg>")
    return "".join(out)


def _image_tag(path: Any) -> str:
    if not isinstance(path, str):
        return ""
    p = Path(path)
    mime = _MIME.get(p.suffix.lower())
    try:
        if mime is None or not p.is_file() or p.stat().st_size > MAX_INLINE_IMAGE_BYTES:
            return ""
        data = base64.b64encode(p.read_bytes()).decode("ascii")
    except OSError:
        return ""
    return f'<img class="in" alt="{_e(p.name)}" src="data:{mime};base64,{data}">'


def _matrix_html(summary: dict) -> str:
    m = summary.get("matrix")
    if not m:
        return '<p class="muted">No flip matrix: the task is not a classifier.</p>'
    labels, counts = m["labels"], m["counts"]
    idx = list(range(len(labels)))
    note = ""
    if len(labels) > MAX_MATRIX_LABELS:      # only the labels involved in flips (most flips first)
        involved: dict[int, int] = {}
        for i in idx:
            for j in idx:
                if i != j and counts[i][j]:
                    involved[i] = involved.get(i, 0) + counts[i][j]
                    involved[j] = involved.get(j, 0) + counts[i][j]
        idx = sorted(sorted(involved, key=lambda k: -involved[k])[:MAX_MATRIX_LABELS])
        note = (f'<p class="muted">{len(labels)} labels: the {len(idx)} involved in the most flips are shown.</p>')
    peak = max([counts[i][j] for i in idx for j in idx if i != j] or [0]) or 1
    rows = ['<table id="flip-matrix"><tr><th>A \\ B</th>' + "".join(f"<th>{_e(labels[j])}</th>" for j in idx)
            + "</tr>"]
    for i in idx:
        cells = []
        for j in idx:
            c = counts[i][j]
            if i == j:
                cells.append(f'<td class="num diag">{c}</td>')
            else:
                alpha = 0.15 + 0.85 * c / peak if c else 0
                style = f' style="background:rgba(176,0,32,{alpha:.2f});color:{"#fff" if alpha > 0.5 else "#222"}"' \
                    if c else ""
                cells.append(f'<td class="num flip"{style}>{c or ""}</td>')
        rows.append(f"<tr><th>{_e(labels[i])}</th>{''.join(cells)}</tr>")
    rows.append("</table>")
    return note + "".join(rows)


def _figure_name(kind: str | None) -> str:
    return {"classification": "margin", "embedding": "cosine", "detection": "f1", "segmentation": "pixel_agreement",
            "tensors": "cosine", "keypoints": "pck"}.get(kind or "", "")


def _worst_html(summary: dict) -> str:
    rows = ['<table id="worst"><tr><th>#</th><th>id</th><th>input</th><th>truth</th><th class="a">A</th>'
            '<th class="b">B</th><th>comparison</th><th>latency A / B (ms)</th></tr>']
    for e in summary["worst"]:
        def side(s: dict) -> str:
            if not s.get("ok"):
                return f'<span class="bad">error {_e(s.get("code"))}</span>'
            score = f" ({_fmt(s['score'], 3)})" if isinstance(s.get("score"), float) else ""
            return f"{_e(s.get('prediction'))}{score}"

        cmp = e.get("compare") or {}
        skip = ("kind", "agree", "agree_at", "margin_bound", "top1_match", "score_a", "score_b")
        figs = ", ".join(f"{k.replace('_', ' ')} {_fmt(v, one=True)}" for k, v in cmp.items()
                         if k not in skip and v is not None)
        inp = e.get("input")
        shown = _image_tag(inp) or f"<span>{_e(inp)}</span>"
        verdict = '<span class="ok">agree</span>' if e.get("agree") else '<span class="bad">differ</span>'
        rows.append(f'<tr class="item"><td class="num">{e["index"]}</td><td>{_e(e.get("id"))}</td><td>{shown}</td>'
                    f'<td>{_e(e.get("truth"))}</td><td>{side(e["a"])}</td><td>{side(e["b"])}</td>'
                    f'<td>{verdict} {_e(figs)}</td><td class="num">{_fmt(e["a"].get("latency_ms"), 3)} / '
                    f'{_fmt(e["b"].get("latency_ms"), 3)}</td></tr>')
    rows.append("</table>")
    return "".join(rows)


def render(summary: dict, latencies: tuple[Sequence[Any], Sequence[Any]], figures: dict, meta: dict) -> str:
    """The page: ``summary`` is ``ShadowSummary.to_dict()``, ``latencies`` each side's latency_ms,
    ``figures`` the task figure's values by name, ``meta`` ``{"a", "b", "input", "cpu", "output"}``."""
    from .shadow_summary import rate_text

    a, b = meta["a"], meta["b"]
    agreement = summary.get("agreement")
    acc = summary.get("accuracy")
    lat = summary["latency_ms"]
    agreed = f"{summary['agree']} of {summary['compared']} compared"
    if summary.get("empty"):
        agreed += f"; {summary['empty']} with nothing found on either side"
    if summary.get("mismatched"):
        agreed += f"; {summary['mismatched']} not comparable"
    shown = rate_text(summary["agree"], summary["compared"]) if agreement is not None else "–"
    cards = [("agreement", shown, agreed),
             ("inputs", str(summary["total"]), f"{summary['both_failed']} failed on both sides"
                                                + (f" ({summary['both_failed_differently']} with other errors)"
                                                   if summary.get("both_failed_differently") else "") + ", "
                                                f"{summary['only_a_failed']} only on A, {summary['only_b_failed']} "
                                                f"only on B")]
    if summary.get("labels_note"):
        basis = {"index": "by class index", "text": "matched by text"}.get(summary.get("labels_basis") or "",
                                                                          "by class index")
        cards.append(("labels", basis, summary["labels_note"]))
    cut = summary.get("truncated") or {}
    if cut.get("a") or cut.get("b"):
        cards.append(("truncated A / B", f"{cut['a']} / {cut['b']}", f"{cut['one_side']} cut on one side only"))
    if acc:
        shown = f"{rate_text(acc['correct_a'], acc['samples'])} / {rate_text(acc['correct_b'], acc['samples'])}"
        cards.append(("accuracy A / B", shown, f"{acc['samples']} labelled inputs"))
    if summary.get("accuracy_note"):
        cards.append(("accuracy", "-", summary["accuracy_note"]))
    if summary.get("unknown_labels"):
        cards.append(("unknown labels", str(summary["unknown_labels"]["count"]), summary["unknown_labels"]["note"]))
    if summary.get("eval_skipped"):
        cards.append(("not eval rows", str(summary["eval_skipped"]["count"]), summary["eval_skipped"]["note"]))
    few = any("p99" in (lat[k].get("few_samples_for") or ()) for k in ("a", "b"))
    cards.append(("latency p50 A / B", f"{_fmt(lat['a']['p50'], 3)} / {_fmt(lat['b']['p50'], 3)} ms",
                  f"p99 {_fmt(lat['a']['p99'], 3)} / {_fmt(lat['b']['p99'], 3)} ms"
                  + (f" (from {lat['a']['n']} / {lat['b']['n']} inputs: under 100, a p99 is the slowest call)"
                     if few else "")))
    card_html = "".join(f'<div class="card">{_e(t)}<b>{_e(v)}</b><span class="muted">{_e(s)}</span></div>'
                        for t, v, s in cards)
    sides = "".join(
        f'<tr><th class="{k}">{k.upper()}</th><td>{_e(s["model"])} v{_e(s["version"])}</td><td>{_e(s["target"])}</td>'
        f'<td>{_e(s["device"])}</td><td><code>{_e(str(s["manifest_sha256"])[:12])}…</code></td>'
        f'<td><code>{_e(s["path"])}</code></td></tr>' for k, s in (("a", a), ("b", b)))
    lat_svg = histogram_svg([(f"A {a['target']} on {a['device']}", latencies[0], COLORS["a"]),
                             (f"B {b['target']} on {b['device']}", latencies[1], COLORS["b"])],
                            title="latency per input (infer(): raw in, result out); dashed p50, dotted p99", unit="ms")
    fig_name = _figure_name(summary.get("kind"))
    fig_svg = ""
    if figures.get(fig_name):
        fig_svg = histogram_svg([(fig_name, figures[fig_name], "#6a3d9a")], log=False, marks=False, height=170,
                                title=f"{fig_name} per input (B against A)", unit=fig_name)
    flips = "".join(f'<tr><td>{_e(f["a"])}</td><td>{_e(f["b"])}</td><td class="num">{f["count"]}</td></tr>'
                    for f in summary["flips"][:30])
    flips_html = (f'<table id="flips"><tr><th>A says</th><th>B says</th><th>inputs</th></tr>{flips}</table>'
                  if flips else '<p class="muted">No label flips.</p>')
    errors = summary["errors"]
    err_html = "".join(f"<li>{k.upper()}: " + (", ".join(f"{_e(c)} {n}" for c, n in errs.items()) or "none")
                       + "</li>" for k, errs in errors.items())
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    matrix_basis = {"index": " of the same class index, each named A's=B's text: their labels share no text",
                    "text": " as A's class of its text; one that is no class of A's by B's own text"}.get(
        summary.get("labels_basis") or "", "")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">{GENERATOR}
<title>edge-infer shadow: {_e(a['model'])} A vs B</title><style>{CSS}</style></head>
<body>
<h1>edge-infer shadow: {_e(a['model'])} v{_e(a['version'])} (A) vs {_e(b['model'])} v{_e(b['version'])} (B)</h1>
<p class="muted">input <code>{_e(meta.get('input'))}</code> · {_e(summary.get('kind'))} · written {stamp} ·
latencies measured on {_e(meta.get('cpu'))}</p>
<table id="sides"><tr><th></th><th>model</th><th>variant</th><th>device</th><th>seal</th><th>artifact</th></tr>
{sides}</table>
<div class="cards" id="summary">{card_html}</div>
<h2>Latency distributions</h2>
<div id="latency">{lat_svg}</div>
{f'<h2>Task comparison</h2><div id="figure">{fig_svg}</div>' if fig_svg else ''}
<h2>Flip matrix (rows: A's label, columns: B's{matrix_basis})</h2>
{_matrix_html(summary)}
{flips_html}
<h2>Worst {len(summary['worst'])} items</h2>
{_worst_html(summary)}
<h2>Errors</h2><ul id="errors">{err_html}</ul>
</body></html>
"""


def is_report(path) -> bool:
    """``path`` is a page this module wrote (its generator tag, or the title of a page from before
    the tag): what ``--resume`` may rewrite without ``--force``."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096).decode("utf-8", "replace")
    except OSError:
        return False
    return head.startswith("<!DOCTYPE html>") and (GENERATOR in head or "<title>edge-infer shadow: " in head)


def write_report(path, summary, meta: dict, *, replace: bool = True) -> Path:
    """Write the page for a ``ShadowSummary`` to ``path``; returns the path. ``replace`` False: a
    file that exists by now is refused (``score_output_exists``), never overwritten."""
    d = summary.to_dict()
    page = render(d, (summary.latencies_a, summary.latencies_b), summary.figures, meta)
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        try:    # a lone surrogate in an id or input (a JSONL "\ud800", an undecodable CSV byte): its \uXXXX escape
            fh = open(p, "w" if replace else "x", encoding="utf-8", errors="backslashreplace")
        except FileExistsError:     # created while the run ran (checked before it: cli_shadow.check_report_path)
            from . import error_codes as ec
            from .errors import InputError

            raise InputError(f"--report {p} exists: pass --force to overwrite it", code=ec.SCORE_OUTPUT_EXISTS,
                             path=str(p)) from None
        with fh:
            fh.write(page)
    except OSError as exc:          # --report names a folder, a path under a file: the caller's option, exit 2
        from .score_job import output_error

        raise output_error(p, exc) from None
    return p


__all__ = ["is_report", "render", "write_report", "histogram_svg"]
