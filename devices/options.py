"""Declared device options: the ``Option`` record and how a value is parsed, the validated
``DeviceOptions``, ``resolve_options`` (a caller's plain dict checked against a backend's
declarations) and the declarations backends share (``threads_option``, ``cache_options``).
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Iterable, Mapping

from edge_runtime import error_codes as ec
from edge_runtime.value import Frozen

# keys a converter records beside the runtime options that are notes, not options
PROVENANCE_KEYS = ("why",)


# -- declared options ------------------------------------------------------------
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class Option(Frozen):
    """One device option: ``kind`` is bool, int, float or str; ``choices`` (str) are matched
    case-insensitively and normalised; ``env`` is read when the option is not given (a bad
    value there is the operator's, a ``DeviceError``); ``default`` None means the backend or
    its framework decides (the help says how)."""

    name: str
    kind: type
    default: Any
    help: str
    choices: tuple
    minimum: float | None
    env: str | None
    maximum: Callable[[], tuple[int, str]] | None

    def __init__(self, name: str, kind: type, default: Any = None, help: str = "", choices: tuple = (),
                 minimum: float | None = None, env: str | None = None,
                 maximum: Callable[[], tuple[int, str]] | None = None) -> None:
        # maximum (int options): () -> (the bound on this machine, why), read when a value is parsed
        self.__dict__.update(name=name, kind=kind, default=default, help=help, choices=choices, minimum=minimum,
                             env=env, maximum=maximum)

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
                **({"maximum": self.maximum()[0]} if self.maximum is not None else {}),
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
            if self.maximum is not None and value > self.maximum()[0]:
                hi, why = self.maximum()
                raise bad(f"an integer <= {hi} ({why})")
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


class DeviceOptions(Frozen):
    """Validated options: ``values`` holds every declared option (given, from its ``env``, or
    its default), ``given`` only those set explicitly (normalised), ``provenance`` the recorded
    notes that came with them and are not options."""

    values: Mapping
    given: Mapping
    provenance: Mapping

    def __init__(self, values: Mapping | None = None, given: Mapping | None = None,
                 provenance: Mapping | None = None) -> None:
        self.__dict__.update(values={} if values is None else values, given={} if given is None else given,
                             provenance={} if provenance is None else provenance)

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
        import difflib      # only for an unknown option's suggestion

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
            value = opt.parse(value)
        if value is not None and value == "auto" == opt.default:
            # "auto" is the declared default that defers (OpenVINO's precision: what the artifact
            # recorded, else f32): asked for, it overrides nothing the converter recorded, nor
            # does an environment variable override it
            values[name] = value
        elif value is not None:
            values[name] = given[name] = value
        elif opt.env and os.environ.get(opt.env):
            values[name] = opt.parse(os.environ[opt.env], f"environment variable {opt.env}", DeviceError)
        else:
            values[name] = opt.default
    return DeviceOptions(values, given, prov)


def threads_ceiling() -> tuple[int, str]:
    """The most CPU threads a session may ask for here: 4 per logical CPU. Past the CPUs more threads only
    contend, and thousands stalled the load (100000 on onnxruntime: no answer in a minute, exit by timeout;
    2**33 was a vendor TypeError as device_load_failed)."""
    n = os.cpu_count() or 1
    return 4 * n, f"4 per logical CPU, {n} here: more only contend, and thousands stall the load"


def threads_option(default_help: str = "the framework's default") -> Option:
    return Option("threads", int, None, f"CPU threads per session (default: {default_help}; "
                  "$EDGE_RUNTIME_THREADS when set)", minimum=0, env="EDGE_RUNTIME_THREADS", maximum=threads_ceiling)


def cache_options(what: str, kind: str, switch_env: str) -> tuple[Option, Option]:
    return (Option("cache", bool, True, f"cache {what} (${switch_env}=0 also switches it off)"),
            Option("cache_dir", str, None, f"where (default: $EDGE_RUNTIME_CACHE_DIR/{kind}, "
                                            f"else ~/.cache/edge-runtime/{kind})"))
