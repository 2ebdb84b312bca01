"""Wrap an existing quantized TFLite model (a Coral model-zoo file, say) into an artifact.

Nothing is converted: the model file is copied and hashed; its input/output
names, dtypes, shapes and quantization come from the model itself; labels may
be shifted by a background offset. A model compiled for the Edge TPU becomes
an ``edgetpu`` variant, any other a ``tflite-int8`` one (the one target the
TFLite backend runs: a float model too, its ``quantization`` record saying what
the graph computes in, ``precision`` ``fp32``, ``fp16``, ``dynamic-range``,
``int8``, ...; never assumed from the target's name). Parity is recorded
as not measured: there is no fp32 reference to measure it against. Which
tasks it imports, the check of the model's tensors and the ``preprocess`` /
``postprocess`` sections come from the task contract (``Task.importable``,
``check_io``, ``import_sections``, ``takes_labels``, ``import_options``); the
request's checks, the labels and the artifact written are shared with ONNX
import (:mod:`.import_common`, which also names the import options: the vision
ones ``resize_mode``, ``pad``, ``pad_position``, ``channel_order``, ``family``,
``postprocess`` besides ``resize``/``scale``/``mean``/``std``).

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

from pathlib import Path

import numpy as np

from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError, InputError
from edge_runtime.models.image_import import image_preprocess  # noqa: F401 (re-exported: tests, callers)

from .import_common import importable_task, prepare, write_artifact  # noqa: F401 (importable_task re-exported)
from .tflite_head import head_columns


def _spec(detail: dict, *, role: str = "input/output", file: str | None = None) -> dict:
    """The I/O spec of an interpreter tensor detail. Its ``quantization`` tuple is ``(0.0, 0)``
    for a tensor quantized per channel (the parameters are in ``quantization_parameters``):
    an integer one is refused, since the runtime (de)quantizes I/O with one scale and zero point."""
    spec = {"name": detail["name"], "dtype": np.dtype(detail["dtype"]).name,
            "shape": [int(d) for d in detail["shape"]]}
    scale, zero = detail.get("quantization", (0.0, 0))
    params = detail.get("quantization_parameters") or {}
    scales = np.asarray(params.get("scales", ()), dtype=np.float64).reshape(-1)
    zeros = np.asarray(params.get("zero_points", ()), dtype=np.int64).reshape(-1)
    if len(scales) > 1 and np.dtype(detail["dtype"]).kind in "iu":
        axis = int(params.get("quantized_dimension", 0))
        raise ArtifactError(
            f"{role} tensor {detail['name']!r} ({spec['dtype']} {spec['shape']}) is quantized per channel: "
            f"{len(scales)} scales along axis {axis}; edge-infer quantizes and dequantizes model inputs and "
            f"outputs with one scale and zero point per tensor, so it would feed or read this tensor unscaled. "
            f"Re-export the model with per-tensor quantization on its inputs and outputs (per-channel "
            f"weights inside the model are fine)",
            file=file, code=ec.IMPORT_IO_PER_CHANNEL, tensor=detail["name"], axis=axis, scales=len(scales))
    if not scale and len(scales) == 1:
        scale, zero = scales[0], (zeros[0] if len(zeros) else 0)
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
        inputs = [_spec(d, role="input", file=Path(path).name) for d in interp.get_input_details()]
        outputs = [_spec(d, role="output", file=Path(path).name) for d in interp.get_output_details()]
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
            outputs = [_spec(d, role="output", file=Path(path).name) for d in probe.get_output_details()]
        except Exception:  # noqa: BLE001 - an Edge TPU op, say: keep what the model declares
            pass
    return {"inputs": inputs, "outputs": outputs, "ops": ops, "format": "tflite", "edgetpu": is_edgetpu_model(path),
            "argmax_classes": _argmax_classes(interp), "head_columns": head_columns(interp),
            "precision": _precision(interp)}


# the ops that take weights (input 1): what they compute in is the model's precision
_WEIGHTED_OPS = {"CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "CONV_3D", "FULLY_CONNECTED", "BATCH_MATMUL"}


def _precision(interp) -> dict:
    """What the model computes in, from its graph: ``compute`` (the dtypes the weighted ops,
    convolutions and fully connected, write), ``weights`` (their constant weights' dtypes, through
    a DEQUANTIZE: float16 weights) and ``precision``: ``int8``/``int16x8`` (quantized activations),
    ``dynamic-range`` (int8 weights, float activations), ``fp16`` (float16 weights), ``fp32``, else
    ``mixed``; ``unread`` where the graph cannot be read. Without weighted ops, the dtypes every op
    writes decide."""
    try:
        tensors = {int(d["index"]): d for d in interp.get_tensor_details()}
        ops = interp._get_ops_details()
        writer = {int(o): op for op in ops for o in op["outputs"]}

        def dtype(i: int) -> str:
            return np.dtype(tensors[i]["dtype"]).name

        weighted = [op for op in ops if op["op_name"] in _WEIGHTED_OPS]
        compute = {dtype(int(o)) for op in (weighted or ops) for o in op["outputs"] if int(o) in tensors}
        compute -= {"int32", "int64", "bool"}       # indices, shapes, counts: no precision
        weights = set()
        for op in weighted:
            w = int(op["inputs"][1]) if len(op["inputs"]) > 1 else -1
            src = writer.get(w)
            if src is not None and src["op_name"] == "DEQUANTIZE" and src["inputs"]:
                w = int(src["inputs"][0])
            if w in tensors and w not in writer:
                weights.add(dtype(w))
    except Exception:  # noqa: BLE001 - a graph the private op listing cannot read: not judged
        return {"precision": "unread", "compute": [], "weights": []}
    floats, ints = {"float32", "float16"}, {"int8", "uint8"}
    if compute and compute <= ints:
        precision = "int8"
    elif compute and compute <= ints | {"int16"}:
        precision = "int16x8"
    elif compute and compute <= floats:
        precision = ("dynamic-range" if weights & ints else "fp16" if weights == {"float16"}
                     else "fp32" if weights <= {"float32"} else "mixed")
    else:
        precision = "mixed" if compute else "unread"
    return {"precision": precision, "compute": sorted(compute), "weights": sorted(weights)}


def _argmax_classes(interp) -> dict:
    """``{output name: {"classes": N, "over": "TENSOR [shape]"}}`` for each output an ARG_MAX over
    the last axis writes (DeepLab's class map): its class count, which the output's own shape
    does not show, so that a labels file can be checked against it. Empty where unreadable."""
    try:
        outs = {d["index"]: d["name"] for d in interp.get_output_details()}
        tensors = {d["index"]: d for d in interp.get_tensor_details()}
        found = {}
        for op in interp._get_ops_details():
            hit = [outs[i] for i in op["outputs"] if i in outs]
            if op["op_name"] != "ARG_MAX" or not hit or len(op["inputs"]) < 2:
                continue
            src = tensors[op["inputs"][0]]
            shape = [int(d) for d in src["shape"]]
            axis = int(np.asarray(interp.get_tensor(op["inputs"][1])).reshape(-1)[0])
            if shape and axis in (-1, len(shape) - 1) and shape[-1] > 1:
                found[hit[0]] = {"classes": shape[-1], "over": f"{src['name']} {shape}"}
        return found
    except Exception:  # noqa: BLE001 - a model the private op listing cannot read: no hint
        return {}


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


def _quantization(info: dict, target: str) -> dict:
    """The variant's ``quantization`` record, what the graph computes in (:func:`_precision`), never
    assumed from the target: a float model runs under ``tflite-int8``, the one target the TFLite
    backend loads (``devices.tflite_backend``), recorded as the float model it is."""
    io = "/".join(sorted({s["dtype"] for s in info["inputs"] + info["outputs"]})) + " I/O"
    p = info.get("precision") or {"precision": "unread", "compute": [], "weights": []}
    precision = p["precision"]
    weights = "/".join(p["weights"]) + " (as in the model)" if p["weights"] else "as in the model"
    compute = "/".join(p["compute"])
    if precision in ("fp32", "fp16"):
        return {"scheme": f"float (not quantized{', float16 weights' if precision == 'fp16' else ''})",
                "weights": weights, "activations": f"{compute or 'float32'}; {io}", "precision": precision,
                "note": f"a float model under target {target} (the target the TFLite backend runs): no int8 in it"}
    if precision == "dynamic-range":
        return {"scheme": "imported: dynamic-range quantization (int8 weights, float activations)",
                "weights": weights, "activations": f"{compute}; {io}", "precision": precision}
    return {"scheme": "imported (as quantized by its producer)", "weights": weights,
            "activations": f"{compute}; {io}" if compute else io, "precision": precision}


def import_tflite(model: Path, out: Path, *, task: str = "image-classification", labels: Path | None = None,
                  label_offset: int = 0, name: str | None = None, version: str = "1", force: bool = False,
                  resize: str | None = None, scale=None, mean=None, std=None, **options) -> dict:
    """Import ``model`` into the artifact directory ``out``; returns the manifest.

    ``scale``/``mean``/``std`` state the image normalisation (numbers, lists,
    or strings such as ``"1/255"`` and ``"0.485,0.456,0.406"``); ``resize`` the
    interpolation (default: the task's, ``bilinear-half-pixel`` for image
    classification); ``options`` the other import options the task reads
    (``resize_mode``, ``pad``, ``pad_position``, ``channel_order``, ``family``,
    ``postprocess``: :mod:`.import_common`).
    """
    job = prepare(model, out, task=task, labels=labels, label_offset=label_offset, force=force,
                  options={"resize": resize, "scale": scale, "mean": mean, "std": std, **options},
                  read=lambda path, warnings: read_model(path))
    info = job["info"]
    target = "edgetpu" if info["edgetpu"] else "tflite-int8"
    variant: dict = {"quantization": _quantization(info, target), "toolchain": {"imported_ops": len(info["ops"])}}
    report = _edgetpu_summary(job["model"])
    if report is not None:
        variant["edgetpu_report"] = report
    return write_artifact(job, task=task, name=name, version=version, target=target, rel=f"{target}/model.tflite",
                          variant=variant)
