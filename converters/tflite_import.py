"""Wrap an existing quantized TFLite model (a Coral model-zoo file, say) into an artifact.

Nothing is converted: the model file is copied and hashed; its input/output
names, dtypes, shapes and quantization come from the model itself; labels may
be shifted by a background offset. A model compiled for the Edge TPU becomes
an ``edgetpu`` variant, any other a ``tflite-int8`` one. Parity is recorded
as not measured: there is no fp32 reference to measure it against.

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
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from edge_runtime import __version__
from edge_runtime.artifact import ArtifactWriter, sha256_file
from edge_runtime.errors import ArtifactError, InputError
from edge_runtime.manifest import FORMAT, FORMAT_VERSION

_MAX_MODEL_BYTES = 512 << 20
log = logging.getLogger("edge_runtime.import")

# (name, normalisation, the options that state it): the ranges a warning may name
_KNOWN_NORMALISATIONS = (
    ("[-1, 1]", {"scale": 1 / 127.5, "mean": [1.0], "std": [1.0]}, "--scale 1/127.5 --mean 1 --std 1"),
    ("[0, 1] (RGB/255)", {"scale": 1 / 255, "mean": [0.0], "std": [1.0]}, "--scale 1/255 --mean 0 --std 1"),
    ("ImageNet mean/std", {"scale": 1 / 255, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
     "--scale 1/255 --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225"),
    ("[0, 255]", {"scale": 1.0, "mean": [0.0], "std": [1.0]}, "--scale 1 --mean 0 --std 1"),
)
_MIN_COVERAGE = 1 / 8


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
        raise InputError(why, code="import_no_interpreter")
    try:
        interp = mod.Interpreter(model_path=str(path))
        inputs = [_spec(d) for d in interp.get_input_details()]
        outputs = [_spec(d) for d in interp.get_output_details()]
        ops = [d["op_name"] for d in interp._get_ops_details()]
    except ValueError as exc:
        raise ArtifactError(f"not a TFLite model the interpreter accepts: {str(exc).strip()[:300]}",
                            file=Path(path).name, code="import_model_invalid") from None
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


def _image_layout(shape: list[int]) -> str | None:
    if len(shape) != 4 or shape[0] != 1:
        return None
    if shape[3] in (1, 3):
        return "NHWC"
    if shape[1] in (1, 3):
        return "NCHW"
    return None


def _check_image_model(info: dict) -> None:
    if len(info["inputs"]) != 1:
        raise InputError(f"an image classifier takes one input; this model has {len(info['inputs'])} "
                         "(import it with --task tensors)", code="import_model_unsupported")
    spec = info["inputs"][0]
    shape = spec["shape"]
    if _image_layout(shape) is None:
        raise InputError(f"image input must be [1, H, W, 1|3] or [1, 1|3, H, W], got {shape} "
                         "(import it with --task tensors)", code="import_model_unsupported")
    if spec["dtype"] not in ("uint8", "int8", "float32"):
        raise InputError(f"image input dtype {spec['dtype']} is not supported", code="import_model_unsupported")
    from edge_runtime.models.image_classification import NotAClassifier, classifier_output

    try:
        classifier_output(info["outputs"])
    except NotAClassifier as exc:
        raise InputError(str(exc), code="import_task_mismatch") from None


def _floats(value, what: str) -> list[float]:
    """``0.5``, ``"1/255"``, ``"0.485,0.456,0.406"`` or a list of those → floats."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        items = [value]
    elif isinstance(value, str):
        items = [v for v in value.replace(" ", "").split(",") if v != ""]
    else:
        items = list(value)
    out = []
    for item in items:
        try:
            if isinstance(item, str) and "/" in item:
                num, den = item.split("/", 1)
                f = float(num) / float(den)
            else:
                f = float(item)
        except (ValueError, ZeroDivisionError):
            raise InputError(f"{what}: {item!r} is not a number (write 0.5, 1/255 or 0.485,0.456,0.406)",
                             code="import_preprocess_invalid") from None
        if not math.isfinite(f):
            raise InputError(f"{what}: {item!r} is not finite", code="import_preprocess_invalid")
        out.append(f)
    if not out:
        raise InputError(f"{what} is empty", code="import_preprocess_invalid")
    return out


