"""Pick the (variant, backend, device) to run an artifact on, and say why.

Backends report facts (``Suitability``: can it run here, a tier, the reason);
they never rank themselves. ``POLICY`` below is the one ordered table that
turns those facts and the hardware into the choice: the first row a candidate
matches places it, rows in one group tie (the manifest's variant order breaks
the tie), and a candidate's ``score`` is its row's place counted from the
bottom (0: cannot run). README's "Hardware detection and device selection"
shows the same table; a test keeps the two equal.

``device="auto"`` takes the best-placed candidate. A measurement on the target
(``measured``: the next step, probe-set parity and latency on this machine)
may override the static order: it is given the usable candidates in policy
order and returns the one to run and why, or None to keep the policy's
choice; ``Choice.decided_by`` says which decided. A named device
(``"onnxruntime"``, ``"onnxruntime:tensorrt"``) forces one backend and
sub-device; when it cannot run, ``strict`` raises ``DeviceError`` and
otherwise the choice falls back to the best alternative (the same backend's
default device included) and says why.

A backend's own promise is checked once its sessions exist
(``session_fallback``): a session that runs somewhere else than the device it
was chosen for (ONNX Runtime silently drops execution providers it cannot
initialise) is a fallback too: reported, or under ``strict`` a ``DeviceError``.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from edge_runtime.devices import registry
from edge_runtime.devices.base import Suitability

from . import error_codes as ec
from .errors import ArtifactError, DeviceError
from .value import Frozen


# -- the policy ------------------------------------------------------------------
def _always(hw: dict, target: str) -> bool:
    return True


def _x86_avx2(hw: dict, target: str) -> bool:
    cpu = hw.get("cpu") or {}
    return str(hw.get("machine", "")).lower() in ("x86_64", "amd64") and "avx2" in set(cpu.get("features") or [])


def _intel_avx2(hw: dict, target: str) -> bool:
    return _x86_avx2(hw, target) and (hw.get("cpu") or {}).get("vendor") == "GenuineIntel"


def _arm(hw: dict, target: str) -> bool:
    return str(hw.get("machine", "")).lower() in ("aarch64", "arm64", "armv7l")


def _float(hw: dict, target: str) -> bool:
    return target == "onnx-fp32"


def _not_float(hw: dict, target: str) -> bool:
    return target != "onnx-fp32"


def _int8_dot(hw: dict, target: str) -> bool:
    return target == "onnx-int8" and bool((hw.get("cpu") or {}).get("int8_dot"))


class Rule(Frozen):
    family: str                 # the backend family ("*": any)
    tier: str                   # the tier it reports ("*": any)
    when: str                   # the hardware condition, in words ("" : always)
    why: str
    test: Callable[[dict, str], bool]     # (hardware, target) -> does the condition hold

    def __init__(self, family: str, tier: str, when: str, why: str,
                 test: Callable[[dict, str], bool] = _always) -> None:
        d = self.__dict__
        d["family"], d["tier"], d["when"], d["why"], d["test"] = family, tier, when, why, test

    def matches(self, family: str, tier: str | None, hardware: dict, target: str) -> bool:
        return self.family in ("*", family) and self.tier in ("*", tier) and self.test(hardware, target)


# best first; the rules in one group tie
POLICY: tuple[tuple[Rule, ...], ...] = (
    (Rule("edgetpu", "accelerator", "", "an Edge TPU with libedgetpu runs the whole int8 graph"),),
    (Rule("onnxruntime", "tensorrt", "", "TensorRT int8 on an NVIDIA GPU (Jetson or discrete)"),),
    (Rule("onnxruntime", "cuda", "", "CUDA on an NVIDIA GPU"),),
    (Rule("openvino", "accelerator", "", "an OpenVINO GPU, NPU or AUTO device (only when asked for)"),),
    (Rule("coreml", "accelerator", "",
          "Core ML on Apple Silicon: the Neural Engine or GPU allowed (Core ML does not report which ran)"),),
    (Rule("openvino", "cpu", "x86-64 with AVX2, Intel", "OpenVINO int8 is the fastest CPU path on Intel", _intel_avx2),),
    (Rule("openvino", "cpu", "x86-64 with AVX2", "OpenVINO int8 measured faster than ONNX Runtime int8 "
                                                "(bench/bench_openvino.py)", _x86_avx2),),
    (Rule("tflite", "cpu", "ARM", "LiteRT/XNNPACK, the lightest CPU runtime on ARM boards", _arm),),
    (Rule("onnxruntime", "cpu", "onnx-int8 on a CPU with int8 dot products (VNNI/AMX/dotprod)",
          "ONNX Runtime's int8 kernels without int16 saturation", _int8_dot),),
    (Rule("onnxruntime", "cpu", "an int8 variant", "ONNX Runtime on the CPU", _not_float),
     Rule("coreml", "cpu", "", "Core ML on the CPU: an Intel Mac (CPU and GPU), or compute units CPU_ONLY")),
    (Rule("tflite", "cpu", "", "LiteRT on a non-ARM CPU"),),
    (Rule("openvino", "cpu", "", "OpenVINO without AVX2"),),
    (Rule("onnxruntime", "cpu", "an onnx-fp32 (float) variant", "float, below every int8 path: run when tune "
          "measures it fastest within budget here (`convert --with-fp32`), or when asked for", _float),),
    (Rule("edgetpu", "unready", "", "an Edge TPU without libedgetpu: still forceable, ranked below every CPU path"),),
    (Rule("*", "*", "", "any other backend that can run (third-party, tests): above 'cannot' only"),),
)


def place(family: str, suit: Suitability, hardware: dict, target: str) -> Suitability:
    """``suit`` with its score and policy row filled in (0 and no row when it cannot run)."""
    if not suit.ok:
        return suit.replace(score=0, policy=None)
    for i, group in enumerate(POLICY):
        for rule in group:
            if rule.matches(family, suit.tier, hardware, target):
                return suit.replace(score=len(POLICY) - i, policy=rule.why)
    raise AssertionError("the policy's last row matches every candidate")


def assess(backend_name: str, target: str, hardware: dict, device: str | None = None) -> Suitability:
    """One backend's facts for ``target`` here, placed by the policy."""
    backend = registry.get_backend(backend_name)
    return place(backend.family, backend.suitability(target, hardware, device), hardware, target)


