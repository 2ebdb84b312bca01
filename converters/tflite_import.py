"""Wrap an existing quantized TFLite model (a Coral model-zoo file, say) into an artifact.

Nothing is converted: the model file is copied and hashed; its input/output
names, dtypes, shapes and quantization come from the model itself; labels may
be shifted by a background offset. A model compiled for the Edge TPU becomes
an ``edgetpu`` variant, any other a ``tflite-int8`` one. Parity is recorded
as not measured: there is no fp32 reference to measure it against. Which
tasks it imports, the check of the model's tensors and the ``preprocess`` /
``postprocess`` sections come from the task contract (``Task.importable``,
``check_io``, ``import_sections``, ``takes_labels``, ``import_options``); the
built-in importable tasks are image-classification and tensors.

Image classifiers (``task="image-classification"``): one image input,
``[1, H, W, C]`` (NHWC) or ``[1, C, H, W]`` (NCHW), C in 1/3; one ``[1, C]``
or ``[C]`` score output. Anything else (a YOLO or SSD detector, a
segmentation class map, pose keypoints) is refused with an ``InputError``
naming the tensor, its shape and the task that fits. Images are resized the
way Coral's models were evaluated (bilinear, half-pixel centres, truncated),
normalised to ``x = (p * scale - mean[c]) / std[c]`` and quantized with the
input tensor's own scale and zero point. The normalisation is stated with
``scale``/``mean``/``std`` (``mean``/``std`` are in units of ``p * scale``;
``scale`` defaults to 1/255 once ``mean`` or ``std`` is stated); without it,
the default for the input dtype (:func:`edge_runtime.models.image.default_normalisation`):

- uint8: the pixels are the quantized input (``q = p``, Coral's convention:
  ``scale`` = input scale, ``mean`` = zero point × scale, ``std`` = 1);
- int8 and float32: ``[-1, 1]`` (``p / 127.5 - 1``), with a warning for int8
  that names the normalisation the input quantization's range looks like
  (``[0, 1]``, ``[-1, 1]``, ImageNet mean/std, ``[0, 255]``).

The normalisation is checked against the input quantization: pixel values
0..255 must quantize inside the integer range (at most one level over an end:
``[-1, 1]`` at scale 1/128 reaches 128), else ``InputError``
``import_normalisation_clips``; under 1/8 of the integer range used is a
warning. Warnings (also for duplicate labels) are logged and recorded in
``model.source.warnings``.

Recorded in ``preprocess``: ``size``, ``channels``, ``layout``, ``resize``,
``scale``, ``mean``, ``std``, ``normalisation_source`` (``stated`` or
``default``) and ``input``: ``"pixels"`` where the quantized normalised
pixels are the pixels themselves (``q = p``, or ``p - 128`` for int8: the
runtime casts them, no arithmetic), ``"quantized"`` for any other integer
input; absent for a float input.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from edge_runtime import __version__
from edge_runtime.artifact import ArtifactWriter, sha256_file
from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError, InputError
from edge_runtime.manifest import FORMAT, FORMAT_VERSION
from edge_runtime.models import get_task, tasks_where
from edge_runtime.models.base import TaskMismatch
from edge_runtime.models.image_import import image_preprocess  # noqa: F401 (re-exported: tests, callers)

_MAX_MODEL_BYTES = 512 << 20
log = logging.getLogger("edge_runtime.import")

def _spec(detail: dict) -> dict:
    spec = {"name": detail["name"], "dtype": np.dtype(detail["dtype"]).name,
            "shape": [int(d) for d in detail["shape"]]}
    scale, zero = detail.get("quantization", (0.0, 0))
    if scale:
        spec["quantization"] = {"scale": float(scale), "zero_point": int(zero)}
    sig = detail.get("shape_signature")
    # a -1 batch dimension is fine: the interpreter allocates (and we run) batch 1
    if sig is not None and any(int(d) < 0 for d in list(sig)[1:]):
        spec["dynamic"] = True
    return spec


def read_model(path: Path) -> dict:
    """I/O specs and op names through the interpreter (no tensors allocated)."""
    from edge_runtime.devices.tflite_backend import interpreter_module, is_edgetpu_model

    mod, why = interpreter_module()
    if mod is None:
        raise InputError(why, code=ec.IMPORT_NO_INTERPRETER)
    try:
        interp = mod.Interpreter(model_path=str(path))
        inputs = [_spec(d) for d in interp.get_input_details()]
        outputs = [_spec(d) for d in interp.get_output_details()]
        ops = [d["op_name"] for d in interp._get_ops_details()]
    except ValueError as exc:
        raise ArtifactError(f"not a TFLite model the interpreter accepts: {str(exc).strip()[:300]}",
                            file=Path(path).name, code=ec.IMPORT_MODEL_INVALID) from None
    if any(not o["shape"] for o in outputs):
        # shapes a custom op decides (TFLite_Detection_PostProcess) read [] until tensors are allocated
        try:
            kw = {}
            if hasattr(mod, "OpResolverType"):     # no XNNPACK delegate: it logs a line on stderr
                kw["experimental_op_resolver_type"] = mod.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
            probe = mod.Interpreter(model_path=str(path), **kw)
            probe.allocate_tensors()
            outputs = [_spec(d) for d in probe.get_output_details()]
        except Exception:  # noqa: BLE001 - an Edge TPU op, say: keep what the model declares
            pass
    return {"inputs": inputs, "outputs": outputs, "ops": ops, "edgetpu": is_edgetpu_model(path)}


def _edgetpu_summary(model: Path) -> dict | None:
    """The static Edge TPU compatibility report, when the ``tflite`` parser is installed."""
    try:
        import tflite  # noqa: F401
    except ImportError:
        return None
    from .edgetpu_report import edgetpu_report
    from .tflite_inspect import inspect_tflite

    r = edgetpu_report(inspect_tflite(model))
    keep = ("edgetpu_compiled", "fully_mappable", "op_count", "tpu_ops", "cpu_ops", "first_unsupported",
            "load_error", "split", "tpu_parameter_bytes", "exceeds_on_chip_memory", "warnings", "verdict")
    return {k: r[k] for k in keep}


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


def import_tflite(model: Path, out: Path, *, task: str = "image-classification", labels: Path | None = None,
                  label_offset: int = 0, name: str | None = None, version: str = "1", force: bool = False,
                  resize: str = "bilinear-half-pixel", scale=None, mean=None, std=None) -> dict:
    """Import ``model`` into the artifact directory ``out``; returns the manifest.

    ``scale``/``mean``/``std`` state the image normalisation (numbers, lists,
    or strings such as ``"1/255"`` and ``"0.485,0.456,0.406"``).
    """
    model, out = Path(model), Path(out)
    if not model.is_file():
        raise InputError(f"model {model} does not exist", code=ec.IMPORT_MODEL_MISSING)
    if model.stat().st_size > _MAX_MODEL_BYTES:
        raise InputError(f"model is over {_MAX_MODEL_BYTES >> 20} MiB", code=ec.IMPORT_MODEL_TOO_LARGE)
    task_cls = importable_task(task)
    given = {k: v for k, v in (("scale", scale), ("mean", mean), ("std", std)) if v is not None}
    if labels and not task_cls.takes_labels:
        takes = ", ".join(tasks_where(lambda t: t.importable and t.takes_labels)) or "none"
        raise InputError(f"--labels: task {task} takes no labels (a {task} artifact returns the model's outputs); "
                         f"drop --labels, or import with a task that takes them ({takes})",
                         code=ec.IMPORT_LABELS_UNUSED)
    unused = [k for k in given if k not in task_cls.import_options]
    if unused:
        flags = "/".join(f"--{k}" for k in unused)
        raise InputError(f"{flags}: task {task} takes no such pre-processing (it reads "
                         f"{', '.join('--' + o for o in task_cls.import_options) or 'none'}; a {task} artifact "
                         f"takes its inputs as given)", code=ec.IMPORT_PREPROCESS_UNUSED)
    if label_offset and not labels:
        raise InputError("--label-offset shifts a labels file: give --labels too", code=ec.IMPORT_LABELS_UNUSED)
    if label_offset < 0:
        raise InputError(f"--label-offset must be 0 or more, got {label_offset}", code=ec.IMPORT_LABELS_MISMATCH)
    if out.exists() and not out.is_dir():
        raise InputError(f"output {out} exists and is not a directory (-o names the artifact directory to write)",
                         code=ec.IMPORT_OUT_NOT_A_DIRECTORY)
    if out.exists() and any(out.iterdir()) and not force:
        raise InputError(f"output directory {out} exists and is not empty (use --force)", code=ec.CONVERT_OUT_EXISTS)
    info = read_model(model)
    if any(s.get("dynamic") for s in info["inputs"] + info["outputs"]):
        raise InputError("the model has dynamic dimensions; artifacts are static-shape", code=ec.IMPORT_SHAPE_DYNAMIC)
    try:
        facts = task_cls.check_io(info["inputs"], info["outputs"])
    except TaskMismatch as exc:      # the model's inputs are unsupported; its outputs are another task's
        raise InputError(str(exc), code=ec.IMPORT_MODEL_UNSUPPORTED if exc.part == "inputs"
                         else ec.IMPORT_TASK_MISMATCH) from None
    warnings: list[str] = []
    options = {k: v for k, v in {"resize": resize, **given}.items() if k in task_cls.import_options}
    pre, post = task_cls.import_sections(info, options, warnings)
    names = None
    if labels:
        from edge_runtime.models.base import describe_duplicates, duplicate_labels

        classes, spec = facts.get("classes"), facts.get("output") or {}
        try:
            text = Path(labels).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read labels file {labels}: {exc}", code=ec.IMPORT_LABELS_UNREADABLE) from None
        names = [ln.strip() for ln in text.splitlines() if ln.strip()]
        names = [f"background_{i}" if label_offset > 1 else "background" for i in range(label_offset)] + names
        if classes is not None and len(names) != classes:
            raise InputError(f"{len(names)} labels (offset {label_offset} included) for {classes} classes "
                             f"(output {spec['name']!r} {spec['shape']}); adjust --label-offset",
                             code=ec.IMPORT_LABELS_MISMATCH)
        dup = duplicate_labels(names)
        if dup:
            warnings.append(f"{Path(labels).name}: {describe_duplicates(dup)}")
    for w in warnings:
        log.warning("%s: %s", model.name, w)
    target = "edgetpu" if info["edgetpu"] else "tflite-int8"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except (FileExistsError, NotADirectoryError) as exc:
        raise InputError(f"cannot create the output directory {out}: {exc.strerror or exc} "
                         f"(a path component is a file)", code=ec.IMPORT_OUT_NOT_A_DIRECTORY) from None
    try:
        writer = ArtifactWriter(tmp)
        rel = f"{target}/model.tflite"
        writer.add_file(rel, model)
        if names is not None:
            post["labels"] = writer.add_file("labels.txt", data=("\n".join(names) + "\n").encode("utf-8"))
        weights = sorted({s["dtype"] for s in info["inputs"] + info["outputs"]})
        source = {"file": model.name, "sha256": sha256_file(model), "imported": True}
        if warnings:
            source["warnings"] = list(warnings)
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "model": {"name": name or model.stem, "version": version, "source": source},
            "task": task,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": {},
            "preprocess": pre,
            "postprocess": post,
            "limits": {},
            "variants": [{
                "target": target,
                "buckets": [{"name": "static", "file": rel, "inputs": info["inputs"], "outputs": info["outputs"]}],
                "quantization": {"scheme": "imported (as quantized by its producer)",
                                 "weights": "as in the model", "activations": "/".join(weights) + " I/O"},
                "parity": {"metric": "not_measured", "value": None, "samples": 0,
                           "note": "imported model: no fp32 reference to measure against"},
                "toolchain": {"edge-runtime": __version__, "imported_ops": len(info["ops"])},
            }],
        }
        report = _edgetpu_summary(model)
        if report is not None:
            manifest["variants"][0]["edgetpu_report"] = report
        writer.write_manifest(manifest)
        if out.exists():
            shutil.rmtree(out)
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
        return manifest
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
