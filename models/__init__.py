"""Task contracts: how raw input becomes tensors and tensors a prediction.

Pure pre/post-processing, no device code; used identically by the runtime and
by converters (parity runs). The registry is one table, task name → lazy
``"module:attr"``, fed by the ``edge_runtime.tasks`` entry-point group: the
built-in tasks register there too (``pyproject.toml``; ``_BUILTIN`` below is
the same table for a source tree without installed metadata), and an entry
point from another distribution adds a task (or replaces a built-in one).
A new task is one module (a :class:`~.base.Task` subclass) plus one entry
point ``name = "package.module:Class"``; tests may also :func:`register`.

Listing names imports nothing; :func:`get_task` imports one task module and
checks that it holds a ``Task`` subclass whose ``name`` is the registered one.
"""

from __future__ import annotations

import sys
import threading
from edge_runtime.plugins import entry_point_refs, forget_scan, resolve_ref

from edge_runtime import error_codes as ec
from edge_runtime.errors import EdgeRuntimeError, InputError

GROUP = "edge_runtime.tasks"
_BUILTIN = {
    "text-classification": "edge_runtime.models.text_classification:TextClassification",
    "text-embedding": "edge_runtime.models.text_embedding:TextEmbedding",
    "image-classification": "edge_runtime.models.image_classification:ImageClassification",
    "tensors": "edge_runtime.models.tensors:Tensors",
    "object-detection": "edge_runtime.models.object_detection:ObjectDetection",
    "pose-estimation": "edge_runtime.models.pose_estimation:PoseEstimation",
    "semantic-segmentation": "edge_runtime.models.semantic_segmentation:SemanticSegmentation",
}


class UnknownTask(InputError, KeyError):
    """No task is registered under the name asked for (the message names the known ones).
    Also a ``KeyError``, as the registry's lookups were before."""

    code = ec.TASK_UNKNOWN

    def __str__(self) -> str:   # KeyError would quote the message
        return self.message


class TaskInvalid(EdgeRuntimeError):
    """A registered task cannot be imported, or is not a Task (a broken plug-in: not the caller's)."""

    code = ec.TASK_INVALID


_lock = threading.Lock()
_registered: dict[str, object] = {}      # register(): name -> "module:attr" or a Task subclass
_scanned: tuple[tuple, dict] | None = None   # (sys.path it was read for, entry points found)
_resolved: dict[tuple[str, object], type] = {}


def _entry_points() -> dict[str, str]:
    """The group's entries, this distribution's first and any other's over them; read again
    whenever ``sys.path`` changed (a distribution added at run time is seen)."""
    global _scanned
    key = tuple(sys.path)
    if _scanned is not None and _scanned[0] == key:
        return _scanned[1]
    found = entry_point_refs(GROUP)
    _scanned = (key, found)
    return found


def task_refs() -> dict[str, object]:
    """name -> "module:attr" (or a class given to :func:`register`), sorted by name."""
    with _lock:
        refs: dict[str, object] = dict(_BUILTIN)
        refs.update(_entry_points())
        refs.update(_registered)
    return dict(sorted(refs.items()))


def task_names() -> list[str]:
    return list(task_refs())


def register(name: str, task) -> None:
    """Register (or replace) a task: a Task subclass or "module:attr" (tests; plug-ins use the entry point)."""
    with _lock:
        _registered[name] = task


def unregister(name: str) -> None:
    with _lock:
        _registered.pop(name, None)


def refresh() -> None:
    """Forget what was read from the entry points and resolved (a distribution changed in place)."""
    global _scanned
    with _lock:
        _scanned = None
        _resolved.clear()
    forget_scan()


def unknown_task(name) -> UnknownTask:
    return UnknownTask(f"unknown task {name!r} (known: {', '.join(task_names())})", task=str(name),
                       known=task_names())


def get_task(name: str):
    """The Task subclass registered as ``name``: :class:`UnknownTask` when there is none,
    :class:`TaskInvalid` when what is registered cannot be loaded or is not a Task."""
    refs = task_refs()
    if name not in refs:
        raise unknown_task(name)
    ref = refs[name]
    with _lock:
        cls = _resolved.get((name, ref))
    if cls is not None:
        return cls
    cls = _load(name, ref)
    with _lock:
        _resolved[(name, ref)] = cls
    return cls


def _load(name: str, ref):
    from .base import Task

    shown = ref if isinstance(ref, str) else getattr(ref, "__qualname__", repr(ref))
    obj = ref
    if isinstance(ref, str):
        try:
            obj = resolve_ref(ref)
        except Exception as exc:
            raise TaskInvalid(f"task {name!r} ({shown}) cannot be loaded: {type(exc).__name__}: {exc}",
                              task=name) from exc
    if not (isinstance(obj, type) and issubclass(obj, Task)):
        raise TaskInvalid(f"task {name!r} ({shown}) is {obj!r}, not a subclass of edge_runtime.models.base.Task",
                          task=name)
    if obj.name != name:
        raise TaskInvalid(f"task {name!r} ({shown}) declares name {obj.name!r}: a task registers under its own "
                          f"name", task=name)
    missing = [m for m in _REQUIRED if getattr(obj, m, None) is getattr(Task, m)]
    if missing:
        # before 2026-12-07 it passed, and its first input failed as input_invalid (exit 2, the caller
        # blamed) or inference_failed, with the empty message of the base's NotImplementedError
        raise TaskInvalid(f"task {name!r} ({shown}) does not define {', '.join(missing)}: a Task subclass "
                          f"implements {', '.join(_REQUIRED)} (README: How to add a task)", task=name)
    return obj


# what the base Task leaves to each task (its own raises NotImplementedError)
_REQUIRED = ("prepare", "finish", "compare")


def tasks_where(predicate) -> list[str]:
    """Names of the registered tasks whose class satisfies ``predicate`` (broken plug-ins left out)."""
    out = []
    for name in task_names():
        try:
            if predicate(get_task(name)):
                out.append(name)
        except TaskInvalid:
            continue
    return out
