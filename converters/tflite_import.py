"""Wrap an existing quantized TFLite model (a Coral model-zoo file, say) into an artifact.

Nothing is converted: the model file is copied and hashed; its input/output
names, dtypes, shapes and quantization come from the model itself; image
pre-processing is recorded the way such models were evaluated (bilinear
resize with half-pixel centres, the resized pixels fed as the input's
integer dtype); labels may be shifted by a background offset. A model
compiled for the Edge TPU becomes an ``edgetpu`` variant, any other a
``tflite-int8`` one. Parity is recorded as not measured: there is no fp32
reference to measure it against.
"""

from __future__ import annotations

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


def _check_image_model(info: dict) -> None:
    if len(info["inputs"]) != 1:
        raise InputError(f"an image classifier takes one input; this model has {len(info['inputs'])} "
                         "(import it with --task tensors)", code="import_model_unsupported")
    spec = info["inputs"][0]
    shape = spec["shape"]
    if len(shape) != 4 or shape[0] != 1 or shape[3] not in (1, 3):
        raise InputError(f"image input must be [1, H, W, 1|3], got {shape} (import it with --task tensors)",
                         code="import_model_unsupported")
    if spec["dtype"] not in ("uint8", "int8", "float32"):
        raise InputError(f"image input dtype {spec['dtype']} is not supported", code="import_model_unsupported")


def _image_sections(info: dict, resize: str) -> tuple[dict, dict]:
    spec = info["inputs"][0]
    shape = spec["shape"]
    pre = {"kind": "image", "size": [shape[1], shape[2]], "channels": shape[3], "layout": "NHWC", "resize": resize}
    if spec["dtype"] == "float32":   # a float model: the usual [-1, 1] normalisation
        pre.update(scale=1 / 127.5, mean=[1.0], std=[1.0])
    else:
        pre["input"] = "pixels"
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
                  resize: str = "bilinear-half-pixel") -> dict:
    model, out = Path(model), Path(out)
    if not model.is_file():
        raise InputError(f"model {model} does not exist", code="import_model_missing")
    if model.stat().st_size > _MAX_MODEL_BYTES:
        raise InputError(f"model is over {_MAX_MODEL_BYTES >> 20} MiB", code="import_model_too_large")
    if task not in ("image-classification", "tensors"):
        raise InputError(f"import supports image-classification and tensors, not {task!r}",
                         code="import_task_unsupported")
    if out.exists() and any(out.iterdir()) and not force:
        raise InputError(f"output directory {out} exists and is not empty (use --force)", code="convert_out_exists")
    info = read_model(model)
    if any(s.get("dynamic") for s in info["inputs"] + info["outputs"]):
        raise InputError("the model has dynamic dimensions; artifacts are static-shape", code="import_shape_dynamic")
    if task == "image-classification":
        _check_image_model(info)
    target = "edgetpu" if info["edgetpu"] else "tflite-int8"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        writer = ArtifactWriter(tmp)
        rel = f"{target}/model.tflite"
        writer.add_file(rel, model)
        if task == "tensors":
            pre, post = {"kind": "tensors"}, {}
        else:
            pre, post = _image_sections(info, resize)
        if labels and task == "image-classification":
            classes = int(np.prod(info["outputs"][0]["shape"][1:]))
            names = [ln.strip() for ln in Path(labels).read_text(encoding="utf-8").splitlines() if ln.strip()]
            names = [f"background_{i}" if label_offset > 1 else "background" for i in range(label_offset)] + names
            if len(names) != classes:
                raise InputError(f"{len(names)} labels (offset {label_offset} included) for {classes} model "
                                 f"outputs; adjust --label-offset", code="import_labels_mismatch")
            post["labels"] = writer.add_file("labels.txt", data=("\n".join(names) + "\n").encode("utf-8"))
        weights = sorted({s["dtype"] for s in info["inputs"] + info["outputs"]})
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "model": {"name": name or model.stem, "version": version,
                      "source": {"file": model.name, "sha256": sha256_file(model), "imported": True}},
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
