"""Pick the (variant, backend, device) to run an artifact on.

Every backend that declares a variant's target scores itself for the
detected hardware; ``device="auto"`` takes the best score. A named device
(``"onnxruntime"``, ``"onnxruntime:cuda"``) forces one backend; when it
cannot run, ``strict`` raises ``DeviceError`` and otherwise the choice falls
back to the best alternative and says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edge_runtime.devices import registry
from edge_runtime.devices.base import Suitability

from .errors import ArtifactError, DeviceError


@dataclass
class Choice:
    variant: dict
    backend_name: str
    suitability: Suitability
    candidates: list[dict] = field(default_factory=list)
    fallback: str | None = None


def check_targets(targets: list[str]) -> dict[str, list[str]]:
    known = registry.known_targets()
    for target in targets:
        if target not in known:
            raise ArtifactError(f"no device backend knows target {target!r} (known targets: "
                                f"{', '.join(sorted(known)) or 'none'})", file="manifest.json",
                                code="artifact_target_unknown")
    return known


def _parse(device: str) -> tuple[str | None, str | None]:
    if not device or device == "auto":
        return None, None
    name, _, sub = device.partition(":")
    return name, (sub or None)


def choose(variants: list[dict], hardware: dict, device: str = "auto", strict: bool = False,
           target: str | None = None) -> Choice:
    known = check_targets([v["target"] for v in variants])
    want_backend, want_sub = _parse(device)
    if want_backend is not None and want_backend not in registry.available_backends():
        raise DeviceError(f"unknown device {device!r} (backends: {', '.join(registry.available_backends())})",
                          code="device_unknown")
    candidates = []
    for order, variant in enumerate(variants):
        if target and variant["target"] != target:
            continue
        for name in known.get(variant["target"], []):
            backend = registry.get_backend(name)
            sub = want_sub if name == want_backend else None
            suit = backend.suitability(variant["target"], hardware, sub)
            candidates.append({"variant": variant, "backend": name, "suitability": suit, "order": order})
    if not candidates:
        raise DeviceError(f"artifact has no {target!r} variant", code="device_no_variant")
    table = [{"target": c["variant"]["target"], "backend": c["backend"], "score": c["suitability"].score,
              "device": c["suitability"].device, "reason": c["suitability"].reason} for c in candidates]
    fallback = None
    if want_backend is not None:
        forced = [c for c in candidates if c["backend"] == want_backend and c["suitability"].ok]
        if forced:
            best = max(forced, key=lambda c: (c["suitability"].score, -c["order"]))
            return Choice(best["variant"], best["backend"], best["suitability"], table)
        reasons = "; ".join(f"{c['variant']['target']}: {c['suitability'].reason}"
                            for c in candidates if c["backend"] == want_backend) or \
            f"{want_backend} runs none of the artifact's targets ({', '.join(v['target'] for v in variants)})"
        if strict:
            raise DeviceError(f"device {device!r} cannot run this artifact: {reasons}", code="device_unavailable")
        fallback = f"requested {device!r} is unavailable ({reasons})"
    usable = [c for c in candidates if c["suitability"].ok]
    if not usable:
        reasons = "; ".join(f"{c['backend']} for {c['variant']['target']}: {c['suitability'].reason}" for c in candidates)
        raise DeviceError(f"no device can run this artifact here: {reasons}", code="device_unavailable")
    best = max(usable, key=lambda c: (c["suitability"].score, -c["order"]))
    return Choice(best["variant"], best["backend"], best["suitability"], table, fallback)