def _stated_normalisation(channels: int, scale=None, mean=None, std=None) -> dict | None:
    if scale is None and mean is None and std is None:
        return None
    sc = _floats(scale, "--scale") if scale is not None else [1 / 255]
    if len(sc) != 1 or sc[0] <= 0:
        raise InputError(f"--scale must be one positive number, got {scale!r}", code="import_preprocess_invalid")
    mn = _floats(mean, "--mean") if mean is not None else [0.0]
    sd = _floats(std, "--std") if std is not None else [1.0]
    for what, vals in (("--mean", mn), ("--std", sd)):
        if len(vals) not in (1, channels):
            raise InputError(f"{what} has {len(vals)} values for a {channels}-channel input (give 1 or {channels})",
                             code="import_preprocess_invalid")
    if any(v == 0 for v in sd):
        raise InputError("--std must not be 0", code="import_preprocess_invalid")
    return {"scale": sc[0], "mean": mn, "std": sd}


def _range(norm: dict, channels: int) -> tuple[float, float]:
    """The normalised float range of pixel values 0..255 over all channels."""
    mean = np.broadcast_to(np.asarray(norm["mean"], dtype=np.float64), (channels,))
    std = np.broadcast_to(np.asarray(norm["std"], dtype=np.float64), (channels,))
    ends = np.stack([(0.0 - mean) / std, (255.0 * norm["scale"] - mean) / std])
    return float(ends.min()), float(ends.max())


def _looks_like(spec: dict, channels: int):
    """The known normalisation whose float range matches the input quantization's, or None."""
    q = spec.get("quantization")
    if not q:
        return None
    info = np.iinfo(np.dtype(spec["dtype"]))
    lo, hi = (info.min - q["zero_point"]) * q["scale"], (info.max - q["zero_point"]) * q["scale"]
    best = None
    for name, norm, flags in _KNOWN_NORMALISATIONS:
        a, b = _range(norm, channels)
        err = (abs(a - lo) + abs(b - hi)) / max(hi - lo, 1e-12)
        if err < 0.1 and (best is None or err < best[0]):
            best = (err, name, flags)
    return None if best is None else best[1:]


def image_preprocess(spec: dict, *, resize: str = "bilinear-half-pixel", scale=None, mean=None, std=None,
                     warnings: list | None = None) -> dict:
    """The ``preprocess`` section for an image input ``spec`` (see the module doc),
    the normalisation checked against the input's quantization. Warnings are
    appended to ``warnings``."""
    from edge_runtime.models.image import input_plan, quantized_levels, default_normalisation

    warnings = [] if warnings is None else warnings
    shape = spec["shape"]
    layout = _image_layout(shape)
    if layout is None:
        raise InputError(f"image input must be [1, H, W, 1|3] or [1, 1|3, H, W], got {shape}",
                         code="import_model_unsupported")
    h, w, c = (shape[1], shape[2], shape[3]) if layout == "NHWC" else (shape[2], shape[3], shape[1])
    pre = {"kind": "image", "size": [h, w], "channels": c, "layout": layout, "resize": resize}
    norm = _stated_normalisation(c, scale, mean, std)
    source = "stated" if norm is not None else "default"
    if norm is None:
        norm = default_normalisation(spec)
        if spec["dtype"] == "int8":
            seen = _looks_like(spec, c)
            if seen is None or seen[0] != _KNOWN_NORMALISATIONS[0][0]:
                q = spec["quantization"] if spec.get("quantization") else {"scale": 1.0, "zero_point": 0}
                hint = (f"; its input quantization (scale {q['scale']:.6g}, zero point {q['zero_point']}) "
                        f"covers the range of {seen[0]}: if that is what it was trained on, import with {seen[1]}"
                        if seen else "")
                warnings.append(f"no normalisation stated for the int8 input: assuming [-1, 1] "
                                f"(--scale 1/127.5 --mean 1 --std 1){hint}")
    pre.update(scale=float(norm["scale"]), mean=[float(v) for v in norm["mean"]],
               std=[float(v) for v in norm["std"]], normalisation_source=source)
    dtype = np.dtype(spec["dtype"])
    if dtype.kind in "iu":
        levels = quantized_levels(pre, spec, c)
        info = np.iinfo(dtype)
        lo, hi = float(levels.min()), float(levels.max())
        q = spec.get("quantization") or {"scale": 1.0, "zero_point": 0}
        flo, fhi = _range(norm, c)
        if lo < info.min - 1 or hi > info.max + 1:
            seen = _looks_like(spec, c)
            hint = f"; the input quantization covers the range of {seen[0]} ({seen[1]})" if seen else ""
            raise InputError(
                f"the normalised pixels ({flo:.4g}..{fhi:.4g}) quantize to {lo:.1f}..{hi:.1f} with the input's "
                f"scale {q['scale']:.6g} and zero point {q['zero_point']}, outside {dtype.name} "
                f"{info.min}..{info.max}: they would be clipped. The normalisation does not fit the model's "
                f"input; state the one it was trained with (--scale/--mean/--std){hint}",
                code="import_normalisation_clips")
        share = (hi - lo) / (info.max - info.min)
        if share < _MIN_COVERAGE:
            warnings.append(f"the normalised pixels ({flo:.4g}..{fhi:.4g}) use {hi - lo:.1f} of the "
                            f"{info.max - info.min} steps of the {dtype.name} input ({share:.0%}): most pixel "
                            "values quantize alike; check --scale/--mean/--std")
        kind, _ = input_plan(pre, spec, c)
        pre["input"] = "pixels" if kind in ("cast", "shift") else "quantized"
    return pre