def policy_table() -> list[dict]:
    """The policy as rows (``score``, ``backend``, ``tier``, ``when``, ``why``), best first."""
    return [{"score": len(POLICY) - i, "backend": r.family, "tier": r.tier, "when": r.when, "why": r.why}
            for i, group in enumerate(POLICY) for r in group]


# -- the choice ------------------------------------------------------------------
# given the usable candidate rows in policy order and the hardware: (row, why) or None
Measured = Callable[[list, dict], "tuple[dict, str] | None"]


class Choice(Frozen):
    variant: dict
    backend_name: str
    suitability: Suitability
    candidates: list[dict]
    fallback: str | None
    decided_by: str                   # "policy", "measurement" or "forced" (the device asked for)
    measured: str | None              # the measurement's reason when it decided

    def __init__(self, variant: dict, backend_name: str, suitability: Suitability,
                 candidates: list[dict] | None = None, fallback: str | None = None, decided_by: str = "policy",
                 measured: str | None = None) -> None:
        self.__dict__.update(variant=variant, backend_name=backend_name, suitability=suitability,
                             candidates=[] if candidates is None else candidates, fallback=fallback,
                             decided_by=decided_by, measured=measured)


def check_targets(targets: list[str]) -> dict[str, list[str]]:
    known = registry.known_targets()
    for target in targets:
        broken = registry.broken_for(known, target)
        if broken is not None:          # only a plug-in that fails to load declares it: the plug-in's fault
            raise broken
        if target not in known:
            raise ArtifactError(f"no device backend knows target {target!r} (known targets: "
                                f"{', '.join(sorted(known)) or 'none'})", file="manifest.json",
                                code=ec.ARTIFACT_TARGET_UNKNOWN)
    return known


def parse_device(device: str | None) -> tuple[str | None, str | None]:
    """``"auto"`` → (None, None); ``"onnxruntime:cuda:1"`` → ("onnxruntime", "cuda:1")."""
    if device is None or device == "auto":
        return None, None
    if not device:
        # "" is no device: an unset variable or an empty option, not a wish for "auto"
        raise DeviceError("device '' is empty: write auto, BACKEND or BACKEND:DEVICE (`edge-infer devices` lists "
                          "them)", code=ec.DEVICE_UNKNOWN)
    name, sep, sub = device.partition(":")
    if sep and (not name or any(not part for part in sub.split(":"))):
        # "onnxruntime:" or "fake::": an empty part is no device (it read as the backend's default, or
        # was handed on to the backend as it was); the caller meant something, so it is refused
        raise DeviceError(f"device {device!r} has an empty part: write BACKEND or BACKEND:DEVICE "
                          "(`edge-infer devices` lists them)", code=ec.DEVICE_UNKNOWN)
    return name, (sub or None)


