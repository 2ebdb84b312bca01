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

LiteRT (``tflite``) has no MiniLM variant; it runs Coral's MobileNetV2 1.0/224
uint8 imported as an artifact (``edge-infer infer ART --image cat.bmp``)
against a raw script that imports ``ai_edge_litert``, PIL and numpy, loads the
same ``model.tflite`` with the same thread count, runs one warm-up call,
decodes the image, resizes it by hand (half-pixel bilinear, as the task does),
invokes, takes the top class and exits (one bucket: ``raw_one`` is ``raw``).

Wall time and peak RSS (``wait4``'s ``ru_maxrss``) are medians per side.
OpenVINO runs both with their model caches warm (each its own, filled
first). Goals (issue #20): wall ≤ 1.15, peak RSS ≤ 1.10.

Usage: python bench/bench_coldstart.py [--repeats 11] [--devices onnxruntime,openvino,tflite] [--out ...]
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


_RAW_TFLITE = r"""
import json, sys
import numpy as np
from PIL import Image
from ai_edge_litert.interpreter import Interpreter
model, image, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
interp = Interpreter(model_path=model, num_threads=threads)
interp.allocate_tensors()
i_in, i_out = interp.get_input_details()[0], interp.get_output_details()[0]
_, h, w, _ = i_in["shape"]
interp.set_tensor(i_in["index"], np.zeros(i_in["shape"], np.uint8))
interp.invoke()
def axis(n_in, n_out):
    src = np.clip((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0, n_in - 1)
    i0 = np.floor(src).astype(np.intp)
    return i0, np.minimum(i0 + 1, n_in - 1), (src - i0).astype(np.float32)
x = np.asarray(Image.open(image).convert("RGB"), dtype=np.float32)
y0, y1, wy = axis(x.shape[0], h)
x0, x1, wx = axis(x.shape[1], w)
rows = x[y0] + (x[y1] - x[y0]) * wy[:, None, None]
x = rows[:, x0] + (rows[:, x1] - rows[:, x0]) * wx[None, :, None]
interp.set_tensor(i_in["index"], np.floor(np.clip(x, 0, 255)).astype(np.uint8)[None])
interp.invoke()
print(json.dumps({"class": int(interp.get_tensor(i_out["index"]).argmax())}))
"""

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "coral"
CACHE = Path.home() / ".cache" / "edge-runtime" / "bench"


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


def _env(cache: str) -> dict:
    # bytecode cached on both sides, as after any pip install: with PYTHONDONTWRITEBYTECODE set (CI
    # boxes, containers) our editable sources were compiled afresh every run (~0.14 s) and the
    # vendors' pip-compiled site-packages were not
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["EDGE_RUNTIME_CACHE_DIR"] = cache
    return env


def _alternate(paths: dict, env: dict, repeats: int) -> tuple[dict, dict]:
    """Median wall s and peak RSS MB per side: every side warmed once (page cache, model caches),
    then ``repeats`` rounds, the order rotated and reversed every other round."""
    for cmd in paths.values():
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
    # the VM's speed drifts between minutes (1.6-1.9x here): each round's ours/raw, run seconds
    # apart, cancels the drift that the ratio of two medians keeps
    for k in names:
        if k != "ours":
            med[f"paired/{k}"] = statistics.median(o / x for o, x in zip(wall["ours"], wall[k]))
    return med, {k: statistics.median(v) for k, v in rss.items()}


def _figures(target, buckets, repeats, med, mrss) -> dict:
    return {"target": target, "buckets": buckets, "repeats": repeats,
            "ours_s": round(med["ours"], 3), "raw_s": round(med["raw"], 3),
            "raw_one_bucket_s": round(med["raw_one"], 3),
            "ours_rss_mb": round(mrss["ours"], 1), "raw_rss_mb": round(mrss["raw"], 1),
            "raw_one_bucket_rss_mb": round(mrss["raw_one"], 1),
            "ratio_wall": round(med["ours"] / med["raw"], 4),
            "ratio_wall_paired": round(med["paired/raw"], 4),
            "ratio_wall_vs_one_bucket": round(med["ours"] / med["raw_one"], 4),
            "ratio_rss": round(mrss["ours"] / mrss["raw"], 4),
            "ratio_rss_vs_one_bucket": round(mrss["ours"] / mrss["raw_one"], 4),
            "goal": "wall <= 1.15, peak RSS <= 1.10 (raw loading the same bucket files)"}


def bench_tflite(repeats: int) -> dict:
    """Coral MobileNetV2 uint8 on LiteRT: ``edge-infer infer --image`` vs the raw interpreter script."""
    from edge_runtime.converters.tflite_import import import_tflite
    import edge_runtime as er

    art = CACHE / "mnv2-coral"
    if not (art / "manifest.json").exists():
        import_tflite(SHARED / "mobilenet_v2_1.0_224_quant.tflite", art, labels=SHARED / "imagenet_labels.txt")
    with er.load(art, device="tflite", strict=True) as rt:     # the thread count load() picks here
        threads = rt.info()["sessions"][0]["threads"]
    image = str(SHARED / "cat.bmp")
    env = _env(tempfile.mkdtemp(prefix="coldstart-cache-"))
    edge_infer = str(Path(sys.executable).with_name("edge-infer"))
    ours = [edge_infer, "infer", str(art), "--image", image, "--device", "tflite", "--require-device", "--json"]
    raw = [sys.executable, "-c", _RAW_TFLITE, str(art / "tflite-int8" / "model.tflite"), image, str(threads)]
    med, mrss = _alternate({"ours": ours, "raw": raw}, env, repeats)
    med["raw_one"], mrss["raw_one"] = med["raw"], mrss["raw"]
    out = _figures("tflite-int8", [224], repeats, med, mrss)
    out["model"] = "Coral MobileNetV2 1.0/224 uint8 (one bucket)"
    return out


def bench_device(art: Path, device: str, repeats: int) -> dict:
    man = json.loads((art / "manifest.json").read_text())
    target = "onnx-int8" if device == "onnxruntime" else "openvino"
    variant = next(v for v in man["variants"] if v["target"] == target)
    buckets = sorted(variant["buckets"], key=lambda b: b["inputs"][0]["shape"][1])
    files = [str(art / b["file"]) for b in buckets]
    lengths = [int(b["inputs"][0]["shape"][1]) for b in buckets]
    cache = tempfile.mkdtemp(prefix="coldstart-cache-")
    env = _env(cache)
    edge_infer = str(Path(sys.executable).with_name("edge-infer"))
    ours = [edge_infer, "infer", str(art), "--text", TEXT, "--device", device, "--require-device", "--json"]
    tok = str(art / "tokenizer.json")
    raw_all = [sys.executable, "-c", _RAW, device, tok, json.dumps(files), json.dumps(lengths),
               os.path.join(cache, "raw"), TEXT]
    raw_one = [sys.executable, "-c", _RAW, device, tok, json.dumps(files[:1]), json.dumps(lengths[:1]),
               os.path.join(cache, "raw"), TEXT]
    med, mrss = _alternate({"ours": ours, "raw": raw_all, "raw_one": raw_one}, env, repeats)
    return _figures(target, lengths, repeats, med, mrss)


def main():
    from bench_openvino import build_artifact

    ap = argparse.ArgumentParser()
    ap.add_argument("--artifact", type=Path)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--devices", default="onnxruntime,openvino,tflite")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "coldstart.json")
    args = ap.parse_args()
    devices = args.devices.split(",")
    text_devices = [d for d in devices if d != "tflite"]
    art = (args.artifact or build_artifact()) if text_devices else None
    res = {"machine": machine(), "model": "MiniLM-L6 embedding int8, two buckets", "text": TEXT, "devices": {}}
    for device in devices:
        print(f"running {device} ...", file=sys.stderr, flush=True)
        res["devices"][device] = bench_tflite(args.repeats) if device == "tflite" else \
            bench_device(art, device, args.repeats)
        print(json.dumps(res["devices"][device]), file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
