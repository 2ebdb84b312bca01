"""The ``openvino`` target: NNCF int8 OpenVINO IR (``.xml`` + ``.bin``) per bucket.

Per bucket: the fp32 ONNX with static dims (done by the pipeline) →
``openvino.convert_model`` → ``openvino_quant.quantize`` → IR saved with
fp32 weights storage (no silent fp16 compression).
"""

from __future__ import annotations

from pathlib import Path

from .base import BucketBuild, BucketIO, BuildContext, Converter, RecipeTrial

# 7-bit weights: u8 x s7 pairs sum within int16, so the AVX2 kernel (vpmaddubsw, no VNNI) gives
# the same integers as VNNI/AMX; parity measured on any x86 build host holds on the others
_SAFE = {"overflow_fix": "enable"}


class OpenVinoConverter(Converter):
    target = "openvino"
    suffix = ".xml"
    recipes = ("cnn", "transformer", "transformer-fast", "accuracy-control", "weights-int8")

    def default_recipe(self, task: str) -> str:
        from edge_runtime.models import get_task

        return get_task(task).recipe_family     # "transformer" (text) or "cnn": both recipes here

    def auto_recipes(self, task: str) -> list[RecipeTrial]:
        """Fastest first: every static int8 trial has 7-bit weights (the same figures on AVX2 and
        VNNI); int8 weights with float activations last (no int8 activation arithmetic at all)."""
        last = RecipeTrial("weights-int8", {}, "int8 weights, float activations: nothing saturates")
        if self.default_recipe(task) == "transformer":
            return [RecipeTrial("transformer-fast", dict(_SAFE), "every MatMul int8, 7-bit weights"),
                    RecipeTrial("transformer", dict(_SAFE), "FFN-down, attention-out and head float, 7-bit weights"),
                    last]
        return [RecipeTrial("cnn", dict(_SAFE), "int8, 7-bit weights"),
                RecipeTrial("cnn", {**_SAFE, "preset": "mixed"}, "asymmetric activations, 7-bit weights"),
                last]

    def build_bucket(self, fp32_path: Path, out_path: Path, calibration_feeds: list[dict],
                     ctx: BuildContext) -> BucketBuild:
        from .openvino_quant import quantize

        recipe = ctx.recipe or self.default_recipe(ctx.task)
        info = quantize(fp32_path, out_path, calibration_feeds, task=ctx.task, recipe=recipe,
                        overrides=ctx.overrides, task_obj=ctx.task_obj, prepared=list(ctx.prepared),
                        budget=ctx.budget)
        return BucketBuild(info)   # tensors and the .bin: read from the saved IR (describe)

    def runtime_candidates(self) -> list[dict]:
        """Inference precisions to measure parity and speed with; the fastest
        within budget is recorded in the variant and used by the backend."""
        from edge_runtime.devices.openvino_core import precision_candidates

        return precision_candidates()

    def describe(self, path: Path) -> BucketIO:
        """Inputs, outputs and the weights file (.bin) of a saved IR."""
        import openvino as ov

        model = ov.Core().read_model(str(path))

        def spec(port):
            return {"name": port.get_any_name(), "dtype": port.get_element_type().to_dtype().name,
                    "shape": [int(d) for d in port.get_partial_shape().to_shape()]}

        return BucketIO([spec(p) for p in model.inputs], [spec(p) for p in model.outputs],
                        (Path(path).with_suffix(".bin"),))

    def toolchain(self) -> dict:
        import nncf
        import openvino

        return {"openvino": openvino.__version__, "nncf": nncf.__version__}
