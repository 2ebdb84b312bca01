"""The device seam: the protocol the runtime relies on, and the skeleton backends share.

**The protocol** (everything ``edge_runtime`` uses; nothing else is probed with
``hasattr``):

- ``Backend``: ``name`` (as registered), ``family`` (its row key in the choice
  policy, ``edge_runtime/selection.py``), ``targets``, ``options`` (declared
  ``Option`` records), ``suitability(target, hardware, device=None)`` →
  ``Suitability`` (facts: can it run here, a tier, the reason; never a score),
  ``load(model_path, bucket, device=None, options=None, *, provenance=None)`` →
  ``Session``. ``options`` is a plain dict, validated against the declarations
  (``InputError`` naming the valid ones); ``provenance`` carries recorded notes
  that are not options (why the converter picked them).
- ``Session``: ``device`` (where it really runs), ``capabilities`` (a frozen
  ``Capabilities``, read once by the runtime at load), ``fallback`` (None, or
  why it runs elsewhere than asked), ``run(feeds, cancel=None)``, ``info()``,
  ``close()``.
- ``BatchSession``: ``run_many(feeds_list, timeout_s=None)`` and
  ``prepare_many()``, present exactly when ``capabilities.batched``.
- ``SessionCrashed``: what ``run`` raises when the process running the backend
  died (the runtime reports it as ``backend_crashed``).

**The skeleton** (``DeviceBackend``, ``DeviceSession`` and helpers): target and
package checks with the install hint, the device string, the injected vendor
module and probe, declared and validated options (``EDGE_RUNTIME_THREADS``
included), the closed guard and feed check, model I/O names against the
manifest, an object pool, a writable cache directory. A backend file holds what
is unique to its device.

This module holds ``DeviceBackend`` and is the import path for all of it; the
parts live beside it: ``protocol`` (the facts and the protocols), ``options``
(declared options and their validation), ``session`` (the feed check and
``DeviceSession``), ``pool`` (``Pool``) and ``cache`` (the cache directory).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from edge_runtime import error_codes as ec

from .cache import cache_dir, writable_dir
from .options import PROVENANCE_KEYS, DeviceOptions, Option, cache_options, resolve_options, threads_option
from .pool import Pool
from .protocol import Backend, BatchSession, Capabilities, Session, SessionCrashed, Suitability, cannot
from .session import DeviceSession, FeedCheck, check_feeds, check_io

__all__ = ["PROVENANCE_KEYS", "Backend", "BatchSession", "Capabilities", "DeviceBackend", "DeviceOptions",
           "DeviceSession", "FeedCheck", "Option", "Pool", "Session", "SessionCrashed", "Suitability", "cache_dir",
           "cache_options", "cannot", "check_feeds", "check_io", "resolve_options", "threads_option",
           "writable_dir"]


# -- the skeleton: backends ------------------------------------------------------
class DeviceBackend:
    """A backend's skeleton. Subclasses set the class attributes and implement ``assess``
    (facts for a target on a parsed device) and ``open`` (one bucket's session)."""

    name: str = ""
    family: str = ""                 # the policy table's key; defaults to ``name``
    targets: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()   # import names; any one present will do (hardware["packages"])
    package_label: str = ""          # "onnxruntime", "a TFLite interpreter", ...
    install: str = ""                # the install step named when it is missing
    devices: tuple[str, ...] = ("cpu",)   # sub-devices (the part after "name:"); the first is the default
    options: tuple[Option, ...] = ()

    def __init__(self, module=None, probe: Callable[[dict], dict] | None = None, name: str | None = None):
        # tests replace the vendor boundary (``module``: the framework's module) and what the
        # vendor side looks like here (``probe``: hardware record -> facts); the code between
        # them is the real one, with no branch on whether anything was injected
        self._module = module
        self._probe = probe
        if name:
            self.name = name
        if not self.family:
            self.family = type(self).name or self.name

    # facts ----------------------------------------------------------------------
    def facts(self, hardware: dict) -> dict:
        """What the vendor side looks like here: the injected probe's answer, else ``probe``."""
        return (self._probe or self.probe)(hardware)

    def probe(self, hardware: dict) -> dict:
        """Default facts from the hardware record (nothing is imported): ``installed``. A package
        the record does not cover (a third-party backend's SDK: the probe knows only the built-in
        backends' packages) is looked up as the probe does (``find_spec``), never assumed present."""
        from edge_runtime.hardware_packages import find_spec, unusable

        pkgs = hardware.get("packages") or {}

        def present(p: str) -> bool:
            if p in pkgs:
                return bool(pkgs[p])
            top, *subs = p.split(".")
            spec = find_spec(top, None)
            for sub in subs:        # "sdk.runtime": looked up in the parent's folders, the parent not imported
                spec = find_spec(sub, list(spec.submodule_search_locations or [])) if spec is not None else None
            return spec is not None and unusable(spec) is None

        return {"installed": not self.packages or any(present(p) for p in self.packages)}

    def host_unsupported(self, hardware: dict) -> str | None:
        """Why this backend cannot run on this host at all (checked before the package), or None."""
        return None

    def missing(self, facts: dict) -> str | None:
        """Why the vendor side cannot run anything here (default: the package is not installed)."""
        if not facts.get("installed", True):
            return f"{self.package_label or self.name} is not installed ({self.install})"
        return None

    def parse_device(self, device: str | None):
        """The sub-device (``None``: the default); ``ValueError`` naming the valid ones."""
        want = (device or self.devices[0]).lower()
        if want not in self.devices:
            raise ValueError(f"unknown {self.name} device {device!r} ({', '.join(self.devices)})")
        return want

    def suitability(self, target: str, hardware: dict, device: str | None = None) -> Suitability:
        if target not in self.targets:
            return cannot(self.name, f"{self.name} does not run {target!r} variants")
        why = self.host_unsupported(hardware)
        if why:
            return cannot(self.name, why)
        facts = self.facts(hardware)
        why = self.missing(facts)
        if why:
            return cannot(self.name, why)
        try:
            sub = self.parse_device(device)
        except ValueError as exc:
            return cannot(f"{self.name}:{device}", str(exc))
        return self.assess(target, hardware, sub, device is not None, facts)

    def assess(self, target: str, hardware: dict, sub, forced: bool, facts: dict) -> Suitability:
        """Facts for ``target`` on sub-device ``sub`` (``forced``: the caller named it)."""
        return Suitability("cpu", f"{self.name}:{sub}", f"{self.name} on the CPU")

    def precision_hints(self, target: str, hardware: dict) -> list[dict]:
        """Device option sets worth measuring for ``target`` here (``edge-infer verify --all``,
        ``tune``): ``{}`` (what the artifact recorded) first, then any other precision the device
        offers. Default: ``[{}]``."""
        return [{}]

    # loading ----------------------------------------------------------------------
    def resolve_options(self, options=None, provenance=None) -> DeviceOptions:
        return resolve_options(self.options, options, self.name, provenance)

    def vendor(self):
        """The framework's module: the injected one, else imported now (``DeviceError`` with
        the install step when it is not importable)."""
        if self._module is not None:
            return self._module
        try:
            return self.import_vendor()
        except ImportError as exc:
            from edge_runtime.errors import DeviceError

            raise DeviceError(f"{self.package_label or self.name} is not importable ({exc}): {self.install}",
                              code=ec.DEVICE_UNAVAILABLE) from None

    def import_vendor(self):
        import importlib

        if not self.packages:       # was an IndexError, "tuple index out of range"
            raise NotImplementedError(f"device backend {self.name!r} declares no packages: set packages, or "
                                      "override import_vendor(), or pass module=")
        return importlib.import_module(self.packages[0])

    def load(self, model_path, bucket: dict, device: str | None = None, options=None, *, provenance=None):
        opts = self.resolve_options(options, provenance)    # before anything is built
        sub = self.parse_device(device)
        return self.open(Path(model_path), bucket, sub, opts)

    def open(self, model_path: Path, bucket: dict, sub, options: DeviceOptions):
        raise NotImplementedError(f"device backend {self.name!r} ({type(self).__module__}.{type(self).__qualname__}) "
                                  "does not implement DeviceBackend.open(model_path, bucket, sub, options)")
