"""The artifact manifest: schema, validation and (de)serialisation.

``manifest.json`` pins everything an inference depends on. This module only
knows the JSON shape, and of a task what its contract declares
(``Task.manifest_sections``: keys it needs at load, ``manifest_files``: keys
that name files; the task registry says which tasks exist); file verification
lives in :mod:`edge_runtime.artifact`.

The manifest seals itself: ``manifest_sha256`` is the sha256 of its own
content without that key, in canonical JSON (sorted keys, no whitespace,
ASCII). Every other file is pinned by the manifest, and the seal pins the
manifest, so a flipped byte anywhere in an artifact is refused at load. The
seal catches corruption, not an attacker who recomputes it (that needs a
signature); a re-sealed edit must still pass :func:`validate`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from . import error_codes as ec
from .errors import ArtifactError
from . import records

FORMAT = "edge-runtime-artifact"
FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)
MANIFEST_NAME = "manifest.json"
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
SEAL = "manifest_sha256"


def task_names() -> list[str]:
    """The tasks this runtime knows (the task registry: built-ins and ``edge_runtime.tasks`` entry points)."""
    from edge_runtime.models import task_names as names

    return names()


# required keys and their JSON types, per level
_TOP = {
    "format": str,
    "format_version": int,
    "model": dict,
    "task": str,
    "files": dict,
    "preprocess": dict,
    "postprocess": dict,
    "limits": dict,
    "variants": list,
}
_MODEL = {"name": str, "version": str}
_VARIANT = {"target": str, "buckets": list, "quantization": dict, "parity": dict, "toolchain": dict}
_BUCKET = {"name": str, "file": str, "inputs": list, "outputs": list}
_TENSOR = {"name": str, "dtype": str, "shape": list}
_PARITY = {"metric": str, "value": (int, float, type(None)), "samples": int}
_QUANT = {"scheme": str, "weights": str, "activations": str}
DTYPES = ("float32", "float16", "int8", "uint8", "int16", "int32", "int64", "bool")
# the most elements one tensor may declare (int32 sizes: TFLite, TensorRT): a shape past it cannot be
# allocated on any edge device, and numpy failed on it mid warm-up with an untyped MemoryError/ValueError
MAX_TENSOR_ELEMENTS = 2**31 - 1


def _reject_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ArtifactError(f"duplicate key {key!r} in manifest", file=MANIFEST_NAME,
                                code=ec.MANIFEST_DUPLICATE_KEY)
        seen[key] = value
    return seen


def parse(raw: bytes) -> records.Manifest:
    """Parse and validate manifest bytes; every failure is an ``ArtifactError``."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ArtifactError(f"manifest is {len(raw)} bytes, over the {MAX_MANIFEST_BYTES} byte limit",
                            file=MANIFEST_NAME, code=ec.MANIFEST_TOO_LARGE)
    try:
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=_reject_duplicates)
    except ArtifactError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ArtifactError(f"manifest does not parse: {exc}", file=MANIFEST_NAME,
                            code=ec.MANIFEST_UNPARSABLE) from None
    check_seal(data)
    validate(data)
    return records.build(data)   # typed and read-only from here on: nothing downstream changes it


def seal(data: dict) -> str:
    """sha256 of the manifest's content without its seal, in canonical JSON."""
    body = {k: v for k, v in data.items() if k != SEAL}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canon.encode("ascii")).hexdigest()


def check_seal(data: Any) -> None:
    if not isinstance(data, dict):
        raise ArtifactError("manifest must be an object", file=MANIFEST_NAME, code=ec.MANIFEST_FIELD_INVALID)
    recorded = data.get(SEAL)
    if recorded is None:
        raise ArtifactError(f"manifest has no {SEAL} seal (written by hand or by an older edge-runtime?)",
                            file=MANIFEST_NAME, code=ec.MANIFEST_UNSEALED)
    actual = seal(data)
    if recorded != actual:
        shown = recorded[:12] if isinstance(recorded, str) else repr(recorded)[:12]
        raise ArtifactError(f"manifest content does not match its seal ({SEAL} {shown}…, content {actual[:12]}…): "
                            "the manifest was corrupted or edited", file=MANIFEST_NAME,
                            code=ec.MANIFEST_SEAL_MISMATCH)


