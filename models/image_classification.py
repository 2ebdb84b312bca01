"""image-classification: decode → resize → normalise → (quantize) → top-k.

The task contract holds at load as at import (:func:`classifier_output`): a
classifier has one ``[1, C]`` or ``[C]`` score output (``[1, C, 1, 1]`` and
the like, one dimension over 1, are taken too); detectors, segmenters and
pose models are refused with the tensor, its shape and the task that fits.
"""

from __future__ import annotations

import os

from edge_runtime.errors import ArtifactError

from .base import (Prepared, Task, TaskOutput, classification_parity, dequantize, rank_classes, score_keys,
                   softmax)
from .image import _pil, decode, input_plan, load_image_samples, to_tensor


class NotAClassifier(ValueError):
    """The model's outputs do not fit image classification; the message says what they look like."""


def _shape(spec: dict) -> list[int]:
    return [int(d) for d in spec.get("shape", [])]


def _fits(outputs: list[dict]) -> str:
    """What a set of outputs that is not a classifier's looks like, and the task that fits."""
    later = "not yet a task: import it with --task tensors"
    names = " ".join(str(o.get("name", "")) for o in outputs)
    shapes = [_shape(o) for o in outputs]
    ssd_like = len(outputs) == 4 and sorted(map(len, shapes)) == [1, 2, 2, 3] and any(s[-1:] == [4] for s in shapes)
    if "TFLite_Detection_PostProcess" in names or ssd_like:
        return (f"{len(outputs)} outputs (boxes, classes, scores, count) look like an SSD detector with "
                f"TFLite_Detection_PostProcess (object-detection with the SSD post-process, {later})")
    if len(outputs) != 1:
        return (f"an image classifier has exactly one output, this model has {len(outputs)} "
                "(import it with --task tensors)")
    s = shapes[0]
    big = [d for d in s if d > 1]
    if len(s) in (3, 4) and s[-1] in (2, 3) and s[-2] in (17, 13, 14, 16, 21) and (len(s) == 3 or s[1] == 1):
        return f"per-keypoint (y, x, score) rows look like pose estimation ({later})"
    if len(s) == 3 and s[0] == 1 and len(big) == 2:
        small, large = sorted(s[1:])
        if 5 <= small <= 512 and large >= 8 * small:
            return f"[boxes + class scores] x anchors looks like a YOLO detector (object-detection, {later})"
    if len(s) in (3, 4) and s[0] == 1 and s[1] > 1 and s[2] > 1:
        return f"a per-pixel class map looks like semantic segmentation ({later})"
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

    def __init__(self, manifest, read_file, buckets):
        super().__init__(manifest, read_file, buckets)
        if len(buckets) != 1:
            raise ArtifactError("image classification takes exactly one bucket", file="manifest.json",
                                code="manifest_field_invalid")
        inputs = buckets[0]["inputs"]
        if len(inputs) != 1:
            raise ArtifactError("image classification models take one input", file="manifest.json",
                                code="manifest_field_invalid")
        self.input = inputs[0]
        _pil()  # import the decoder at load, not inside the first infer()'s latency
        channels = int(self.pre.get("channels", 3))
        self.mode = {1: "L", 3: "RGB"}.get(channels)
        if self.mode is None:
            raise ArtifactError(f"unsupported channel count {channels}", file="manifest.json",
                                code="manifest_field_invalid")
        if "size" not in self.pre:
            raise ArtifactError("image preprocess needs 'size'", file="manifest.json", code="manifest_field_missing")
        try:
            spec, n = classifier_output(buckets[0]["outputs"], self.post.get("output"))
        except NotAClassifier as exc:
            raise ArtifactError(str(exc), file="manifest.json", code="artifact_task_mismatch") from None
        self.output = spec["name"]
        self.labels = self.read_labels() or [str(i) for i in range(n)]
        if len(self.labels) != n:
            raise ArtifactError(f"{len(self.labels)} labels for {n} classes (output {self.output!r} "
                                f"{spec['shape']})", file=self.post.get("labels"), code="artifact_labels_mismatch")
        self.keys = score_keys(self.labels)
        self.top_k = self.post.get("top_k", 5)
        self.apply_softmax = self.post.get("softmax", True)
        self.plan = input_plan(self.pre, self.input, channels)

    def warmup_sample(self):
        import io

        buf = io.BytesIO()
        h, w = self.pre["size"]
        _pil().new(self.mode, (w, h)).save(buf, format="PNG")
        return buf.getvalue()

    def request_bytes(self, raw) -> int:
        if isinstance(raw, (str, os.PathLike)):
            return 0  # a path; the file's size is checked against max_image_bytes
        return super().request_bytes(raw)

    def prepare(self, raw, limits) -> Prepared:
        img = decode(raw, limits, self.mode)
        x = to_tensor(img, self.pre, self.input, self.plan)
        return Prepared(bucket=0, feeds={self.input["name"]: x}, length=img.size[0] * img.size[1])

    def finish(self, outputs, prepared) -> TaskOutput:
        spec = self.output_spec(self.output)
        vals = dequantize(outputs[self.output], spec).reshape(-1)
        probs = softmax(vals) if self.apply_softmax else vals
        label, class_id, scores, top = rank_classes(probs, self.labels, self.top_k, self.keys)
        return TaskOutput(prediction=label, scores=scores, class_id=class_id, top_k=top)
