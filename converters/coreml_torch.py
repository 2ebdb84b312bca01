"""The PyTorch side of the coreml target: the source module per bucket, its
agreement with the ONNX source, and ``w8a8`` calibration.

Sources (coremltools 9 converts PyTorch, not ONNX):

- a TorchScript file or a ``torch.export`` program (``.pt2``, see
  ``coreml_export``) as ``ConvertRequest.torch_source`` (e.g. the MiniLM
  recipe's ``embedding.pt2``); it must take the same inputs as the ONNX source;
- otherwise the fp32 ONNX bucket translated by ``coreml_onnx2torch`` (plain CNN ops).

Either way the module is run against the bucket's fp32 ONNX (onnxruntime) on
calibration feeds first: a torch source that is not the same model as the
ONNX source (the parity reference of every target) fails the convert.

``w8a8`` (this module: the ONNX translation; ``coreml_export`` for a
``torch.export`` program): ``coremltools.optimize.torch.quantization.LinearQuantizer``
inserts fake-quantize layers (FX graph mode, so not from a TorchScript file),
the calibration feeds run through it with observers on and no training, observers are frozen and ``finalize`` gives the
quantize/dequantize reference model that ``ct.convert`` turns into int8
weights and int8/uint8 activations.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .registry import ConversionFailed


def torch_feeds(feeds: dict, names: list[str]):
    import torch

    return tuple(torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in names)


def run(module, feeds: dict, names: list[str], out_names: list[str]) -> dict:
    import torch

    with torch.no_grad():
        out = module(*torch_feeds(feeds, names))
    out = out if isinstance(out, (tuple, list)) else (out,)
    if len(out) != len(out_names):
        raise ConversionFailed(f"the torch model returns {len(out)} outputs, the contract has {len(out_names)}")
    return {n: o.detach().numpy().astype(np.float32) for n, o in zip(out_names, out)}


def source_module(fp32_onnx: Path, torch_source: Path | None):
    """(module, route description, kind): kind 'torchscript' | 'export' (a ``torch.export``
    program: the module is its ``.module()``) | 'onnx'."""
    if torch_source:
        import torch

        from .coreml_export import load_program, source_kind

        name = Path(torch_source).name
        if source_kind(Path(torch_source)) == "export":
            return load_program(Path(torch_source)).module(), f"torch.export program {name}", "export"
        try:
            module = torch.jit.load(str(torch_source), map_location="cpu").eval()
        except Exception as exc:  # noqa: BLE001
            raise ConversionFailed(f"torch source {name} does not load as TorchScript: "
                                   f"{type(exc).__name__}: {str(exc)[:200]}") from None
        return module, f"TorchScript {name}", "torchscript"
    from .coreml_onnx2torch import translate

    module, _, _ = translate(fp32_onnx)
    return module, "ONNX → torch translation (converters/coreml_onnx2torch.py)", "onnx"


def agreement(module, fp32_onnx: Path, feeds: list[dict], inputs: list[dict], outputs: list[dict],
              samples: int = 4, tolerance: float = 1e-3) -> dict:
    """Max abs difference torch vs the fp32 ONNX on a few calibration feeds (relative to the output range)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(fp32_onnx), providers=["CPUExecutionProvider"])
    names, out_names = [t["name"] for t in inputs], [t["name"] for t in outputs]
    worst, scale = 0.0, 0.0
    for f in feeds[:samples]:
        got = run(module, f, names, out_names)
        ref = dict(zip(out_names, sess.run(out_names, {n: f[n] for n in names})))
        for n in out_names:
            worst = max(worst, float(np.abs(got[n] - ref[n]).max()))
            scale = max(scale, float(np.abs(ref[n]).max()))
    rel = worst / max(scale, 1e-6)
    if rel > tolerance:
        raise ConversionFailed(f"the torch model disagrees with the ONNX source: max abs diff {worst:.3g} "
                               f"({rel:.3g} of the output range, tolerance {tolerance}); it is not the same model")
    return {"max_abs_diff": worst, "relative": rel, "samples": min(samples, len(feeds))}


FLOAT16_MAX = 65504.0
_COMPUTE = ("linear", "conv", "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum")