def _check(obj: Any, spec: dict, where: str) -> None:
    if not isinstance(obj, dict):
        raise ArtifactError(f"{where} must be an object", file=MANIFEST_NAME, code=ec.MANIFEST_FIELD_INVALID)
    for key, typ in spec.items():
        if key not in obj:
            raise ArtifactError(f"missing field {where}.{key}", file=MANIFEST_NAME, code=ec.MANIFEST_FIELD_MISSING)
        value = obj[key]
        if isinstance(value, bool) and typ is not bool:
            ok = False
        else:
            ok = isinstance(value, typ)
        if not ok:
            raise ArtifactError(f"field {where}.{key} has the wrong type ({type(value).__name__})",
                                file=MANIFEST_NAME, code=ec.MANIFEST_FIELD_INVALID)


def _check_text(data: Any) -> None:
    """Every string (and key) must be Unicode text: a JSON ``\\ud800`` escape parses to a lone surrogate
    that no file name, log line or terminal can encode (a file path of one crashed the load)."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[max(0, exc.start - 30):exc.end + 10] if isinstance(exc.object, str) else ""
        raise ArtifactError(f"manifest holds a lone surrogate escape, not Unicode text (near {bad!r})",
                            file=MANIFEST_NAME, code=ec.MANIFEST_FIELD_INVALID) from None


def _unique(names: list, what: str) -> None:
    """``names`` (targets of the variants, buckets of a variant) must not repeat: the one a lookup
    by name finds would hide the others (which variant a target loads, tune measures, verify checks)."""
    seen: set = set()
    for name in names:
        if name in seen:
            raise ArtifactError(f"two {what} are named {name!r}", file=MANIFEST_NAME,
                                code=ec.MANIFEST_FIELD_INVALID)
        seen.add(name)


def _check_tensors(bucket: dict, bwhere: str) -> None:
    for side in ("inputs", "outputs"):
        if not bucket[side]:
            raise ArtifactError(f"{bwhere} declares no {side}", file=MANIFEST_NAME, code=ec.MANIFEST_FIELD_INVALID)
    for k, tensor in enumerate(bucket["inputs"] + bucket["outputs"]):
        _check(tensor, _TENSOR, f"{bwhere}.tensor[{k}]")
    # feeds are keyed by input name: a repeated one loaded and fed one array to both (a third input
    # went unfed, or the warm-up failed unclearly). Outputs may share a name: they are matched by position
    _unique([t["name"] for t in bucket["inputs"]], f"inputs of {bwhere} (bucket {bucket['name']!r})")
    for tensor in bucket["inputs"] + bucket["outputs"]:
        if tensor["dtype"] not in DTYPES:
            raise ArtifactError(f"{bwhere}: unknown dtype {tensor['dtype']!r}", file=MANIFEST_NAME,
                                code=ec.MANIFEST_FIELD_INVALID)
        if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in tensor["shape"]):
            raise ArtifactError(f"{bwhere}: tensor {tensor['name']!r} shape {tensor['shape']} is not static",
                                file=MANIFEST_NAME, code=ec.MANIFEST_SHAPE_DYNAMIC)
        elements = 1
        for d in tensor["shape"]:
            elements *= d
            if elements > MAX_TENSOR_ELEMENTS:
                raise ArtifactError(f"{bwhere}: tensor {tensor['name']!r} shape {tensor['shape']} is over "
                                    f"{MAX_TENSOR_ELEMENTS} elements", file=MANIFEST_NAME,
                                    code=ec.MANIFEST_FIELD_INVALID)


def validate(data: Any) -> None:
    _check(data, _TOP, "manifest")
    _check_text(data)
    if data["format"] != FORMAT:
        raise ArtifactError(f"not an edge-runtime artifact (format {data['format']!r})", file=MANIFEST_NAME,
                            code=ec.MANIFEST_FORMAT_UNKNOWN)
    if data["format_version"] not in SUPPORTED_VERSIONS:
        raise ArtifactError(f"unknown format version {data['format_version']!r} (this runtime reads "
                            f"{', '.join(map(str, SUPPORTED_VERSIONS))})", file=MANIFEST_NAME,
                            code=ec.MANIFEST_VERSION_UNKNOWN)
    _check(data["model"], _MODEL, "model")
    task = _task(data["task"])
    for path, entry in data["files"].items():
        _check(entry, {"sha256": str, "bytes": int}, f"files[{path!r}]")
        if len(entry["sha256"]) != 64:
            raise ArtifactError(f"files[{path!r}].sha256 is not a sha256 hex digest", file=MANIFEST_NAME,
                                code=ec.MANIFEST_FIELD_INVALID)
    if not data["variants"]:
        raise ArtifactError("manifest lists no variants", file=MANIFEST_NAME, code=ec.MANIFEST_FIELD_MISSING)
    _unique([v.get("target") for v in data["variants"] if isinstance(v, dict)], "variants' targets")
    for i, variant in enumerate(data["variants"]):
        where = f"variants[{i}]"
        _check(variant, _VARIANT, where)
        _check(variant["quantization"], _QUANT, f"{where}.quantization")
        _check(variant["parity"], _PARITY, f"{where}.parity")
        _check_budget(variant["parity"], f"{where}.parity")
        if not isinstance(variant.get("runtime", {}), dict):
            raise ArtifactError(f"{where}.runtime must be an object", file=MANIFEST_NAME,
                                code=ec.MANIFEST_FIELD_INVALID)
        if not variant["buckets"]:
            raise ArtifactError(f"{where} has no buckets", file=MANIFEST_NAME, code=ec.MANIFEST_FIELD_MISSING)
        _unique([b.get("name") for b in variant["buckets"] if isinstance(b, dict)], f"{where} buckets")
        for j, bucket in enumerate(variant["buckets"]):
            bwhere = f"{where}.buckets[{j}]"
            _check(bucket, _BUCKET, bwhere)
            if bucket["file"] not in data["files"]:
                raise ArtifactError(f"{bwhere}.file {bucket['file']!r} is not listed in files", file=MANIFEST_NAME,
                                    code=ec.MANIFEST_FIELD_INVALID)
            extra = bucket.get("extra_files", [])
            if not isinstance(extra, list) or any(not isinstance(e, str) or e not in data["files"] for e in extra):
                raise ArtifactError(f"{bwhere}.extra_files must list files named in files", file=MANIFEST_NAME,
                                    code=ec.MANIFEST_FIELD_INVALID)
            _check_tensors(bucket, bwhere)
    _check_probe(data)
    for section, keys in task.manifest_sections.items():   # what the task needs at load
        _check(data.get(section), keys, section)
    for key in dict.fromkeys(("tokenizer", "labels", *task.manifest_files)):
        for section in ("preprocess", "postprocess"):   # each: a listed preprocess.labels hid an unlisted,
            ref = data[section].get(key)                 # unhashed postprocess.labels the task read
            if isinstance(ref, str) and ref and ref not in data["files"]:
                raise ArtifactError(f"{section}.{key} file {ref!r} is not listed in files", file=MANIFEST_NAME,
                                    code=ec.MANIFEST_FIELD_INVALID)


def _check_budget(parity: dict, where: str) -> None:
    """``parity.budget``, when present: null (an imported artifact records none) or a finite number
    in [0, 1] (a bool is not one), the figure verify and tune hold the path to."""
    import math

    budget = parity.get("budget")
    if budget is None:
        return
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget) \
            or not 0.0 <= budget <= 1.0:
        raise ArtifactError(f"field {where}.budget must be null or a number in [0, 1], got {budget!r}",
                            file=MANIFEST_NAME, code=ec.MANIFEST_FIELD_INVALID)


def _check_probe(data: dict) -> None:
    """The optional probe set (``edge_runtime.probe``): its two files are artifact files."""
    if "probe" not in data:
        return
    _check(data["probe"], {"inputs": str, "reference": str, "samples": int}, "probe")
    for key in ("inputs", "reference"):
        if data["probe"][key] not in data["files"]:
            raise ArtifactError(f"probe.{key} {data['probe'][key]!r} is not listed in files", file=MANIFEST_NAME,
                                code=ec.MANIFEST_FIELD_INVALID)


def _task(name: str):
    """The manifest's task contract (its declared sections and files); an unknown task is the artifact's."""
    from edge_runtime.models import UnknownTask, get_task

    try:
        return get_task(name)
    except UnknownTask:
        raise ArtifactError(f"unknown task {name!r} (known: {', '.join(task_names())})", file=MANIFEST_NAME,
                            code=ec.MANIFEST_TASK_UNKNOWN) from None


def dumps(data: dict) -> bytes:
    """Validated, sealed manifest bytes."""
    data = {k: v for k, v in data.items() if k != SEAL}
    validate(data)
    data[SEAL] = seal(data)
    return (json.dumps(data, indent=2, sort_keys=False) + "\n").encode("utf-8")
