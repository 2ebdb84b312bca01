"""The ``onnx-int8`` target: static QDQ int8 ONNX for ONNX Runtime.

Per bucket: the fp32 model with static dims (done by the pipeline) →
``onnx_quant.quantize`` with the model family's recipe → checked model.
"""

from __future__ import annotations

from pathlib import Path

from .base import BucketBuild, BuildContext, Converter, RecipeTrial


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

    def auto_recipes(self, task: str) -> list[RecipeTrial]:
        """Fastest first, each without int8 arithmetic that saturates on AVX2 (ORT's U8S8
        kernel sums u8*s8 pairs into int16 there): the transformer recipes are U8U8; the CNN
        ones 7-bit weights (reduce_range), then U8U8."""
        if self.default_recipe(task) == "transformer":
            return [RecipeTrial("transformer-fast", {}, "GELU-fed FFN2 MatMuls int8 too (U8U8)"),
                    RecipeTrial("transformer", {}, "FFN2, attention and head MatMuls float (U8U8)")]
        return [RecipeTrial("cnn", {"reduce_range": True}, "U8S8 with 7-bit weights"),
                RecipeTrial("cnn", {"weights": "uint8"}, "U8U8")]

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
