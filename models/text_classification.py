"""text-classification: tokenizer → logits → softmax → labels."""

from __future__ import annotations

from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError

from .base import TaskOutput, classification_parity, classify, dequantize, score_keys
from .text import TextTask, load_text_samples


class TextClassification(TextTask):
    name = "text-classification"
    parity_metric = "top1_agreement"
    load_samples = staticmethod(load_text_samples)
    compare = staticmethod(classification_parity)
    takes_labels = True
    manifest_files = ("tokenizer", "labels")

    @classmethod
    def build_sections(cls, request, writer, outputs):
        post = {"output": outputs[0]["name"], "softmax": True}
        return cls.text_preprocess(request, writer), cls.labels_section(request, writer, post)

    def __init__(self, manifest, read_file, buckets):
        super().__init__(manifest, read_file, buckets)
        self.output = self.post.get("output", "logits")
        labels = self.read_labels()
        n = self.output_spec(self.output)["shape"][-1]
        self.labels: list[str] = [str(i) for i in range(n)] if labels is None else labels
        if len(self.labels) != n:
            raise ArtifactError(f"{len(self.labels)} labels for {n} model outputs", file=self.post.get("labels"),
                                code=ec.ARTIFACT_LABELS_MISMATCH)
        self.keys = score_keys(self.labels)          # "label#index" for a repeated label
        self.top_k = self.post.get("top_k")
        self.apply_softmax = self.post.get("softmax", True)

    def finish(self, outputs, prepared) -> TaskOutput:
        spec = self.output_spec(self.output, prepared.bucket)
        logits = dequantize(outputs[self.output], spec).reshape(-1)
        label, class_id, scores, top = classify(logits, self.labels, self.top_k, self.keys, self.apply_softmax)
        return TaskOutput(prediction=label, scores=scores, class_id=class_id, top_k=top)
