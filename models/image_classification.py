"""image-classification: decode → resize → normalise → (quantize) → top-k.

The task contract holds at load as at import (:func:`classifier_output`): a
classifier has one ``[1, C]`` or ``[C]`` score output (``[1, C, 1, 1]`` and
the like, one dimension over 1, are taken too); detectors, segmenters and
pose models are refused with the tensor, its shape and the task that fits.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError, InputError
from edge_runtime.limits import IMAGE_LIMITS

from .base import (Prepared, Task, TaskMismatch, TaskOutput, classification_parity, classify,
                   preprocess_error, score_keys)
from .classification import check_ranking, classify_values, code_table, source_softmax_outputs
from .image import _RESAMPLE, TensorPlan, _pixels, check_image_preprocess, input_plan, load_image_samples
from .image_decode import _pil, bmp_bytes, decode_pixels, image_size

LAYOUTS = ("NCHW", "NHWC")
RESIZE_METHODS = tuple(_RESAMPLE) + ("bilinear-half-pixel",)
IMAGE_DTYPES = ("uint8", "int8", "float32")


class NotAClassifier(TaskMismatch):
    """The model's outputs do not fit image classification; the message says what they look like."""

    def __init__(self, message: str):
        super().__init__(message, part="outputs")


def _shape(spec: dict) -> list[int]:
    return [int(d) for d in spec.get("shape", [])]


def _fits(outputs: list[dict]) -> str:
    """What a set of outputs that is not a classifier's looks like, and the task that fits."""
    later = "import it with --task {}"
    names = " ".join(str(o.get("name", "")) for o in outputs)
    shapes = [_shape(o) for o in outputs]
    ssd_like = len(outputs) == 4 and sorted(map(len, shapes)) == [1, 2, 2, 3] and any(s[-1:] == [4] for s in shapes)
    if "TFLite_Detection_PostProcess" in names or ssd_like:
        return (f"{len(outputs)} outputs (boxes, classes, scores, count) look like an SSD detector with "
                f"TFLite_Detection_PostProcess ({later.format('object-detection')})")
    if len(outputs) != 1:
        return (f"an image classifier has exactly one output, this model has {len(outputs)} "
                "(import it with --task tensors)")
    s = shapes[0]
    big = [d for d in s if d > 1]
    if len(s) in (3, 4) and s[-1] in (2, 3) and s[-2] in (17, 13, 14, 16, 21) and (len(s) == 3 or s[1] == 1):
        return f"per-keypoint (y, x, score) rows look like pose estimation ({later.format('pose-estimation')})"
    if len(s) == 3 and s[0] == 1 and len(big) == 2:
        small, large = sorted(s[1:])
        if 5 <= small <= 512 and large >= 8 * small:
            return (f"[boxes + class scores] x anchors looks like a YOLO detector "
                    f"({later.format('object-detection --family yolo')})")
    if len(s) in (3, 4) and s[0] == 1 and s[1] > 1 and s[2] > 1:
        return f"a per-pixel class map looks like semantic segmentation ({later.format('semantic-segmentation')})"
    return "an image classifier has one [1, C] or [C] score output (import it with --task tensors)"


def classifier_output(outputs: list[dict], name: str | None = None) -> tuple[dict, int]:
    """``(spec, classes)`` of the score output, or :class:`NotAClassifier`.

    ``name`` picks one of several outputs (``postprocess.output``); without it the
    model must have exactly one.
    """
    if name is not None:
        chosen = [o for o in outputs if o.get("name") == name]
        if not chosen:
            raise NotAClassifier(f"the model has no output {name!r}")
        spec = chosen[0]
    elif len(outputs) == 1:
        spec = outputs[0]
    else:
        raise NotAClassifier(f"not an image classifier: {_fits(outputs)}")
    s = _shape(spec)
    big = [d for d in s if d > 1]
    if s and len(big) == 1 and (len(s) == 1 or s[0] == 1) and big[0] >= 2:
        return spec, big[0]
    fits = _fits(outputs if name is None else [spec])
    raise NotAClassifier(f"not an image classifier: output {spec.get('name')!r} has shape {s}: {fits}")


