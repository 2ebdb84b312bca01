"""The probe set: a few held-out raw inputs kept in the artifact, with the fp32
source's results for them, so parity can be measured again on the machine that
runs the artifact (``edge-infer verify``, ``load(verify=True)``, ``tune``).

Two files, hashed like every other file of the artifact:

- ``probe/inputs.npz``: the raw inputs as the task's ``prepare`` takes them
  (text as UTF-8, image files as their bytes, arrays and named arrays as they
  are), keys ``"<i>.<kind>[.<name>]"``.
- ``probe/reference.npz``: the fp32 source's :class:`TaskOutput` for each, the
  arrays (``embedding``, ``outputs``) as arrays and the rest (prediction,
  class_id, ranked scores, top_k) as one JSON document under ``"meta"``.

Both load with ``allow_pickle=False``: a probe file is data, never code. The
set is bounded: ``DEFAULT_COUNT`` samples at most, and as many as fit in
``DEFAULT_MAX_BYTES`` (inputs and reference together); the manifest's
``probe`` section states the count, the bytes and the cap.
"""

from __future__ import annotations

import io
import json
import re
import struct
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import error_codes as ec
from .errors import ArtifactError, InputError

INPUTS = "probe/inputs.npz"
REFERENCE = "probe/reference.npz"
DEFAULT_COUNT = 32
DEFAULT_MAX_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class ProbeSet:
    inputs: list             # raw inputs, as prepare() takes them
    reference: list          # the fp32 source's TaskOutput for each
    section: dict            # the manifest's probe section


# -- encoding ---------------------------------------------------------------------
def _encode_input(i: int, raw) -> dict[str, np.ndarray]:
    if isinstance(raw, str):
        return {f"{i}.text": np.frombuffer(raw.encode("utf-8", "surrogatepass"), dtype=np.uint8)}
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return {f"{i}.bytes": np.frombuffer(bytes(raw), dtype=np.uint8)}
    if isinstance(raw, np.ndarray):
        return {f"{i}.array": raw}
    if isinstance(raw, dict) and all(isinstance(k, str) and "." not in k for k in raw):
        return {f"{i}.named.{k}": np.asarray(v) for k, v in raw.items()}
    raise TypeError(f"a probe input must be text, bytes, an array or named arrays, not {type(raw).__name__}")


def _decode_inputs(arrays: dict[str, np.ndarray]) -> list:
    out: dict[int, Any] = {}
    for key, arr in arrays.items():
        idx, _, rest = key.partition(".")
        kind, _, name = rest.partition(".")
        i = int(idx)
        if kind == "text":
            out[i] = arr.tobytes().decode("utf-8", "surrogatepass")
        elif kind == "bytes":
            out[i] = arr.tobytes()
        elif kind == "array":
            out[i] = arr
        elif kind == "named":
            out.setdefault(i, {})[name] = arr
        else:
            raise ValueError(f"unknown probe input key {key!r}")
    if sorted(out) != list(range(len(out))):
        raise ValueError("probe inputs are not numbered 0..n-1")
    return [out[i] for i in range(len(out))]


def _encode_output(i: int, res) -> tuple[dict[str, np.ndarray], dict]:
    arrays: dict[str, np.ndarray] = {}
    if getattr(res, "embedding", None) is not None:
        arrays[f"{i}.embedding"] = np.asarray(res.embedding)
    for name, arr in (getattr(res, "outputs", None) or {}).items():
        if "." in name or "/" in name:
            name = name.replace(".", "\x1f").replace("/", "\x1e")
        arrays[f"{i}.outputs.{name}"] = np.asarray(arr)
    meta = {"prediction": _json(res.prediction), "class_id": res.class_id, "top_k": _json(res.top_k),
            "scores": [[k, float(v)] for k, v in (res.scores or {}).items()]}
    for key in ("detections", "keypoints", "near_detections"):
        if getattr(res, key, None) is not None:
            meta[key] = _json(getattr(res, key))
    return arrays, meta


