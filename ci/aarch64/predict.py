"""Run every artifact of a host-built set on the same inputs and write what each
answered (prediction, class index, top-5 scores) plus timings, as JSON.

    python predict.py ARTIFACTS_DIR OUT.json [--repeat N]

Runs unchanged on x86-64 and on aarch64 (under qemu); compare.py diffs the two.
Timings under emulation measure qemu, not a board.
"""

from __future__ import annotations

import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(__import__("os").environ.get("EDGE_SHARED_DATA", ROOT.parent / "shared" / "data"))


DEADLINE_MS = 120_000     # emulation: Coral's MobileNetV2 takes seconds under qemu's Cortex-A53
# device -> the packages that provide it (one of them)
PACKAGES = {"onnxruntime": ("onnxruntime",), "openvino": ("openvino",), "tflite": ("ai_edge_litert", "tflite_runtime")}


def inputs(kind: str) -> list[tuple[str, str]]:
    if kind == "digits":
        held = ROOT / "models" / "zoo" / "digits-cnn" / "held_out"
        return [(f"{d.name}/{p.name}", str(p)) for d in sorted(held.iterdir()) for p in sorted(d.iterdir())[:2]]
    coral = SHARED / "coral"
    return [(n, str(coral / n)) for n in ("cat.bmp", "parrot.jpg", "grace_hopper.bmp", "bird.bmp")]


def one(art_dir: Path, name: str, spec: dict, repeat: int) -> dict:
    """One model, in this process (main() runs each in its own: a crash is one model's answer)."""
    import edge_runtime as er

    entry: dict = {"device": spec["device"]}
    try:
        t0 = time.perf_counter()
        rt = er.load(art_dir / name, device=spec["device"], strict=True)
        entry["load_s"] = round(time.perf_counter() - t0, 3)
    except Exception as e:       # a backend that does not install here is reported, not fatal
        entry["error"] = f"{type(e).__name__}: {e}"
        return entry
    with rt:
        answers = {}
        for key, path in inputs(spec["inputs"]):
            res = rt.infer(path, deadline_ms=DEADLINE_MS)
            answers[key] = {"prediction": res.prediction, "class_id": res.class_id, "device": res.device,
                            "top_k": [{"index": int(t["index"]), "score": float(t["score"])}
                                      for t in (res.top_k or [])[:5]]}
        first = inputs(spec["inputs"])[0][1]
        lat = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            rt.infer(first, deadline_ms=DEADLINE_MS)
            lat.append((time.perf_counter() - t0) * 1000)
        entry.update(answers=answers, latency_ms_p50=round(statistics.median(lat), 2), runs=repeat)
    return entry


def main() -> int:
    art_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 5
    index = json.loads((art_dir / "index.json").read_text())
    if "--one" in sys.argv:
        name = sys.argv[sys.argv.index("--one") + 1]
        out.write_text(json.dumps(one(art_dir, name, index[name], repeat)))
        return 0
    code = "import sys, time, json; t = time.perf_counter(); import edge_runtime; print(time.perf_counter() - t)"
    import_s = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    report = {"machine": platform.machine(), "python": platform.python_version(), "import_s": round(import_s, 3),
              "models": {}}
    for name, spec in index.items():
        mods = PACKAGES.get(spec["device"], ())
        if mods and not any(importlib.util.find_spec(m) for m in mods):
            report["models"][name] = {"device": spec["device"], "not_installed": True,
                                      "error": f"none of {', '.join(mods)} is installed here"}
            continue
        part = out.parent / "parts" / f"{out.stem}.{name}.json"
        part.parent.mkdir(exist_ok=True)
        proc = subprocess.run([sys.executable, __file__, str(art_dir), str(part), "--repeat", str(repeat), "--one", name],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0 or not part.exists():
            report["models"][name] = {"device": spec["device"], "error": f"exit {proc.returncode}: "
                                      + (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]}
        else:
            report["models"][name] = json.loads(part.read_text())
        print(f"{name}: {'error ' + report['models'][name]['error'] if 'error' in report['models'][name] else 'ok'}",
              file=sys.stderr)
    out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
