"""What every ``edge-infer import`` format shares: the request's checks, the task's sections, the artifact.

A format's importer (``tflite_import.import_tflite``, ``onnx_import.import_onnx``)
reads its model's tensors and ops and says what its variant is (target,
quantization, toolchain); everything else is here, once:

- :func:`check_request`: the model file, the task (``Task.importable``), the
  options given against the ones the task reads (``Task.import_options``: a flag
  it does not read is refused, ``import_preprocess_unused``, naming those it
  does), labels and the output directory;
- :func:`task_sections`: the task's ``check_io`` and ``import_sections``, a
  :class:`~edge_runtime.models.base.TaskMismatch` from either an ``InputError``
  (``import_model_unsupported`` for the inputs, ``import_task_mismatch`` for
  the outputs); then the labels file, checked against the class count;
- :func:`write_artifact`: the files hashed and the manifest written into a
  temporary directory that replaces ``out`` in one rename.

The import options (the keys passed to tasks, and the CLI flag of each):
``resize`` (``--resize``: the interpolation), ``scale``/``mean``/``std``,
``resize_mode`` (``--letterbox``/``--stretch``), ``pad``, ``pad_position``,
``channel_order``, ``family`` (a detector's decoder) and ``postprocess`` (a
JSON object of decode parameters merged over the family's defaults).
:func:`import_model` picks the importer by the file's suffix (:data:`IMPORTERS`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from edge_runtime import __version__
from edge_runtime import error_codes as ec
from edge_runtime.artifact import ArtifactWriter, sha256_file
from edge_runtime.errors import InputError
from edge_runtime.manifest import FORMAT, FORMAT_VERSION
from edge_runtime.models import get_task, tasks_where
from edge_runtime.models.base import TaskMismatch

MAX_MODEL_BYTES = 512 << 20
log = logging.getLogger("edge_runtime.import")

# suffix -> "module:function" of the importer (each takes import_model's arguments)
IMPORTERS = {
    ".tflite": "edge_runtime.converters.tflite_import:import_tflite",
    ".onnx": "edge_runtime.converters.onnx_import:import_onnx",
}
# the import options a task may read (Task.import_options), and the CLI flag that states each
OPTION_FLAGS = {
    "resize": "--resize", "scale": "--scale", "mean": "--mean", "std": "--std",
    "resize_mode": "--letterbox/--stretch", "pad": "--pad", "pad_position": "--pad-position",
    "channel_order": "--channel-order", "family": "--family", "postprocess": "--postprocess",
}
PAD_POSITIONS = ("top-left", "center")
CHANNEL_ORDERS = ("RGB", "BGR")
RESIZE_MODES = ("stretch", "letterbox")


def option_flag(key: str) -> str:
    return OPTION_FLAGS.get(key, "--" + key.replace("_", "-"))


def import_model(model, out, **kw) -> dict:
    """Import ``model`` with the importer its suffix names (a TFLite flatbuffer under another
    suffix is still TFLite); ``kw`` as :func:`edge_runtime.converters.tflite_import.import_tflite`."""
    from edge_runtime.plugins import resolve_ref

    model = Path(model)
    suffix = model.suffix.lower()
    if suffix not in IMPORTERS:
        if not model.is_file():
            raise InputError(f"model {model} does not exist", code=ec.IMPORT_MODEL_MISSING)
        with open(model, "rb") as fh:
            head = fh.read(8)
        if head[4:8] != b"TFL3":
            raise InputError(f"{model.name}: import reads {', '.join(IMPORTERS)} models (by suffix), not "
                             f"{suffix or 'a file without a suffix'}", code=ec.IMPORT_FORMAT_UNSUPPORTED)
        suffix = ".tflite"
    result: dict = resolve_ref(IMPORTERS[suffix])(model, out, **kw)
    return result


def parse_postprocess(value) -> dict | None:
    """``--postprocess``: a JSON object (as text or already a dict), or None."""
    if value is None or isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value)
    except (TypeError, ValueError) as exc:
        raise InputError(f"--postprocess is not valid JSON ({exc}); give an object such as "
                         f"'{{\"score_threshold\": 0.3}}'", code=ec.IMPORT_POSTPROCESS_INVALID) from None
    if not isinstance(parsed, dict):
        raise InputError(f"--postprocess must be a JSON object, got {type(parsed).__name__} ({value!r})",
                         code=ec.IMPORT_POSTPROCESS_INVALID)
    return parsed


def _check_choices(given: dict) -> None:
    def bad(key, want):
        raise InputError(f"{option_flag(key)}: {want}, got {given[key]!r}", code=ec.IMPORT_PREPROCESS_INVALID)

    pad = given.get("pad")
    if "pad" in given and not (isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad <= 255):
        bad("pad", "need an integer 0..255")
    for key, allowed in (("pad_position", PAD_POSITIONS), ("channel_order", CHANNEL_ORDERS),
                         ("resize_mode", RESIZE_MODES)):
        if key in given and given[key] not in allowed:
            bad(key, f"need one of {', '.join(allowed)}")
    if "family" in given and not (isinstance(given["family"], str) and given["family"]):
        bad("family", "need a family name")


def check_request(model: Path, out: Path, *, task: str, labels, label_offset: int, force: bool,
                  options: dict) -> tuple[type, dict]:
    """``(task class, the options given)``, or the ``InputError`` that refuses the request.
    ``options``: every import option by key, None where not stated."""
    if not model.is_file():
        raise InputError(f"model {model} {'is a directory, not a model file' if model.is_dir() else 'does not exist'}",
                         code=ec.IMPORT_MODEL_MISSING)
    if model.stat().st_size > MAX_MODEL_BYTES:
        raise InputError(f"model is over {MAX_MODEL_BYTES >> 20} MiB", code=ec.IMPORT_MODEL_TOO_LARGE)
    task_cls = importable_task(task)
    given = {k: v for k, v in options.items() if v is not None}
    if "postprocess" in given:
        given["postprocess"] = parse_postprocess(given["postprocess"])
    if labels and not task_cls.takes_labels:
        takes = ", ".join(tasks_where(lambda t: t.importable and t.takes_labels)) or "none"
        raise InputError(f"--labels: task {task} takes no labels (a {task} artifact returns the model's outputs); "
                         f"drop --labels, or import with a task that takes them ({takes})",
                         code=ec.IMPORT_LABELS_UNUSED)
    unused = [k for k in given if k not in task_cls.import_options]
    if unused:
        flags = ", ".join(option_flag(k) for k in unused)
        reads = ", ".join(option_flag(o) for o in task_cls.import_options) or "none"
        raise InputError(f"{flags}: task {task} takes no such option (it reads {reads}"
                         f"{'' if task_cls.import_options else f'; a {task} artifact takes its inputs as given'})",
                         code=ec.IMPORT_PREPROCESS_UNUSED, unused=unused, reads=list(task_cls.import_options))
    _check_choices(given)
    if label_offset and not labels:
        raise InputError("--label-offset shifts a labels file: give --labels too", code=ec.IMPORT_LABELS_UNUSED)
    if label_offset < 0:
        raise InputError(f"--label-offset must be 0 or more, got {label_offset}", code=ec.IMPORT_LABELS_MISMATCH)
    if out.exists() and not out.is_dir():
        raise InputError(f"output {out} exists and is not a directory (-o names the artifact directory to write)",
                         code=ec.IMPORT_OUT_NOT_A_DIRECTORY)
    if out.exists() and any(out.iterdir()) and not force:
        raise InputError(f"output directory {out} exists and is not empty (use --force)", code=ec.CONVERT_OUT_EXISTS)
    return task_cls, given


def importable_task(task: str):
    """The task class ``import`` builds artifacts of (``Task.importable``), or ``import_task_unsupported``."""
    from edge_runtime.models import TaskInvalid, task_names

    try:
        cls = get_task(task) if task in task_names() else None
    except TaskInvalid:
        cls = None
    if cls is None or not cls.importable:
        raise InputError(f"import supports {', '.join(tasks_where(lambda t: t.importable))}, not {task!r}",
                         code=ec.IMPORT_TASK_UNSUPPORTED)
    return cls


def refuse_dynamic(info: dict) -> None:
    dyn = [s for s in info["inputs"] + info["outputs"] if s.get("dynamic")]
    if dyn:
        shown = ", ".join(f"{s['name']!r} {s.get('declared', s['shape'])}" for s in dyn)
        raise InputError(f"the model has dynamic dimensions ({shown}); artifacts are static-shape (a dynamic batch "
                         f"dimension is run as 1; export the model with the other dimensions fixed)",
                         code=ec.IMPORT_SHAPE_DYNAMIC)


def _mismatch(exc: TaskMismatch) -> InputError:
    """The model's inputs are unsupported; its outputs are another task's."""
    return InputError(str(exc), code=ec.IMPORT_MODEL_UNSUPPORTED if exc.part == "inputs"
                      else ec.IMPORT_TASK_MISMATCH)


def task_sections(task_cls, info: dict, given: dict, warnings: list) -> tuple[dict, dict, dict]:
    """``(facts, preprocess, postprocess)``: the task's check of the model's tensors (with the
    stated ``family``/``postprocess`` as its post-processing) and its sections."""
    stated = {k: given[k] for k in ("family", "postprocess") if k in given}
    hint = None
    if stated:
        hint = {**(stated.get("postprocess") or {}), **({"family": stated["family"]} if "family" in stated else {})}
    options = {k: v for k, v in given.items() if k in task_cls.import_options}
    try:
        facts = (task_cls.check_io(info["inputs"], info["outputs"]) if hint is None
                 else task_cls.check_io(info["inputs"], info["outputs"], hint))
        pre, post = task_cls.import_sections(info, options, warnings)
    except TaskMismatch as exc:
        raise _mismatch(exc) from None
    return facts or {}, pre, post


def _offset_hint(n: int, classes: int, offset: int) -> str:
    """What can make ``n`` names (``offset`` included) fit ``classes``: "adjust --label-offset" was said to a
    file with more names than the model has classes too (COCO's 90 ids on an 80-class detector), which no
    offset fixes."""
    if n < classes:
        return (f"--label-offset {offset + classes - n} if the file lacks {classes - n} leading background "
                "class(es), else the labels file made for this model")
    if offset >= n - classes:
        return f"--label-offset {offset - (n - classes)} (the file holds the background class(es) itself?)"
    return (f"the file names {n - classes - offset} more classes than the model has, which no --label-offset "
            "fixes: use the labels file made for this model (COCO's 90-id list fits a 90-class SSD, not an "
            "80-class YOLO)")


def read_labels(labels, label_offset: int, facts: dict, warnings: list) -> list[str] | None:
    """The labels file's names (``label_offset`` background names first), checked against the
    class count ``check_io`` found; duplicates warned about."""
    if not labels:
        return None
    from edge_runtime.models.base import describe_duplicates, duplicate_labels

    classes, spec = facts.get("classes"), facts.get("output") or {}
    argmax = (facts.get("argmax") or {}) if classes is None else {}
    try:
        text = Path(labels).read_text(encoding="utf-8-sig")     # a byte-order mark is no part of the first label
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read labels file {labels}: {exc}", code=ec.IMPORT_LABELS_UNREADABLE) from None
    lines = [ln.strip() for ln in text.splitlines()]
    names = [ln for ln in lines if ln]
    indexed = _indexed_labels(names, Path(labels).name, warnings)
    inner = [i + 1 for i, ln in enumerate(lines[:max((i for i, ln in enumerate(lines) if ln), default=0)]) if not ln]
    if inner and indexed is names and classes is None and not argmax:
        # no class count tells a stray newline from an unused id (ids from an in-graph postprocess): either
        # reading would shift every label after it for the other
        raise InputError(f"{Path(labels).name} has blank line(s) between names (line(s) "
                         f"{', '.join(map(str, inner[:5]))}): each line is one class id, so every label after one "
                         "would shift; write '???' for an unused id, or remove the line", code=ec.IMPORT_LABELS_MISMATCH)
    if indexed is not names and label_offset:
        raise InputError(f"{Path(labels).name} gives each label its id ('ID NAME' lines), so --label-offset "
                         f"{label_offset} would move every label off its id: drop --label-offset",
                         code=ec.IMPORT_LABELS_MISMATCH)
    names = indexed
    names = [f"background_{i}" if label_offset > 1 else "background" for i in range(label_offset)] + names
    if argmax:
        n = argmax["classes"]
        if len(names) < n:
            raise InputError(f"{len(names)} labels (offset {label_offset} included) for {n} classes (the ArgMax "
                             f"that writes output {spec.get('name')!r} runs over {argmax['over']}): every class "
                             f"after a missing one would get the next one's name; adjust --label-offset "
                             f"(a background class missing from the file?)", code=ec.IMPORT_LABELS_MISMATCH)
        if len(names) > n:
            warnings.append(f"{Path(labels).name}: {len(names)} labels for {n} classes (the ArgMax over "
                            f"{argmax['over']}): the last {len(names) - n} ({', '.join(map(repr, names[n:][:3]))}"
                            f"{', ...' if len(names) - n > 3 else ''}) name no class")
    if classes is not None and len(names) != classes:
        where = f" (output {spec['name']!r} {spec['shape']})" if spec else ""
        raise InputError(f"{len(names)} labels (offset {label_offset} included) for {classes} classes{where}; "
                         f"{_offset_hint(len(names), classes, label_offset)}", code=ec.IMPORT_LABELS_MISMATCH)
    dup = duplicate_labels(names)
    if dup:
        warnings.append(f"{Path(labels).name}: {describe_duplicates(dup)}")
    return names


_INDEXED_LABEL = re.compile(r"(\d+)(?:\s*:\s*|\s+)(\S.*)")


def _indexed_labels(lines: list[str], name: str, warnings: list) -> list[str]:
    """A labels file in the ``ID NAME`` / ``ID: NAME`` form of Coral's model zoo (``0  person``,
    ``1  bicycle``, ..., ids skipped where the model has no class) is read by id, as pycoral's
    ``read_label_file`` reads it: the names without their ids, at their ids, an id left out
    named by its number. Taking the lines in order instead would shift every label after the
    first skipped id (and keep the ids in the names). A file is read this way only when every
    line has that form and the ids are distinct; else its lines are the labels, in order."""
    if len(lines) < 2:
        return lines
    found = [_INDEXED_LABEL.fullmatch(ln) for ln in lines]
    if not all(found):
        return lines
    by_id = {int(m.group(1)): m.group(2).strip() for m in found if m}
    if len(by_id) != len(lines):
        return lines
    top = max(by_id)
    missing = [i for i in range(top + 1) if i not in by_id]
    shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
    warnings.append(f"{name}: labels in 'ID NAME' form, read by id (ids 0..{top}"
                    + (f"; no label for {len(missing)} id(s): {shown}, named by their number" if missing else "")
                    + ")")
    return [by_id.get(i, str(i)) for i in range(top + 1)]


def prepare(model, out, *, task: str, labels, label_offset: int, force: bool, options: dict, read) -> dict:
    """Everything up to the artifact: the request checked, ``read(model)`` (the format's reading:
    ``inputs``, ``outputs``, ``ops`` and whatever else the format keeps), the sections and labels.
    Returns ``{"model", "out", "info", "pre", "post", "names", "warnings"}``."""
    model, out = Path(model), Path(out)
    task_cls, given = check_request(model, out, task=task, labels=labels, label_offset=label_offset, force=force,
                                    options=options)
    warnings: list[str] = []
    info = read(model, warnings)
    refuse_dynamic(info)
    facts, pre, post = task_sections(task_cls, info, given, warnings)
    out_name = (facts.get("output") or {}).get("name")
    if facts.get("classes") is None and out_name in (info.get("argmax_classes") or {}):
        facts = {**facts, "argmax": info["argmax_classes"][out_name]}
    names = read_labels(labels, label_offset, facts, warnings)
    return {"model": model, "out": out, "info": info, "pre": pre, "post": post, "names": names,
            "warnings": warnings}


def write_artifact(job: dict, *, task: str, name: str | None, version: str, target: str, rel: str,
                   variant: dict, source: dict | None = None) -> dict:
    """Write the artifact of ``job`` (:func:`prepare`'s) to its ``out``: the model copied to ``rel``,
    the labels, the manifest with one ``target`` variant (``variant``: its ``quantization``,
    ``toolchain`` and any other fields). Returns the manifest."""
    model, out, info, warnings = job["model"], job["out"], job["info"], job["warnings"]
    post = dict(job["post"])
    for w in warnings:
        log.warning("%s: %s", model.name, w)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except (FileExistsError, NotADirectoryError) as exc:
        raise InputError(f"cannot create the output directory {out}: {exc.strerror or exc} "
                         f"(a path component is a file)", code=ec.IMPORT_OUT_NOT_A_DIRECTORY) from None
    try:
        writer = ArtifactWriter(tmp)
        writer.add_file(rel, model)
        if job["names"] is not None:
            post["labels"] = writer.add_file("labels.txt", data=("\n".join(job["names"]) + "\n").encode("utf-8"))
        src = {"file": model.name, "sha256": sha256_file(model), "imported": True, **(source or {})}
        if warnings:
            src["warnings"] = list(warnings)
        record = {"target": target,
                  "buckets": [{"name": "static", "file": rel, "inputs": info["inputs"], "outputs": info["outputs"]}],
                  "parity": {"metric": "not_measured", "value": None, "samples": 0,
                             "note": "imported model: no fp32 reference to measure against"},
                  **variant}
        record["toolchain"] = {"edge-runtime": __version__, **record.get("toolchain", {})}
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "model": {"name": name or model.stem, "version": version, "source": src},
            "task": task,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": {},
            "preprocess": job["pre"],
            "postprocess": post,
            "limits": {},
            "variants": [record],
        }
        writer.write_manifest(manifest)
        if out.exists():
            shutil.rmtree(out)
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
        return manifest
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