def _json(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    return value


def _decode_outputs(arrays: dict[str, np.ndarray], meta: list[dict]):
    from edge_runtime.models.base import Outputs, Scores, TaskOutput

    outs = []
    for i, m in enumerate(meta):
        emb = arrays.get(f"{i}.embedding")
        prefix = f"{i}.outputs."
        named = {k[len(prefix):].replace("\x1f", ".").replace("\x1e", "/"): v
                 for k, v in arrays.items() if k.startswith(prefix)}
        scores = Scores(((k, v) for k, v in m.get("scores") or []), class_id=m.get("class_id"), top_k=m.get("top_k"))
        outs.append(TaskOutput(prediction=m.get("prediction"), scores=scores, embedding=emb,
                               outputs=Outputs(named) if named else None, class_id=m.get("class_id"),
                               top_k=m.get("top_k"), detections=m.get("detections"),
                               keypoints=m.get("keypoints"), near_detections=m.get("near_detections")))
    return outs


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, allow_pickle=False, **arrays)
    return buf.getvalue()


# -- build (convert) --------------------------------------------------------------
def build(samples: list, references: list, *, count: int = DEFAULT_COUNT, max_bytes: int = DEFAULT_MAX_BYTES,
          source: str = "") -> tuple[bytes, bytes, dict]:
    """``(inputs.npz, reference.npz, section)`` for the first ``count`` samples that fit in
    ``max_bytes`` (raw inputs and reference outputs, uncompressed, together)."""
    if len(samples) != len(references):
        raise ValueError("one reference output per probe sample")
    kept_in: dict[str, np.ndarray] = {}
    kept_ref: dict[str, np.ndarray] = {}
    meta: list[dict] = []
    used = 0
    for raw, res in zip(samples, references):
        if len(meta) >= count:
            break
        i = len(meta)
        ins = _encode_input(i, raw)
        refs, m = _encode_output(i, res)
        size = sum(a.nbytes for a in (*ins.values(), *refs.values())) + len(json.dumps(m))
        if used + size > max_bytes:
            break
        used += size
        kept_in.update(ins)
        kept_ref.update(refs)
        meta.append(m)
    if samples and count > 0 and not meta:
        # a probe set of no sample verifies nothing: verify and tune would refuse the artifact later
        raise InputError(f"--probe-max-bytes {max_bytes} admits no probe sample (the first needs {size} bytes "
                         "with its reference result); raise it, or --probe-samples 0 for no probe set",
                         code=ec.CONVERT_REQUEST_INVALID)
    kept_ref["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    section = {"inputs": INPUTS, "reference": REFERENCE, "samples": len(meta), "offered": len(samples),
               "max_samples": count, "max_bytes": max_bytes, "bytes": used, "source": source,
               "reference_from": "fp32 source ONNX on onnxruntime:cpu, same pre/post-processing"}
    return _npz(kept_in), _npz(kept_ref), section


# -- read (runtime) ---------------------------------------------------------------
# numpy's own header, as ``np.save`` writes a plain C-order array: read here without numpy's
# ``ast.literal_eval`` per array (65 arrays: ~3.5 ms of a ~9 ms probe read at load, which
# ``load(verify=True)`` pays); anything else is left to ``np.load``
_NPY_HEADER = re.compile(r"\{'descr': '([<>|=]?[a-zA-Z]\d*)', 'fortran_order': False, "
                         r"'shape': \(((?:\d+, ?)*\d*)\), \} *\n")


def _npy_fast(data: bytes) -> np.ndarray | None:
    """The array a ``.npy`` file holds, or None when it is not the plain case (numpy decides then)."""
    if data[:6] != b"\x93NUMPY" or len(data) < 10:
        return None
    if data[6] == 1:
        (hlen,), start = struct.unpack_from("<H", data, 8), 10
    elif data[6] in (2, 3):
        (hlen,), start = struct.unpack_from("<I", data, 8), 12
    else:
        return None
    m = _NPY_HEADER.fullmatch(data[start:start + hlen].decode("latin-1"))
    if m is None:
        return None
    dtype = np.dtype(m.group(1))
    if dtype.hasobject or dtype.fields is not None:
        return None
    shape = tuple(int(d) for d in m.group(2).replace(" ", "").split(",") if d)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    body = memoryview(data)[start + hlen:]
    if len(body) != count * dtype.itemsize:
        return None
    return np.frombuffer(bytearray(body), dtype=dtype, count=count).reshape(shape)


