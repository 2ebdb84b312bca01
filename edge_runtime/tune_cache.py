"""The cache of measured decisions (``tune``) and of what verify found here (``verify``): one JSON
file per key under the user cache dir (``$EDGE_RUNTIME_CACHE_DIR``, else ``$XDG_CACHE_HOME/edge-runtime``,
else ``~/.cache/edge-runtime``), keyed by the artifact's seal, this machine's hardware fingerprint and
the installed backend versions; every entry is checked before anything reads it (a damaged one is a
miss, never a load that breaks), written atomically, and a verify row's read-modify-write is
serialised by a bounded advisory lock. ``edge_runtime.tune`` measures; this module keeps.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

from . import host
from .errors import EdgeRuntimeError

fcntl: Any
try:
    import fcntl
except ImportError:      # no advisory file locks here (Windows): threads of one process still serialise
    fcntl = None

PURPOSES = ("latency", "throughput")
log = logging.getLogger("edge_runtime")
_warned: set[str] = set()


def cache_root() -> Path:
    env = os.environ.get("EDGE_RUNTIME_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edge-runtime"


# what an entry means: bumped when the figures or the decision a version writes change meaning
CACHE_FORMAT = 2


def cache_key(seal: str, hw, versions: dict | None = None) -> dict:
    """The key of one entry. Besides the seal, the machine and the backend packages, the
    edge-runtime version and the cache format: the backends' own code (options, thread sizing,
    pre-processing) is edge-runtime's, and a decision an older version measured was read as valid
    by a newer one (the key named only the backend packages); and ``$EDGE_RUNTIME_THREADS``."""
    import edge_runtime

    versions = host.backend_versions() if versions is None else versions
    parts = {"seal": seal, "hardware": host.fingerprint(hw), "backends": dict(sorted(versions.items())),
             "runtime": str(getattr(edge_runtime, "__version__", "?")), "format": CACHE_FORMAT}
    # the thread count every backend's ``threads`` option takes from the environment: a decision
    # measured (and whose options were resolved) with one count is not one for another
    if os.environ.get("EDGE_RUNTIME_THREADS"):
        parts["threads_env"] = os.environ["EDGE_RUNTIME_THREADS"]
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]
    return {"digest": digest, **parts}


def _path(kind: str, digest: str) -> Path:
    return cache_root() / kind / f"{digest}.json"


def lookup(seal: str | None, hw, kind: str = "tune") -> dict | None:
    """The cached entry for this artifact on this machine with these backends, or None."""
    if not seal:
        return None
    key = cache_key(seal, hw)
    try:
        entry = json.loads(_path(kind, key["digest"]).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != key:    # a hash clash or a stale format
        return None
    bad = (_tune_problem if kind == "tune" else _verify_problem)(entry)
    if bad:         # damaged or hand-edited: a miss (measure again), never a load that breaks
        where = str(_path(kind, key["digest"]))
        if where + bad not in _warned:
            _warned.add(where + bad)
            log.warning("ignoring the cached %s entry %s: %s (edge-infer %s measures it again)", kind, where, bad,
                        kind)
        return None
    return entry


# -- what a cached entry must hold before anything reads it -------------------------
def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _tune_problem(entry: dict) -> str | None:
    """Why a tune entry cannot be used (None: it can): the decision's paths and options (checked
    against the backend's declared options, so a damaged value is the cache's fault, not the
    caller's), and the rows ``devices --artifact`` and ``rt.info()`` show."""
    decision = entry.get("decision")
    if not isinstance(decision, dict):
        return "its decision is not an object"
    for purpose, d in decision.items():
        if purpose not in PURPOSES:
            return f"unknown purpose {purpose!r}"
        if not isinstance(d, dict) or not all(isinstance(d.get(k), str) for k in ("target", "backend", "why")):
            return f"the {purpose} decision lacks its target, backend or reason"
        if not isinstance(d.get("device_options"), dict):
            return f"the {purpose} decision's device_options is not an object"
        bad = _options_problem(d["backend"], d["device_options"])
        if bad:
            return f"the {purpose} decision's device options: {bad}"
    static = entry.get("static")
    if static is not None and not isinstance(static, dict):
        return "its static choice is not an object"
    rows = entry.get("rows", [])
    if not isinstance(rows, list) or not all(isinstance(r, dict) and _row_problem(r) is None for r in rows):
        return "its measured rows are malformed"
    return None


