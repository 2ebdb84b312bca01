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
"""

from __future__ import annotations

import difflib
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, runtime_checkable

import numpy as np

from edge_runtime import error_codes as ec

# keys a converter records beside the runtime options that are notes, not options
PROVENANCE_KEYS = ("why",)


# -- facts -----------------------------------------------------------------------
@dataclass(frozen=True)
class Suitability:
    """A backend's facts about one target on this hardware (and device, when asked for one).

    ``tier`` names the kind of path it would use ("accelerator", "gpu", "cpu", ...; None:
    cannot run here). The backend never ranks itself: ``score`` and ``policy`` are filled in
    by the policy table in ``edge_runtime.selection`` (0: cannot run, higher is better)."""

    tier: str | None
    device: str         # the concrete device it would use, e.g. "onnxruntime:cpu"
    reason: str         # why (shown in rt.info(), fallbacks, `edge-infer devices`)
    score: int = 0
    policy: str | None = None

    @property
    def ok(self) -> bool:
        return self.tier is not None


def cannot(device: str, reason: str) -> Suitability:
    return Suitability(None, device, reason)


@dataclass(frozen=True)
class Capabilities:
    """How the runtime may drive a session; read once, when the session is loaded."""

    inline: bool = False        # run() may be called in the caller's thread (else the runtime's worker pool)
    cancellable: bool = False   # run(feeds, cancel=token) stops a running call when the token fires
    batched: bool = False       # run_many()/prepare_many() exist (the BatchSession protocol)
    batch_warmup: bool = False  # prepare_many() is worth calling before a batch job (a separate compile)


class SessionCrashed(RuntimeError):
    """The process that ran the backend died during a call (a native crash)."""


# -- declared options ------------------------------------------------------------
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Option:
    """One device option: ``kind`` is bool, int, float or str; ``choices`` (str) are matched
    case-insensitively and normalised; ``env`` is read when the option is not given (a bad
    value there is the operator's, a ``DeviceError``); ``default`` None means the backend or
    its framework decides (the help says how)."""

    name: str
    kind: type
    default: Any = None
    help: str = ""
    choices: tuple = ()
    minimum: float | None = None
    env: str | None = None

    @property
    def metavar(self) -> str:
        if self.choices:
            return "|".join(str(c) for c in self.choices)
        if self.kind is str and self.name.endswith(("_dir", "_library", "_path")):
            return "PATH"
        return {bool: "true|false", int: "N", float: "X"}.get(self.kind, "S")

    def describe(self) -> dict:
        return {"name": self.name, "type": self.kind.__name__, "default": self.default, "help": self.help,
                **({"choices": list(self.choices)} if self.choices else {}),
                **({"minimum": self.minimum} if self.minimum is not None else {}),
                **({"env": self.env} if self.env else {})}

    def parse(self, value, what: str | None = None, err=None):
        """The option's value from a caller's (or environment's) ``value``; raises ``err``
        (``InputError`` by default) naming the option and what it takes."""
        from edge_runtime.errors import InputError

        what = what or f"device option {self.name}"
        err = err or InputError

        def bad(wants: str):
            return err(f"{what} must be {wants}, got {value!r}", code=ec.DEVICE_OPTION_INVALID, option=self.name)

        if self.kind is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, int) and value in (0, 1):
                return bool(value)
            if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
                return value.strip().lower() in _TRUE
            raise bad("a boolean (true or false)")
        if self.kind is int:
            if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
                value = int(value)
            elif isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad("an integer")
            if self.minimum is not None and value < self.minimum:
                raise bad(f"an integer >= {self.minimum:g}")
            return value
        if self.kind is float:
            if isinstance(value, str):
                try:
                    value = float(value)
                except ValueError:
                    raise bad("a number") from None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                raise bad("a number")
            if self.minimum is not None and value < self.minimum:
                raise bad(f"a number >= {self.minimum:g}")
            return float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or not value:
            raise bad("a non-empty string")
        if self.choices:
            for c in self.choices:
                if value.strip().lower() == str(c).lower():
                    return c
            raise bad(f"one of {', '.join(map(str, self.choices))}")
        return value


@dataclass(frozen=True)
class DeviceOptions:
    """Validated options: ``values`` holds every declared option (given, from its ``env``, or
    its default), ``given`` only those set explicitly (normalised), ``provenance`` the recorded
    notes that came with them and are not options."""

    values: Mapping = field(default_factory=dict)
    given: Mapping = field(default_factory=dict)
    provenance: Mapping = field(default_factory=dict)

    def __getitem__(self, key):
        return self.values[key]

    def get(self, key, default=None):
        value = self.values.get(key)
        return default if value is None else value


def resolve_options(declarations: Iterable[Option], options: Mapping | DeviceOptions | None, backend: str,
                    provenance: Mapping | None = None) -> DeviceOptions:
    """Validate ``options`` against ``declarations``: an unknown key or a bad value is an
    ``InputError`` (code ``device_option_unknown`` / ``device_option_invalid``) that names the
    valid options; a bad environment value is a ``DeviceError``. Provenance keys (``why``)
    in ``options`` are moved to ``provenance``, never treated as options."""
    from edge_runtime.errors import DeviceError, InputError

    if isinstance(options, DeviceOptions):
        return options
    declared: dict[str, Option] = {o.name: o for o in declarations}
    raw = dict(options or {})
    prov = dict(provenance or {})
    for key in PROVENANCE_KEYS:
        if key in raw:
            prov.setdefault(key, raw.pop(key))
    unknown = sorted(k for k in raw if k not in declared)
    if unknown:
        valid = ", ".join(sorted(declared)) or "none"
        close = difflib.get_close_matches(str(unknown[0]), list(declared), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise InputError(f"unknown device option{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(map(repr, unknown))} for {backend} (valid: {valid}){hint}",
                         code=ec.DEVICE_OPTION_UNKNOWN, option=unknown[0], backend=backend, valid=sorted(declared))
    values: dict[str, Any] = {}
    given: dict[str, Any] = {}
    for name, opt in declared.items():
        value = raw.get(name)
        if value is not None:
            values[name] = given[name] = opt.parse(value)
        elif opt.env and os.environ.get(opt.env):
            values[name] = opt.parse(os.environ[opt.env], f"environment variable {opt.env}", DeviceError)
        else:
            values[name] = opt.default
    return DeviceOptions(values, given, prov)


def threads_option(default_help: str = "the framework's default") -> Option:
    return Option("threads", int, None, f"CPU threads per session (default: {default_help}; "
                  "$EDGE_RUNTIME_THREADS when set)", minimum=0, env="EDGE_RUNTIME_THREADS")


def cache_options(what: str, kind: str, switch_env: str) -> tuple[Option, Option]:
    return (Option("cache", bool, True, f"cache {what} (${switch_env}=0 also switches it off)"),
            Option("cache_dir", str, None, f"where (default: $EDGE_RUNTIME_CACHE_DIR/{kind}, "
                                            f"else ~/.cache/edge-runtime/{kind})"))


# -- the protocol ----------------------------------------------------------------
@runtime_checkable
class Session(Protocol):
    device: str
    capabilities: Capabilities
    fallback: str | None

    def run(self, feeds: Mapping[str, np.ndarray], cancel=None) -> dict[str, np.ndarray]: ...

    def info(self) -> dict: ...

    def close(self) -> None: ...


@runtime_checkable
class BatchSession(Protocol):
    def run_many(self, feeds_list: list, timeout_s: float | None = None) -> list: ...

    def prepare_many(self) -> None: ...


@runtime_checkable
class Backend(Protocol):
    name: str
    family: str
    targets: tuple[str, ...]
    options: tuple[Option, ...]

    def suitability(self, target: str, hardware: dict, device: str | None = None) -> Suitability: ...

    def load(self, model_path: Path, bucket: dict, device: str | None = None, options: dict | None = None, *,
             provenance: dict | None = None) -> Session: ...


# -- the skeleton: sessions ------------------------------------------------------
class FeedCheck:
    """The bucket's inputs, precomputed: feeds must match them exactly (names, arrays,
    shapes, dtypes). Raises ``ValueError`` (the runtime wraps it); input validation proper
    is the task contract's job, this only protects the native code."""

    __slots__ = ("_names", "_specs", "_wanted")

    def __init__(self, bucket: dict):
        self._specs = tuple((t["name"], tuple(int(d) for d in t["shape"]), np.dtype(t["dtype"]))
                            for t in bucket["inputs"])
        self._names = frozenset(n for n, _, _ in self._specs)
        self._wanted = [list(s) for _, s, _ in self._specs]

    def __call__(self, feeds: Mapping) -> None:
        if feeds.keys() != self._names:
            raise ValueError(f"feeds {sorted(feeds)} do not match model inputs {sorted(self._names)}")
        for (name, shape, dtype), wanted in zip(self._specs, self._wanted):
            arr = feeds[name]
            if not isinstance(arr, np.ndarray):
                raise ValueError(f"input {name!r} is not a numpy array")
            if arr.shape != shape:
                raise ValueError(f"input {name!r} has shape {list(arr.shape)}, model wants {wanted}")
            if arr.dtype != dtype:
                raise ValueError(f"input {name!r} has dtype {arr.dtype}, model wants {dtype}")


def check_feeds(feeds: Mapping[str, np.ndarray], bucket: dict) -> None:
    """One-off form of ``FeedCheck`` (sessions precompute theirs)."""
    FeedCheck(bucket)(feeds)


def check_io(inputs: Iterable[str], outputs: Iterable[str], bucket: dict, what: str = "model") -> None:
    """The model's own input names must be the manifest's, and it must have every output the
    manifest names (``ValueError`` otherwise: the runtime makes it a ``device_load_failed``)."""
    inputs, outputs = set(inputs), set(outputs)
    wanted = {t["name"] for t in bucket["inputs"]}
    if inputs != wanted:
        raise ValueError(f"{what} inputs {sorted(inputs)} differ from the manifest's {sorted(wanted)}")
    missing = [t["name"] for t in bucket["outputs"] if t["name"] not in outputs]
    if missing:
        raise ValueError(f"{what} has no output(s) {missing} (has {sorted(outputs)})")


class DeviceSession:
    """A session's skeleton: the closed guard and the feed check around ``_run``;
    ``capabilities`` (set per class, or per instance in ``__init__`` when an option decides)
    and ``fallback`` default to the plain case."""

    capabilities = Capabilities()
    fallback: str | None = None

    def __init__(self, bucket: dict, device: str):
        self.device = device
        self._bucket = bucket
        self._check = FeedCheck(bucket)
        self._closed = False

    def run(self, feeds, cancel=None):
        if self._closed:
            raise RuntimeError("session is closed")
        self._check(feeds)
        return self._run(feeds, cancel)

    def _run(self, feeds, cancel):
        raise NotImplementedError

    def info(self) -> dict:
        return {}

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._release()

    def _release(self) -> None:
        """Drop native objects (after ``close``; runs once)."""


class Pool:
    """Reusable native objects (infer requests, interpreters), one per concurrent call: ``first``
    made at load so the first call pays nothing, more made on demand up to ``limit``."""

    def __init__(self, make: Callable[[], object], limit: int, first=None):
        self._make = make
        self._limit = max(1, int(limit))
        self._free = [make() if first is None else first]
        self._made = 1
        self._cv = threading.Condition()

    def acquire(self):
        with self._cv:
            while not self._free:
                if self._made < self._limit:
                    self._made += 1
                    break
                self._cv.wait()
            else:
                return self._free.pop()
        try:
            return self._make()
        except BaseException:
            with self._cv:
                self._made -= 1
                self._cv.notify()
            raise

    def release(self, item) -> None:
        with self._cv:
            self._free.append(item)
            self._cv.notify()

    def clear(self) -> None:
        with self._cv:
            self._free = []

    @property
    def size(self) -> int:
        return self._made


def cache_dir(options: Mapping, kind: str, switch_env: str) -> Path | None:
    """A backend's per-user cache directory (``$EDGE_RUNTIME_CACHE_DIR/<kind>``, default
    ``~/.cache/edge-runtime/<kind>``), ``options["cache_dir"]`` if given, or None when
    switched off by ``cache=false`` or ``<switch_env>=0``."""
    if options.get("cache") is False or os.environ.get(switch_env, "1").lower() in ("0", "false", "off"):
        return None
    if options.get("cache_dir"):
        return Path(options["cache_dir"])
    base = os.environ.get("EDGE_RUNTIME_CACHE_DIR")
    if base:
        return Path(base) / kind
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg or Path.home() / ".cache") / "edge-runtime" / kind


def writable_dir(path: Path) -> str | None:
    """Create ``path`` (0700) and check it is writable: None, or why not."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(f"{path} is not writable")
    except OSError as exc:
        return str(exc)
    return None


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
        """Default facts from the hardware record (nothing is imported): ``installed``."""
        pkgs = hardware.get("packages", {})
        return {"installed": not self.packages or any(pkgs.get(p, True) for p in self.packages)}

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

        return importlib.import_module(self.packages[0])

    def load(self, model_path, bucket: dict, device: str | None = None, options=None, *, provenance=None):
        opts = self.resolve_options(options, provenance)    # before anything is built
        sub = self.parse_device(device)
        return self.open(Path(model_path), bucket, sub, opts)

    def open(self, model_path: Path, bucket: dict, sub, options: DeviceOptions):
        raise NotImplementedError
