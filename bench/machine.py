"""The machine a bench ran on, from the runtime's own hardware probe: every figure names its CPU."""

from __future__ import annotations

import os
import platform


def machine() -> dict:
    from edge_runtime import hardware as hw

    cpu = (hw.detect_cached().get("cpu") or {})
    features = list(cpu.get("features") or [])
    isa = "AVX-512 VNNI" if "avx512_vnni" in features else ("AVX2" if "avx2" in features else
                                                             (platform.machine() or "?"))
    if "amx_int8" in features:
        isa += " + AMX"
    return {"cpu": cpu.get("model") or platform.processor() or platform.machine(),
            "vendor": cpu.get("vendor"), "isa": isa, "features": features,
            "cores": cpu.get("cores") or os.cpu_count(), "python": platform.python_version(),
            "shared_box_load_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}


def cpu_label(m: dict) -> str:
    """"2-core Intel(R) Xeon(R) Processor (AVX-512 VNNI + AMX)"."""
    return f"{m.get('cores')}-core {m.get('cpu')} ({m.get('isa')})"
