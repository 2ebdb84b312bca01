"""Ray benchmark (not a test): ``score --engine ray`` vs local ``score``, one run.

For digits-cnn (onnx-int8, images named in a JSONL) and MiniLM embedding (onnx-int8,
SST-2 dev sentences), each through the ``edge-infer`` CLI in a child process:

- local: ``edge-infer score`` (batch 32, 2 in flight); its summary's throughput
  (load excluded), run before and after the Ray run, the ratio over their mean;
- ray, one node: a head node with 2 CPUs (``ray.cluster_utils.Cluster``: the raylets
  ``ray start`` starts, owned by this process, so stopping them stops nothing else on
  the box; never ``ray stop``), ``--actors 2
  --cpus-per-actor 1``; throughput "once Ray has started" is the steady rate after
  the first lines (actor start-up = load + verify + warm-up, reported apart), and
  the wall rate with actor start-up is reported too. The steady rate reads high:
  blocks an actor finished before the first block's lines wait behind it (order is
  kept) and are written at once; the wall rate reads low (actor start-up in it);
- one node vs two: a head with 1 CPU (``--actors 1``), then a second raylet on
  this machine (``Cluster.add_node``: what ``ray start --address`` does, 1 CPU) and
  ``--actors 2``.

Ray start-up: ``ray.init()`` of a fresh local Ray in a child process (object store
200 MB), timed apart. Rounds: one (a noisy shared box: read ratios, not absolutes).

Usage: python bench/bench_ray.py [--n-digits 30000] [--n-text 1000] [--reuse DIR] [--out bench/results/ray.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
STORE = 200_000_000


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} CPUs)"
    except OSError:
        pass
    return platform.processor()


def artifacts(tmp: Path, models: list[str]) -> dict[str, Path]:
    from edge_runtime.converters.pipeline import convert
    from edge_runtime.converters.zoo import convert_request

    out = {"digits": tmp / "digits-int8", "minilm": tmp / "minilm-embedding"}
    if "digits" in models:
        convert(convert_request("digits-cnn", "image-classification", out["digits"]))
    if "minilm" in models:
        convert(convert_request("minilm", "text-embedding", out["minilm"], targets=["onnx-int8"],
                                cache=ROOT / "tests" / ".cache"))
    return out


def inputs(tmp: Path, n_digits: int, n_text: int) -> dict[str, Path]:
    images = sorted((ROOT / "models" / "zoo" / "digits-cnn" / "held_out").glob("*/*.png"))
    digits = tmp / "digits.jsonl"
    digits.write_text("".join(json.dumps({"id": i, "image": str(images[i % len(images)])}) + "\n"
                              for i in range(n_digits)))
    rows = (ROOT.parent / "shared" / "data" / "text" / "sst2" / "dev.tsv").read_text().splitlines()[1:]
    texts = [r.split("\t")[0] for r in rows if r.strip()]
    text = tmp / "text.jsonl"
    text.write_text("".join(json.dumps({"id": i, "text": texts[i % len(texts)]}) + "\n" for i in range(n_text)))
    return {"digits": digits, "minilm": text}


def score(art: Path, src: Path, out: Path, *extra: str) -> dict:
    # local score: its default batch (32); Ray: its own default, sized at start to ~100 ms of model time
    batch = [] if "--engine" in extra else ["--batch-size", "32"]
    cmd = [PY, "-m", "edge_runtime", "score", str(art), str(src), "-o", str(out), "--force", "--quiet", "--json",
           *batch, *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def cluster(cpus: int):
    """A Ray head on this machine (on its own IP: Ray maps 127.0.0.1 to it), started and stopped
    by this process only: never ``ray stop``, which would stop every Ray on the box."""
    from ray.cluster_utils import Cluster

    return Cluster(initialize_head=True, head_node_args={"num_cpus": cpus, "object_store_memory": STORE,
                                                         "include_dashboard": False})


def ray_init_seconds() -> float:
    code = ("import time; t=time.perf_counter(); import ray; ray.init(address='local', "
            "object_store_memory=200_000_000, include_dashboard=False, logging_level='ERROR'); "
            "print(time.perf_counter()-t); ray.shutdown()")
    return round(float(subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True,
                                      timeout=300).stdout.strip().splitlines()[-1]), 3)


def ray_row(report: dict) -> dict:
    r = report["ray"]
    return {"steady_per_s": r.get("steady_per_s"), "wall_per_s": report["throughput_per_s"],
            "actor_startup_s": r.get("first_rows_s"), "actors": r["actors"], "ok": report["ok"],
            "batch_size": r.get("batch_size"), "batch_size_why": r.get("batch_size_why")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-digits", type=int, default=30000)     # ~10 s locally: long against actor start-up
    ap.add_argument("--n-text", type=int, default=1000)
    ap.add_argument("--models", default="digits,minilm")
    ap.add_argument("--reuse", type=Path, help="a folder holding digits-int8/ and minilm-embedding/ from an earlier "
                                                "run: no conversion")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ray.json")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    models = args.models.split(",")
    arts = ({"digits": args.reuse / "digits-int8", "minilm": args.reuse / "minilm-embedding"} if args.reuse
            else artifacts(tmp, models))
    srcs = inputs(tmp, args.n_digits, args.n_text)
    result: dict = {"cpu": cpu_name(), "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "note": "one run on a shared, busy box: ratios, not absolutes", "models": {}}
    result["ray_init_s"] = ray_init_seconds()
    for m in models:
        result["models"][m] = {"n": args.n_digits if m == "digits" else args.n_text,
                               "local_per_s_before": score(arts[m], srcs[m], tmp / f"{m}-local.jsonl")["throughput_per_s"]}
    c = cluster(2)
    try:
        for m in models:
            rep = score(arts[m], srcs[m], tmp / f"{m}-ray.jsonl", "--engine", "ray", "--address", c.address,
                        "--actors", "2", "--cpus-per-actor", "1")
            row = result["models"][m]
            row["ray_2_actors"] = ray_row(rep)
            # local again right after: the box's load drifts; the ratio uses the mean of both local runs
            row["local_per_s_after"] = score(arts[m], srcs[m], tmp / f"{m}-local2.jsonl")["throughput_per_s"]
            row["local_per_s"] = round((row["local_per_s_before"] + row["local_per_s_after"]) / 2, 2)
            steady = row["ray_2_actors"]["steady_per_s"]
            row["ratio_steady"] = round(steady / row["local_per_s"], 3) if steady else None
            row["ratio_wall_with_actor_startup"] = round(rep["throughput_per_s"] / row["local_per_s"], 3)
    finally:
        c.shutdown()
    c = cluster(1)
    scaling: dict = {}
    try:
        for m in models:
            scaling[m] = {"one_node_1_actor": ray_row(score(
                arts[m], srcs[m], tmp / f"{m}-n1.jsonl", "--engine", "ray", "--address", c.address,
                "--actors", "1", "--cpus-per-actor", "1"))}
        c.add_node(num_cpus=1, object_store_memory=STORE)     # a second raylet on this machine
        c.wait_for_nodes()
        for m in models:
            scaling[m]["two_nodes_2_actors"] = ray_row(score(
                arts[m], srcs[m], tmp / f"{m}-n2.jsonl", "--engine", "ray", "--address", c.address,
                "--actors", "2", "--cpus-per-actor", "1"))
            a, b = scaling[m]["one_node_1_actor"]["steady_per_s"], scaling[m]["two_nodes_2_actors"]["steady_per_s"]
            scaling[m]["two_over_one_steady"] = round(b / a, 3) if a and b else None
        result["nodes"] = scaling
    finally:
        c.shutdown()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
