"""Build small artifacts for tests: fake-backend (or any test backend's) variants of every task."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from edge_runtime.artifact import ArtifactWriter
from fake_backend import write_fake_model
from edge_runtime.manifest import FORMAT, FORMAT_VERSION

WORDS = ["good", "bad", "great", "awful", "stock", "market", "crashes", "rises", "the", "a", "is", "movie"]


# the tiny vision artifacts: task -> (output spec, postprocess, labels)
VISION = {
    "object-detection": ({"name": "output0", "dtype": "float32", "shape": [1, 7, 12]},
                         {"family": "yolo", "output": "output0", "box_units": "pixels", "class_activation": "sigmoid",
                          "score_threshold": 0.25,
                          "iou_threshold": 0.45, "max_detections": 20}, ["cat", "dog", "bird"]),
    "pose-estimation": ({"name": "keypoints", "dtype": "float32", "shape": [1, 1, 17, 3]},
                        {"output": "keypoints"}, None),
    "semantic-segmentation": ({"name": "logits", "dtype": "float32", "shape": [1, 16, 16, 3]},
                              {"output": "logits"}, ["background", "cat", "dog"]),
}


def tiny_tokenizer_json() -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3}
    for w in WORDS:
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tok.to_str()


def _variant(writer, root, buckets, target="fake", seed=0, write_model=write_fake_model, suffix=".npz"):
    out = []
    for i, b in enumerate(buckets):
        rel = f"{target}/{b['name']}{suffix}"
        (root / target).mkdir(parents=True, exist_ok=True)
        write_model(root / rel, b, seed=seed + i)
        writer.add_file(rel)
        out.append({**b, "file": rel})
    return {"target": target, "buckets": out,
            "quantization": {"scheme": "none", "weights": "float32", "activations": "float32",
                             "calibration": {"samples": 0, "fingerprint": ""}},
            "parity": {"metric": "none", "value": None, "samples": 0},
            "toolchain": {"edge-runtime": "test"}}


def _pose_model(path, bucket, seed=0) -> None:
    """The fake model of a pose artifact: random coordinates, and scores that are probabilities (fixed, 0.1..0.95:
    a pose task refuses scores past 0..1 as a model answering logits)."""
    write_fake_model(path, bucket, seed=seed)
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["W__keypoints"][:, 2::3] = 0.0
    arrays["b__keypoints"][2::3] = np.linspace(0.1, 0.95, arrays["b__keypoints"][2::3].size)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def _t(name, dtype, shape):
    return {"name": name, "dtype": dtype, "shape": list(shape)}


def make_artifact(root, task="text-classification", *, limits=None, buckets=(8, 16), labels=("negative", "positive"),
                  seed=0, target="fake", write_model=write_fake_model, suffix=".npz", probe: int = 0,
                  budget: float = 0.99, host_info: dict | None = None) -> Path:
    """A small artifact of ``task`` with one variant of ``target`` whose model files
    ``write_model(path, bucket, seed=...)`` writes (the fake backend's by default).
    ``probe=N`` keeps a probe set of N inputs whose reference results are the fake model's own
    (parity 1.0 recorded, ``budget``); ``host_info`` is the build-host record."""
    root = Path(root)
    w = ArtifactWriter(root)
    if task in ("text-classification", "text-embedding"):
        w.add_file("tokenizer.json", data=tiny_tokenizer_json().encode())
        pre = {"kind": "text", "tokenizer": "tokenizer.json", "max_length": max(buckets), "pad_id": 0}
        specs = []
        for L in buckets:
            ins = [_t("input_ids", "int64", [1, L]), _t("attention_mask", "int64", [1, L]),
                   _t("token_type_ids", "int64", [1, L])]
            if task == "text-classification":
                outs = [_t("logits", "float32", [1, len(labels)])]
            else:
                outs = [_t("last_hidden_state", "float32", [1, L, 8])]
            specs.append({"name": f"seq{L}", "inputs": ins, "outputs": outs})
        if task == "text-classification":
            w.add_file("labels.txt", data=("\n".join(labels) + "\n").encode())
            post = {"output": "logits", "softmax": True, "labels": "labels.txt"}
        else:
            post = {"output": "last_hidden_state", "pooling": "mean", "normalize": True}
    elif task == "image-classification":
        pre = {"kind": "image", "size": [8, 8], "channels": 1, "scale": 1 / 255, "mean": [0.5], "std": [0.5],
               "layout": "NCHW", "resize": "bilinear"}
        labels = [str(i) for i in range(10)]
        w.add_file("labels.txt", data=("\n".join(labels) + "\n").encode())
        specs = [{"name": "static", "inputs": [_t("image", "float32", [1, 1, 8, 8])],
                  "outputs": [_t("logits", "float32", [1, 10])]}]
        post = {"output": "logits", "softmax": True, "top_k": 3, "labels": "labels.txt"}
    elif task in VISION:
        pre = {"kind": "image", "size": [16, 16], "channels": 3, "scale": 1 / 255, "mean": [0.0], "std": [1.0],
               "layout": "NCHW", "resize": "letterbox" if task == "object-detection" else "stretch",
               "interpolation": "bilinear", "pad": 114}
        out, post, labels = VISION[task]
        if task == "pose-estimation" and write_model is write_fake_model:
            write_model = _pose_model
        if labels:
            w.add_file("labels.txt", data=("\n".join(labels) + "\n").encode())
            post = {**post, "labels": "labels.txt"}
        specs = [{"name": "static", "inputs": [_t("images", "float32", [1, 3, 16, 16])], "outputs": [out]}]
    else:
        pre = {"kind": "tensors"}
        specs = [{"name": "static", "inputs": [_t("x", "float32", [1, 4]), _t("k", "int32", [1, 2])],
                  "outputs": [_t("y", "float32", [1, 3])]}]
        post = {}
    variant = _variant(w, root, specs, target=target, seed=seed, write_model=write_model, suffix=suffix)
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION,
                "model": {"name": f"tiny-{task}", "version": "3"}, "task": task, "files": {},
                "preprocess": pre, "postprocess": post, "limits": dict(limits or {}), "variants": [variant]}
    if probe:
        manifest["probe"] = _probe(w, root, manifest, variant, probe)
        from edge_runtime.models import get_task

        variant["parity"] = {"metric": get_task(task).parity_metric, "value": 1.0, "samples": probe,
                             "budget": budget, "passed": True}
    if host_info is not None:
        manifest["build"] = {"host_info": host_info}
    w.write_manifest(manifest)
    return root


def probe_inputs(task: str, n: int) -> list:
    """``n`` raw inputs of ``task``'s kind (the tiny artifacts' shapes)."""
    rng = np.random.default_rng(123)
    if task in ("text-classification", "text-embedding"):
        return [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 12)))) for _ in range(n)]
    if task == "image-classification":
        return [png_bytes(rng.integers(0, 256, size=(8, 8), dtype=np.uint8)) for _ in range(n)]
    if task in VISION:
        return [png_bytes(rng.integers(0, 256, size=(12 + i % 9, 20, 3), dtype=np.uint8)) for i in range(n)]
    return [{"x": rng.standard_normal((1, 4)).astype(np.float32), "k": rng.integers(0, 9, (1, 2)).astype(np.int32)}
            for _ in range(n)]


def _probe(writer, root: Path, manifest: dict, variant: dict, n: int) -> dict:
    """The probe set of a fake variant: its own outputs are the reference (numpy, exact)."""
    from edge_runtime import probe
    from edge_runtime.limits import DEFAULT_LIMITS
    from edge_runtime.models import get_task
    from fake_backend import FakeBackend

    task = get_task(manifest["task"])(manifest, lambda rel: (root / rel).read_bytes(), variant["buckets"])
    sessions = [FakeBackend().load(root / b["file"], b, None, {}) for b in variant["buckets"]]
    raws = probe_inputs(manifest["task"], n)
    refs = []
    for raw in raws:
        prepared = task.prepare(raw, DEFAULT_LIMITS)
        refs.append(task.finish(sessions[prepared.bucket].run(prepared.feeds), prepared))
    inputs, reference, section = probe.build(raws, refs, count=n, source="tests/factories.py")
    writer.add_file(probe.INPUTS, data=inputs)
    writer.add_file(probe.REFERENCE, data=reference)
    return section


def png_bytes(arr: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def rewrite_manifest(root, mutate, reseal: bool = True) -> None:
    """Apply ``mutate(dict)`` to manifest.json without re-hashing any file. ``reseal``
    recomputes the manifest's own seal (a deliberate edit, which validation must
    still catch); without it the edit looks like corruption."""
    from edge_runtime.manifest import SEAL, seal

    p = Path(root) / "manifest.json"
    data = json.loads(p.read_text())
    mutate(data)
    if reseal:
        data[SEAL] = seal(data)
    p.write_text(json.dumps(data))


def seal_of(art: Path) -> str:
    """The artifact's seal, as tune and verify key their records by it."""
    return json.loads((Path(art) / "manifest.json").read_text())["manifest_sha256"]


