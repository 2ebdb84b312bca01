"""Per-call overhead benchmark (not a test): digits-cnn through ``rt.infer`` vs hand-written code.

digits-cnn (8x8 grayscale, a sub-0.1 ms model) built once with an ``onnx-int8``,
an ``openvino`` and a ``tflite-int8`` variant (~/.cache/edge-runtime/bench,
~30 s the first time). For each backend, four paths run on the same 50
held-out digits, in blocks (never call by call), the block order rotated
every round:

- ``rt.infer(array)`` and ``rt.infer(path)``;
- the raw code doing the same pre/post by hand around the raw vendor call
  on a session the bench creates with the runtime's settings (the same
  thread count, ORT graph level, OpenVINO hint and precision): for an array
  normalise in numpy (quantize for LiteRT), run, dequantize, softmax, top 5
  labels and scores; for a path the same after PIL's decode.

The raw path also runs on the runtime's own native session (its ORT
``InferenceSession``, a request of its OpenVINO compiled model, a LiteRT
interpreter with its options), so ``overhead_us`` (ours minus that raw, per
call) is what our layer adds and nothing else: session instances of one
file differ by a few µs on their own. Figures: medians of the per-block
means (wall clock) and of per-call thread CPU time (``time.thread_time``:
what the calling thread itself spent, the figure least disturbed by a
shared box; ORT's and OpenVINO's own worker threads are outside it).

Goals (issue #20): ratio <= 1.15 on every backend; overhead <= 25 µs.

Usage: python bench/bench_overhead.py [--rounds 12] [--per-block 100] [--devices onnxruntime,openvino,tflite]
       [--out bench/results/overhead.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from machine import machine  # noqa: E402

CACHE = Path.home() / ".cache" / "edge-runtime" / "bench"
ROOT = Path(__file__).resolve().parents[1]
HELD_OUT = ROOT / "models" / "zoo" / "digits-cnn" / "held_out"
TARGETS = {"onnxruntime": "onnx-int8", "openvino": "openvino", "tflite": "tflite-int8"}


def build_artifact() -> Path:
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.zoo import convert_request

    out = CACHE / "digits-all"
    if not (out / "manifest.json").exists():
        convert(convert_request("digits-cnn", "image-classification", out,
                                targets=["openvino", "onnx-int8", "tflite-int8"], force=True))
    return out


def _softmax(x):
    e = np.exp(x.astype(np.float64) - x.max())
    return (e / e.sum()).astype(np.float32)


def raw_paths(rt, device: str, own: bool):
    """(array_fn, path_fn): hand-written pre/post around the raw vendor call, on a new native
    session with the runtime's settings, or (``own``) on the runtime's own native session."""
    from PIL import Image

    man = rt.artifact.manifest
    pre, bucket = man["preprocess"], rt.variant.buckets[0]
    spec_in, spec_out = bucket.inputs[0], bucket.outputs[0]
    model = str(rt.artifact.path(bucket.file))
    labels = rt.task.labels
    scale = np.float32(pre["scale"])
    mean, std = np.float32(pre["mean"][0]), np.float32(pre["std"][0])
    name_in = spec_in["name"]
    sess = rt._sessions[0]
    threads = (rt.threads_fit or {}).get("threads")      # the runtime's fitted count (None: the default)
    if device == "onnxruntime":
        import onnxruntime as ort

        if own:
            s = sess._sess
        else:
            so = ort.SessionOptions()
            so.inter_op_num_threads = 1
            if threads:
                so.intra_op_num_threads = threads
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            s = ort.InferenceSession(model, sess_options=so, providers=["CPUExecutionProvider"])
        outs = [spec_out["name"]]

        def run(x):
            return s.run(outs, {name_in: x})[0]
    elif device == "openvino":
        import openvino as ov

        if own:
            cm = sess._compiled
        else:
            cfg = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": sess.precision}
            if threads:
                cfg["INFERENCE_NUM_THREADS"] = threads
            cm = ov.Core().compile_model(model, "CPU", cfg)
        req = cm.create_infer_request()

        def run(x):
            req.infer({name_in: x}, share_inputs=True, share_outputs=True)
            return req.get_output_tensor(0).data
    else:
        interp0 = sess._pool._free[0][0] if own else None
        if interp0 is None:
            from ai_edge_litert.interpreter import Interpreter

            interp0 = Interpreter(model_path=model, num_threads=rt.info()["sessions"][0]["threads"])
            interp0.allocate_tensors()
        interp = interp0
        i_in, i_out = interp.get_input_details()[0]["index"], interp.get_output_details()[0]["index"]

        def run(x):
            interp.set_tensor(i_in, x)
            interp.invoke()
            return interp.get_tensor(i_out)

    qi, qo = spec_in.get("quantization"), spec_out.get("quantization")

    def tensor(a):
        if qi:      # quantized input: normalise and quantize in float64, as the converter defines it
            x = (a * float(pre["scale"]) - float(pre["mean"][0])) / float(pre["std"][0])
            return np.clip(np.rint(x / qi["scale"] + qi["zero_point"]), -128, 127).astype(np.int8)[None, None]
        return ((a.astype(np.float32) * scale - mean) / std)[None, None]

    def post(y):
        y = y.reshape(-1)
        if qo:
            y = (y.astype(np.float32) - qo["zero_point"]) * qo["scale"]
        p = _softmax(y)
        top = np.argsort(-p, kind="stable")[:5].tolist()
        return labels[top[0]], {labels[i]: float(p[i]) for i in top}

    def array_fn(a):
        return post(run(tensor(a)))

    def path_fn(p):
        return post(run(tensor(np.asarray(Image.open(p).convert("L")))))

    return array_fn, path_fn


def timed_block(fn, items):
    """(wall µs per call, thread-CPU µs per call) over one block."""
    c0, t0 = time.thread_time(), time.perf_counter()
    for x in items:
        fn(x)
    t1, c1 = time.perf_counter(), time.thread_time()
    return (t1 - t0) / len(items) * 1e6, (c1 - c0) / len(items) * 1e6


def bench_device(art: Path, device: str, rounds: int, per_block: int) -> dict:
    from PIL import Image

    import edge_runtime as er

    paths = sorted(HELD_OUT.rglob("*.png"))[:50]
    arrays = [np.asarray(Image.open(p).convert("L")) for p in paths]
    strs = [str(p) for p in paths]
    rt = er.load(art, device=device, strict=True)
    assert rt.variant.target == TARGETS[device], rt.variant.target
    raw_a, raw_p = raw_paths(rt, device, own=False)
    own_a, own_p = raw_paths(rt, device, own=True)
    for a, p in zip(arrays, strs):          # the same answers, both ways
        r = rt.infer(a)
        for fn, x in ((raw_a, a), (own_a, a), (raw_p, p), (own_p, p)):
            label, scores = fn(x)
            assert label == r.prediction and list(scores) == list(r.scores), (device, p, label, r.prediction)
            assert all(abs(scores[k] - r.scores[k]) < 1e-5 for k in scores)
        assert rt.infer(p).to_dict()["top_k"] == r.to_dict()["top_k"]
    work_a = (arrays * (per_block // len(arrays) + 1))[:per_block]
    work_p = (strs * (per_block // len(strs) + 1))[:per_block]
    paths_ = {"rt_array": (rt.infer, work_a), "raw_array": (raw_a, work_a), "raw_own_array": (own_a, work_a),
              "rt_path": (rt.infer, work_p), "raw_path": (raw_p, work_p), "raw_own_path": (own_p, work_p)}
    for fn, items in paths_.values():       # warm every path
        timed_block(fn, items[:20])
    wall: dict[str, list] = {k: [] for k in paths_}
    cpu: dict[str, list] = {k: [] for k in paths_}
    names = list(paths_)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        if r % 2:
            order.reverse()
        for k in order:
            w, c = timed_block(*paths_[k])
            wall[k].append(w)
            cpu[k].append(c)
    rt.close()
    med = {k: statistics.median(v) for k, v in wall.items()}
    cmed = {k: statistics.median(v) for k, v in cpu.items()}
    out = {"target": TARGETS[device], "calls_each": rounds * per_block, "threads_fit": rt.threads_fit,
           "wall_us": {k: round(v, 1) for k, v in med.items()},
           "thread_cpu_us": {k: round(v, 1) for k, v in cmed.items()}}
    for kind in ("array", "path"):
        out[f"ratio_{kind}"] = round(med[f"rt_{kind}"] / med[f"raw_{kind}"], 4)
        out[f"ratio_{kind}_own_session"] = round(med[f"rt_{kind}"] / med[f"raw_own_{kind}"], 4)
        out[f"overhead_{kind}_us"] = round(med[f"rt_{kind}"] - med[f"raw_own_{kind}"], 1)
        out[f"overhead_{kind}_thread_cpu_us"] = round(cmed[f"rt_{kind}"] - cmed[f"raw_own_{kind}"], 1)
    out["goal"] = "ratio <= 1.15; overhead <= 25 us per call"
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--per-block", type=int, default=100)
    ap.add_argument("--devices", default="onnxruntime,openvino,tflite")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "overhead.json")
    args = ap.parse_args()
    art = build_artifact()
    res = {"machine": machine(), "model": "digits-cnn (8x8 grayscale, 10 classes)"}
    for device in args.devices.split(","):
        print(f"running {device} ...", file=sys.stderr, flush=True)
        res[device] = bench_device(art, device, args.rounds, args.per_block)
        print(json.dumps(res[device]), file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
