"""Spine benchmarks (not tests): ratios against the raw backend, one run.

(a) ``rt.infer(text)`` vs hand-written ``tokenizers`` + raw
    ``onnxruntime.InferenceSession.run`` on the same int8 MiniLM artifact,
    seq-64 bucket, batch 1. Goal: ratio <= 1.05. The raw path runs twice:
    on a session the bench creates, and on the runtime's own session object
    (the same code, so that ratio is what our layer adds; the difference
    between the two raw figures is between ORT session instances).
(b) ``import edge_runtime`` wall time in a fresh interpreter and the modules
    it pulls in. Goal: <= 0.15 s and no ML framework.

Usage: python bench/bench_spine.py [--artifact DIR] [--out bench/results/spine.json]
Without --artifact the int8 MiniLM embedding artifact is built into
~/.cache/edge-runtime/bench (a few minutes the first time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_openvino import pooled  # noqa: E402  (imports no vendor library at module level)

HEAVY = {"onnxruntime", "openvino", "torch", "tensorflow", "coremltools", "nncf", "onnx", "ai_edge_litert",
         "tflite_runtime", "transformers"}
CACHE = Path.home() / ".cache" / "edge-runtime" / "bench"


def build_artifact() -> Path:
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.zoo import convert_request

    import importlib.util

    if importlib.util.find_spec("openvino") is not None:   # one build serves this bench and bench_openvino
        sys.path.insert(0, str(Path(__file__).parent))
        from bench_openvino import build_artifact as both

        return both()
    out = CACHE / "minilm-embedding-int8"
    if not (out / "manifest.json").exists():
        convert(convert_request("minilm", "text-embedding", out, cache=CACHE, force=True))
    return out


def bench_infer(artifact: Path, blocks: int, per_block: int) -> dict:
    import onnxruntime as ort
    from tokenizers import Tokenizer

    import edge_runtime as er
    from edge_runtime.converters.zoo import ZOO

    rt = er.load(artifact, device="onnxruntime")
    bucket = next(b for b in rt.variant["buckets"] if b["name"] == "seq64")
    # raw path: the same model file, the artifact's tokenizer, ORT defaults like the backend
    tok = Tokenizer.from_file(str(artifact / "tokenizer.json"))
    tok.enable_truncation(max_length=64)
    tok.enable_padding(length=64, pad_id=0, pad_token="[PAD]")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(artifact / bucket["file"]), sess_options=so, providers=["CPUExecutionProvider"])
    out_name = bucket["outputs"][0]["name"]

    # the runtime's own InferenceSession object for the same bucket: raw calls on it
    # isolate what our layer adds from differences between two ORT session instances
    own = rt._sessions[rt.variant["buckets"].index(bucket)]._sess

    def raw(text, session=sess):      # the task's post-processing too: masked mean, L2 norm (bench_openvino.pooled)
        e = tok.encode(text)
        feeds = {"input_ids": np.asarray([e.ids], np.int64), "attention_mask": np.asarray([e.attention_mask], np.int64),
                 "token_type_ids": np.asarray([e.type_ids], np.int64)}
        return pooled(session.run([out_name], feeds)[0], e.attention_mask)

    texts = [t for t in (ZOO / "minilm" / "calibration.txt").read_text().splitlines()
             if t.strip() and len(tok.encode(t).attention_mask) and sum(tok.encode(t).attention_mask) < 64][:per_block]
    assert all(rt.infer(t).bucket == "seq64" for t in texts)
    for t in texts[:10]:
        raw(t), rt.infer(t)
    ours, theirs, same = [], [], []
    paths = [(raw, theirs), (lambda t: raw(t, own), same), (rt.infer, ours)]
    for block in range(blocks):      # whole blocks, never call-by-call; the order rotates every block
        k = block % len(paths)
        for fn, times in paths[k:] + paths[:k]:
            for t in texts:
                t0 = time.perf_counter()
                fn(t)
                times.append((time.perf_counter() - t0) * 1000)
    rt.close()
    m_ours, m_raw, m_same = statistics.median(ours), statistics.median(theirs), statistics.median(same)
    return {"calls_each": len(ours), "rt_infer_median_ms": round(m_ours, 3), "raw_median_ms": round(m_raw, 3),
            "raw_on_runtime_session_median_ms": round(m_same, 3),
            "ratio_vs_raw_on_runtime_session": round(m_ours / m_same, 4),
            "ratio_raw_runtime_session_vs_raw_own_session": round(m_same / m_raw, 4),
            "rt_infer_p99_ms": round(float(np.percentile(ours, 99)), 3),
            "raw_p99_ms": round(float(np.percentile(theirs, 99)), 3),
            "ratio": round(m_ours / m_raw, 4), "goal": "<= 1.03 (issue #20)"}


def bench_import(repeats: int) -> dict:
    code = ("import sys,time;b=set(sys.modules);t=time.perf_counter();import edge_runtime;"
            "d=time.perf_counter()-t;import json;print(json.dumps([d,sorted({m.split('.')[0] for m in set(sys.modules)-b})]))")
    times, mods = [], []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        dt, mods = json.loads(out)
        times.append(dt)
    return {"median_s": round(statistics.median(times), 4), "max_s": round(max(times), 4), "modules": mods,
            "ml_frameworks": sorted(set(mods) & HEAVY), "goal": "<= 0.15 s, no ML framework"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifact", type=Path)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--per-block", type=int, default=60)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "spine.json")
    args = ap.parse_args()
    artifact = args.artifact or build_artifact()
    sys.path.insert(0, str(Path(__file__).parent))
    from machine import machine

    res = {"machine": machine(),
           "import": bench_import(7), "infer_vs_raw_seq64": bench_infer(artifact, args.blocks, args.per_block)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
