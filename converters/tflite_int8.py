"""The ``tflite-int8`` target: full-integer TFLite (the Edge TPU's input) per bucket.

ONNX with static dims (done by the pipeline) → ``onnx2tf`` SavedModel (inputs
kept in their ONNX layout, so every variant takes the same feeds) →
``tf.lite.TFLiteConverter`` with the artifact's calibration feeds as the
representative dataset, ``TFLITE_BUILTINS_INT8`` only and int8 (or uint8)
input/output. The converter's "int8 only" setting does not guarantee an
all-int8 graph, so the result is inspected (``tflite_inspect``) and the
static Edge TPU report is recorded with the quantization; the pipeline's
parity gate then catches a silently wrong conversion (onnx2tf has made one).

Toolchain (extra ``convert-tflite``): tensorflow 2.21 + onnx2tf 1.28.8 on
Python 3.11 with numpy 2 (see TOOLCHAINS). Overrides: ``io_dtype`` ("int8" /
"uint8"), ``replace_erf`` (onnx2tf ``-rtpo erf``: exact GELU would otherwise
become a Flex op), ``float_ops`` (op types kept in float through TF's
quantization debugger, e.g. ["DIV"], whose int8 kernel TF 2.21 builds wrong:
the model is then no longer all-int8, and says so).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
from pathlib import Path

from .base import BucketBuild, BuildContext, Converter
from .registry import ConversionFailed

_KNOWN = {"io_dtype", "replace_erf", "float_ops"}


def _onnx2tf(src: Path, out_dir: Path, input_names: list[str], replace_erf: bool) -> dict:
    import onnx2tf

    # onnx2tf runs `onnxsim` as a command: the environment's bin must be on PATH
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    kw = dict(input_onnx_file_path=str(src), output_folder_path=str(out_dir), non_verbose=True,
              keep_ncw_or_nchw_or_ncdhw_input_names=input_names, output_signaturedefs=True)
    if replace_erf:
        kw["replace_to_pseudo_operators"] = ["erf"]   # onnx2tf matches lower-case names
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            onnx2tf.convert(**kw)
        return {"strict_mode": True}
    except (Exception, SystemExit) as first:
        # strict mode's accuracy correction fails on some graphs (MiniLM: a folded constant
        # becomes a model output); without it onnx2tf converts, and the parity gate judges
        shutil.rmtree(out_dir, ignore_errors=True)
        with contextlib.redirect_stdout(io.StringIO()):
            onnx2tf.convert(**kw, disable_strict_mode=True)
        return {"strict_mode": False, "strict_mode_error": f"{type(first).__name__}: {str(first)[:200]}"}


def _tf_reason(exc: Exception) -> str:
    """The converter's own 'error:' lines (its last line is MLIR noise)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if "error:" in ln]
    text = "; ".join(dict.fromkeys(ln.split("error:", 1)[1].strip() for ln in lines)) if lines else \
        (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return text[:600]


def quantize(fp32_onnx: Path, out_path: Path, feeds: list[dict], work: Path, overrides: dict | None = None) -> dict:
    import numpy as np
    import tensorflow as tf

    from .onnx_io import io_specs

    overrides = dict(overrides or {})
    unknown = set(overrides) - _KNOWN
    if unknown:
        raise ValueError(f"unknown tflite recipe override(s) {sorted(unknown)} (known: {sorted(_KNOWN)})")
    io_dtype = overrides.get("io_dtype", "int8")
    if io_dtype not in ("int8", "uint8"):
        raise ValueError(f"io_dtype must be int8 or uint8, got {io_dtype!r}")
    if not feeds:
        raise ValueError("no usable calibration samples")
    inputs, _ = io_specs(fp32_onnx)
    names = [t["name"] for t in inputs]
    layout_kept = [t["name"] for t in inputs if 3 <= len(t["shape"]) <= 5]   # onnx2tf would make them channel-last
    saved = Path(work) / f"savedmodel_{Path(out_path).stem}"
    try:
        onnx2tf_info = _onnx2tf(Path(fp32_onnx), saved, layout_kept, bool(overrides.get("replace_erf", True)))
    except BaseException as exc:  # onnx2tf raises anything (and sys.exit()s on some errors)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise ConversionFailed(f"onnx2tf could not convert the model: {type(exc).__name__}: "
                               f"{str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ''}") from None

    def representative():
        for f in feeds:
            yield {n: np.asarray(f[n]) for n in names}

    float_ops = [str(o).upper() for o in overrides.get("float_ops", [])]
    conv = tf.lite.TFLiteConverter.from_saved_model(str(saved))
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = representative
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = conv.inference_output_type = {"int8": tf.int8, "uint8": tf.uint8}[io_dtype]
    try:
        if float_ops:   # selective: those op types stay float (TF's quantization debugger)
            conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8, tf.lite.OpsSet.TFLITE_BUILTINS]
            dbg = tf.lite.experimental.QuantizationDebugger(
                converter=conv, debug_dataset=representative,
                debug_options=tf.lite.experimental.QuantizationDebugOptions(denylisted_ops=float_ops))
            data = dbg.get_nondebug_quantized_model()
        else:
            data = conv.convert()
    except Exception as exc:  # an op with no int8 kernel, say: typed, with TF's reason
        raise ConversionFailed(f"TFLite full-int8 conversion failed: {_tf_reason(exc)}") from None
    Path(out_path).write_bytes(data)

    from .edgetpu_report import edgetpu_report
    from .tflite_inspect import inspect_tflite

    inspection = inspect_tflite(out_path)
    report = edgetpu_report(inspection)
    summary = inspection["summary"]
    return {
        "scheme": "tflite-full-integer (post-training, representative dataset)",
        "weights": "int8 (per-channel for conv/dense)",
        "activations": f"int8, {io_dtype} input/output",
        "recipe": "full-int8",
        "float_ops": float_ops,
        "onnx2tf": onnx2tf_info,
        "all_int8": bool(summary.get("all_int8")),
        "op_counts": summary.get("op_counts"),
        "edgetpu_report": {k: report[k] for k in ("fully_mappable", "tpu_ops", "cpu_ops", "first_unsupported",
                                                  "tpu_parameter_bytes", "exceeds_on_chip_memory", "verdict")},
    }


