"""The ``onnx-int8`` target: static QDQ int8 ONNX for ONNX Runtime.

Per bucket: the fp32 model with static dims (done by the pipeline) →
``onnx_quant.quantize`` with the model family's recipe → checked model.
"""

from __future__ import annotations

from pathlib import Path


class OnnxInt8Converter:
    target = "onnx-int8"
    suffix = ".onnx"

    @property
    def recipes(self) -> tuple[str, ...]:
        from .onnx_quant import RECIPES

        return tuple(RECIPES)

    def default_recipe(self, task: str) -> str:
        return "transformer" if task.startswith("text-") else "cnn"

    def build_bucket(self, fp32_path: Path, out_path: Path, calibration_feeds: list[dict], options: dict) -> dict:
        from .onnx_quant import quantize

        recipe = options.get("recipe") or self.default_recipe(options["task"])
        info = quantize(fp32_path, out_path, calibration_feeds, recipe=recipe, overrides=options.get("overrides"))
        info.setdefault("recipe", recipe)
        return info

    def toolchain(self) -> dict:
        import onnx
        import onnxruntime

        return {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}
