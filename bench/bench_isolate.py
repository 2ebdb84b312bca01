"""Isolation overhead (not a test): ``rt.infer`` with ``isolate=True`` vs in-process, one run.

Same artifact, same inputs, whole blocks alternating. Default: digits-cnn
int8 on ONNX Runtime (sub-millisecond model: the worst case for a fixed
per-call cost) and, when the Coral data is present, MobileNetV2 uint8 on
LiteRT. Reports the medians and the ratio isolated / in-process.

Usage: python bench/bench_isolate.py [--blocks 6] [--per-block 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench_soak import _digits_artifact

RESULTS = Path(__file__).parent / "results"
CORAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "coral"


def compare(art, device, inputs, blocks, per_block) -> dict:
    import edge_runtime as er

    with er.load(art, device=device, strict=True) as plain, er.load(art, device=device, strict=True,
                                                                      isolate=True) as iso:
        times = {"in_process": [], "isolated": []}
        paths = [("in_process", plain), ("isolated", iso)]
        for b in range(blocks):
            for name, rt in (paths if b % 2 == 0 else paths[::-1]):
                for i in range(per_block):
                    t0 = time.perf_counter()
                    rt.infer(inputs[i % len(inputs)])
                    times[name].append((time.perf_counter() - t0) * 1000)
        m = {k: statistics.median(v) for k, v in times.items()}
    return {"device": device, "calls_each": len(times["isolated"]), "in_process_median_ms": round(m["in_process"], 3),
            "isolated_median_ms": round(m["isolated"], 3), "overhead_ms": round(m["isolated"] - m["in_process"], 3),
            "ratio": round(m["isolated"] / m["in_process"], 4)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--per-block", type=int, default=100)
    ap.add_argument("--out", type=Path, default=RESULTS / "isolate.json")
    args = ap.parse_args()
    from edge_runtime.converters.zoo import ZOO

    digits = sorted(str(p) for p in (ZOO / "digits-cnn" / "held_out").rglob("*.png"))[:50]
    res = {"digits-cnn onnx-int8": compare(_digits_artifact(), "onnxruntime", digits, args.blocks, args.per_block)}
    if (CORAL / "mobilenet_v2_1.0_224_quant.tflite").exists():
        from edge_runtime.converters.tflite_import import import_tflite

        art = Path(tempfile.mkdtemp()) / "mnv2"
        import_tflite(CORAL / "mobilenet_v2_1.0_224_quant.tflite", art, labels=CORAL / "imagenet_labels.txt")
        imgs = [str(CORAL / n) for n in ("cat.bmp", "parrot.jpg", "grace_hopper.bmp", "bird.bmp")]
        res["mobilenet_v2 uint8 tflite"] = compare(art, "tflite", imgs, args.blocks, max(args.per_block // 4, 10))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
