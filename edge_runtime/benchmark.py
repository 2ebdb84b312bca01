"""``edge-infer bench``: our runtime against the raw vendor API, same files, same inputs, one run.

Figures (each a median over ``repeats`` rounds):

- cold start: process start → first result, in a fresh child process (ours:
  import, verify, load, warm up, infer; raw: import the vendor library,
  create the session on the bucket's file, run the same feeds once);
- peak RSS of those children after ``calls`` further calls;
- warm latency p50/p95/p99 per bucket: ``rt.infer(input)`` against our task
  pre-processing + the raw call (so the ratio is what the runtime layer adds);
- throughput sync (one call after another) and async (ours: ``infer_batch``
  from ``concurrency`` threads; raw: the vendor's throughput path, e.g.
  OpenVINO's AsyncInferQueue).

Ratios are ours / raw (latency, cold start, RSS: lower is better;
throughput: higher is better).

Honesty of the figures: the CPU they ran on is named (``cpu``, ``host``); the raw
runner gets the thread count and precision our sessions actually run with
(``threads_fit``'s one thread, ``$EDGE_RUNTIME_THREADS``, OpenVINO's compiled precision) on the
device ours runs on (onnxruntime's providers, OpenVINO's device; ``raw_device`` names it) and one untimed call
before its latency rounds, as ours had its warm-up; a percentile computed from
fewer calls a round than it needs (p95: 20, p99: 100) is listed in
``few_calls_for``; throughput counts only the items that succeeded (``*_failed``
the rest); the cold-start children load the same device, variant and options, and
report the device they ran on.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .bench_raw import raw_runner


def bucket_samples(rt) -> list:
    """One raw input per bucket that the task routes to that bucket (the task declares them)."""
    return rt.task.bucket_samples(rt.limits)


# calls a round a percentile needs before at least one call lies above it (below that it is the slowest call)
MIN_CALLS = {"p50": 2, "p95": 20, "p99": 100}


def few_calls_for(calls: int) -> list[str]:
    """The percentiles that ``calls`` samples a round cannot estimate (each then reads the slowest call)."""
    return [p for p, n in MIN_CALLS.items() if calls < n]


def cpu_label(hardware: dict) -> str:
    """``"2-core AMD EPYC (x86-vnni)"``: the CPU every figure of a bench ran on."""
    from .host import cpu_int8_class

    cpu = hardware.get("cpu") or {}
    cores = cpu.get("cores")
    return (f"{f'{cores}-core ' if cores else ''}{cpu.get('model') or hardware.get('machine') or 'unknown CPU'}"
            f" ({cpu_int8_class(hardware)})")


def raw_options(rt, idx: int) -> dict:
    """The options the raw runner of bucket ``idx`` gets: ours as they run, not only as they were asked
    for: the thread count the session runs with (the caller's, ``threads_fit``'s one, or
    ``$EDGE_RUNTIME_THREADS``, which our backends read when no count is given), the precision the session
    compiled with, and where it runs (onnxruntime's providers, OpenVINO's device): never the CPU against
    ours on a GPU."""
    opts = dict(rt.device_options)
    fit = getattr(rt, "threads_fit", None) or {}
    sessions = getattr(rt, "_sessions", None) or []
    sess = sessions[idx] if idx < len(sessions) else None
    if "threads" not in opts:       # a given count (0: the backend's default) stands
        ran = getattr(sess, "threads", None)            # onnxruntime's intra-op count, as the session set it
        env = os.environ.get("EDGE_RUNTIME_THREADS", "").strip()
        if isinstance(ran, int) and not isinstance(ran, bool) and ran > 0:
            opts["threads"] = ran
        elif fit.get("threads"):
            opts["threads"] = fit["threads"]
        elif env.isdigit() and int(env) > 0:
            opts["threads"] = int(env)
    precision = getattr(sess, "precision", None)
    if isinstance(precision, str):
        opts["precision"] = precision
    providers = getattr(sess, "providers", None)
    if isinstance(providers, list) and providers:
        opts["providers"] = [str(p) for p in providers]
        po = getattr(sess, "provider_options", None) or {}
        opts["provider_options"] = {str(p): {str(k): str(v) for k, v in (po.get(p) or {}).items()} for p in providers}
    ov_device = getattr(sess, "_tp_device", None)       # OpenVINO: where ours compiles (AUTO resolved to CPU)
    if isinstance(ov_device, str):
        opts["ov_device"] = ov_device
    return opts


def _percentiles(ms: list[float]) -> dict:
    a = np.asarray(ms)
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)), "p99": float(np.percentile(a, 99))}


def _median_of(rounds: list[dict]) -> dict:
    return {k: round(statistics.median(r[k] for r in rounds), 4) for k in rounds[0]}


def _ratio(a, b):
    return round(a / b, 4) if a is not None and b else None


def warm_latency(rt, raws, samples, calls: int, repeats: int) -> dict:
    out = {}
    for idx, (bucket, sample) in enumerate(zip(rt.variant["buckets"], samples)):
        if sample is None:
            continue
        raw = raws[idx]
        if raw is not None:     # its first call (session set-up, allocation): untimed, as our warm-up was
            raw.run(rt.task.prepare(sample, rt.limits).feeds)
        ours_r: list[dict] = []
        raw_r: list[dict] = []
        for rep in range(repeats):            # whole blocks, order swapped each round
            order = [("ours", lambda: rt.infer(sample)), ("raw", lambda: raw.run(rt.task.prepare(sample, rt.limits).feeds))]
            if raw is None:
                order = order[:1]
            for name, fn in (order if rep % 2 == 0 else order[::-1]):
                times = []
                for _ in range(calls):
                    t0 = time.perf_counter()
                    fn()
                    times.append((time.perf_counter() - t0) * 1000)
                (ours_r if name == "ours" else raw_r).append(_percentiles(times))
        ours = _median_of(ours_r)
        entry = {"ours_ms": ours, "calls_per_round": calls, "few_calls_for": few_calls_for(calls)}
        if raw_r:
            rawm = _median_of(raw_r)
            entry.update(raw_ms=rawm, ratio={k: _ratio(ours[k], rawm[k]) for k in ours})
        out[bucket["name"]] = entry
    return out


def throughput(rt, raws, samples, calls: int, repeats: int, batch: int, concurrency: int) -> dict:
    idx, sample = next((i, s) for i, s in enumerate(samples) if s is not None)
    raw = raws[idx]
    items = [sample] * calls
    res = {"bucket": rt.variant["buckets"][idx]["name"], "items": calls}
    rounds: dict[str, list] = {"ours_sync": [], "ours_async": [], "raw_sync": [], "raw_async": []}

    def ours_async():
        chunks = [items[i:i + batch] for i in range(0, len(items), batch)]
        with ThreadPoolExecutor(concurrency) as pool:
            done = [r for part in pool.map(rt.infer_batch, chunks) for r in part]
        return sum(1 for r in done if not isinstance(r, BaseException))     # an item's error is no item done

    def raw_async():
        raw.run_async([rt.task.prepare(x, rt.limits).feeds for x in items], concurrency)

    fns = {"ours_sync": lambda: [rt.infer(x) for x in items], "ours_async": ours_async}
    failed: dict[str, int] = {}
    if raw is not None:
        fns.update(raw_sync=lambda: [raw.run(rt.task.prepare(x, rt.limits).feeds) for x in items],
                   raw_async=raw_async)
    fns["ours_async"]()                       # first use of the throughput path compiles it
    if raw is not None:
        fns["raw_async"]()
    for rep in range(repeats):
        names = list(fns) if rep % 2 == 0 else list(fns)[::-1]
        for name in names:
            t0 = time.perf_counter()
            got = fns[name]()
            elapsed = time.perf_counter() - t0
            ok = got if isinstance(got, int) else calls
            failed[name] = max(failed.get(name, 0), calls - ok)
            rounds[name].append(ok / elapsed)
    for name, vals in rounds.items():
        res[name + "_per_s"] = round(statistics.median(vals), 2) if vals else None
        if failed.get(name):
            res[name + "_failed"] = failed[name]      # most items failed in one round, of ``items``
    res["ratio_sync"] = _ratio(res["ours_sync_per_s"], res["raw_sync_per_s"])
    res["ratio_async"] = _ratio(res["ours_async_per_s"], res["raw_async_per_s"])
    return res


_CHILD = r"""
import json, sys, time
mode, artifact, device, sample_path, calls = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
ran = {}
if mode == "ours":
    import edge_runtime as er
    sample = json.load(open(sample_path))
    rt = er.load(artifact, device=device, target=sample["target"], device_options=sample["options"] or None,
                 strict=sample["strict"])
    ran = {"device": rt.device, "target": rt.variant["target"], "options": dict(rt.device_options)}
    run = lambda: rt.infer(sample["value"])
