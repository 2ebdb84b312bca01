"""TFLite benchmark (not a test): ``rt.infer`` vs the raw LiteRT interpreter, one run.

Coral's MobileNetV2 1.0/224 uint8 imported as an artifact; the raw path does
the same pre-processing by hand (decode, half-pixel bilinear resize,
truncate, uint8) and calls ``set_tensor``/``invoke``/``get_tensor`` on an
interpreter with the same thread count. Blocks alternate, never call by
call. Goal: ratio <= 1.05.

Usage: python bench/bench_tflite.py [--out bench/results/tflite.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "coral"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--per-block", type=int, default=40)
    ap.add_argument("--pooled", action="store_true",
                    help="device option inline=false (worker pool: returns at the deadline; the CPU default is inline)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "tflite.json")
    args = ap.parse_args()
    from ai_edge_litert.interpreter import Interpreter
    from PIL import Image

    import edge_runtime as er
    from edge_runtime.converters.tflite_import import import_tflite
    from edge_runtime.models.image import resize_half_pixel

    art = Path(tempfile.mkdtemp()) / "mnv2"
    import_tflite(SHARED / "mobilenet_v2_1.0_224_quant.tflite", art, labels=SHARED / "imagenet_labels.txt")
    images = [str(SHARED / n) for n in ("cat.bmp", "parrot.jpg", "grace_hopper.bmp", "bird.bmp")]
    rt = er.load(art, device="tflite", strict=True, device_options={"inline": not args.pooled})
    threads = rt.info()["sessions"][0]["threads"]
    interp = Interpreter(model_path=str(art / "tflite-int8" / "model.tflite"), num_threads=threads)
    interp.allocate_tensors()
    i_in, i_out = interp.get_input_details()[0]["index"], interp.get_output_details()[0]["index"]

    def raw(path):
        x = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32)
        x = np.floor(np.clip(resize_half_pixel(x, 224, 224), 0, 255)).astype(np.uint8)[None]
        interp.set_tensor(i_in, x)
        interp.invoke()
        return interp.get_tensor(i_out).copy()

    for p in images:
        assert int(raw(p).argmax()) == rt.task.labels.index(rt.infer(p).prediction)
    work = (images * ((args.per_block + len(images) - 1) // len(images)))[: args.per_block]
    ours, theirs = [], []
    paths = [(raw, theirs), (rt.infer, ours)]
    for block in range(args.blocks):     # whole blocks, the order swapped every block
        for fn, times in (paths if block % 2 == 0 else paths[::-1]):
            for p in work:
                t0 = time.perf_counter()
                fn(p)
                times.append((time.perf_counter() - t0) * 1000)
    rt.close()
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from machine import machine

    res = {"machine": machine(), "model": "mobilenet_v2_1.0_224_quant (uint8)", "threads": threads, "inline": not args.pooled, "cores": os.cpu_count(),
           "calls_each": len(ours), "rt_infer_median_ms": round(statistics.median(ours), 3),
           "raw_median_ms": round(statistics.median(theirs), 3),
           "ratio": round(statistics.median(ours) / statistics.median(theirs), 4), "goal": "<= 1.03"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
