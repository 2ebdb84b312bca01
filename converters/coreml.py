"""The ``coreml`` target: one ML program ``.mlpackage`` per bucket, int8 weights.

Per bucket: a PyTorch module (``coreml_torch.source_module``: the request's
``torch_source``, a TorchScript file or a ``torch.export`` program, else the
fp32 ONNX bucket translated to torch), checked against the fp32 ONNX →
(``w8a8`` only) calibrated fake-quantization → ``ct.convert(convert_to="mlprogram")``
with the bucket's static shapes and the contract's I/O names → (``w8``, and
``w8a8`` from a program for the weights left float, e.g. embedding tables)
``linear_quantize_weights`` → saved → validated from the saved spec (``coreml_spec``).

Modes (``--recipe``), named in the variant's quantization record:

- ``w8``: weights int8 (``coremltools.optimize.coreml.linear_quantize_weights``,
  linear_symmetric, per channel), activations in the compute precision
  (float16 by default: what the GPU and Neural Engine run).
- ``w8a8``: weights and activations int8 (``coremltools.optimize.torch``
  ``LinearQuantizer`` calibrated on the artifact's calibration feeds before
  conversion). Needs an FX graph: the ONNX route, or a ``torch.export``
  program (``coreml_export``: linears lifted, SmoothQuant, the recipe's
  float-input layers named in ``w8a8_recipe``); not TorchScript.

Default: the best mode this host can build for the source: ``w8a8`` on the
ONNX → torch route and from a ``torch.export`` program (int8 weights and
activations, the Neural Engine's int8-int8 path, and the only mode whose
parity a Linux host can measure, on the fake-quantized torch model), ``w8``
for a TorchScript source (``w8a8`` cannot be prepared from one).

Parity: Core ML predicts only on macOS. There the pipeline measures it like
every target; elsewhere it is recorded as not measured with the reason, and
for ``w8a8`` the fake-quantized torch model's parity is measured and labelled
as such (``parity.measured_on``). That stand-in computes in float32 between its
quantize/dequantize (``quantization.parity_precision`` says so); it is compared
with the finalized model that is converted (``fake_quant_vs_finalized``, refused
above ``coreml_torch.FAKE_QUANT_TOLERANCE``). Each stand-in belongs to its
package path's latest build, so ``recipe auto``'s w8 trial is never measured on
the w8a8 trial's stand-ins.

float16 compute (the default): an ML program computes every op in float16, so an
activation past 65504 is inf there while the float32 torch model (and the
stand-in) shows nothing. ``coreml_torch.float16_range`` runs the float model on
calibration feeds and the convert is refused when a conv/linear/matmul output or
a model output goes past it (recorded as ``quantization.float16_range``).

Feature names: a contract name that is no identifier, or one of MIL's reserved
names (``tensor``, ``state``, ``int8``, ...: coremltools renames those itself),
gets a Core ML name of ours, recorded in the bucket's ``tensor_names``.

Overrides: ``compute_precision`` (float16 | float32), ``minimum_deployment_target``
(macOS14 default, macOS15, iOS17, iOS18), ``weight_threshold`` (smallest weight
quantized, elements; default 1: all), ``quantization_scheme`` (w8a8: symmetric |
affine; default symmetric on the ONNX route, affine from a program: see coreml_export), ``agreement_tolerance`` (torch vs ONNX source, relative; 1e-3); from a
``torch.export`` program, w8a8: ``smoothquant_alpha`` (0.8; 0 turns it off),
``w8a8_float_inputs`` (ops whose consumer linears keep float inputs; "gelu").
"""

from __future__ import annotations

import contextlib
import json
import importlib.util
import io
import platform
import shutil
import time
from pathlib import Path

from .base import BucketBuild, BuildContext, Converter, ParityStandIn
from .registry import ConversionFailed

_KNOWN = {"compute_precision", "minimum_deployment_target", "weight_threshold", "quantization_scheme",
          "agreement_tolerance", "smoothquant_alpha", "w8a8_float_inputs"}
MODES = ("w8", "w8a8")
ENTRY = "Manifest.json"   # the package file a bucket's "file" names; the rest are its extra_files


