"""Cold start and peak memory (not a test): ``edge-infer infer --text`` vs a raw script, whole processes.

MiniLM int8 (the artifact ``bench_openvino.py`` builds: two buckets, seq 64
and 128, an ``onnx-int8`` and an ``openvino`` variant). For each backend, in
alternating fresh processes (spawn to exit, the order swapped every round):

- ours: ``edge-infer infer ART --text "..." --device BACKEND --json``
  (verify, choose, load and warm up every bucket, one result, exit);
- raw: a script that imports the vendor library and ``tokenizers``, loads
  the same bucket files (``raw``: all of them, as ``load()`` does;
  ``raw_one``: only the seq-64 one the text needs), runs one warm-up call
  on each, tokenizes the text, runs it, prints the output and exits.

Wall time and peak RSS (``wait4``'s ``ru_maxrss``) are medians per side.
OpenVINO runs both with their model caches warm (each its own, filled
first). Goals (issue #20): wall ≤ 1.15, peak RSS ≤ 1.10.

Usage: python bench/bench_coldstart.py [--repeats 5] [--devices onnxruntime,openvino] [--out ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from machine import machine  # noqa: E402

TEXT = "a short sentence about the weather, which was fine"

_RAW = r"""
import json, sys
import numpy as np
from tokenizers import Tokenizer
device, tok_path, files, lengths, cache = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
toks = {}
for n in lengths:
    t = Tokenizer.from_file(tok_path)
    t.enable_truncation(max_length=n)
    t.enable_padding(length=n, pad_id=0, pad_token="[PAD]")
    toks[n] = t
if device == "onnxruntime":
    import onnxruntime as ort
    so = ort.SessionOptions(); so.inter_op_num_threads = 1
    runs = [ (lambda s: (lambda f: s.run(None, f)[0]))(ort.InferenceSession(f, sess_options=so, providers=["CPUExecutionProvider"])) for f in files]
else:
    import openvino as ov
    core = ov.Core()
    cfg = {"PERFORMANCE_HINT": "LATENCY", "CACHE_DIR": cache}
    def mk(f):
        r = core.compile_model(f, "CPU", cfg).create_infer_request()
        return lambda feeds: r.infer(feeds)[0]
    runs = [mk(f) for f in files]
def feeds(n, text):
    e = toks[n].encode(text)
    return {"input_ids": np.asarray([e.ids], np.int64), "attention_mask": np.asarray([e.attention_mask], np.int64),
            "token_type_ids": np.asarray([e.type_ids], np.int64)}
for n, run in zip(lengths, runs):
    run(feeds(n, "warm up"))
out = runs[0](feeds(lengths[0], sys.argv[6]))
print(json.dumps({"shape": list(np.asarray(out).shape)}))
"""


def _run(cmd, env) -> tuple[float, float]:
    """(wall s, peak RSS MB) of one fresh process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}): {err[-800:]}")
    return wall, ru.ru_maxrss / 1024


def bench_device(art: Path, device: str, repeats: int) -> dict:
    man = json.loads((art / "manifest.json").read_text())
    target = "onnx-int8" if device == "onnxruntime" else "openvino"
    variant = next(v for v in man["variants"] if v["target"] == target)
    buckets = sorted(variant["buckets"], key=lambda b: b["inputs"][0]["shape"][1])
    files = [str(art / b["file"]) for b in buckets]
    lengths = [int(b["inputs"][0]["shape"][1]) for b in buckets]
    cache = tempfile.mkdtemp(prefix="coldstart-cache-")
    # bytecode cached on both sides, as after any pip install: with PYTHONDONTWRITEBYTECODE set (CI
    # boxes, containers) our editable sources were compiled afresh every run (~0.14 s) and the
    # vendors' pip-compiled site-packages were not
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["EDGE_RUNTIME_CACHE_DIR"] = cache
    edge_infer = str(Path(sys.executable).with_name("edge-infer"))
    ours = [edge_infer, "infer", str(art), "--text", TEXT, "--device", device, "--require-device", "--json"]
    tok = str(art / "tokenizer.json")
    raw_all = [sys.executable, "-c", _RAW, device, tok, json.dumps(files), json.dumps(lengths),
               os.path.join(cache, "raw"), TEXT]
    raw_one = [sys.executable, "-c", _RAW, device, tok, json.dumps(files[:1]), json.dumps(lengths[:1]),
               os.path.join(cache, "raw"), TEXT]
    paths = {"ours": ours, "raw": raw_all, "raw_one": raw_one}
    for cmd in paths.values():      # warm the page cache and the model caches on every side
        _run(cmd, env)
    wall: dict = {k: [] for k in paths}
    rss: dict = {k: [] for k in paths}
    names = list(paths)
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in (order if r % 2 == 0 else order[::-1]):
            w, m = _run(paths[k], env)
            wall[k].append(w)
            rss[k].append(m)
    med = {k: statistics.median(v) for k, v in wall.items()}
    mrss = {k: statistics.median(v) for k, v in rss.items()}
    return {"target": target, "buckets": lengths, "repeats": repeats,
            "ours_s": round(med["ours"], 3), "raw_s": round(med["raw"], 3), "raw_one_bucket_s": round(med["raw_one"], 3),
            "ours_rss_mb": round(mrss["ours"], 1), "raw_rss_mb": round(mrss["raw"], 1),
            "raw_one_bucket_rss_mb": round(mrss["raw_one"], 1),
            "ratio_wall": round(med["ours"] / med["raw"], 4), "ratio_wall_vs_one_bucket": round(med["ours"] / med["raw_one"], 4),
            "ratio_rss": round(mrss["ours"] / mrss["raw"], 4), "ratio_rss_vs_one_bucket": round(mrss["ours"] / mrss["raw_one"], 4),
            "goal": "wall <= 1.15, peak RSS <= 1.10 (raw loading the same bucket files)"}


def main():
    from bench_openvino import build_artifact

    ap = argparse.ArgumentParser()
    ap.add_argument("--artifact", type=Path)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--devices", default="onnxruntime,openvino")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "coldstart.json")
    args = ap.parse_args()
    art = args.artifact or build_artifact()
    res = {"machine": machine(), "model": "MiniLM-L6 embedding int8, two buckets", "text": TEXT, "devices": {}}
    for device in args.devices.split(","):
        print(f"running {device} ...", file=sys.stderr, flush=True)
        res["devices"][device] = bench_device(art, device, args.repeats)
        print(json.dumps(res["devices"][device]), file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