_ROW_NUMBERS = ("value", "budget", "latency_ms_median", "batch_items_per_s", "p_value", "recorded")


def _row_problem(r: dict) -> str | None:
    if not isinstance(r.get("target"), str) or not isinstance(r.get("backend"), str):
        return "no target or backend"
    if not isinstance(r.get("device_options") or {}, dict):
        return "device_options"
    if any(r.get(k) is not None and not _num(r[k]) for k in _ROW_NUMBERS):
        return "a figure is not a number"
    if r.get("p_value") is not None and not (_num(r.get("disagreements")) and _num(r.get("samples"))):
        return "p_value without its counts"
    err = r.get("error")
    if err is not None and not (isinstance(err, str) or isinstance(err, dict) and isinstance(err.get("code"), str)):
        return "error"
    if not isinstance(r.get("unverified_buckets") or [], list):
        return "unverified_buckets"
    return None


def options_refused(backend: str, options: dict | None) -> str | None:
    """Why ``backend`` refuses the caller's device ``options`` (an unknown key, a bad value), in its
    own words; None when it takes them (an empty dict is no options)."""
    return _options_problem(backend, dict(options or {})) if options else None


def _options_problem(backend: str, options: dict) -> str | None:
    """The backend's own validation of cached options (a backend not installed here is no
    problem of the entry's: ``measured_choice`` then finds the path gone)."""
    from edge_runtime.devices import registry

    from .errors import InputError

    try:
        declared = registry.get_backend(backend).options
    except Exception:  # noqa: BLE001 - not registered here: the policy decides at load
        return None
    from edge_runtime.devices.base import resolve_options

    try:
        resolve_options(declared, options, backend)
    except InputError as exc:
        return exc.message
    except EdgeRuntimeError:
        return None     # an environment problem of this machine, reported when the path loads
    return None


def _verify_problem(entry: dict) -> str | None:
    paths = entry.get("paths")
    if not isinstance(paths, dict) or not all(isinstance(v, dict) for v in paths.values()):
        return "its paths are not objects"
    return None


_tmp_serial = itertools.count()


def store(seal: str, hw, entry: dict, kind: str = "tune") -> Path:
    """Write the entry atomically: a temp file of this call's own (pid, thread, serial: two
    threads or processes storing one key never share one), then renamed over the entry; the
    temp file is removed when anything fails."""
    key = cache_key(seal, hw)
    p = _path(kind, key["digest"])
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f"{p.stem}.{os.getpid()}.{threading.get_ident()}.{next(_tmp_serial)}.tmp")
    try:
        tmp.write_text(json.dumps({**entry, "key": key}, indent=1, sort_keys=True))
        os.replace(tmp, p)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise
    return p


def measured_choice(entry: dict | None, purpose: str = "latency"):
    """A ``selection.Measured`` hook that picks the cached decision's row (None: keep the policy)."""
    if not entry:
        return None
    decision = (entry.get("decision") or {}).get(purpose)
    if not decision:
        return None

    def pick(usable: list, hardware) -> tuple[dict, str] | None:
        for row in usable:
            if (row["variant"]["target"], row["backend"]) == (decision["target"], decision["backend"]):
                return row, decision["why"]
        # that path cannot run here any more (its backend gone, or unsuitable now): the policy decides,
        # and says so (before, the load silently ran the static path with decided_by "policy"). Not
        # when the rows are of one other variant: that is a load's target= (the decision is not for it)
        targets = {r["variant"]["target"] for r in usable}
        if decision["target"] in targets or len(targets) > 1:
            _warn_once(f"the tune decision ({purpose}: {decision['target']} on {decision['backend']}) cannot run here "
                       f"any more (not among the usable paths: {', '.join(_usable_names(usable)) or 'none'}); the "
                       "static policy decides; run edge-infer tune again")
        return None

    return pick


def _usable_names(usable: list) -> list[str]:
    return [f"{r['variant']['target']} on {r['backend']}" for r in usable
            if isinstance(r, dict) and isinstance(r.get("variant"), dict)]


# -- what verify found here (the ISA note at load says whether one ran) ------------
def verify_key(device: str, target: str | None, device_options: dict | None) -> str:
    """One measured path: the device, the variant and the options it ran with (a bf16 verify
    says nothing of an f32 load on the same device, nor one variant of another)."""
    opts = json.dumps(dict(device_options or {}), sort_keys=True, default=str)
    return f"{device} {target} {opts}"


