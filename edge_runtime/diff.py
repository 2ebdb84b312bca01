"""``edge-infer diff A B``: every difference between two artifacts' sealed manifests.

An inference version is a full-stack snapshot (the manifest pins it), so two
versions differ exactly where their manifests do. Each difference is a leaf
path of the manifest (``variants[onnx-int8].quantization.recipe``) with both
values, grouped in the seed's terms:

- **identity**: model name and version, task, format version;
- **prediction** (the math): every file's sha256 (weights, tokenizer, labels,
  probe set), the source model, pre- and post-processing field by field, the
  quantization (recipe, excluded nodes, calibration fingerprint, a tensor's
  input/output scale and zero point), the recipe trials, the parity figures,
  the probe set;
- **inference** (where and how it runs): limits, which variants (targets)
  exist, their static buckets (names, shapes, dtypes), recorded runtime
  options, toolchain versions, the build host;
- **timings**: figures that change on every build (``created``, ``seconds``,
  ``device_ms_median``, ``runtime.why``'s measured ms): listed, never counted.

Two sections say what a user of each version gets past the manifest's leaves: ``limits``, each
limit as a load applies it (default, task default or the manifest's) where A's and B's differ, and
``labels``, each class id whose name differs (the labels file's lines, else the task's ``0``..``n-1``),
with a side flagged whose labels do not match its outputs' classes or cannot be read (every load
refuses it). A labels file's sha256 alone did not say that two classes swapped names.

Variants are matched by target, buckets and tensors by name, files by path;
a list of names (``nodes_to_exclude``) shows what was added and removed.
``same`` is true when no identity, prediction or inference field, limit or label differs
(``edge-infer diff`` exits 0, else 1). Both artifacts are verified first (a
corrupt one is an ``ArtifactError``, exit 3): a diff of what the manifest says
is only worth something if the files are what it says.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

IDENTITY, PREDICTION, INFERENCE, TIMING = "identity", "prediction", "inference", "timing"
SIDES = (IDENTITY, PREDICTION, INFERENCE)
SIDE_TITLES = {IDENTITY: "identity (model, version, task)",
               PREDICTION: "prediction side (the math: weights, pre/post-processing, quantization, parity)",
               INFERENCE: "inference side (device, runtime, limits, buckets, toolchain, build host)",
               TIMING: "timings (build-host measurements that change on every build; not counted)"}
TIMING_KEYS = ("created", "seconds", "device_ms_median", "device_ms")
_MISSING = object()
_KEYED_LISTS = {"variants": "target", "buckets": "name", "inputs": "name", "outputs": "name"}


@dataclass(frozen=True)
class Difference:
    path: str
    side: str
    a: Any          # None with ``change`` "added"
    b: Any          # None with ``change`` "removed"
    change: str     # "changed", "added" (only in B), "removed" (only in A)
    added: tuple = ()     # for lists of names: what B has and A not
    removed: tuple = ()   # ... and what A has and B not

    def to_dict(self) -> dict:
        d = asdict(self)
        d["added"], d["removed"] = list(self.added), list(self.removed)
        return d


def side_of(path: str) -> str:
    """Which side a manifest leaf belongs to (see the module doc). The names inside ``[...]`` (a
    target, bucket, tensor or file name: ``outputs[backbone.quantization.out]``) are names, never
    the manifest's own keys."""
    import re

    bare = re.sub(r"\[[^\]]*\]", "", path)
    parts = bare.split(".")
    last = parts[-1]
    top = parts[0]
    if _is_timing(bare, top, last):
        return TIMING
    if path in ("model.name", "model.version", "task", "format", "format_version"):
        return IDENTITY
    if top in ("files", "preprocess", "postprocess", "probe", "model"):
        return PREDICTION
    if top == "variants":
        if ".quantization" in bare or ".parity" in bare or ".recipe_trials" in bare:
            return PREDICTION
        return INFERENCE
    return INFERENCE        # limits, build (host), anything new: where and how it runs


def _is_timing(bare: str, top: str, last: str) -> bool:
    """A build-time measurement: ``created`` at the top, and ``seconds`` / ``device_ms*`` where the
    builder records them (``build``, a variant's quantization, parity and trials), or a variant's
    ``runtime.why``. The same key elsewhere (a plug-in task's ``preprocess.seconds`` of audio, a
    limit, a recorded runtime option) is part of what runs, never a timing."""
    if bare == "created" or (top == "build" and last in TIMING_KEYS):
        return True
    if top != "variants":
        return False
    if bare.endswith(".runtime.why"):
        return True
    return last in TIMING_KEYS and any(f".{s}" in bare for s in ("quantization", "parity", "recipe_trials",
                                                                  "runtime_trials"))