def float16_range(module, feeds: list[dict], names: list[str], samples: int = 32) -> dict:
    """The largest magnitude the float model produces where Core ML's float16 compute would hold it:
    every conv/linear/matmul output and every model output (an FX graph: the ONNX route, a
    ``torch.export`` program) or the model outputs only (TorchScript), on calibration feeds.

    An ML program converted with ``compute_precision`` float16 computes every op in float16, whose
    largest finite value is 65504: a larger activation becomes inf there, and the float32 outputs
    the package declares carry inf/NaN (the float32 torch model, and with it the Linux parity
    stand-in, sees nothing)."""
    import torch

    worst: list = [0.0, None]      # largest magnitude, where

    def seen(value, where: str) -> None:
        for t in (value if isinstance(value, (tuple, list)) else (value,)):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
                m = float(t.detach().abs().max())
                if m > worst[0] or m != m:
                    worst[0], worst[1] = m, where

    graph = getattr(module, "graph", None)
    interp = None
    if isinstance(module, torch.fx.GraphModule) and isinstance(graph, torch.fx.Graph):
        class _Watch(torch.fx.Interpreter):
            def run_node(self, n):
                out = super().run_node(n)
                target = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
                if n.op == "call_module":
                    kind = type(self.module.get_submodule(n.target)).__name__.lower()
                else:
                    kind = str(target).lower()
                if n.op == "output" or (n.op != "placeholder" and any(c in kind for c in _COMPUTE)):
                    seen(out, n.name if n.op != "output" else "a model output")
                return out

        interp = _Watch(module)
    checked = ("conv/linear/matmul outputs and model outputs" if interp is not None else "model outputs")
    used = feeds[:samples]
    with torch.no_grad():
        for f in used:
            args = torch_feeds(f, names)
            if interp is not None:
                interp.run(*args)
            else:
                seen(module(*args), "a model output")
    m, at = float(worst[0]), worst[1]
    return {"max_abs": m, "at": at, "float16_max": FLOAT16_MAX, "samples": len(used), "checked": checked,
            "fits": bool(m == m and m <= FLOAT16_MAX)}


def calibrate_w8a8(module, feeds: list[dict], names: list[str], overrides: dict):
    """(prepared fake-quant model with frozen observers, finalized reference model)."""
    import torch
    from coremltools.optimize.torch.quantization import LinearQuantizer, LinearQuantizerConfig

    if isinstance(module, torch.jit.ScriptModule):
        raise ConversionFailed("w8a8 needs an FX-traceable torch module (coremltools.optimize.torch prepares it in "
                               "FX graph mode); a TorchScript source cannot be prepared: use w8, or give a "
                               "torch.export program (.pt2)")
    if not feeds:
        raise ValueError("w8a8 needs calibration samples")
    cfg = LinearQuantizerConfig.from_dict({"global_config": {
        "quantization_scheme": overrides.get("quantization_scheme", "symmetric"),
        "milestones": [0, 0, 1 << 30, 1 << 30]}})   # observers and fake quant on from step 0, never frozen by steps
    quantizer = LinearQuantizer(module, cfg)
    try:
        prepared = quantizer.prepare(example_inputs=torch_feeds(feeds[0], names))
    except Exception as exc:  # noqa: BLE001 - FX tracing / pattern matching failures
        raise ConversionFailed(f"coremltools.optimize.torch could not prepare the model for w8a8: "
                               f"{type(exc).__name__}: {str(exc)[:300]}") from None
    quantizer.step()
    prepared.eval()
    with torch.no_grad():
        for f in feeds:
            prepared(*torch_feeds(f, names))
    prepared.apply(torch.ao.quantization.disable_observer)
    return prepared, quantizer.finalize(inplace=False)


FAKE_QUANT_TOLERANCE = 0.05     # relative to the output range; MiniLM measured 0.006 / 0.0008, digits ~0


def stand_in_agreement(prepared, finalized, feeds: list[dict], names: list[str], out_names: list[str],
                       samples: int = 4) -> dict:
    """The fake-quantized model (the parity stand-in) against the finalized one (what is converted),
    on a few calibration feeds: the parity figure is only the package's if they are the same model."""
    worst, scale = 0.0, 0.0
    used = feeds[:samples]
    for f in used:
        a, b = run(prepared, f, names, out_names), run(finalized, f, names, out_names)
        for n in out_names:
            worst = max(worst, float(np.abs(a[n] - b[n]).max()))
            scale = max(scale, float(np.abs(a[n]).max()))
    return {"max_abs_diff": worst, "relative": worst / max(scale, 1e-6), "samples": len(used)}


def check_stand_in(record: dict) -> None:
    if not record["relative"] <= FAKE_QUANT_TOLERANCE:
        raise ConversionFailed(f"the fake-quantized model (the parity stand-in) and the finalized model (what is "
                               f"converted) disagree: max abs diff {record['max_abs_diff']:.3g} "
                               f"({record['relative']:.3g} of the output range, tolerance {FAKE_QUANT_TOLERANCE}); "
                               "a parity figure measured on one would not be the package's")


class TorchSession:
    """A Session over a torch module (the fake-quantized w8a8 model: parity stand-in on Linux)."""

    cancellable = False

    def __init__(self, module, bucket: dict, label: str):
        self._module, self._bucket = module, bucket
        self._names = [t["name"] for t in bucket["inputs"]]
        self._outs = [t["name"] for t in bucket["outputs"]]
        self.device = f"torch:cpu ({label})"

    def run(self, feeds, cancel=None):
        from edge_runtime.devices.base import check_feeds

        check_feeds(feeds, self._bucket)
        return run(self._module, feeds, self._names, self._outs)

    def info(self) -> dict:
        return {"device": self.device}

    def close(self) -> None:
        self._module = None