else:
    import numpy as np
    from edge_runtime.bench_raw import raw_runner
    spec = json.load(open(sample_path))
    feeds = {k: np.load(v) for k, v in spec["feeds"].items()}
    raw = raw_runner(spec["backend"], spec["file"], spec["bucket"], spec["options"])
    run = lambda: raw.run(feeds)
run()
print(json.dumps({"first": time.time(), **ran}), flush=True)
for _ in range(calls):
    run()
from edge_runtime.bench_raw import peak_rss_kb     # VmHWM, else ru_maxrss in KiB (macOS counts bytes)
print(json.dumps({"rss_kb": peak_rss_kb()}), flush=True)
"""


def _child(mode: str, artifact, device: str, sample_path: Path, calls: int) -> tuple[float, int, dict]:
    from .errors import InferenceRuntimeError

    t0 = time.time()
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, mode, str(artifact), device, str(sample_path),
                               str(calls)], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        raise InferenceRuntimeError(f"the {mode} cold-start child gave no figures in 600 s", device=device) from None
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or len(lines) < 2 or "rss_kb" not in lines[1]:
        # a typed error naming the child: never a cold start or RSS figure from a child that did not finish
        raise InferenceRuntimeError(f"the {mode} cold-start child failed (exit {proc.returncode}): "
                                    f"{proc.stderr.strip()[-500:] or 'no figures printed'}", device=device)
    ran = {k: v for k, v in lines[0].items() if k != "first"}
    return lines[0]["first"] - t0, lines[1]["rss_kb"], ran


def cold_start(rt, samples, calls: int, repeats: int, device: str, device_options: dict | None = None,
               strict: bool = False) -> dict:
    idx, sample = next((i, s) for i, s in enumerate(samples) if s is not None)
    bucket = rt.variant["buckets"][idx]
    if not isinstance(sample, (str, bytes)) and type(rt.task).input_kind != "image":
        return {"skipped": "cold start needs a text or image sample"}
    tmp = Path(tempfile.mkdtemp(prefix="edge-bench-"))
    value = sample if isinstance(sample, str) else str(tmp / "sample.png")
    if isinstance(sample, bytes):
        Path(value).write_bytes(sample)
    # the child loads what this process runs: the same device, variant and options
    (tmp / "ours.json").write_text(json.dumps({"value": value, "target": rt.variant["target"],
                                               "options": device_options or {}, "strict": strict}, default=str))
    feeds = rt.task.prepare(value, rt.limits).feeds
    files = {}
    for name, arr in feeds.items():
        files[name] = str(tmp / f"{name}.npy")
        np.save(files[name], arr)
    (tmp / "raw.json").write_text(json.dumps({"backend": rt.choice.backend_name, "feeds": files,
                                              "file": str(rt.artifact.path(bucket["file"])), "bucket": bucket,
                                              "options": raw_options(rt, idx)}, default=str))
    res = {"bucket": bucket["name"]}
    modes = ["ours", "raw"] if rt.choice.backend_name in _raw_backends() else ["ours"]
    got: dict[str, list[tuple[float, int, dict]]] = {m: [] for m in modes}
    try:
        for rep in range(repeats):
            for m in (modes if rep % 2 == 0 else modes[::-1]):
                got[m].append(_child(m, rt.artifact.root, device, tmp / f"{m}.json", calls))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for m, vals in got.items():
        res[f"{m}_s"] = round(statistics.median(v[0] for v in vals), 4)
        res[f"{m}_peak_rss_mb"] = round(statistics.median(v[1] for v in vals) / 1024, 1)
    # never the load figures of another device, variant or configuration under this one's name
    here = (rt.device, rt.variant["target"], json.dumps(rt.device_options, sort_keys=True, default=str))
    ran = {(v[2].get("device"), v[2].get("target"), json.dumps(v[2].get("options"), sort_keys=True, default=str))
           for v in got["ours"]}
    res["ours_device"] = sorted(str(r[0]) for r in ran)[0] if len(ran) == 1 else sorted(str(r[0]) for r in ran)
    if ran != {here}:
        res["device_differs"] = (f"the cold-start child ran {', '.join(f'{d} ({t}, options {o})' for d, t, o in ran)}, "
                                 f"not {here[0]} ({here[1]}, options {here[2]})")
    if "raw" in got:
        res["ratio_cold_start"] = _ratio(res["ours_s"], res["raw_s"])
        res["ratio_peak_rss"] = _ratio(res["ours_peak_rss_mb"], res["raw_peak_rss_mb"])
    return res


def _raw_backends():
    from .bench_raw import RAW

    return RAW


def run_bench(artifact, device: str = "auto", *, calls: int = 50, repeats: int = 3, batch: int = 32,
              concurrency: int = 2, cold: bool = True, device_options: dict | None = None,
              strict: bool = False) -> dict:
    from . import error_codes as ec
    from .errors import InputError
    from .runtime import load

    for name, v in (("calls", calls), ("repeats", repeats), ("batch", batch), ("concurrency", concurrency)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:     # no figure from zero calls or rounds
            raise InputError(f"{name} must be an integer of at least 1, not {v!r}", code=ec.INPUT_INVALID)
    with load(artifact, device=device, device_options=device_options, strict=strict) as rt:
        samples = bucket_samples(rt)
        raws = []
        for idx, bucket in enumerate(rt.variant["buckets"]):
            raws.append(raw_runner(rt.choice.backend_name, str(rt.artifact.path(bucket["file"])), bucket,
                                   raw_options(rt, idx)))
        from .host import host_record

        raw_device = getattr(raws[0], "device", None) if raws[0] is not None else None
        result = {"artifact": str(artifact), "model": rt.artifact.name, "device": rt.device,
                  "target": rt.variant["target"], "raw": rt.choice.backend_name if raws[0] is not None else None,
                  "raw_device": raw_device,
                  "fallback": rt.choice.fallback or None,
                  "cpu": cpu_label(rt.hardware), "host": host_record(rt.hardware),
                  "threads": raw_options(rt, 0).get("threads"),      # as the session runs (caller, fit, env)
                  "raw_options": raw_options(rt, 0) if raws[0] is not None else None,
                  "calls": calls, "repeats": repeats,
                  "units": {"latency": "ms per call", "throughput": "items/s", "cold_start": "s",
                            "peak_rss_mb": "MiB (VmHWM, else ru_maxrss, KiB / 1024)"},
                  "warm_latency": warm_latency(rt, raws, samples, calls, repeats),
                  "throughput": throughput(rt, raws, samples, calls, repeats, batch, concurrency)}
        if raw_device is not None and raw_device != rt.device:
            result["raw_device_differs"] = (f"the raw side ran on {raw_device}, ours on {rt.device}: "
                                            "the ratios compare two devices")
        if cold:
            result["cold_start"] = cold_start(rt, samples, calls, repeats, device, device_options, strict)
    return result
