"""Run the benches and regenerate the ratios table (``bench/results/ratios.md`` and README's copy), one command.

Each bench runs in its own process (``bench/bench_*.py``) and writes its JSON
under ``bench/results/``; the table is then built from those files: each ratio
beside its goal, whether it is met, and the CPU it was measured on (from the
runtime's hardware probe, ``bench/machine.py``). A result measured on another
CPU than this one is marked so. Benches that need what is not installed (a
backend, the MiniLM weights) fail alone: their rows keep the last figures, and
the failure is listed under the table. The same table replaces README's between
``<!-- ratios:begin -->`` and ``<!-- ratios:end -->`` (``--readme``; a README without both
markers is left as it is, said on stderr).

Usage:
    python bench/run_all.py            # every bench, the default rounds (~20-40 min on 2 cores)
    python bench/run_all.py --quick    # fewer rounds (~5-10 min; noisier figures)
    python bench/run_all.py --only overhead --only tflite
    python bench/run_all.py --table    # no bench: the table from the JSON already there
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
README = HERE.parent / "README.md"
BEGIN, END = "<!-- ratios:begin -->", "<!-- ratios:end -->"
sys.path.insert(0, str(HERE))
from machine import cpu_label, machine  # noqa: E402

# name -> (script, full args, quick args, result file)
BENCHES = {
    "overhead": ("bench_overhead.py", [], ["--rounds", "6", "--per-block", "50"], "overhead.json"),
    "tflite": ("bench_tflite.py", [], ["--blocks", "4", "--per-block", "24"], "tflite.json"),
    "spine": ("bench_spine.py", [], ["--blocks", "3", "--per-block", "30"], "spine.json"),
    "openvino": ("bench_openvino.py", [],
                 ["--blocks", "3", "--cold-repeats", "2", "--only", "infer_vs_raw_seq64",
                  "--only", "infer_batch_vs_async_queue", "--only", "cold_start"], "openvino.json"),
    "score": ("bench_score.py", [], ["--rounds", "3", "--n", "128"], "score.json"),
    "coldstart": ("bench_coldstart.py", [], ["--repeats", "3"], "coldstart.json"),
}


def _get(d, *path):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _row(what, value, goal, op, limit, source, note="", machine=None):
    """A table row; ``limit`` None: a figure shown for context, held to no goal."""
    if value is None:
        return None
    if isinstance(value, float):
        value += 0.0            # -0.0 (a rounded tiny negative) reads "-0" in the table
    if limit is None:
        return {"what": what, "value": value, "goal": "(none)", "met": None, "source": source, "note": note,
                "machine": machine}
    met = value <= limit if op == "<=" else value >= limit
    return {"what": what, "value": value, "goal": f"{op} {limit:g}", "met": met, "source": source, "note": note,
            "machine": machine}


def rows(results: dict) -> list[dict]:
    out = []
    ovh = results.get("overhead") or {}
    for dev, label in (("onnxruntime", "ONNX Runtime"), ("openvino", "OpenVINO"), ("tflite", "LiteRT")):
        r = ovh.get(dev)
        if not r:
            continue
        src = "bench_overhead.py"
        out.append(_row(f"digits-cnn `rt.infer(array)` / raw, {label}", r["ratio_array"], "", "<=", 1.15, src,
                        f"{r['wall_us']['rt_array']:.0f} vs {r['wall_us']['raw_array']:.0f} µs"))
        out.append(_row(f"digits-cnn `rt.infer(path)` / raw, {label}", r["ratio_path"], "", "<=", 1.15, src,
                        f"{r['wall_us']['rt_path']:.0f} vs {r['wall_us']['raw_path']:.0f} µs"))
        c = r["thread_cpu_us"]
        out.append(_row(f"digits-cnn `rt.infer(array)` / raw, {label}, calling thread's CPU time", 
                        round(c["rt_array"] / c["raw_own_array"], 4), "", "<=", 1.15, src,
                        f"{c['rt_array']:.0f} vs {c['raw_own_array']:.0f} µs (robust to a busy box; excludes "
                        "the vendor's worker threads)"))
        # the goal holds per call whatever the input: an array and a path, each its own row (the path's
        # was a note beside the array's "met" until 2026-12-07, and it was over 25 µs on ONNX Runtime)
        for kind in ("array", "path"):
            out.append(_row(f"digits-cnn fixed cost per call beyond the vendor call and the raw pre/post, {label}, "
                            f"`rt.infer({kind})` (µs)", r[f"overhead_{kind}_us"], "", "<=", 25, src,
                            f"thread CPU: {r[f'overhead_{kind}_thread_cpu_us']} µs"))
    t = results.get("tflite") or {}
    out.append(_row("MobileNetV2 (Coral uint8) `rt.infer(path)` / raw decode + resize + invoke, LiteRT",
                    t.get("ratio"), "", "<=", 1.03, "bench_tflite.py",
                    f"{t.get('rt_infer_median_ms')} vs {t.get('raw_median_ms')} ms"))
    s = _get(results, "spine", "infer_vs_raw_seq64") or {}
    out.append(_row("MiniLM seq 64 `rt.infer(text)` / tokenizers + raw run, ONNX Runtime", s.get("ratio"), "",
                    "<=", 1.03, "bench_spine.py",
                    f"{s.get('rt_infer_median_ms')} vs {s.get('raw_median_ms')} ms; on the runtime's own session "
                    f"{s.get('ratio_vs_raw_on_runtime_session')}"))
    o = results.get("openvino") or {}
    i = o.get("infer_vs_raw_seq64") or {}
    out.append(_row("MiniLM seq 64 `rt.infer(text)` / tokenizers + raw infer request, OpenVINO", i.get("ratio"), "",
                    "<=", 1.03, "bench_openvino.py",
                    f"{i.get('rt_infer_median_ms')} vs {i.get('raw_median_ms')} ms; on the runtime's own compiled "
                    f"model {i.get('ratio_vs_raw_on_runtime_compiled_model')}", i.get("machine") or {}))
    b = o.get("infer_batch_vs_async_queue") or {}
    out.append(_row("MiniLM `rt.infer_batch` / raw `AsyncInferQueue`, OpenVINO (throughput)", b.get("ratio"), "",
                    ">=", 0.90, "bench_openvino.py", f"{b.get('rt_infer_batch_per_s')} vs {b.get('raw_per_s')} /s",
                    b.get("machine") or {}))
    sc = results.get("score") or {}
    out.append(_row("MiniLM seq 128 `edge-infer score` / raw `AsyncInferQueue`, OpenVINO (throughput)",
                    sc.get("ratio"), "", ">=", 0.90, "bench_score.py",
                    f"{sc.get('score_loop_per_s')} vs {sc.get('raw_async_queue_per_s')} /s; median of per-round "
                    f"paired ratios {sc.get('paired_ratios')}, ratio of medians {sc.get('ratio_of_medians')}; "
                    f"against the raw queue with our {sc.get('our_jobs')} requests "
                    f"{sc.get('ratio_vs_raw_same_jobs')} ({sc.get('raw_same_jobs_per_s')} /s)"))
    c = o.get("cold_start") or {}
    if "warm_cache" in c:
        # context only: raw compiles the seq-64 bucket alone while load() compiles both; the goal's
        # like-for-like figure (raw loading the same bucket files) is bench_coldstart's row below
        out.append(_row("MiniLM cold start, process start → first result / raw compiling one of the two buckets, "
                        "OpenVINO, both warm cache", c["warm_cache"]["ratio"], "", "<=", None, "bench_openvino.py",
                        f"{c['warm_cache']['rt_s']} vs {c['warm_cache']['raw_s']} s; both uncached "
                        f"{_get(c, 'no_cache', 'ratio')}", c.get("machine") or {}))
    cs = results.get("coldstart") or {}
    for dev, r in (cs.get("devices") or {}).items():
        what = "MobileNetV2 (Coral uint8) `edge-infer infer --image`" if dev == "tflite" else \
            "MiniLM (two buckets) `edge-infer infer --text`"
        out.append(_row(f"{what} / raw script, {dev}: cold start",
                        r.get("ratio_wall_paired", r.get("ratio_wall")), "", "<=", 1.15, "bench_coldstart.py",
                        f"median of per-round ratios; {r.get('ours_s')} vs {r.get('raw_s')} s, medians "
                        f"(ratio {r.get('ratio_wall')}; raw loads the same bucket files)"))
        out.append(_row(f"{what} / raw script, {dev}: peak RSS",
                        r.get("ratio_rss"), "", "<=", 1.10, "bench_coldstart.py",
                        f"{r.get('ours_rss_mb')} vs {r.get('raw_rss_mb')} MB"))
    return [r for r in out if r is not None]


def table(results: dict, here: dict, failures: list[str]) -> str:
    day = time.strftime('%Y-%m-%d', time.gmtime())
    lines = [f"# Ratios against hand-written raw code ({day})", "",
             f"Regenerated on {day} by `python bench/run_all.py` on a {cpu_label(here)}. "
             "Medians of alternating blocks, their order rotated; a shared box is noisy: trust the ratios, "
             "not the absolute times.", "",
             "| what | ratio / figure | goal | met | measured on | bench | detail |", "|---|---|---|---|---|---|---|"]
    for r in rows(results):
        name = r["source"].removesuffix(".py").removeprefix("bench_")
        m = r["machine"] if r["machine"] is not None else (_get(results, name, "machine") or {})
        cpu = cpu_label(m) if m.get("isa") else "older run (CPU not recorded)"
        if m.get("isa") and (m.get("cpu"), m.get("isa")) != (here.get("cpu"), here.get("isa")):
            cpu += " (not this CPU)"
        if m.get("shared_box_load_1min") is not None:
            cpu += f", load {m['shared_box_load_1min']}"
        met = "n/a" if r["met"] is None else ("yes" if r["met"] else "**no**")
        lines.append(f"| {r['what']} | **{r['value']:g}** | {r['goal']} | {met} | {cpu} "
                     f"| `{r['source']}` | {r['note']} |")
    if failures:
        lines += ["", "Benches that did not run this time (their rows, if any, are older figures):", ""]
        lines += [f"- {f}" for f in failures]
    return "\n".join(lines) + "\n"


def splice_readme(readme: str, table_text: str) -> str | None:
    """``readme`` with the block between its markers replaced by ``table_text`` (its ``#`` title
    line dropped: README has its own heading), or None when the markers are not there once each,
    in order."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        return None
    body = table_text.split("\n", 1)[1].strip("\n") if table_text.startswith("# ") else table_text.strip("\n")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{body}\n{END}{tail}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer rounds: minutes, not half an hour")
    ap.add_argument("--only", action="append", choices=sorted(BENCHES), help="run only these benches")
    ap.add_argument("--table", action="store_true", help="run nothing: rebuild the table from the JSON results")
    ap.add_argument("--timeout", type=int, default=3600, help="seconds per bench")
    ap.add_argument("--out", type=Path, default=RESULTS / "ratios.md")
    ap.add_argument("--readme", type=Path, default=README, help="the README whose ratios block gets the table")
    args = ap.parse_args()
    failures = []
    if not args.table:
        for name, (script, full, quick, _) in BENCHES.items():
            if args.only and name not in args.only:
                continue
            if not (HERE / script).exists():
                failures.append(f"{name}: {script} is absent")
                continue
            cmd = [sys.executable, str(HERE / script), *(quick if args.quick else full)]
            print(f"== {name}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                ok = proc.returncode == 0
                why = (proc.stderr.strip().splitlines() or ["?"])[-1]
            except subprocess.TimeoutExpired:
                ok, why = False, f"timed out after {args.timeout} s"
            print(f"   {'ok' if ok else 'FAILED'} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            if not ok:
                failures.append(f"{name}: {why}")
    results = {}
    for name, (_, _, _, res) in BENCHES.items():
        p = RESULTS / res
        if p.exists():
            results[name] = json.loads(p.read_text())
    text = table(results, machine(), failures)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    if args.readme.exists():
        spliced = splice_readme(args.readme.read_text(), text)
        if spliced is None:
            print(f"{args.readme}: no {BEGIN} ... {END} block: not updated", file=sys.stderr)
        else:
            args.readme.write_text(spliced)
    print(text)


if __name__ == "__main__":
    main()
