"""text-embedding: masked mean pooling + L2 normalisation (or a pooled output).

The pooling is the source model's, not ours to guess: sentence-transformers models
such as all-MiniLM mean-pool and normalise; BGE and other CLS-pooled models take the
first token's state; dot-product models are not normalised. ``convert --postprocess
'{"pooling": "cls", "normalize": false}'`` states it (default: mean over a
``[1, seq, dim]`` output, none for an already pooled one; normalised). A wrong pooling
is invisible to parity (the fp32 reference is pooled the same way), so the values are
checked at convert and again at load: an unknown one is refused, never read as "none".
"""

from __future__ import annotations

import numpy as np

from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError, InputError

from .base import TaskOutput, dequantize
from .text import TextTask, load_text_samples

POOLINGS = ("mean", "cls", "none")
_POST_KEYS = ("pooling", "normalize")


def _pooling_problem(pooling, normalize, rank: int | None) -> str | None:
    """Why ``pooling``/``normalize`` do not fit an output of ``rank`` dimensions, or None."""
    if pooling not in POOLINGS:
        return f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}"
    if not isinstance(normalize, bool):
        return f"normalize must be true or false, not {normalize!r}"
    if rank is not None and pooling in ("mean", "cls") and rank != 3:
        return f"pooling {pooling!r} needs a [1, seq, dim] output; this one has {rank} dimensions (use \"none\")"
    if rank is not None and pooling == "none" and rank == 3:
        return "pooling \"none\" on a [1, seq, dim] output would flatten every token's state into one vector"
    return None


class TextEmbedding(TextTask):
    name = "text-embedding"
    parity_metric = "cosine_mean"
    load_samples = staticmethod(load_text_samples)

    takes_postprocess = True        # {"pooling": "mean" | "cls" | "none", "normalize": bool}

    @classmethod
    def build_sections(cls, request, writer, outputs):
        first = outputs[0]    # [1, seq, dim] hidden states are mean-pooled; anything else is already pooled
        stated = dict(getattr(request, "postprocess", None) or {})
        unknown = sorted(set(stated) - set(_POST_KEYS))
        if unknown:
            raise InputError(f"text-embedding --postprocess takes {', '.join(_POST_KEYS)}; not {', '.join(unknown)}",
                             code=ec.CONVERT_REQUEST_INVALID)
        post = {"output": first["name"], "pooling": "mean" if len(first["shape"]) == 3 else "none",
                "normalize": True, **stated}
        why = _pooling_problem(post["pooling"], post["normalize"], len(first["shape"]))
        if why:
            raise InputError(f"text-embedding --postprocess: {why}", code=ec.CONVERT_REQUEST_INVALID)
        return cls.text_preprocess(request, writer), post

    def __init__(self, manifest, read_file, buckets):
        super().__init__(manifest, read_file, buckets)
        self.output = self.post.get("output", "last_hidden_state")
        self.pooling = self.post.get("pooling", "mean")
        self.normalize = self.post.get("normalize", True)
        # an output the model lacks loaded, and then every call failed as "inference_failed": the artifact's
        specs = [self.output_spec(self.output, i) for i in range(len(buckets))]
        why = _pooling_problem(self.pooling, self.normalize, len(specs[0]["shape"]) if specs else None)
        if why:
            raise ArtifactError(f"postprocess: {why}", file="manifest.json", code=ec.MANIFEST_FIELD_INVALID)

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
