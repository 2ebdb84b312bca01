"""NNCF post-training int8 quantization of an OpenVINO model.

Recipes (the same names as the onnx-int8 target's where they mean the same):

``cnn`` (the default for tasks of ``recipe_family`` "cnn": image, tensors)
    ``nncf.quantize`` with the artifact's calibration feeds, the plain path
    with the performance preset (symmetric int8 weights and activations).
``transformer`` (the default for tasks of ``recipe_family`` "transformer": text)
    ``ModelType.TRANSFORMER`` (SmoothQuant, the mixed preset), with the
    MatMuls fed by GELU (FFN down projections) and by attention (output
    projections), and the head after the last LayerNorm, kept in float:
    found in the graph's structure, not by name. Measured on MiniLM over the
    872 SST-2 sentences: embedding cosine min 0.995 (0.978 fully int8, short
    fragments like "cool ?" the worst), classifier agreement 0.992 (0.984).
``transformer-fast``
    ``ModelType.TRANSFORMER`` with every MatMul int8 (the TOOLCHAINS recipe):
    ~1.8x faster than ``transformer``, embedding cosine mean 0.997.
``accuracy-control``
    ``nncf.quantize_with_accuracy_control`` over ``transformer-fast`` (text)
    or ``cnn``: quantize, then revert the most harmful layers to float until
    the artifact's own parity metric (top-1 agreement / embedding cosine
    against the fp32 model, through the task's post-processing) drops by at
    most ``max_drop`` (default ``1 - budget``). It validates on the
    calibration samples, so the pipeline's held-out parity stays unbiased.

``weights-int8``
    ``nncf.compress_weights`` (INT8_ASYM): int8 weights of MatMuls, Convolutions and
    embeddings, activations in float. No int8 activation arithmetic, so no
    saturation on any CPU: the last resort of ``--recipe auto``.

Overrides (``--recipe-override``): ``ignored_scope`` ({"names", "patterns",
"types"}), ``float_matmuls`` (any of "gelu", "attention-out", "head"), ``subset_size`` (a
positive integer: NNCF calibrates on the first ``subset_size`` feeds; default 300; the record's
``calibration_samples`` and the manifest's ``calibration`` count only those),
``fast_bias_correction``, ``preset`` ("performance" / "mixed"),
``model_type`` ("transformer" / "none"), ``smooth_quant_alpha``,
``activation_range`` (an NNCF range estimator: minmax, mean_minmax,
mean_quantile, histogram, ...), ``max_drop``.
"""

from __future__ import annotations

RECIPES = ("cnn", "transformer", "transformer-fast", "accuracy-control", "weights-int8")
FLOAT_KINDS = ("gelu", "attention-out", "head")
_RECIPE_DEFAULTS: dict[str, dict] = {
    "cnn": {"model_type": "none"},
    "transformer": {"model_type": "transformer", "float_matmuls": list(FLOAT_KINDS)},
    "transformer-fast": {"model_type": "transformer"},
}
_KNOWN_OVERRIDES = {"overflow_fix", "ignored_scope", "float_matmuls", "subset_size", "fast_bias_correction", "preset", "model_type",
                    "smooth_quant_alpha", "activation_range", "max_drop"}


def float_matmuls(model, kinds) -> list[str]:
    """Names of MatMuls to keep in float, found in the graph's structure:
    ``gelu``: fed by a Gelu (FFN down projection); ``attention-out``: fed by
    attention (ScaledDotProductAttention through reshapes, the attention
    output projection); ``head``: after the last MVN (LayerNorm)."""
    kinds = set(kinds or ())
    bad = kinds - set(FLOAT_KINDS)
    if bad:
        raise ValueError(f"float_matmuls: unknown kind(s) {sorted(bad)} ({', '.join(FLOAT_KINDS)})")
    ops = list(model.get_ordered_ops())
    last_mvn = max((k for k, op in enumerate(ops) if op.get_type_name() == "MVN"), default=None)
    names = []
    for k, op in enumerate(ops):
        if op.get_type_name() != "MatMul":
            continue
        src = op.input_value(0).get_node()
        if ("gelu" in kinds and src.get_type_name() == "Gelu") \
                or ("attention-out" in kinds and _fed_by_attention(src)) \
                or ("head" in kinds and last_mvn is not None and k > last_mvn):
            names.append(op.get_friendly_name())
    return names


def _fed_by_attention(node, hops: int = 4) -> bool:
    for _ in range(hops):
        kind = node.get_type_name()
        if kind == "ScaledDotProductAttention":
            return True
        if kind not in ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Convert"):
            return False
        node = node.input_value(0).get_node()
    return False


