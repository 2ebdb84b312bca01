"""Task contracts: how raw input becomes tensors and tensors a prediction.

Pure pre/post-processing, no device code; used identically by the runtime and
by converters (parity runs). ``get_task(name)`` imports one contract lazily.
"""

from __future__ import annotations

import importlib

_TASKS = {
    "text-classification": "edge_runtime.models.text_classification:TextClassification",
    "text-embedding": "edge_runtime.models.text_embedding:TextEmbedding",
    "image-classification": "edge_runtime.models.image_classification:ImageClassification",
    "tensors": "edge_runtime.models.tensors:Tensors",
}


def task_names() -> list[str]:
    return sorted(_TASKS)


def get_task(name: str):
    try:
        module, attr = _TASKS[name].split(":")
    except KeyError:
        raise KeyError(f"unknown task {name!r} (known: {', '.join(sorted(_TASKS))})") from None
    return getattr(importlib.import_module(module), attr)