def describe(path: Path, onnx_inputs: list[dict], onnx_outputs: list[dict]) -> tuple[list, list, dict]:
    """Specs under the ONNX names (so every variant takes the same feeds) and the
    map from those names to the TFLite tensor names."""
    from edge_runtime.devices.tflite_backend import interpreter_module

    from .tflite_import import _spec

    mod, why = interpreter_module()
    if mod is None:
        raise ValueError(why)
    interp = mod.Interpreter(model_path=str(path))
    ins = [_spec(d) for d in interp.get_input_details()]
    outs = [_spec(d) for d in interp.get_output_details()]
    names: dict[str, str] = {}
    by_name = {s["name"]: s for s in ins}
    for src in onnx_inputs:
        for cand in (src["name"], f"serving_default_{src['name']}:0"):
            if cand in by_name:
                names[src["name"]] = cand
                break
        else:
            raise ValueError(f"TFLite model has no input for ONNX input {src['name']!r} (has {sorted(by_name)})")
    if len(outs) != len(onnx_outputs):
        raise ValueError(f"TFLite model has {len(outs)} outputs, the ONNX source {len(onnx_outputs)}")
    # the flatbuffer's output order is not the ONNX order for a model with several outputs, and
    # onnx2tf's signature keys do not name them right either (NanoDet-m's six: '792' keyed to a
    # [1, 676, 32] tensor where the ONNX '792' is [1, 2704, 80]): an output whose shape is unique
    # is matched by its shape; the others by the signature, else by order (the parity gate checks
    # the mapping end to end)
    try:
        sig = interp.get_signature_runner().get_output_details()
    except (ValueError, RuntimeError, AttributeError):
        sig = {}
    free = list(outs)
    for k, src in enumerate(onnx_outputs):
        same = [o for o in free if o["shape"] == list(src["shape"])]
        if len(same) == 1 and sum(list(x["shape"]) == list(src["shape"]) for x in onnx_outputs) == 1:
            pick = same[0]
        elif src["name"] in sig and any(o["name"] == sig[src["name"]]["name"] for o in free):
            pick = next(o for o in free if o["name"] == sig[src["name"]]["name"])
        else:
            pick = free[0]
        free.remove(pick)
        names[src["name"]] = pick["name"]
    rename = {v: k for k, v in names.items()}
    for spec in ins + outs:
        spec["name"] = rename[spec["name"]]
    ins.sort(key=lambda s: [t["name"] for t in onnx_inputs].index(s["name"]))
    return ins, outs, names


class TfliteInt8Converter(Converter):
    target = "tflite-int8"
    suffix = ".tflite"
    recipes = ("full-int8",)

    def default_recipe(self, task: str) -> str:
        return "full-int8"

    def build_bucket(self, fp32_path: Path, out_path: Path, calibration_feeds: list[dict],
                     ctx: BuildContext) -> BucketBuild:
        from .onnx_io import io_specs

        recipe = ctx.recipe or "full-int8"
        if recipe not in self.recipes:
            raise ValueError(f"unknown tflite recipe {recipe!r} (known: {', '.join(self.recipes)})")
        info = quantize(Path(fp32_path), Path(out_path), calibration_feeds, ctx.work, ctx.overrides)
        ins, outs, names = describe(Path(out_path), *io_specs(fp32_path))
        return BucketBuild(info, inputs=ins, outputs=outs, fields={"tensor_names": names})

    def toolchain(self) -> dict:
        import onnx2tf
        import tensorflow as tf

        return {"tensorflow": tf.__version__, "onnx2tf": onnx2tf.__version__}
