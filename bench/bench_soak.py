"""Soak (not a test by itself; tests/test_soak.py runs it): 100,000 ``infer()`` calls, RSS growth.

RSS is read from /proc/self/statm after a warm-up of ``warm`` calls and at
the end; the goal is growth < 5%. Default: the digits-cnn int8 artifact on
ONNX Runtime (built from the bundled model if no artifact is given).

Usage: python bench/bench_soak.py [--artifact DIR] [--device D] [--calls 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def soak(rt, inputs: list, calls: int, warm: int = 5000) -> dict:
    for i in range(warm):
        rt.infer(inputs[i % len(inputs)])
    base = rss_bytes()
    peak = base
    t0 = time.perf_counter()
    for i in range(calls):
        rt.infer(inputs[i % len(inputs)])
        if i % 5000 == 0:
            peak = max(peak, rss_bytes())
    wall = time.perf_counter() - t0
    end = rss_bytes()
    return {"calls": calls, "warm_calls": warm, "device": rt.device, "wall_s": round(wall, 1),
            "rss_after_warm_mb": round(base / 2**20, 1), "rss_end_mb": round(end / 2**20, 1),
            "rss_peak_mb": round(max(peak, end) / 2**20, 1), "growth": round(end / base - 1, 4), "goal": "< 0.05"}


def _digits_artifact() -> Path:
    from edge_runtime.converters.pipeline import ConvertRequest, convert
    from edge_runtime.converters.zoo import ZOO

    z = ZOO / "digits-cnn"
    out = Path(tempfile.mkdtemp()) / "digits"
    convert(ConvertRequest(source=z / "model.onnx", out=out, task="image-classification", targets=["onnx-int8"],
                           calibration=z / "calibration", parity_data=z / "held_out", labels=z / "labels.txt",
                           preprocess=json.loads((z / "preprocess.json").read_text()), name="digits-cnn", force=True))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifact", type=Path)
    ap.add_argument("--device", default="onnxruntime")
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    args = ap.parse_args()
    import edge_runtime as er
    from edge_runtime.converters.zoo import ZOO

    art = args.artifact or _digits_artifact()
    images = sorted(str(p) for p in (ZOO / "digits-cnn" / "held_out").rglob("*.png"))[:50]
    with er.load(art, device=args.device, strict=True) as rt:
        res = soak(rt, images, args.calls)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
