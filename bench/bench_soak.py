"""Soak (not a test by itself; tests/test_soak.py runs it): 100,000 ``infer()`` calls, RSS growth.

RSS is read from /proc/self/statm after a warm-up of ``warm`` calls and at
the end; the goal is growth < 5%. Default: the digits-cnn int8 artifact
(built from the bundled model with onnx-int8, openvino and tflite-int8
variants if no artifact is given) on ONNX Runtime, OpenVINO and LiteRT, each
device in its own child process so one backend's memory does not hide
another's.

Usage: python bench/bench_soak.py [--artifact DIR] [--device D ...] [--calls 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
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
    convert(ConvertRequest(source=z / "model.onnx", out=out, task="image-classification",
                           targets=["onnx-int8", "openvino", "tflite-int8"],
                           calibration=z / "calibration", parity_data=z / "held_out", labels=z / "labels.txt",
                           preprocess=json.loads((z / "preprocess.json").read_text()), name="digits-cnn", force=True))
    return out


def _one(art: Path, device: str, calls: int, raw: bool) -> dict:
    import edge_runtime as er
    from edge_runtime.converters.zoo import ZOO

    images = sorted(str(p) for p in (ZOO / "digits-cnn" / "held_out").rglob("*.png"))[:50]
    if not raw:
        with er.load(art, device=device, strict=True) as rt:
            return soak(rt, images, calls)
    return soak(_RawLoop(art, device), images, calls)


class _RawLoop:
    """The same task pre-processing, then the vendor API called directly (bench_raw):
    what memory does without our runtime layer (watchdog, metrics, results)."""

    def __init__(self, art: Path, device: str):
        from edge_runtime.artifact import load_artifact
        from edge_runtime.bench_raw import raw_runner
        from edge_runtime.limits import DEFAULT_LIMITS
        from edge_runtime.models import get_task
        from edge_runtime.hardware import detect_cached
        from edge_runtime.selection import choose

        a = load_artifact(art)
        variant = choose(a.variants, detect_cached(), device=device, strict=True).variant
        bucket = variant["buckets"][0]
        self.task = get_task(a.task)(a.manifest, a.read_bytes, variant["buckets"])
        self.runner = raw_runner(device, str(a.path(bucket["file"])), bucket, dict(variant.get("runtime") or {}))
        self.limits, self.device = DEFAULT_LIMITS, f"{device} (raw)"

    def infer(self, raw):
        return self.runner.run(self.task.prepare(raw, self.limits).feeds)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifact", type=Path)
    ap.add_argument("--device", action="append", help="repeatable; default onnxruntime, openvino, tflite")
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_one(args.artifact, args.device[0], args.calls, args.raw)))
        return
    art = args.artifact or _digits_artifact()
    results = {}
    for device in args.device or ["onnxruntime", "openvino", "tflite"]:
        row = {}
        for kind in ("ours", "raw"):
            proc = subprocess.run([sys.executable, __file__, "--child", "--artifact", str(art), "--device", device,
                                   "--calls", str(args.calls)] + (["--raw"] if kind == "raw" else []),
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                row[kind] = {"error": proc.stderr.strip().splitlines()[-1:]}
            else:
                row[kind] = json.loads(proc.stdout.strip().splitlines()[-1])
        if "growth" in row["ours"] and "growth" in row["raw"]:
            row["growth_ours_minus_raw"] = round(row["ours"]["growth"] - row["raw"]["growth"], 4)
            row["wall_ratio"] = round(row["ours"]["wall_s"] / max(row["raw"]["wall_s"], 1e-9), 3)
        results[device] = row
        print(device, json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
