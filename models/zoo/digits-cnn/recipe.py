#!/usr/bin/env python3
"""Rebuild the bundled reference model ``digits-cnn``.

Trains a small CNN on scikit-learn's bundled 8x8 digits data set (no download)
and writes, into ``--out`` (default: this folder):

  model.onnx      fp32, opset 17, input ``image`` [batch,1,8,8] float32,
                  output ``logits`` [batch,10] float32 (raw logits)
  labels.txt      ``0``..``9``, one per line
  held_out/<label>/<index>.png   20 % stratified test split, 8x8 "L" PNGs
  calibration/<index>.png        200 stratified samples of the training split
  recipe.json     what was done (seed, epochs, split sizes, accuracy, ...)

Input contract (the runtime's pre-processing reproduces it exactly):
  png_pixel = round_half_even(v * 255 / 16), v in 0..16 (sklearn value), uint8
  x = (png_pixel / 255.0 - 0.5) / 0.5, float32, NCHW [1,1,8,8]
The model is trained on exactly these values.

Usage:  python models/zoo/digits-cnn/recipe.py [--out DIR]
Needs: torch, onnx, scikit-learn, numpy, Pillow (onnxruntime optional: used to
measure the exported model on the written PNGs).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
from pathlib import Path

import numpy as np

SEED = 20261202
EPOCHS = 60
BATCH_SIZE = 32
LR = 1e-3
WEIGHT_DECAY = 1e-4
TEST_FRACTION = 0.2
N_CALIBRATION = 200
OPSET = 17
MEAN, STD, SCALE = 0.5, 0.5, 1.0 / 255.0
HERE = Path(__file__).resolve().parent


def to_png_pixels(v: np.ndarray) -> np.ndarray:
    """sklearn digit values 0..16 -> uint8 PNG pixels (round half to even)."""
    return np.round(v.astype(np.float64) * 255.0 / 16.0).astype(np.uint8)


def normalise(pixels: np.ndarray) -> np.ndarray:
    """uint8 pixels [..., 8, 8] -> float32 model input (x/255 - 0.5) / 0.5."""
    return ((pixels.astype(np.float32) / np.float32(255.0) - np.float32(MEAN))
            / np.float32(STD)).astype(np.float32)


def build_model():
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 64), nn.ReLU(),
        nn.Linear(64, 10),
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE, help="output folder (default: this folder)")
    args = ap.parse_args(argv)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    os.environ.setdefault("PYTHONHASHSEED", str(SEED))
    import onnx
    import torch
    from PIL import Image
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    deterministic = True
    try:
        torch.use_deterministic_algorithms(True)
    except Exception:  # pragma: no cover - older torch
        deterministic = False

    # ---- data, in the exact on-disk representation -------------------------
    digits = load_digits()
    pixels = to_png_pixels(digits.images)            # [1797, 8, 8] uint8
    labels = digits.target.astype(np.int64)
    idx = np.arange(len(labels))
    train_idx, test_idx = train_test_split(
        idx, test_size=TEST_FRACTION, stratify=labels, random_state=SEED)
    calib_idx, _ = train_test_split(
        train_idx, train_size=N_CALIBRATION, stratify=labels[train_idx], random_state=SEED)
    train_idx, test_idx, calib_idx = np.sort(train_idx), np.sort(test_idx), np.sort(calib_idx)

    # ---- write PNGs + labels ----------------------------------------------
    for sub in ("held_out", "calibration"):
        if (out / sub).exists():
            shutil.rmtree(out / sub)
    for i in test_idx:
        d = out / "held_out" / str(labels[i])
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels[i], mode="L").save(d / f"{i:04d}.png")
    (out / "calibration").mkdir(parents=True)
    for i in calib_idx:
        Image.fromarray(pixels[i], mode="L").save(out / "calibration" / f"{i:04d}.png")
    (out / "labels.txt").write_text("".join(f"{k}\n" for k in range(10)))

    # ---- train -------------------------------------------------------------
    x_all = torch.from_numpy(normalise(pixels)[:, None, :, :])   # [N,1,8,8]
    y_all = torch.from_numpy(labels)
    x_tr, y_tr = x_all[train_idx], y_all[train_idx]
    model = build_model()
    opt = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(SEED)
    for epoch in range(EPOCHS):
        model.train()
        perm = torch.randperm(len(x_tr), generator=gen)
        total = 0.0
        for b in range(0, len(perm), BATCH_SIZE):
            j = perm[b:b + BATCH_SIZE]
            opt.zero_grad()
            loss = loss_fn(model(x_tr[j]), y_tr[j])
            loss.backward()
            opt.step()
            total += loss.item() * len(j)
        if (epoch + 1) % 10 == 0:
            print(f"epoch {epoch + 1:3d}  train loss {total / len(x_tr):.4f}")

    model.eval()
    with torch.no_grad():
        train_acc = float((model(x_tr).argmax(1) == y_tr).float().mean())
        torch_test_pred = model(x_all[test_idx]).argmax(1).numpy()
    torch_test_acc = float((torch_test_pred == labels[test_idx]).mean())
    print(f"torch: train acc {train_acc:.4f}  held_out acc {torch_test_acc:.4f}")

    # ---- export ------------------------------------------------------------
    onnx_path = out / "model.onnx"
    torch.onnx.export(
        model, (torch.zeros(1, 1, 8, 8),), str(onnx_path),
        input_names=["image"], output_names=["logits"],
        dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=OPSET, do_constant_folding=True, dynamo=False,
    )
    m = onnx.load(str(onnx_path))
    m.doc_string = "digits-cnn: sklearn 8x8 digits classifier (edge-runtime reference model)"
    onnx.save(m, str(onnx_path))
    onnx.checker.check_model(onnx.load(str(onnx_path)), full_check=True)
    sha = hashlib.sha256(onnx_path.read_bytes()).hexdigest()

    # ---- measure the exported model on the written PNGs ---------------------
    onnx_acc = None
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    if ort is not None:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
        files = sorted((out / "held_out").glob("*/*.png"))
        xs = np.stack([normalise(np.asarray(Image.open(f).convert("L")))[None] for f in files])
        ys = np.array([int(f.parent.name) for f in files])
        pred = sess.run(["logits"], {"image": xs})[0].argmax(1)
        onnx_acc = float((pred == ys).mean())
        print(f"onnxruntime on held_out PNGs: acc {onnx_acc:.4f} ({int((pred == ys).sum())}/{len(ys)})")
        if onnx_acc != torch_test_acc:
            print("WARNING: onnxruntime accuracy differs from torch accuracy", file=sys.stderr)

    import sklearn
    info = {
        "model": "digits-cnn",
        "seed": SEED,
        "epochs": EPOCHS,
        "batch_size": BATCH_SIZE,
        "optimizer": {"name": "Adam", "lr": LR, "weight_decay": WEIGHT_DECAY},
        "deterministic_algorithms": deterministic,
        "torch_num_threads": 2,
        "dataset": "sklearn.datasets.load_digits (1797 samples, 8x8, values 0..16)",
        "split": {
            "method": "sklearn train_test_split, stratified, random_state=seed",
            "total": int(len(labels)),
            "train": int(len(train_idx)),
            "held_out": int(len(test_idx)),
            "calibration": int(len(calib_idx)),
            "calibration_from": "train split (stratified subset)",
        },
        "accuracy": {
            "train_fp32_torch": round(train_acc, 6),
            "held_out_fp32_torch": round(torch_test_acc, 6),
            "held_out_fp32_onnxruntime": None if onnx_acc is None else round(onnx_acc, 6),
            "held_out_correct": int((torch_test_pred == labels[test_idx]).sum()),
        },
        "preprocessing": {
            "png_encoding": "pixel = round_half_even(v * 255 / 16), v in 0..16",
            "size": [8, 8],
            "channels": 1,
            "color_mode": "L",
            "scale": SCALE,
            "scale_str": "1/255",
            "mean": MEAN,
            "std": STD,
            "formula": "x = (pixel / 255.0 - 0.5) / 0.5",
            "dtype": "float32",
            "layout": "NCHW",
        },
        "onnx": {
            "file": "model.onnx",
            "opset": OPSET,
            "input": {"name": "image", "dtype": "float32", "shape": ["batch", 1, 8, 8]},
            "output": {"name": "logits", "dtype": "float32", "shape": ["batch", 10]},
            "sha256": sha,
            "bytes": onnx_path.stat().st_size,
        },
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "scikit-learn": sklearn.__version__,
            "numpy": np.__version__,
            "onnxruntime": None if ort is None else ort.__version__,
        },
    }
    (out / "recipe.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"wrote {out} (model.onnx sha256 {sha})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
