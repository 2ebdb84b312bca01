"""Pick the (variant, backend, device) to run an artifact on, and say why.

Every backend that declares a variant's target scores itself for the
detected hardware (``rank``); ``device="auto"`` takes the best score. A named
device (``"onnxruntime"``, ``"onnxruntime:tensorrt"``) forces one backend and
sub-device; when it cannot run, ``strict`` raises ``DeviceError`` and
otherwise the choice falls back to the best alternative (the same backend's
default device included) and says why.

A backend's own promise is checked once its sessions exist
(``session_fallback``): a session that runs somewhere else than the device it
was chosen for (ONNX Runtime silently drops execution providers it cannot
initialise) is a fallback too: reported, or under ``strict`` a ``DeviceError``.
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


def parse_device(device: str | None) -> tuple[str | None, str | None]:
    """``"auto"`` → (None, None); ``"onnxruntime:cuda:1"`` → ("onnxruntime", "cuda:1")."""
    if not device or device == "auto":
        return None, None
    name, _, sub = device.partition(":")
    return name, (sub or None)


def rank(variants: list[dict], hardware: dict, device: str = "auto", target: str | None = None) -> list[dict]:
    """Every (variant, backend) pair scored for ``hardware``; the forced backend also with its default device.

    Rows: ``variant``, ``backend``, ``suitability``, ``order`` (variant order in the
    manifest, the tie-break) and ``forced`` (this row is the device asked for).
    """
    known = check_targets([v["target"] for v in variants])
    want_backend, want_sub = parse_device(device)
    if want_backend is not None and want_backend not in registry.available_backends():
        raise DeviceError(f"unknown device {device!r} (backends: {', '.join(registry.available_backends())})",
                          code="device_unknown")
    rows = []
    for order, variant in enumerate(variants):
        if target and variant["target"] != target:
            continue
        for name in known.get(variant["target"], []):
            backend = registry.get_backend(name)
            subs = [want_sub, None] if name == want_backend and want_sub is not None else [None]
            for sub in subs:
                suit = backend.suitability(variant["target"], hardware, sub)
                rows.append({"variant": variant, "backend": name, "suitability": suit, "order": order,
                             "forced": name == want_backend and sub == want_sub})
    if not rows:
        raise DeviceError(f"artifact has no {target!r} variant", code="device_no_variant")
    return rows


def table(rows: list[dict], chosen: dict | None = None) -> list[dict]:
    """The JSON-safe candidate table shown by ``rt.info()`` and ``edge-infer devices``."""
    return [{"target": r["variant"]["target"], "backend": r["backend"], "score": r["suitability"].score,
             "device": r["suitability"].device, "reason": r["suitability"].reason, "forced": r["forced"],
             "chosen": r is chosen} for r in rows]


def _best(rows: list[dict]) -> dict:
    return max(rows, key=lambda r: (r["suitability"].score, -r["order"]))


def choose(variants: list[dict], hardware: dict, device: str = "auto", strict: bool = False,
           target: str | None = None) -> Choice:
    rows = rank(variants, hardware, device, target)
    want_backend, _ = parse_device(device)
    fallback = None
    if want_backend is not None:
        forced = [r for r in rows if r["forced"] and r["suitability"].ok]
        if forced:
            best = _best(forced)
            return Choice(best["variant"], best["backend"], best["suitability"], table(rows, best))
        reasons = "; ".join(f"{r['variant']['target']}: {r['suitability'].reason}" for r in rows if r["forced"]) or \
            f"{want_backend} runs none of the artifact's targets ({', '.join(v['target'] for v in variants)})"
        if strict:
            raise DeviceError(f"device {device!r} cannot run this artifact: {reasons}", code="device_unavailable")
        fallback = f"requested {device!r} is unavailable ({reasons})"
    usable = [r for r in rows if r["suitability"].ok]
    if not usable:
        reasons = "; ".join(f"{r['backend']} for {r['variant']['target']}: {r['suitability'].reason}" for r in rows)
        raise DeviceError(f"no device can run this artifact here: {reasons}", code="device_unavailable")
    best = _best(usable)
    return Choice(best["variant"], best["backend"], best["suitability"], table(rows, best), fallback)


def same_device(promised: str, actual: str) -> bool:
    """A session keeps its backend's promise when it runs on that device (or a numbered
    instance of it: ``edgetpu:usb`` → ``edgetpu:usb:0``); ``X:auto`` is kept by any X device."""
    if actual == promised or actual.startswith(promised + ":"):
        return True
    backend, _, sub = promised.partition(":")
    return sub in ("", "auto") and actual.partition(":")[0] == backend


def session_fallback(choice: Choice, sessions: list, strict: bool = False) -> str | None:
    """Why the loaded sessions do not run where the choice promised, or None.

    A session may explain itself (``session.fallback``: e.g. the execution
    providers ONNX Runtime dropped); otherwise a device other than the
    promised one is reported as such. Under ``strict`` this raises ``DeviceError``.
    """
    promised = choice.suitability.device
    reasons = []
    for sess in sessions:
        why = getattr(sess, "fallback", None)
        if not why and not same_device(promised, sess.device):
            why = f"{choice.backend_name} was chosen for {promised} but its session runs on {sess.device}"
        if why and why not in reasons:
            reasons.append(why)
    if not reasons:
        return None
    message = "; ".join(reasons)
    if strict:
        raise DeviceError(f"{promised} is not what runs: {message}", code="device_fell_back",
                          promised=promised, actual=sessions[0].device)
    return message