def _image_sections(info: dict, resize: str, warnings: list, **norm) -> tuple[dict, dict]:
    spec = info["inputs"][0]
    pre = image_preprocess(spec, resize=resize, warnings=warnings, **norm)
    out = info["outputs"][0]
    q = out.get("quantization") or {}
    # a model that ends in SOFTMAX (maybe then reshaped or re-quantized) already outputs
    # probabilities; inside an Edge TPU custom op the softmax is not visible, but its
    # output quantization is the softmax one (scale 1/256, zero point 0)
    probs = "SOFTMAX" in info["ops"][-3:] or (abs(q.get("scale", 0) - 1 / 256) < 1e-9 and q.get("zero_point") == 0)
    post = {"output": out["name"], "top_k": 5, "softmax": not probs}
    return pre, post


def import_tflite(model: Path, out: Path, *, task: str = "image-classification", labels: Path | None = None,
                  label_offset: int = 0, name: str | None = None, version: str = "1", force: bool = False,
                  resize: str = "bilinear-half-pixel", scale=None, mean=None, std=None) -> dict:
    """Import ``model`` into the artifact directory ``out``; returns the manifest.

    ``scale``/``mean``/``std`` state the image normalisation (numbers, lists,
    or strings such as ``"1/255"`` and ``"0.485,0.456,0.406"``).
    """
    model, out = Path(model), Path(out)
    if not model.is_file():
        raise InputError(f"model {model} does not exist", code="import_model_missing")
    if model.stat().st_size > _MAX_MODEL_BYTES:
        raise InputError(f"model is over {_MAX_MODEL_BYTES >> 20} MiB", code="import_model_too_large")
    if task not in ("image-classification", "tensors"):
        raise InputError(f"import supports image-classification and tensors, not {task!r}",
                         code="import_task_unsupported")
    if task == "tensors":
        if labels:
            raise InputError("--labels is for image-classification: a tensors artifact returns the model's outputs "
                             "and has no labels (drop --labels, or import with --task image-classification)",
                             code="import_labels_unused")
        if any(v is not None for v in (scale, mean, std)):
            raise InputError("--scale/--mean/--std are image pre-processing: a tensors artifact takes its "
                             "inputs as given", code="import_preprocess_unused")
    if label_offset and not labels:
        raise InputError("--label-offset shifts a labels file: give --labels too", code="import_labels_unused")
    if label_offset < 0:
        raise InputError(f"--label-offset must be 0 or more, got {label_offset}", code="import_labels_mismatch")
    if out.exists() and not out.is_dir():
        raise InputError(f"output {out} exists and is not a directory (-o names the artifact directory to write)",
                         code="import_out_not_a_directory")
    if out.exists() and any(out.iterdir()) and not force:
        raise InputError(f"output directory {out} exists and is not empty (use --force)", code="convert_out_exists")
    info = read_model(model)
    if any(s.get("dynamic") for s in info["inputs"] + info["outputs"]):
        raise InputError("the model has dynamic dimensions; artifacts are static-shape", code="import_shape_dynamic")
    if task == "image-classification":
        _check_image_model(info)
    warnings: list[str] = []
    if task == "tensors":
        pre, post = {"kind": "tensors"}, {}
    else:
        pre, post = _image_sections(info, resize, warnings, scale=scale, mean=mean, std=std)
    names = None
    if labels and task == "image-classification":
        from edge_runtime.models.base import describe_duplicates, duplicate_labels
        from edge_runtime.models.image_classification import classifier_output

        spec, classes = classifier_output(info["outputs"])
        try:
            text = Path(labels).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read labels file {labels}: {exc}", code="import_labels_unreadable") from None
        names = [ln.strip() for ln in text.splitlines() if ln.strip()]
        names = [f"background_{i}" if label_offset > 1 else "background" for i in range(label_offset)] + names
        if len(names) != classes:
            raise InputError(f"{len(names)} labels (offset {label_offset} included) for {classes} classes "
                             f"(output {spec['name']!r} {spec['shape']}); adjust --label-offset",
                             code="import_labels_mismatch")
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
                         f"(a path component is a file)", code="import_out_not_a_directory") from None
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
