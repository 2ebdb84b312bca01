"""The ``onnx-int8`` target: static QDQ int8 ONNX for ONNX Runtime.

Per bucket: the fp32 model with static dims (done by the pipeline) →
``onnx_quant.quantize`` with the model family's recipe → checked model.
"""

from __future__ import annotations

from pathlib import Path

from .base import BucketBuild, BuildContext, Converter


class OnnxInt8Converter(Converter):
    target = "onnx-int8"
    suffix = ".onnx"

    @property
    def recipes(self) -> tuple[str, ...]:
        from .onnx_quant import RECIPES

        return tuple(RECIPES)

    def default_recipe(self, task: str) -> str:
        from edge_runtime.models import get_task

        return get_task(task).recipe_family     # "transformer" (text) or "cnn": both recipes here

    def build_bucket(self, fp32_path: Path, out_path: Path, calibration_feeds: list[dict],
                     ctx: BuildContext) -> BucketBuild:
        from .onnx_quant import quantize

        recipe = ctx.recipe or self.default_recipe(ctx.task)
        info = quantize(fp32_path, out_path, calibration_feeds, recipe=recipe, overrides=ctx.overrides)
        info.setdefault("recipe", recipe)
        return BucketBuild(info)   # tensors: read from the built ONNX (Converter.describe)

    def toolchain(self) -> dict:
        import onnx
        import onnxruntime

        return {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}
