"""text-embedding: masked mean pooling + L2 normalisation (or a pooled output)."""

from __future__ import annotations

import numpy as np

from .base import TaskOutput, dequantize
from .text import TextTask, load_text_samples


class TextEmbedding(TextTask):
    name = "text-embedding"
    parity_metric = "cosine_mean"
    load_samples = staticmethod(load_text_samples)

    @classmethod
    def build_sections(cls, request, writer, outputs):
        first = outputs[0]    # [1, seq, dim] hidden states are mean-pooled; anything else is already pooled
        post = {"output": first["name"], "pooling": "mean" if len(first["shape"]) == 3 else "none",
                "normalize": True}
        return cls.text_preprocess(request, writer), post

    def __init__(self, manifest, read_file, buckets):
        super().__init__(manifest, read_file, buckets)
        self.output = self.post.get("output", "last_hidden_state")
        self.pooling = self.post.get("pooling", "mean")
        self.normalize = self.post.get("normalize", True)

    def finish(self, outputs, prepared) -> TaskOutput:
        hidden = dequantize(outputs[self.output], self.output_spec(self.output, prepared.bucket))
        if self.pooling == "mean":
            mask = self.mask_of(prepared).astype(np.float32)[0]           # [seq]
            vec = (mask @ hidden[0]) / max(float(mask.sum()), 1e-9)         # one BLAS call, no [seq, dim] temporary
        elif self.pooling == "cls":
            vec = hidden[0, 0]
        else:                                                              # "none": already pooled
            vec = hidden.reshape(-1)
        vec = vec.astype(np.float32)
        if self.normalize:
            vec = vec / max(float(np.linalg.norm(vec)), 1e-12)
        return TaskOutput(embedding=vec)

    @staticmethod
    def compare(reference, candidate) -> dict:
        cos = []
        for r, c in zip(reference, candidate):
            a, b = r.embedding.astype(np.float64), c.embedding.astype(np.float64)
            cos.append(float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-12)))
        return {
            "metric": "cosine_mean",
            "value": float(np.mean(cos)) if cos else None,
            "min": float(np.min(cos)) if cos else None,
            "samples": len(cos),
        }