def _params(task: str, overrides: dict, model=None) -> tuple[dict, dict]:
    import nncf

    unknown = set(overrides) - _KNOWN_OVERRIDES
    if unknown:
        raise ValueError(f"unknown openvino recipe override(s) {sorted(unknown)} (known: {sorted(_KNOWN_OVERRIDES)})")
    from edge_runtime.models import get_task

    transformer = get_task(task).recipe_family == "transformer"
    model_type = overrides.get("model_type", "transformer" if transformer else "none")
    preset = overrides.get("preset", "mixed" if model_type == "transformer" else "performance")
    # a typo ran as "none" (model_type) or crashed untyped (a KeyError: preset), the record saying the typo
    if model_type not in ("transformer", "none"):
        raise ValueError(f"model_type {model_type!r} is not one of transformer, none")
    if preset not in ("mixed", "performance"):
        raise ValueError(f"preset {preset!r} is not one of mixed, performance")
    if not isinstance(overrides.get("fast_bias_correction", True), bool):   # "false" ran (and was recorded) as True
        raise ValueError(f"fast_bias_correction {overrides['fast_bias_correction']!r} is not true or false")
    if not isinstance(overrides.get("ignored_scope") or {}, dict):
        raise ValueError(f"ignored_scope {overrides['ignored_scope']!r} is not an object of names, patterns, types")
    kw = {
        "model_type": nncf.ModelType.TRANSFORMER if model_type == "transformer" else None,
        "preset": {"mixed": nncf.QuantizationPreset.MIXED,
                   "performance": nncf.QuantizationPreset.PERFORMANCE}[preset],
        "fast_bias_correction": bool(overrides.get("fast_bias_correction", True)),
    }
    scope = dict(overrides.get("ignored_scope") or {})
    kept = float_matmuls(model, overrides.get("float_matmuls")) if model is not None else []
    if kept:
        scope["names"] = list(scope.get("names", [])) + kept
    if scope:
        kw["ignored_scope"] = nncf.IgnoredScope(names=list(scope.get("names", [])),
                                                patterns=list(scope.get("patterns", [])),
                                                types=list(scope.get("types", [])), validate=False)
    advanced = {}
    if "smooth_quant_alpha" in overrides:
        from nncf.quantization.advanced_parameters import AdvancedSmoothQuantParameters

        advanced["smooth_quant_alphas"] = AdvancedSmoothQuantParameters(matmul=float(overrides["smooth_quant_alpha"]))
    if "activation_range" in overrides:
        from nncf.quantization.range_estimator import RangeEstimatorParametersSet

        name = str(overrides["activation_range"]).upper()
        if not hasattr(RangeEstimatorParametersSet, name):
            raise ValueError(f"activation_range {overrides['activation_range']!r} is not one of minmax, mean_minmax, "
                             "median_minmax, mean_no_outliers_minmax, mean_quantile, histogram")
        advanced["activations_range_estimator_params"] = getattr(RangeEstimatorParametersSet, name)
    if "overflow_fix" in overrides:      # 7-bit weights: no u8*s8 int16 saturation on CPUs without VNNI
        from nncf.quantization.advanced_parameters import OverflowFix

        value = str(overrides["overflow_fix"]).lower()
        if value not in ("enable", "first_layer_only", "disable"):
            raise ValueError(f"overflow_fix {overrides['overflow_fix']!r} is not one of enable, first_layer_only, disable")
        advanced["overflow_fix"] = OverflowFix(value)
    if advanced:
        from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters

        kw["advanced_parameters"] = AdvancedQuantizationParameters(**advanced)
    record = {"model_type": model_type, "preset": preset, "fast_bias_correction": kw["fast_bias_correction"],
              "ignored_scope": scope or None, "float_matmuls": list(overrides.get("float_matmuls") or [])}
    for key in ("smooth_quant_alpha", "activation_range", "overflow_fix"):
        if key in overrides:
            record[key] = overrides[key]
    # what NNCF ran with where not overridden: its default 7-bit weights in the first layer only
    record.setdefault("overflow_fix", "first_layer_only")
    return kw, record


def _subset_size(overrides: dict) -> int:
    """How many feeds NNCF calibrates on (its first ones): the ``subset_size`` override, else 300
    (NNCF's default). A bool, a fraction, a string or a count under 1 is refused: ``int()`` took
    2.7 as 2 and "abc" as a crash, and 0 reached NNCF as an untyped ValidationError."""
    value = overrides.get("subset_size", 300)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"subset_size {value!r} is not a positive integer (how many calibration samples NNCF "
                         "calibrates on, its first ones)")
    return value


def _outputs(compiled, result) -> dict:
    return {o.get_any_name(): result[o] for o in compiled.outputs}