def _package_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


class CoremlConverter(Converter):
    target = "coreml"
    suffix = ".mlpackage"
    recipes = MODES

    def __init__(self, system: str | None = None):
        self._system = system or platform.system()
        # package path -> the fake-quantized torch model of its latest build (w8a8 only): a later
        # build into the same place (recipe auto's next trial) drops it, so a w8 trial is never
        # measured on the w8a8 trial's stand-ins
        self._stand_ins: dict[str, object] = {}

    def auto_recipes(self, task: str) -> list:
        """The default mode (w8a8 from an exported program), then w8 (int8 weights only)."""
        from .base import RecipeTrial

        return [RecipeTrial(None, {}, "the default mode"), RecipeTrial("w8", {}, "int8 weights, float activations")]

    def unavailable(self) -> str | None:
        missing = [m for m in ("coremltools", "torch") if importlib.util.find_spec(m) is None]
        return f"{' and '.join(missing)} not installed (pip install 'edge-runtime[convert-coreml]')" if missing else None

    def parity_unavailable(self) -> str | None:
        if self._system == "Darwin":
            return None
        return (f"Core ML prediction runs only on macOS (this host: {self._system}); coremltools here converts, "
                "quantizes weights and validates the spec, but cannot run the model")

    def build_bucket(self, fp32_path: Path, out_path: Path, calibration_feeds: list[dict],
                     ctx: BuildContext) -> BucketBuild:
        from .coreml_spec import validate
        from .coreml_torch import (agreement, calibrate_w8a8, check_stand_in, float16_range, source_module,
                                   stand_in_agreement, torch_feeds)
        from .onnx_io import io_specs

        overrides = dict(ctx.overrides or {})
        unknown = set(overrides) - _KNOWN
        if unknown:
            raise ValueError(f"unknown coreml recipe override(s) {sorted(unknown)} (known: {sorted(_KNOWN)})")
        torch_source = ctx.torch_source
        if ctx.recipe not in (None, *MODES):
            raise ValueError(f"unknown coreml mode {ctx.recipe!r} (known: {', '.join(MODES)})")
        if not calibration_feeds:
            raise ValueError("no usable calibration samples")
        key = Path(out_path).resolve().as_posix()
        self._stand_ins.pop(key, None)      # an earlier build here (another recipe) is no stand-in for this one
        t0 = time.perf_counter()
        ins, outs = io_specs(fp32_path)
        names = [t["name"] for t in ins]
        module, route, kind = source_module(Path(fp32_path), torch_source)
        mode = ctx.recipe or ("w8" if kind == "torchscript" else "w8a8")
        agree = agreement(module, Path(fp32_path), calibration_feeds, ins, outs,
                          tolerance=float(overrides.get("agreement_tolerance", 1e-3)))
        precision = overrides.get("compute_precision", "float16")
        f16 = None
        if precision == "float16":      # the package computes every op in float16: inf past 65504
            f16 = float16_range(module, calibration_feeds, names)
            if not f16["fits"]:
                raise ConversionFailed(
                    f"the model reaches {f16['max_abs']:.4g} at {f16['at']} on the calibration feeds, beyond "
                    f"float16's largest value {f16['float16_max']:.0f}: Core ML's float16 compute would give inf/NaN "
                    "there (the float32 stand-in would not show it); convert with --recipe-override "
                    "'{\"compute_precision\": \"float32\"}'")
        example = torch_feeds(calibration_feeds[0], names)
        recipe = None
        fq_vs_final = None  # w8a8, ONNX route (a program's is in its w8a8_recipe)
        stand_in = None     # w8a8: the fake-quantized torch model, registered once the package validates
        if kind == "export":
            from .coreml_export import calibrate_w8a8 as calibrate_export
            from .coreml_export import lift_linears, static_program

            program = static_program(module, example, names)
            if mode == "w8a8":
                prepared, module, recipe = calibrate_export(
                    lift_linears(program.module()), [torch_feeds(f, names) for f in calibration_feeds], overrides)
                check_stand_in(recipe["fake_quant_vs_finalized"])
                stand_in = prepared
            else:
                module = program
        elif mode == "w8a8":
            prepared, module = calibrate_w8a8(module, calibration_feeds, names, overrides)
            fq_vs_final = stand_in_agreement(prepared, module, calibration_feeds, names, [t["name"] for t in outs])
            check_stand_in(fq_vs_final)
            stand_in = prepared
        core = core_names([t["name"] for t in ins + outs])
        c_ins, c_outs = ([{**t, "name": core[t["name"]]} for t in ts] for ts in (ins, outs))
        mlmodel = self._convert(module, example, c_ins, c_outs, overrides)
        if mode == "w8" or kind == "export":   # w8a8 from a program: embedding tables etc. int8 weight-only
            mlmodel = self._quantize_weights(mlmodel, int(overrides.get("weight_threshold", 1)))
        out_path = Path(out_path)
        shutil.rmtree(out_path, ignore_errors=True)
        renamed = {k: v for k, v in core.items() if k != v}
        if renamed:     # the package says itself which contract name each feature stands for
            mlmodel.user_defined_metadata[NAMES_KEY] = json.dumps(renamed, sort_keys=True)
        mlmodel.save(str(out_path))
        seconds = round(time.perf_counter() - t0, 1)
        floats = recipe["float_input_layers"]["layers"] if recipe else []
        report = validate(out_path, c_ins, c_outs, mode, float_inputs=len(floats))
        back = {v: k for k, v in core.items()}
        quantization = {
            "scheme": f"coreml {mode}: " + (
                "int8 weights (coremltools.optimize.coreml.linear_quantize_weights, linear_symmetric, per channel)"
                if mode == "w8" else "int8 weights and activations (coremltools.optimize.torch LinearQuantizer, "
                "calibrated, before conversion" + ("; linears lifted from the torch.export graph, SmoothQuant; "
                                                   "weights outside linears int8 weight-only)" if recipe else ")")),
            "mode": mode, "recipe": mode,
            # w8 quantizes the weights from their own ranges: no calibration feed shapes the package (the
            # feeds only check the float16 range, recorded as float16_range), so the record says none was used
            **({"calibration_samples": 0} if mode == "w8" else {}),
            "weights": "int8",
            "activations": (f"{precision} (Core ML compute precision)" if mode == "w8" else
                            f"int8/uint8 (quantize/dequantize in front of conv/linear), {precision} between"
                            + (f"; {len(floats)} linear(s) with {precision} inputs by the recipe: "
                               "w8a8_recipe.float_input_layers" if floats else "")),
            "source": route, "source_agreement": agree,
            **({"w8a8_recipe": recipe} if recipe else {}),
            **({"fake_quant_vs_finalized": fq_vs_final} if fq_vs_final else {}),
            "compute_precision": precision,
            **({"float16_range": f16} if f16 else {}),
            **({"parity_precision": (
                "float32: the fake-quantized torch stand-in computes in float32 between its int8 "
                f"quantize/dequantize; the package computes in {precision}"
                + (": float16 rounding is not in the parity figure (float16 overflow is checked: float16_range)"
                   if precision == "float16" else ""))} if mode == "w8a8" else {}),
            "minimum_deployment_target": overrides.get("minimum_deployment_target", "macOS14"),
            "spec_validation": "every bucket, from its saved spec: buckets[].spec_validation",
        }
        if stand_in is not None:
            self._stand_ins[key] = stand_in
        return BucketBuild(quantization, inputs=ins, outputs=outs, entry=ENTRY, fields={
            "coreml": {side: {back.get(k, k): v for k, v in report[side].items()} for side in ("inputs", "outputs")},
            **({"tensor_names": renamed} if renamed else {}), "spec_validation": report,
            "build_seconds": seconds, "package_bytes": _package_bytes(out_path)})

    def _convert(self, module, example, ins: list[dict], outs: list[dict], overrides: dict):
        import coremltools as ct
        import numpy as np
        import torch

        precision = overrides.get("compute_precision", "float16")
        target = overrides.get("minimum_deployment_target", "macOS14")
        if precision not in ("float16", "float32"):
            raise ValueError(f"compute_precision must be float16 or float32, got {precision!r}")
        if not hasattr(ct.target, str(target)):
            raise ValueError(f"unknown minimum_deployment_target {target!r}")
        program = isinstance(module, torch.export.ExportedProgram)   # ct.convert takes its inputs from it
        if not program and not isinstance(module, torch.jit.ScriptModule):
            with torch.no_grad():
                module = torch.jit.trace(module.eval(), example)
        ct_dtypes = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "int64": np.int32}
        bad = [t for t in ins if t["dtype"] not in ct_dtypes]
        if bad:
            raise ConversionFailed(f"input {bad[0]['name']!r} has dtype {bad[0]['dtype']}, which Core ML cannot take")
        try:
            with contextlib.redirect_stderr(io.StringIO()):   # progress bars
                return ct.convert(
                    module, convert_to="mlprogram", minimum_deployment_target=getattr(ct.target, target),
                    inputs=None if program else [ct.TensorType(name=t["name"], shape=tuple(t["shape"]),
                                                               dtype=ct_dtypes[t["dtype"]]) for t in ins],
                    outputs=[ct.TensorType(name=t["name"], dtype=np.float32) for t in outs],
                    compute_precision={"float16": ct.precision.FLOAT16, "float32": ct.precision.FLOAT32}[precision])
        except Exception as exc:  # noqa: BLE001 - coremltools raises anything on an unsupported graph
            raise ConversionFailed(f"coremltools could not convert the model: {type(exc).__name__}: "
                                   f"{str(exc)[:300]}") from None

    @staticmethod
    def _quantize_weights(mlmodel, threshold: int):
        import coremltools.optimize as cto

        cfg = cto.coreml.OptimizationConfig(global_config=cto.coreml.OpLinearQuantizerConfig(
            mode="linear_symmetric", dtype="int8", granularity="per_channel", weight_threshold=threshold))
        with contextlib.redirect_stderr(io.StringIO()):
            return cto.coreml.linear_quantize_weights(mlmodel, config=cfg)

    def parity_stand_in(self, buckets: list[dict]) -> ParityStandIn | None:
        """The w8a8 fake-quantized torch models, else None."""
        models = []
        for b in buckets:       # each bucket's own package's latest build
            rel = b.get("package")
            found = [m for k, m in self._stand_ins.items() if rel and k.endswith("/" + rel)]
            if len(found) != 1:
                return None
            models.append(found[0])
        from .coreml_torch import TorchSession

        label = "fake-quantized torch model"
        return ParityStandIn([TorchSession(m, b, label) for m, b in zip(models, buckets)], label)

    def toolchain(self) -> dict:
        import coremltools
        import torch

        return {"coremltools": coremltools.__version__, "torch": torch.__version__}