def _same(a: Any, b: Any) -> bool:
    """JSON equality: a bool is not the number 1 or 0 (Python's ``True == 1``), NaN equals NaN
    (the same manifest twice is the same), mappings and lists compared element by element."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (Mapping, list, tuple)) or isinstance(b, (Mapping, list, tuple)):
        return False
    return a is b or a == b


def _is_keyed(items: Any, key: str) -> bool:
    """Items matched by ``key``: every one has it and no two share a value (duplicates would
    hide all but the last one's differences: those lists are compared by position)."""
    if not (isinstance(items, list) and all(isinstance(x, Mapping) and key in x for x in items)):
        return False
    names = [str(x[key]) for x in items]
    return len(set(names)) == len(names)


def _scalars(items: Any) -> bool:
    return isinstance(items, list) and all(isinstance(x, (str, int, float, bool)) or x is None for x in items)


def _walk(a: Any, b: Any, path: str, parent_key: str) -> Iterator[Difference]:
    if parent_key and (a is _MISSING and isinstance(b, Mapping) or b is _MISSING and isinstance(a, Mapping)):
        a, b = a if a is not _MISSING else {}, b if b is not _MISSING else {}   # a section on one side: leaf by leaf
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for k in list(a) + [k for k in b if k not in a]:
            name = str(k)
            sub = (f'{path}["{name}"]' if any(c in name for c in './[]"') else
                   f"{path}.{name}" if path else name)
            yield from _walk(a.get(k, _MISSING), b.get(k, _MISSING), sub, str(k))
        return
    key = _KEYED_LISTS.get(parent_key)
    if key and _is_keyed(a, key) and _is_keyed(b, key):
        am = {str(x[key]): x for x in a}
        bm = {str(x[key]): x for x in b}
        for name in list(am) + [n for n in bm if n not in am]:
            yield from _walk(am.get(name, _MISSING), bm.get(name, _MISSING), f"{path}[{name}]", "")
        if [n for n in am if n in bm] != [n for n in bm if n in am]:
            yield Difference(f"{path}.order", side_of(path), list(am), list(bm), "changed")
        return
    if (isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and a and
            all(isinstance(x, Mapping) for x in a + b)):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _walk(x, y, f"{path}[{i}]", "")
        return
    if a is _MISSING and b is _MISSING or (a is not _MISSING and b is not _MISSING and _same(a, b)):
        return
    side = side_of(path)
    if a is _MISSING:
        yield Difference(path, side, None, _plain(b), "added")
    elif b is _MISSING:
        yield Difference(path, side, _plain(a), None, "removed")
    elif _scalars(a) and _scalars(b) and all(isinstance(x, str) for x in a + b):
        yield Difference(path, side, _plain(a), _plain(b), "changed",
                         added=tuple(x for x in b if x not in a), removed=tuple(x for x in a if x not in b))
    else:
        yield Difference(path, side, _plain(a), _plain(b), "changed")


def _plain(value: Any) -> Any:
    """Plain JSON values (the manifest's read-only records are dict/list subclasses)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def diff_manifests(a: Mapping, b: Mapping) -> list[Difference]:
    """Every leaf where manifest ``a`` and ``b`` differ (the seal itself excluded; a vision preprocess key
    stated at what the other side's default reads alike is none: ``diff_preprocess.stated_defaults``)."""
    from .diff_preprocess import stated_defaults

    strip = ("manifest_sha256",)
    a, b = stated_defaults(a, b)
    return list(_walk({k: v for k, v in a.items() if k not in strip}, {k: v for k, v in b.items() if k not in strip},
                      "", ""))


def _head(art) -> dict:
    m = art.manifest
    return {"path": str(Path(art.root).resolve()), "model": m.name, "version": m.version, "task": m.task,
            "manifest_sha256": m.get("manifest_sha256"), "targets": [v.target for v in m.variants]}


def diff_artifacts(path_a, path_b, *, verify: bool = True) -> dict:
    """The report ``edge-infer diff`` prints: ``{"a", "b", "same", "counts", "differences", "limits",
    "labels"}``, each difference ``{"path", "side", "a", "b", "change", "added", "removed"}``."""
    from .artifact import load_artifact

    from .selection import check_targets

    art_a, art_b = load_artifact(path_a, verify=verify), load_artifact(path_b, verify=verify)
    for art in (art_a, art_b):      # as inspect: a target no backend knows is refused at every load
        check_targets(art.targets())
    diffs = diff_manifests(art_a.manifest, art_b.manifest)
    counts = {s: sum(d.side == s for d in diffs) for s in (*SIDES, TIMING)}
    limits, labels = limits_diff(art_a, art_b), labels_diff(art_a, art_b)
    same = not any(counts[s] for s in SIDES) and not limits["changed"] and not labels["changed"]
    return {"a": _head(art_a), "b": _head(art_b), "same": same, "counts": counts,
            "differences": [d.to_dict() for d in diffs], "limits": limits, "labels": labels}


def _task_class(art):
    from edge_runtime.models import get_task

    from .errors import EdgeRuntimeError

    try:
        return get_task(art.manifest["task"])
    except EdgeRuntimeError:
        return None


def _limits_of(art) -> dict:
    """``{"values", "source", "error"}``: each limit as a load of ``art`` applies it (the defaults, the
    task's defaults, then the manifest's ``limits``) and where it comes from; ``error`` (values None)
    where the manifest's limits do not load (every load refuses the artifact)."""
    from .errors import EdgeRuntimeError
    from .limits import DEFAULT_LIMITS

    task = _task_class(art)
    task_limits = dict(getattr(task, "default_limits", None) or {})
    own = art.manifest.get("limits") or {}
    try:
        values = DEFAULT_LIMITS.merged(task_limits, source="manifest").merged(own, source="manifest").to_dict()
    except EdgeRuntimeError as exc:
        return {"values": None, "source": None, "error": f"{exc.message} ({exc.code})"}
    source = {k: "manifest" if k in own else "task default" if k in task_limits else "default" for k in values}
    return {"values": values, "source": source, "error": None}


def limits_diff(art_a, art_b) -> dict:
    """Both sides' limits as the runtime applies them, and ``changed``: each limit whose value differs
    (``{"limit", "a", "b", "a_source", "b_source"}``): a limit one manifest sets and the other leaves at
    its default reads as the two values a user of each version gets refused at."""
    la, lb = _limits_of(art_a), _limits_of(art_b)
    changed = []
    if la["values"] is not None and lb["values"] is not None:
        for k, va in la["values"].items():
            vb = lb["values"].get(k)
            if not _same(va, vb):
                changed.append({"limit": k, "a": va, "b": vb, "a_source": la["source"][k],
                                "b_source": lb["source"][k]})
    return {"a": la, "b": lb, "changed": changed}


def _labels_of(art) -> dict:
    """``{"file", "labels", "count", "mismatch"}``: the class names a load of ``art`` answers with (its
    labels file's non-empty lines, else the task's own: ``0``..``n-1``), and ``mismatch``, the message
    of a variant whose labels do not match its output's classes (every load refuses it)."""
    from . import error_codes as ec
    from .errors import EdgeRuntimeError

    man = art.manifest
    rel = (man.get("postprocess") or {}).get("labels")
    labels: list | None = None
    mismatch = None
    if rel:
        try:
            labels = [x.strip() for x in art.read_bytes(rel).decode("utf-8-sig").splitlines() if x.strip()]
        except (UnicodeDecodeError, EdgeRuntimeError) as exc:
            mismatch = f"labels file {rel}: {exc}"          # as a load refuses it: not UTF-8, or unreadable
    task = _task_class(art)
    for variant in man["variants"] if task is not None else ():
        try:
            built = task(man, art.read_bytes, variant["buckets"])
        except EdgeRuntimeError as exc:
            if exc.code == ec.ARTIFACT_LABELS_MISMATCH and mismatch is None:
                mismatch = f"{variant['target']}: {exc.message} ({exc.code})"
            continue
        if labels is None and not rel and getattr(built, "labels", None):
            labels = [str(x) for x in built.labels]
    return {"file": rel, "labels": labels, "count": None if labels is None else len(labels), "mismatch": mismatch}


def labels_diff(art_a, art_b) -> dict:
    """Both sides' labels (``_labels_of``) and ``changed``: each class id whose name differs
    (``{"class", "a", "b"}``, None on the side that has no such class)."""
    la, lb = _labels_of(art_a), _labels_of(art_b)
    xa, xb = la["labels"] or [], lb["labels"] or []
    unread = any(side["file"] and side["labels"] is None for side in (la, lb))   # never "every class removed"
    changed = [] if unread else [
        {"class": i, "a": xa[i] if i < len(xa) else None, "b": xb[i] if i < len(xb) else None}
        for i in range(max(len(xa), len(xb))) if xa[i:i + 1] != xb[i:i + 1]]
    return {"a": la, "b": lb, "changed": changed}


def _short(value: Any, width: int = 70) -> str:
    import json

    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return value[:12] + "…"
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= width else text[:width - 1] + "…"


def _changed(a: Any, b: Any) -> str:
    """``A -> B`` shortened; where both shorten to the same text (long values that differ past the
    cut, two digests with one prefix) the texts are shown from just before their first difference."""
    import json

    sa, sb = _short(a), _short(b)
    if sa != sb:
        return f"{sa} -> {sb}"
    ta, tb = (json.dumps(v, ensure_ascii=False, default=str) for v in (a, b))
    i = next((k for k, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
    start = max(0, i - 20)

    def window(t):
        part = t[start:start + 60]
        return ("…" if start else "") + part + ("…" if start + 60 < len(t) else "")
    return f"{window(ta)} -> {window(tb)} (first difference at character {i})"


def render_text(report: dict, *, timings: bool = True) -> str:
    """The human report: both heads, the verdict, then each side's differences."""
    lines = []
    for tag in ("a", "b"):
        h = report[tag]
        lines.append(f"{tag.upper()}: {h['path']}  {h['model']} v{h['version']} ({h['task']}; "
                     f"{', '.join(h['targets'])}), seal {str(h['manifest_sha256'])[:12]}…")
    c = report["counts"]
    if report["same"]:
        lines.append("same: no difference in identity, prediction or inference"
                     + (f" ({c[TIMING]} build timings differ, not counted)" if c[TIMING] else ""))
    else:
        lines.append(f"different: {c[IDENTITY]} identity, {c[PREDICTION]} prediction, {c[INFERENCE]} inference "
                     f"({c[TIMING]} build timings, not counted)")
    for side in (*SIDES, TIMING):
        rows = [d for d in report["differences"] if d["side"] == side]
        if not rows or (side == TIMING and not timings):
            continue
        lines.append("")
        lines.append(SIDE_TITLES[side] + ":")
        for d in rows:
            if d["change"] == "added":
                lines.append(f"  + {d['path']}: {_short(d['b'])} (only in B)")
            elif d["change"] == "removed":
                lines.append(f"  - {d['path']}: {_short(d['a'])} (only in A)")
            elif d["added"] or d["removed"]:
                parts = ([f"+{len(d['added'])} {_short(d['added'], 50)}"] if d["added"] else []) + \
                        ([f"-{len(d['removed'])} {_short(d['removed'], 50)}"] if d["removed"] else [])
                lines.append(f"  ~ {d['path']}: {'; '.join(parts)}")
            else:
                lines.append(f"  ~ {d['path']}: {_changed(d['a'], d['b'])}")
    lines.extend(_limit_lines(report.get("limits")))
    lines.extend(_label_lines(report.get("labels")))
    return "\n".join(lines)


LABEL_ROWS = 20     # the text lists this many changed classes; --json lists them all


def _limit_lines(limits: dict | None) -> list[str]:
    if not limits:
        return []
    rows = [f"  ~ {c['limit']}: {_short(c['a'])} ({c['a_source']}) -> {_short(c['b'])} ({c['b_source']})"
            for c in limits["changed"]]
    rows += [f"  ! {tag.upper()}: its limits do not load, every load refuses it: {limits[tag]['error']}"
             for tag in ("a", "b") if limits[tag]["error"]]
    return ["", "limits (as a load applies them: A -> B):", *rows] if rows else []


def _label_lines(labels: dict | None) -> list[str]:
    if not labels:
        return []
    rows = []
    for c in labels["changed"][:LABEL_ROWS]:
        if c["a"] is None:
            rows.append(f"  + [{c['class']}]: {_short(c['b'])} (only in B)")
        elif c["b"] is None:
            rows.append(f"  - [{c['class']}]: {_short(c['a'])} (only in A)")
        else:
            rows.append(f"  ~ [{c['class']}]: {_short(c['a'])} -> {_short(c['b'])}")
    more = len(labels["changed"]) - LABEL_ROWS
    if more > 0:
        rows.append(f"  ... {more} more classes differ (--json lists every one)")
    if labels["changed"] and labels["a"]["count"] != labels["b"]["count"]:
        rows.append(f"  ~ count: {labels['a']['count']} -> {labels['b']['count']}")
    rows += [f"  ! {tag.upper()}: every load refuses its labels: {labels[tag]['mismatch']}"
             for tag in ("a", "b") if labels[tag]["mismatch"]]
    return ["", "labels (class id: name in A -> name in B):", *rows] if rows else []


__all__ = ["Difference", "diff_manifests", "diff_artifacts", "render_text", "side_of", "SIDES"]