class ImageClassification(Task):
    name = "image-classification"
    parity_metric = "top1_agreement"
    load_samples = staticmethod(load_image_samples)
    compare = staticmethod(classification_parity)
    input_kind = "image"
    score_field = "image"
    length_unit = "pixels"
    needs_preprocess = True
    takes_labels = True
    default_limits = IMAGE_LIMITS
    preprocess_keys = ("size", "channels", "scale", "mean", "std", "layout", "resize", "input")
    manifest_sections = {"preprocess": {"size": list}}
    manifest_files = ("labels",)
    importable = True
    import_options = ("resize", "scale", "mean", "std")

    @classmethod
    def check_sample_path(cls, path, what: str) -> None:
        p = Path(path)
        if not p.is_dir() and p.suffix.lower() != ".npy":
            raise InputError(f"{what} {p}: image-classification takes a folder of PNG/JPEG/BMP images or a .npy of "
                             f"uint8 images", code=ec.CONVERT_CALIBRATION_INVALID)

    @classmethod
    def check_preprocess_values(cls, pre: dict) -> None:
        def bad(key, want):
            preprocess_error(f"--preprocess {key!r}: {want}, got {pre[key]!r}")

        check_image_preprocess(pre, cls.name, bad)
        if "layout" in pre and pre["layout"] not in LAYOUTS:
            bad("layout", f"need one of {', '.join(LAYOUTS)}")
        if "resize" in pre and pre["resize"] not in RESIZE_METHODS:
            bad("resize", f"need one of {', '.join(RESIZE_METHODS)}")
        if "input" in pre and not isinstance(pre["input"], str):
            bad("input", "need a string (\"pixels\": the 0..255 pixels are the model's integer input)")

    @classmethod
    def build_sections(cls, request, writer, outputs):
        name = outputs[0]["name"]      # a graph ending in Softmax gives probabilities: not softmaxed again
        post = {"output": name, "softmax": name not in source_softmax_outputs(getattr(request, "source", None)),
                "top_k": 5}
        return {"kind": "image", **request.preprocess}, cls.labels_section(request, writer, post)

    @classmethod
    def check_io(cls, inputs, outputs, post=None) -> dict:
        """One image input ([1, H, W, 1|3] or [1, 1|3, H, W]; uint8, int8 or float32) and one
        class-score output (:func:`classifier_output`)."""
        from .image_import import image_layout

        if len(inputs) != 1:
            raise TaskMismatch(f"an image classifier takes one input; this model has {len(inputs)} "
                               "(import it with --task tensors)", part="inputs")
        shape = inputs[0]["shape"]
        if image_layout(shape) is None:
            raise TaskMismatch(f"image input must be [1, H, W, 1|3] or [1, 1|3, H, W], got {shape} "
                               "(import it with --task tensors)", part="inputs")
        if inputs[0]["dtype"] not in IMAGE_DTYPES:
            raise TaskMismatch(f"image input dtype {inputs[0]['dtype']} is not supported", part="inputs")
        spec, n = classifier_output(outputs, (post or {}).get("output"))
        return {"output": spec, "classes": n}

    @classmethod
    def import_sections(cls, model, options, warnings):
        from .image_import import image_preprocess

        pre = image_preprocess(model["inputs"][0], warnings=warnings, **options)
        out = cls.check_io(model["inputs"], model["outputs"])["output"]
        q = out.get("quantization") or {}
        # a model that ends in SOFTMAX (maybe then reshaped or re-quantized) already outputs
        # probabilities; inside an Edge TPU custom op the softmax is not visible, but its
        # output quantization is the softmax one (scale 1/256, zero point 0)
        probs = "SOFTMAX" in list(model.get("ops", []))[-3:] or (abs(q.get("scale", 0) - 1 / 256) < 1e-9
                                                                 and q.get("zero_point") == 0)
        return pre, {"output": out["name"], "top_k": 5, "softmax": not probs}

    def __init__(self, manifest, read_file, buckets):
        super().__init__(manifest, read_file, buckets)
        if len(buckets) != 1:
            raise ArtifactError("image classification takes exactly one bucket", file="manifest.json",
                                code=ec.MANIFEST_FIELD_INVALID)
        inputs = buckets[0]["inputs"]
        if len(inputs) != 1:
            raise ArtifactError("image classification models take one input", file="manifest.json",
                                code=ec.MANIFEST_FIELD_INVALID)
        self.input = inputs[0]
        _pil()  # PIL at load; each format's decoder with its first image (the warm-up sample's: BMP)
        channels = int(self.pre.get("channels", 3))
        mode = {1: "L", 3: "RGB"}.get(channels)
        if mode is None:
            raise ArtifactError(f"unsupported channel count {channels}", file="manifest.json",
                                code=ec.MANIFEST_FIELD_INVALID)
        self.mode: str = mode
        if "size" not in self.pre:
            raise ArtifactError("image preprocess needs 'size'", file="manifest.json", code=ec.MANIFEST_FIELD_MISSING)
        try:
            spec, n = classifier_output(buckets[0]["outputs"], self.post.get("output"))
        except NotAClassifier as exc:
            raise ArtifactError(str(exc), file="manifest.json", code=ec.ARTIFACT_TASK_MISMATCH) from None
        self.output = spec["name"]
        self.labels = self.read_labels() or [str(i) for i in range(n)]
        if len(self.labels) != n:
            raise ArtifactError(f"{len(self.labels)} labels for {n} classes (output {self.output!r} "
                                f"{spec['shape']})", file=self.post.get("labels"), code=ec.ARTIFACT_LABELS_MISMATCH)
        self.keys = score_keys(self.labels)
        self.top_k = self.post.get("top_k", 5)
        self.apply_softmax = self.post.get("softmax", True)
        check_ranking(self.top_k, self.apply_softmax)      # a manifest's -1 or "false" ranked wrongly, exit 0
        self.plan = input_plan(self.pre, self.input, channels)
        self.tensorize = TensorPlan(self.pre, self.input, channels, self.plan)
        self._input_name = self.input["name"]
        q = spec.get("quantization")        # the score output's dequantization, read once
        self._out_q = (float(q["zero_point"]), float(q["scale"])) if q else None
        # small 8-bit outputs dequantize through a table of every code (the same float32 values)
        small = self.apply_softmax and n <= 64
        self._codes = code_table(spec["dtype"], *self._out_q) if self._out_q and small else None
        self._codes_dtype = np.dtype(spec["dtype"]) if self._codes is not None else None
        self._float_list = small

    def warmup_sample(self):
        h, w = self.pre["size"]
        return bmp_bytes(w, h)

    def request_bytes(self, raw) -> int:
        if isinstance(raw, (str, os.PathLike)):
            return 0  # a path; the file's size is checked against max_image_bytes
        return super().request_bytes(raw)

    def prepare(self, raw, limits) -> Prepared:
        img = decode_pixels(raw, limits, self.mode)     # an array in the model's mode skips PIL
        w, h = image_size(img)
        x = self.tensorize(_pixels(img, self.pre))
        return Prepared(bucket=0, feeds={self._input_name: x}, length=w * h)

    def finish(self, outputs, prepared) -> TaskOutput:
        arr = outputs[self.output]
        values = None       # a small output as Python floats (float32 values): the list path
        if self._codes is not None and arr.dtype == self._codes_dtype:
            codes = self._codes
            values = [codes[c] for c in arr.ravel().tolist()]
        elif self._float_list and arr.dtype == np.float32:
            values = arr.ravel().tolist()
        if values is not None:
            label, class_id, scores, top = classify_values(values, self.labels, self.top_k, self.keys, True)
            return TaskOutput(prediction=label, scores=scores, class_id=class_id, top_k=top)
        if self._out_q is not None and arr.dtype.kind in "iu":      # dequantize(), the spec read at load
            vals = ((arr.astype(np.float32) - self._out_q[0]) * self._out_q[1]).reshape(-1)
        else:
            vals = arr.astype(np.float32, copy=False).reshape(-1)
        label, class_id, scores, top = classify(vals, self.labels, self.top_k, self.keys, self.apply_softmax)
        return TaskOutput(prediction=label, scores=scores, class_id=class_id, top_k=top)
