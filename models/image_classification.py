"""image-classification: decode → resize → normalise → (quantize) → top-k."""

from __future__ import annotations

import os

import numpy as np

from edge_runtime.errors import ArtifactError

from .base import Prepared, Task, TaskOutput, classification_parity, dequantize, softmax, top_k_scores
from .image import _pil, decode, load_image_samples, to_tensor


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
        self.output = self.post.get("output") or buckets[0]["outputs"][0]["name"]
        n = int(np.prod(self.output_spec(self.output)["shape"][1:]))
        self.labels = self.read_labels() or [str(i) for i in range(n)]
        if len(self.labels) != n:
            raise ArtifactError(f"{len(self.labels)} labels for {n} model outputs", file=self.post.get("labels"),
                                code="artifact_labels_mismatch")
        self.top_k = self.post.get("top_k", 5)
        self.apply_softmax = self.post.get("softmax", True)

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
        x = to_tensor(img, self.pre, self.input)
        return Prepared(bucket=0, feeds={self.input["name"]: x}, length=img.size[0] * img.size[1])

    def finish(self, outputs, prepared) -> TaskOutput:
        spec = self.output_spec(self.output)
        vals = dequantize(outputs[self.output], spec).reshape(-1)
        probs = softmax(vals) if self.apply_softmax else vals
        label, scores = top_k_scores(probs, self.labels, self.top_k)
        return TaskOutput(prediction=label, scores=scores)