def convert_tiny_text(src: Path, task: str, **request) -> Path:
    """``src`` (an ONNX over :func:`tiny_tokenizer_json`'s vocabulary, in its own folder) converted to an
    onnx-int8 artifact of ``task``, one bucket of 8 tokens, calibrated on 120 three-word texts; the
    artifact is ``src.parent / "art"``. ``request``: more ConvertRequest fields (``postprocess``)."""
    import itertools

    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.request import ConvertRequest

    root = src.parent
    (root / "tokenizer.json").write_text(tiny_tokenizer_json())
    texts = [" ".join(p) for p in itertools.permutations(WORDS[:8], 3)][:120]
    (root / "cal.txt").write_text("\n".join(texts) + "\n")
    out = root / "art"
    convert(ConvertRequest(source=src, out=out, task=task, targets=["onnx-int8"], calibration=root / "cal.txt",
                           tokenizer=root / "tokenizer.json", buckets=[8],
                           recipe_overrides={"exclude_gelu_matmuls": False}, probe_samples=0, **request))
    return out


def import_detector(model, out, **kw) -> dict:
    """``import_model`` of an object detector (the head guard's tests)."""
    from edge_runtime.converters.import_common import import_model

    return import_model(model, out, task="object-detection", **kw)


def refused_detector_import(model, out, **kw) -> str:
    """The message of an ``import_family_mismatch`` refusal of :func:`import_detector` (nothing written)."""
    import pytest

    import edge_runtime as er

    with pytest.raises(er.InputError) as ei:
        import_detector(model, out, **kw)
    assert ei.value.code == "import_family_mismatch", ei.value
    assert not out.exists()
    return str(ei.value)


def relabel(art, labels: list[str]):
    """``art`` with another labels file (the same model), pinned and resealed as a build writes it."""
    import hashlib

    data = ("\n".join(labels) + "\n").encode()
    (Path(art) / "labels.txt").write_bytes(data)

    def mutate(m):
        m["files"]["labels.txt"].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    rewrite_manifest(art, mutate)
    return Path(art)


def convert_digits(out, monkeypatch=None, **kw):
    """The zoo's digits convert (no probe set) with ``kw`` over its request: (the manifest, the
    progress lines, and with ``monkeypatch`` the Samples ``split_samples`` returned, else None)."""
    from edge_runtime.converters import pipeline
    from edge_runtime.converters.zoo import convert_request

    got = []
    if monkeypatch is not None:
        real = pipeline.split_samples

        def spy(*a, **k):
            got.append(real(*a, **k))
            return got[-1]

        monkeypatch.setattr(pipeline, "split_samples", spy)
    lines: list[str] = []
    man = pipeline.convert(convert_request("digits-cnn", "image-classification", out,
                                           **{"probe_samples": 0, **kw}), lines.append)
    return man, lines, (got[0] if got else None)