def known_device(device: str | None) -> tuple[str | None, str | None]:
    """``parse_device``, and the backend and sub-device checked against the registry: a name that is no
    device on any machine is ``device_unknown`` (one that this host lacks is placed, and may fall back)."""
    want_backend, want_sub = parse_device(device)
    if want_backend is not None and want_backend not in registry.available_backends():
        raise DeviceError(f"unknown device {device!r} (backends: {', '.join(registry.available_backends())})",
                          code=ec.DEVICE_UNKNOWN)
    if want_backend is not None and want_sub is not None:
        try:
            registry.get_backend(want_backend).parse_device(want_sub)
        except ValueError as exc:
            # a sub-device outside the backend's fixed vocabulary ("openvino:warp", "onnxruntime:ｃｐｕ") is a
            # typo on every machine: it fell back to another device with only a warning, and exit 0
            raise DeviceError(f"{exc}: `edge-infer devices` lists them", code=ec.DEVICE_UNKNOWN) from None
    return want_backend, want_sub


def rank(variants: Sequence[dict], hardware: dict, device: str = "auto", target: str | None = None) -> list[dict]:
    """Every (variant, backend) pair placed for ``hardware``; the forced backend also with its default device.

    Rows: ``variant``, ``backend``, ``suitability`` (placed), ``order`` (variant order in the
    manifest, the tie-break) and ``forced`` (this row is the device asked for).
    """
    known = check_targets([v["target"] for v in variants])
    want_backend, want_sub = known_device(device)
    rows = []
    for order, variant in enumerate(variants):
        if target and variant["target"] != target:
            continue
        for name in known.get(variant["target"], []):
            backend = registry.get_backend(name)
            subs = [want_sub, None] if name == want_backend and want_sub is not None else [None]
            for sub in subs:
                suit = place(backend.family, backend.suitability(variant["target"], hardware, sub), hardware,
                             variant["target"])
                rows.append({"variant": variant, "backend": name, "suitability": suit, "order": order,
                             "forced": name == want_backend and sub == want_sub})
    if not rows:
        raise DeviceError(f"artifact has no {target!r} variant", code=ec.DEVICE_NO_VARIANT)
    return rows


def table(rows: list[dict], chosen: dict | None = None) -> list[dict]:
    """The JSON-safe candidate table shown by ``rt.info()`` and ``edge-infer devices``."""
    return [{"target": r["variant"]["target"], "backend": r["backend"], "score": r["suitability"].score,
             "tier": r["suitability"].tier, "device": r["suitability"].device, "reason": r["suitability"].reason,
             "policy": r["suitability"].policy, "forced": r["forced"], "chosen": r is chosen} for r in rows]


def _in_policy_order(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (-r["suitability"].score, r["order"]))