LOCK_WAIT_S = 5.0      # how long remember_verify waits for another writer of the entry
_verify_lock = threading.Lock()      # the threads of this process (flock alone where fcntl is absent)


class _EntryLock:
    """An advisory lock on one cache entry (``<digest>.lock`` beside it): ``fcntl.flock`` where it
    exists, and a lock of this process's threads. Bounded: ``held`` is False when it was not got
    within ``wait_s`` (or the lock file cannot be opened), and ``why`` says why; it never hangs."""

    def __init__(self, entry_path: Path, wait_s: float):
        self.path, self.wait_s = entry_path.with_suffix(".lock"), wait_s
        self.held, self.why, self._thread = False, "", False
        self._fh: Any = None

    def __enter__(self):
        deadline = time.monotonic() + self.wait_s
        self._thread = _verify_lock.acquire(timeout=max(self.wait_s, 0))
        if not self._thread:
            self.why = f"another thread held it for {self.wait_s:g} s"
            return self
        if fcntl is None:
            self.held = True
            return self
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "a+b")
        except OSError as exc:
            self.why = f"{type(exc).__name__}: {exc}"
            return self
        while True:
            try:
                fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.held = True
                return self
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self.why = f"another process held {self.path} for {self.wait_s:g} s"
                    return self
                time.sleep(0.01)
            except OSError as exc:      # a file system without locks
                self.why = f"{type(exc).__name__}: {exc}"
                return self

    def __exit__(self, *exc):
        if self._fh is not None:
            try:
                if self.held and fcntl is not None:
                    fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            except OSError:
                pass
            self._fh.close()
        if self._thread:
            _verify_lock.release()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


def remember_verify(seal: str | None, hw, row: dict) -> None:
    """Keep a verify's figures for this artifact on this machine, passed or not. The entry's read,
    update and write are serialised by an advisory lock beside it, so verifies run at once (threads
    or processes) keep every row. Best effort: a lock not got within ``LOCK_WAIT_S`` writes
    unlocked, and a read-only cache dir keeps nothing; both are a warning, never an error of verify."""
    if not seal or not row.get("device"):
        return
    key = verify_key(row["device"], row.get("target"), row.get("device_options"))
    record = {"target": row.get("target"), "backend": row.get("backend"), "device": row["device"],
              "device_options": dict(row.get("device_options") or {}), "metric": row.get("metric"),
              "value": row.get("value"), "budget": row.get("budget"), "passed": row.get("passed"),
              "samples": row.get("samples"), "unverified_buckets": row.get("unverified_buckets") or [],
              "not_judged": row.get("not_judged"),      # why a figure with a budget was held to nothing
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    where = _path("verify", cache_key(seal, hw)["digest"])
    try:
        with _EntryLock(where, LOCK_WAIT_S) as lock:
            if not lock.held:
                _warn_once(f"the verify record {where} was written without its lock ({lock.why}): a verify "
                           "run at the same moment may lose its row")
            entry = lookup(seal, hw, kind="verify") or {"paths": {}}
            entry["paths"][key] = record
            store(seal, hw, {"paths": entry["paths"]}, kind="verify")
    except (OSError, ValueError) as exc:
        _warn_once(f"the verify of {key} was not remembered in {where}: {type(exc).__name__}: {exc}")


def lookup_verify(seal: str | None, hw, device: str, target: str | None = None,
                  device_options: dict | None = None) -> dict | None:
    entry = lookup(seal, hw, kind="verify")
    return (entry or {}).get("paths", {}).get(verify_key(device, target, device_options))


# -- the entry in a few words (a load that found one says it) -------------------------
def rows_text(entry: dict) -> str:
    """Each measured candidate in a few words: path and parity verdict (or its error)."""
    return "; ".join(f"{r['target']} on {r['backend']}{_opts(r)}: "
                     + (f"failed ({r['error'] if isinstance(r['error'], str) else r['error'].get('code')})"
                        if r.get("error") else
                        f"{r.get('metric', 'parity')} {r.get('value')}, "
                        # a budget is recorded but the probes compared nothing: not "no budget"
                        + ("not judged" if r.get("not_judged") else
                           {True: "pass", False: "UNDER BUDGET"}.get(r.get("passed"), "no budget")))
                     for r in entry.get("rows") or []) or "no candidate ran"


def _opts(row: dict) -> str:
    opts = {k: v for k, v in (row.get("device_options") or {}).items()}
    return f" {opts}" if opts else ""
