"""Labelled evaluation of an artifact: accuracy and latency through ``infer``.

Data: an image folder with one sub-folder per label (``held_out/7/0042.png``)
or a TSV of ``text<TAB>label`` (label as index or name; a header line whose
label column is not a label is skipped).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import EdgeRuntimeError, InputError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


def labelled_samples(path) -> list[tuple[object, str]]:
    p = Path(path)
    if p.is_dir():
        out = []
        for sub in sorted(d for d in p.iterdir() if d.is_dir()):
            for f in sorted(sub.iterdir()):
                if f.suffix.lower() in IMAGE_SUFFIXES:
                    out.append((str(f), sub.name))
        if not out:
            raise InputError(f"{p}: no <label>/<image> files found", code="eval_data_empty")
        return out
    if p.is_file():
        out = []
        for line in p.read_text(encoding="utf-8").splitlines():
            text, sep, label = line.rpartition("\t")
            if sep and text.strip():
                out.append((text, label.strip()))
        if not out:
            raise InputError(f"{p}: no text<TAB>label lines", code="eval_data_empty")
        return out
    raise InputError(f"evaluation data {p} does not exist", code="eval_data_missing")


def evaluate(rt, path, limit: int | None = None) -> dict:
    samples = labelled_samples(path)
    if limit:
        samples = samples[:limit]
    labels = getattr(rt.task, "labels", None) or []
    correct, errors, latencies = 0, {}, []
    for raw, truth in samples:
        if truth.isdigit() and truth not in labels and int(truth) < len(labels):
            truth = labels[int(truth)]
        elif truth not in labels:
            continue  # e.g. a header line
        try:
            res = rt.infer(raw)
        except EdgeRuntimeError as exc:
            errors[exc.code] = errors.get(exc.code, 0) + 1
            continue
        latencies.append(res.latency_ms)
        correct += res.prediction == truth
    n = len(latencies) + sum(errors.values())
    lat = np.asarray(latencies) if latencies else np.asarray([np.nan])
    return {
        "samples": n,
        "correct": int(correct),
        "accuracy": correct / n if n else None,
        "errors": errors,
        "latency_ms": {"p50": float(np.percentile(lat, 50)), "p95": float(np.percentile(lat, 95)),
                       "p99": float(np.percentile(lat, 99)), "mean": float(lat.mean())},
        "device": rt.device,
        "target": rt.variant["target"],
        "parity": {k: rt.variant["parity"].get(k) for k in ("metric", "value", "min", "samples", "budget")
                   if k in rt.variant["parity"]},
    }