def choose(variants: Sequence[dict], hardware: dict, device: str = "auto", strict: bool = False,
           target: str | None = None, measured: Measured | None = None,
           failed: Mapping[tuple[str, str], str] | None = None) -> Choice:
    """The (variant, backend) to load. ``failed``: (target, backend) → why it failed to load here in
    this ``load()`` (``load`` retries the next candidate): that row cannot run, with the reason."""
    rows = rank(variants, hardware, device, target)
    for r in rows:
        why = (failed or {}).get((r["variant"]["target"], r["backend"]))
        if why is not None:
            r["suitability"] = Suitability(None, r["suitability"].device, f"failed to load here: {why}")
    want_backend, _ = parse_device(device)
    fallback = None
    if want_backend is not None:
        forced = [r for r in rows if r["forced"] and r["suitability"].ok]
        if forced:
            best = _in_policy_order(forced)[0]
            return Choice(best["variant"], best["backend"], best["suitability"], table(rows, best),
                          decided_by="forced")
        broken = None if any(r["forced"] for r in rows) else registry.backend_error(device)
        reasons = "; ".join(f"{r['variant']['target']}: {r['suitability'].reason}" for r in rows if r["forced"]) or \
            (broken.message if broken is not None else      # it failed to load, not "runs none" (before 2026-12-07)
             f"{want_backend} runs none of the artifact's targets ({', '.join(v['target'] for v in variants)})")
        if strict:
            raise DeviceError(f"device {device!r} cannot run this artifact: {reasons}",
                              code=ec.DEVICE_BACKEND_BROKEN if broken is not None else ec.DEVICE_UNAVAILABLE)
        fallback = f"requested {device!r} is unavailable ({reasons})"
    usable = _in_policy_order([r for r in rows if r["suitability"].ok])
    if not usable:
        raise DeviceError(f"no device can run this artifact here: {_nothing_runs(rows, device, fallback)}",
                          code=ec.DEVICE_UNAVAILABLE)
    best, decided_by, why = usable[0], "policy", None
    if measured is not None:
        picked = measured(usable, hardware)
        if picked is not None:
            (best, why), decided_by = picked, "measurement"
    return Choice(best["variant"], best["backend"], best["suitability"], table(rows, best), fallback,
                  decided_by, why)


def _nothing_runs(rows: list[dict], device: str, fallback: str | None) -> str:
    """Why no row can run, each reason once: a forced sub-device is also placed as its backend's
    default device, and the two rows' reasons were printed twice ("edgetpu for edgetpu: no Edge TPU
    found; edgetpu for edgetpu: no Edge TPU found" for ``--device edgetpu:usb:01``). The device asked
    for is named first, by the name it was asked by, with why it cannot run (also where its backend
    runs none of the artifact's targets)."""
    parts: list[str] = []
    forced = {(r["backend"], r["variant"]["target"], r["suitability"].reason) for r in rows if r["forced"]}
    if fallback is not None and not any(r["forced"] for r in rows):
        parts.append(fallback.removeprefix("requested "))
    for r in rows:
        key = (r["backend"], r["variant"]["target"], r["suitability"].reason)
        if not r["forced"] and key in forced:
            continue
        part = f"{device if r['forced'] else r['backend']} for {key[1]}: {key[2]}"
        if part not in parts:
            parts.append(part)
    return "; ".join(parts)


def for_options(choice: Choice, backend, hardware: dict, options: Mapping) -> Choice:
    """``choice`` placed for the sub-device its validated ``options`` make, where the backend says
    which (``device_for``: Core ML's ``compute_units=CPU_ONLY`` makes ``coreml:auto`` run
    ``coreml:cpu_only``): ``choose`` saw the device string only, and its tier, reason and device
    must be those of what runs. The chosen candidate row follows. A backend without
    ``device_for`` (its options pick no other device), or options that make the same device:
    ``choice`` as it was. Options that contradict the device asked for: the backend's
    ``InputError``; a sub-device that cannot run here: ``DeviceError``."""
    device_for = getattr(backend, "device_for", None)
    if device_for is None:
        return choice
    sub = choice.suitability.device.partition(":")[2] or None
    made = device_for(sub, dict(options))
    if made == sub or (made is None and sub == "auto"):
        return choice
    target = choice.variant["target"]
    suit = place(backend.family, backend.suitability(target, hardware, made), hardware, target)
    if not suit.ok:
        raise DeviceError(f"{backend.name} options {dict(options)} make device {suit.device}, which cannot run "
                          f"here: {suit.reason}", code=ec.DEVICE_UNAVAILABLE)
    old = choice.suitability
    if (suit.device, suit.tier, suit.reason) == (old.device, old.tier, old.reason):
        return choice
    rows = [{**r, "score": suit.score, "tier": suit.tier, "device": suit.device, "reason": suit.reason,
             "policy": suit.policy} if r.get("chosen") else r for r in choice.candidates]
    return choice.replace(suitability=suit, candidates=rows)


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
        why = sess.fallback
        if not why and not same_device(promised, sess.device):
            why = f"{choice.backend_name} was chosen for {promised} but its session runs on {sess.device}"
        if why and why not in reasons:
            reasons.append(why)
    if not reasons:
        return None
    message = "; ".join(reasons)
    if strict:
        raise DeviceError(f"{promised} is not what runs: {message}", code=ec.DEVICE_FELL_BACK,
                          promised=promised, actual=sessions[0].device)
    return message
