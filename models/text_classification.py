"""text-classification: tokenizer → logits → softmax → labels."""

from __future__ import annotations

from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError

from .base import TaskOutput, classification_parity, classify, dequantize, score_keys
from .classification import check_ranking, source_softmax_outputs
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
        name = outputs[0]["name"]      # a graph ending in Softmax gives probabilities: not softmaxed again
        post = {"output": name, "softmax": name not in source_softmax_outputs(getattr(request, "source", None))}
        return cls.text_preprocess(request, writer), cls.labels_section(request, writer, post)

    def __init__(self, manifest, read_file, buckets):
        super().__init__(manifest, read_file, buckets)
        self.output = self.post.get("output", "logits")
        labels = self.read_labels()
        n = _class_count(self.output_spec(self.output))
        self.labels: list[str] = [str(i) for i in range(n)] if labels is None else labels
        if len(self.labels) != n:
            raise ArtifactError(f"{len(self.labels)} labels for {n} model outputs", file=self.post.get("labels"),
                                code=ec.ARTIFACT_LABELS_MISMATCH)
        self.keys = score_keys(self.labels)          # "label#index" for a repeated label
        self.top_k = self.post.get("top_k")
        self.apply_softmax = self.post.get("softmax", True)
        check_ranking(self.top_k, self.apply_softmax)

    def finish(self, outputs, prepared) -> TaskOutput:
        spec = self.output_spec(self.output, prepared.bucket)
        logits = dequantize(outputs[self.output], spec).reshape(-1)
        label, class_id, scores, top = classify(logits, self.labels, self.top_k, self.keys, self.apply_softmax)
        return TaskOutput(prediction=label, scores=scores, class_id=class_id, top_k=top)


def _class_count(spec: dict) -> int:
    """The class count of a ``[1, C]`` (or ``[C]``) score output, C >= 2. A single logit (a
    regression or sigmoid head: softmax over one value is 1.0 for every input, label 0 always)
    or a per-token output (``[1, seq, C]``) is not a text classifier's: refused (convert reads
    this too, so such a model fails its convert instead of answering one label for everything)."""
    shape = list(spec.get("shape") or [])
    big = [d for d in shape if isinstance(d, int) and d != 1]       # a named (dynamic) dim is the batch's
    if len(big) == 1 and big[0] >= 2 and (len(shape) == 1 or shape[0] == 1 or not isinstance(shape[0], int)):
        return big[0]
    raise ArtifactError(f"output {spec.get('name')!r} has shape {shape}: a text classifier has one [1, C] score "
                        f"output with C >= 2 classes (a single logit is a regression or sigmoid head, a "
                        f"[1, seq, C] output a per-token one: use --task tensors)", file="manifest.json",
                        code=ec.ARTIFACT_TASK_MISMATCH)

