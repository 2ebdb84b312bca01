"""The ``onnx-fp32`` target: the source model itself, float, static shapes, for ONNX Runtime.

Not a quantized target: it exists so that ``edge-infer tune`` can choose float where int8
loses on the machine that runs the artifact (a CPU without int8 dot products: on the
2-core AVX2 EPYC of 2026-12-03, OpenVINO int8 MiniLM took 37.5 ms and fp32 29.9 ms).
``convert --with-fp32`` adds it beside the int8 targets. Per bucket it is the pipeline's
static-shape fp32 model, checked and copied; parity is measured like any target's (against
the same fp32 reference, so it only catches a broken export). The static policy never
prefers it over an int8 path (``selection.POLICY``): only a measurement (tune) or an
explicit ``--target onnx-fp32`` / ``device=... target=...`` runs it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .base import BucketBuild, BuildContext, Converter

SCHEME = "float (not quantized)"


class OnnxFp32Converter(Converter):
    target = "onnx-fp32"
    suffix = ".onnx"
    quantizes = False
    recipes = ("fp32",)

    def default_recipe(self, task: str) -> str:
        return "fp32"

    def build_bucket(self, fp32_path: Path, out_path: Path, calibration_feeds: list[dict],
                     ctx: BuildContext) -> BucketBuild:
        import onnx

        onnx.checker.check_model(str(fp32_path), full_check=True)
        shutil.copyfile(fp32_path, out_path)
        return BucketBuild({"scheme": SCHEME, "weights": "float32", "activations": "float32", "recipe": "fp32",
                            "why": "an fp32 variant for tune to choose where int8 loses on the CPU that runs it"})

    def toolchain(self) -> dict:
        import onnx
        import onnxruntime

        return {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}
