"""Compare the x86-64 and aarch64 answers for the same artifacts and inputs, add
the aarch64 test results and timings, write one JSON report, print a summary.

    python compare.py OUT_DIR REPORT.json

OUT_DIR holds x86_64.json, aarch64.json (the main emulated CPU),
aarch64-CPU.json (extra CPUs), junit*.xml and times.json. ``ok`` is true when
every model has the same top-1 on every input on the main CPU (a backend
without an aarch64 wheel excepted) and the test subset passed with no failure
or error. The extra CPUs are compared and reported, not judged.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def junit(paths: list[Path]) -> dict:
    if not paths:
        return {"ran": False}
    suites = []
    for path in paths:
        root = ET.parse(path).getroot()
        suites += [root] if root.tag == "testsuite" else list(root)
    n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    failed = [f"{c.get('classname')}::{c.get('name')}" for s in suites for c in s
              if c.find("failure") is not None or c.find("error") is not None]
    skipped = sorted({(c.find("skipped").get("message") or "")[:160] for s in suites for c in s
                      if c.find("skipped") is not None})
    return {"ran": True, "passed": n["tests"] - n["failures"] - n["errors"] - n["skipped"],
            "failed": n["failures"], "errors": n["errors"], "skipped": n["skipped"], "failures": failed,
            "skip_reasons": skipped, "time_s": round(sum(float(s.get("time", 0)) for s in suites), 1)}


def compare(x86: dict, arm: dict) -> dict:
    out = {}
    for name, a in x86["models"].items():
        b = arm.get("models", {}).get(name)
        if b is None or "answers" not in b or "answers" not in a:
            out[name] = {"compared": False, "x86_error": a.get("error"), "aarch64_error": (b or {}).get("error"),
                         "not_installed": bool((b or {}).get("not_installed"))}
            continue
        same, diffs, mismatches = 0, [], []
        for key, ax in a["answers"].items():
            bx = b["answers"].get(key)
            if bx is None:
                mismatches.append({"input": key, "aarch64": "missing"})
                continue
            if ax["class_id"] == bx["class_id"]:
                same += 1
            else:
                mismatches.append({"input": key, "x86": ax["prediction"], "aarch64": bx["prediction"]})
            sa = {t["index"]: t["score"] for t in ax["top_k"]}
            sb = {t["index"]: t["score"] for t in bx["top_k"]}
            diffs += [abs(sa[i] - sb[i]) for i in sa.keys() & sb.keys()]
        out[name] = {"compared": True, "device": b.get("device"), "inputs": len(a["answers"]), "same_top1": same,
                     "mismatches": mismatches, "max_score_diff": max(diffs) if diffs else 0.0,
                     "latency_ms_p50": {"x86_64": a.get("latency_ms_p50"), "aarch64_qemu": b.get("latency_ms_p50")},
                     "load_s": {"x86_64": a.get("load_s"), "aarch64_qemu": b.get("load_s")}}
    return out


def main() -> int:
    out, report_p = Path(sys.argv[1]), Path(sys.argv[2])
    x86 = json.loads((out / "x86_64.json").read_text())
    arm_p = out / "aarch64.json"
    arm = json.loads(arm_p.read_text()) if arm_p.exists() else {"models": {}, "error": "no aarch64 answers"}
    times = json.loads((out / "times.json").read_text()) if (out / "times.json").exists() else {}
    models = compare(x86, arm)
    others = {p.stem.split("-", 1)[1]: compare(x86, json.loads(p.read_text())) for p in sorted(out.glob("aarch64-*.json"))}
    tests = junit(sorted(out.glob("junit*.xml")))
    # a backend without an aarch64 wheel is reported, not failed; any other gap fails
    top1_ok = bool(models) and all(m["compared"] and m["same_top1"] == m["inputs"] for m in models.values()
                                   if not m.get("not_installed"))
    ok = top1_ok and tests.get("ran", False) and tests["failed"] == 0 and tests["errors"] == 0
    report = {"ok": ok, "same_top1_everywhere": top1_ok, "machine_inside": arm.get("machine"),
              "qemu_cpu": times.get("qemu_cpu"), "other_cpus": others,
              "import_s": {"x86_64": x86.get("import_s"), "aarch64_qemu": arm.get("import_s")},
              "models": models, "tests": tests, "times_s": times,
              "note": "aarch64 timings are qemu-user emulation on the x86 host, not an ARM core's speed"}
    report_p.write_text(json.dumps(report, indent=1))
    print(f"aarch64 (qemu-user) summary: {'OK' if ok else 'FAILED'}")
    print(f"  inside: machine {arm.get('machine')}; import edge_runtime {arm.get('import_s')} s "
          f"(x86 {x86.get('import_s')} s)")
    rows = [(times.get("qemu_cpu", "?"), name, m) for name, m in models.items()]
    rows += [(cpu, name, m) for cpu, ms in others.items() for name, m in ms.items()]
    for cpu, name, m in rows:
        name = f"{cpu:11s} {name}"
        if m["compared"]:
            print(f"  {name:32s} {m['device']:11s} top-1 same {m['same_top1']}/{m['inputs']}, "
                  f"max score diff {m['max_score_diff']:.3g}; p50 x86 {m['latency_ms_p50']['x86_64']} ms, "
                  f"qemu {m['latency_ms_p50']['aarch64_qemu']} ms")
        else:
            print(f"  {name:32s} not compared: x86 {m['x86_error']}; aarch64 {m['aarch64_error']}")
    if tests.get("ran"):
        print(f"  tests: {tests['passed']} passed, {tests['failed']} failed, {tests['errors']} errors, "
              f"{tests['skipped']} skipped in {tests['time_s']} s")
        for f in tests["failures"]:
            print(f"    FAILED {f}")
    else:
        print("  tests: did not run")
    print(f"  times: {json.dumps(times)}")
    print(f"  report: {report_p}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