NAMES_KEY = "edge_runtime.tensor_names"


# names coremltools' sanitizer (``NameSanitizer``, MIL pass ``sanitize_input_output_names``) renames
# to ``<name>_workaround`` although they are identifiers: MIL's type and keyword names
MIL_RESERVED = frozenset({"any", "bool", "program", "func", "tensor", "list", "dict", "tuple", "true", "false",
                          "string", "bf16", "fp16", "fp32", "fp64", "int8", "int16", "int32", "int64", "uint8",
                          "uint16", "uint32", "uint64", "state"})


def core_names(names: list[str]) -> dict[str, str]:
    """contract name -> a Core ML feature name: ML Program features must match
    ``[A-Za-z_][A-Za-z0-9_]*`` (NanoDet's ``input.1`` and ``792`` do not) and not be one of MIL's
    reserved names (``tensor``, ``state``, ``int8``, ...: coremltools would rename them itself);
    others stay as they are."""
    import re

    ident = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
    out: dict[str, str] = {n: n for n in names                            # identifiers keep their names
                           if ident.fullmatch(n) and n not in MIL_RESERVED}
    taken = set(out.values())
    for n in names:
        if n in out:
            continue
        c = "t_" + re.sub(r"\W", "_", n)
        while c in taken:
            c += "_"
        out[n] = c
        taken.add(c)
    return {n: out[n] for n in names}