def _validation(model, task, prepared: list, ov):
    """Items (prepared input, fp32 reference output) and the NNCF validation_fn."""
    ref_model = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    items = [(p, task.finish(_outputs(ref_model, ref_model(p.feeds)), p)) for p in prepared]

    def validation_fn(compiled, data):
        refs, cands, per_item = [], [], []
        for p, ref in data:
            cand = task.finish(_outputs(compiled, compiled(p.feeds)), p)
            refs.append(ref)
            cands.append(cand)
            per_item.append(float(task.compare([ref], [cand])["value"]))
        return float(task.compare(refs, cands)["value"]), per_item

    return items, validation_fn


def quantize(fp32_onnx, out_xml, feeds: list[dict], *, task: str, recipe: str = "cnn",
             overrides: dict | None = None, task_obj=None, prepared: list | None = None,
             budget: float | None = None) -> dict:
    import logging

    import nncf
    import openvino as ov

    nncf.set_log_level(logging.WARNING)   # its INFO lines list every ignored node
    if recipe not in RECIPES:
        raise ValueError(f"unknown openvino recipe {recipe!r} (known: {', '.join(RECIPES)})")
    if not feeds:
        raise ValueError("no usable calibration samples")
    overrides = {**_RECIPE_DEFAULTS.get(recipe, {}), **(overrides or {})}
    max_drop = overrides.pop("max_drop", None)
    model = ov.convert_model(str(fp32_onnx))
    kw, record = _params(task, overrides, model)
    if recipe == "weights-int8":
        return _compress_weights(model, out_xml, recipe, overrides, nncf, ov)
    record["subset_size"] = _subset_size(overrides)
    subset = min(len(feeds), record["subset_size"])    # what NNCF runs over (no warning that there are fewer)
    calib = nncf.Dataset(feeds)
    info: dict = {"scheme": "nncf-ptq-static", "weights": "int8 symmetric per-channel",
                  "activations": "int8 per-tensor (" + ("asymmetric where mixed" if record["preset"] == "mixed"
                                                        else "symmetric") + ")",
                  "recipe": recipe, "nncf": record}
    if recipe == "accuracy-control":
        if task_obj is None or not prepared:
            raise ValueError("accuracy-control needs the task and prepared validation samples")
        drop = float(max_drop) if max_drop is not None else max(0.0, 1.0 - float(budget if budget is not None else 0.99))
        if not 0.0 <= drop <= 1.0:      # NaN too: NNCF would compare every drop against it as False
            raise ValueError(f"max_drop {max_drop!r} is not a number in [0, 1]")
        items, validation_fn = _validation(model, task_obj, prepared, ov)
        q = nncf.quantize_with_accuracy_control(model, calib, nncf.Dataset(items), validation_fn,
                                                max_drop=drop, subset_size=subset, **kw)
        info["accuracy_control"] = {"max_drop": drop, "metric": task_obj.parity_metric,
                                    "validation_samples": len(items)}
    else:
        q = nncf.quantize(model, calib, subset_size=subset, **kw)
    fq = sum(1 for op in q.get_ops() if op.get_type_name() == "FakeQuantize")
    if fq == 0:
        raise ValueError("NNCF inserted no quantizers: the IR would run in float")
    info["fake_quantize_ops"] = fq
    # NNCF's statistics run over the first ``subset_size`` feeds (islice): the rest calibrated nothing
    info["calibration_samples"] = subset
    # compress_to_fp16 defaults to True and would silently store fp16 weights
    ov.save_model(q, str(out_xml), compress_to_fp16=False)
    return info


def _compress_weights(model, out_xml, recipe: str, overrides: dict, nncf, ov) -> dict:
    """int8 weights, float activations (``weights-int8``)."""
    unknown = set(overrides) - {"ignored_scope"}
    if unknown:
        raise ValueError(f"recipe weights-int8 takes only the ignored_scope override, not {sorted(unknown)}")
    kw = {}
    scope = overrides.get("ignored_scope")
    if scope:
        kw["ignored_scope"] = nncf.IgnoredScope(names=list(scope.get("names", [])),
                                                patterns=list(scope.get("patterns", [])),
                                                types=list(scope.get("types", [])), validate=False)
    q = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM, **kw)
    int8 = sum(1 for op in q.get_ops() if op.get_type_name() == "Constant"
               and op.get_output_element_type(0).get_type_name() in ("u8", "i8"))
    if int8 == 0:
        raise ValueError("NNCF compressed no weights: the IR would be float")
    ov.save_model(q, str(out_xml), compress_to_fp16=False)
    return {"scheme": "nncf-weight-compression", "weights": "int8 asymmetric per-channel",
            "activations": "float (weights decompressed at run time; no int8 activation arithmetic)",
            "recipe": recipe, "nncf": {"mode": "int8_asym", "ignored_scope": scope or None},
            "int8_weight_constants": int8,
            "calibration_samples": 0}      # data-free: the weights' own ranges, no calibration feed is run