# room for what the manifest's ``bytes`` does not count: each member's .npy header, the JSON of
# the reference's "meta" beside the figure counted
_NPY_OVERHEAD = 512
_SLACK = 64 * 1024


def _load_npz(blob: bytes, max_bytes: int | None = None) -> dict[str, np.ndarray]:
    """An ``.npz`` (``np.savez_compressed``) as ``{key: array}``, never unpickling: the plain arrays
    by ``_npy_fast``, any other member by ``np.load(allow_pickle=False)``. With ``max_bytes``, a
    file whose members declare more than that decompressed is refused before any is inflated
    (a few hundred KB can hold gigabytes of zeros); ``zipfile`` never inflates a member past the
    size it declares (a member that lies fails its CRC)."""
    out: dict[str, np.ndarray] = {}
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        infos = zf.infolist()
        if max_bytes is not None:
            declared = sum(i.file_size for i in infos)
            if declared > max_bytes + _NPY_OVERHEAD * len(infos) + _SLACK:
                raise ProbeTooLarge(f"its arrays take {declared} bytes decompressed, over the {max_bytes} bytes "
                                    "the manifest records for the probe set")
        for name in zf.namelist():
            if not name.endswith(".npy"):
                raise ValueError(f"{name!r} is not an array")
            data = zf.read(name)
            arr = _npy_fast(data)
            out[name[:-4]] = arr if arr is not None else np.load(io.BytesIO(data), allow_pickle=False)
    return out


class ProbeTooLarge(ValueError):
    """A probe file that would decompress past the size its manifest records."""


def _cap(section: dict) -> int:
    """The decompressed bytes a probe file may hold: the recorded size of the set (inputs and
    reference together), else its cap, else the default cap."""
    for key in ("bytes", "max_bytes"):
        n = section.get(key)
        if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
            return n
    return DEFAULT_MAX_BYTES


def section_of(manifest) -> dict | None:
    probe = manifest.get("probe")
    return probe if isinstance(probe, dict) else None


def read(artifact) -> ProbeSet:
    """The artifact's probe set (its files verified by the artifact's own hash check first);
    an artifact without one, or one that does not decode, is an ``ArtifactError``."""
    section = section_of(artifact.manifest)
    if section is None:
        source = ((artifact.manifest.get("model") or {}).get("source") or {})
        if isinstance(source, dict) and source.get("imported"):
            why = ("an imported model has none: there is no fp32 source to keep reference results from. Convert "
                   "its float source with `edge-infer convert` (with --parity-data) for an artifact that verify "
                   "and tune can measure")
        else:
            why = "converted before edge-runtime kept one: re-convert it to verify it on this machine"
        raise ArtifactError(f"the artifact has no probe set ({why})", file="manifest.json", code=ec.PROBE_MISSING)
    cap = _cap(section)
    try:
        inputs = _decode_inputs(_load_npz(artifact.read_bytes(section["inputs"]), cap))
        arrays = _load_npz(artifact.read_bytes(section["reference"]), cap)
        meta = json.loads(arrays.pop("meta").tobytes().decode("utf-8"))
        reference = _decode_outputs(arrays, meta)
    except ArtifactError:
        raise
    except Exception as exc:     # a corrupt file is refused by its hash first; this is a malformed one
        raise ArtifactError(f"probe set does not decode: {type(exc).__name__}: {exc}", file=section["inputs"],
                            code=ec.PROBE_INVALID) from None
    if len(inputs) != len(reference) or len(inputs) != section.get("samples"):
        raise ArtifactError(f"probe set holds {len(inputs)} inputs and {len(reference)} references, the manifest "
                            f"says {section.get('samples')}", file=section["inputs"], code=ec.PROBE_INVALID)
    if not inputs:
        raise ArtifactError("the probe set holds no sample (converted with a --probe-max-bytes no sample fits in): "
                            "nothing to verify or tune with; re-convert it with a larger --probe-max-bytes",
                            file=section["inputs"], code=ec.PROBE_INVALID)
    return ProbeSet(inputs, reference, dict(section))
