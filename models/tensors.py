"""tensors: named numpy arrays in, named arrays out (no pre/post-processing).

Inputs are fed as given (in the model's own dtype: a quantized input of an
imported model takes its integer codes, floats for it are refused with the
scale and zero point to quantize with; one of a converted artifact, whose
contract is its float source's, quantizes real values, ``round(x / scale) +
zero_point`` saturated, and takes an array of its own dtype as codes). Another
dtype is cast only where no value changes: integers range-checked (never
wrapped), floats narrowed only within the target's range (never to infinity),
a bool input from booleans or 0/1 only; a quantized input refuses booleans and
codes of the other signedness at the same width (uint8 for int8). A (N,) array
fills a [1, N] input; a masked array with masked elements is refused.

Outputs come back as ``res.outputs``: each quantized output (an integer tensor
with a scale and zero point in the manifest, checked at load) dequantized to
float32 with the model's own parameters, ``(q - zero_point) * scale`` (int32
codes exactly); every other output as the model returned it. The quantized arrays exactly as
returned are kept in ``res.raw_outputs`` (only the outputs that were
dequantized; ``None`` when none was). Parity (``compare``) runs on the
dequantized values.
"""

from __future__ import annotations

import math
import zipfile
from itertools import chain
from pathlib import Path

import numpy as np

from edge_runtime import error_codes as ec
from edge_runtime.errors import ArtifactError, InputError

from .base import Outputs, Prepared, Task, TaskOutput, dequantize, preprocess_error, reject_type

NORM_SLACK = 1.25      # a candidate's output norm within 1.25x of the reference's leaves its cosine as it is

_NPZ = "the tensors task takes an .npz of named arrays, one per model input, samples along the first axis " \
       "(numpy.savez(F, input_name=array))"


class Tensors(Task):
    name = "tensors"
    parity_metric = "cosine_mean"
    input_kind = "tensors"
    score_field = "inputs"
    length_unit = "elements"
    preprocess_keys = ("allow_nonfinite",)
    importable = True

    @classmethod
    def check_sample_path(cls, path, what: str) -> None:
        p = Path(path)
        if p.is_dir():
            raise InputError(f"{what} {p} is a directory; {_NPZ}", code=ec.CONVERT_CALIBRATION_INVALID)
        if not zipfile.is_zipfile(p):
            raise InputError(f"{what} {p} is not an .npz archive; {_NPZ}", code=ec.CONVERT_CALIBRATION_INVALID)

    @classmethod
    def check_preprocess_values(cls, pre: dict) -> None:
        if "allow_nonfinite" in pre and not isinstance(pre["allow_nonfinite"], bool):
            preprocess_error(f"--preprocess 'allow_nonfinite': need true or false, got {pre['allow_nonfinite']!r}")

    @classmethod
    def import_sections(cls, model, options, warnings):
        return {"kind": "tensors"}, {}

    def __init__(self, manifest, read_file, buckets):
        super().__init__(manifest, read_file, buckets)
        # A converted artifact's raw inputs are its float source's: a quantized input there (tflite-int8
        # and edgetpu have int8 I/O) takes real values and quantizes them, as the onnx-int8 and openvino
        # variants of the same artifact take them (an array in the input's own dtype stays its codes).
        # An imported model's (and a manifest without a source record) takes the model's own codes.
        # Convert's draft has no model section: it converts.
        model = manifest.get("model")
        source = model.get("source") if isinstance(model, dict) else None
        self.real_inputs: bool = model is None or (isinstance(source, dict) and not source.get("imported"))
        for b in buckets:
            for t in list(b["inputs"]) + list(b["outputs"]):
                if t.get("quantization"):
                    _check_quantization(t, b.get("name"))

    @property
    def allows_nonfinite_outputs(self) -> bool:
        # an artifact built to pass NaN/inf through (--preprocess allow_nonfinite) may return them too
        return bool(self.pre.get("allow_nonfinite", False))

    def bucket_samples(self, limits) -> list:
        return [{t["name"]: np.zeros(t["shape"], dtype=t["dtype"]) for t in b["inputs"]} for b in self.buckets]

    def request_bytes(self, raw) -> int:
        """The arrays' bytes; a list (a JSON input's, a caller's) counts as the array it becomes in the
        model's dtype (before, a dict of lists counted 0 and passed any request limit)."""
        if isinstance(raw, dict):
            total = 0
            sizes: dict | None = None
            for k, v in raw.items():
                if isinstance(v, np.ndarray):
                    total += int(v.nbytes)
                    continue
                if sizes is None:
                    sizes = {t["name"]: np.dtype(t["dtype"]).itemsize for t in self.buckets[0]["inputs"]}
                total += _value_bytes(v, sizes.get(k, 8) if isinstance(k, str) else 8)
            return total
        if isinstance(raw, (list, tuple)) and len(self.buckets[0]["inputs"]) == 1:
            return _value_bytes(raw, np.dtype(self.buckets[0]["inputs"][0]["dtype"]).itemsize)
        return super().request_bytes(raw)

    def prepare(self, raw, limits) -> Prepared:
        # a single-input model takes its array bare: an ndarray, or a list (a JSON ``{"inputs": [...]}``
        # of a model whose input is itself named "inputs" comes here unwrapped)
        if isinstance(raw, (np.ndarray, list, tuple)) and len(self.buckets[0]["inputs"]) == 1:
            raw = {self.buckets[0]["inputs"][0]["name"]: raw}
        if not isinstance(raw, dict):
            reject_type(raw, "a dict of named arrays")
        allow_nonfinite = bool(self.pre.get("allow_nonfinite", False))
        errors = []
        for idx, bucket in enumerate(self.buckets):
            specs = {t["name"]: t for t in bucket["inputs"]}
            if set(raw) != set(specs):
                raise InputError(f"inputs {sorted(map(str, raw))} do not match the model's {sorted(specs)}",
                                 code=ec.INPUT_WRONG_NAMES)
            feeds = {}
            for name, spec in specs.items():
                arr = _as_array(raw[name], name, spec, self.real_inputs)
                shape = list(spec["shape"])
                if shape and shape[0] == 1 and list(arr.shape) == shape[1:]:     # a rank-0 input has no batch axis
                    arr = arr[None]
                if list(arr.shape) != shape:
                    errors.append(f"{name}: shape {list(arr.shape)} (model wants {shape})")
                    break
                if arr.dtype.kind == "f" and not allow_nonfinite and not np.isfinite(arr).all():
                    raise InputError(f"input {name!r} contains NaN or infinity", code=ec.INPUT_NONFINITE)
                feeds[name] = arr
            else:
                return Prepared(bucket=idx, feeds=feeds)
        raise InputError("no bucket fits the input: " + "; ".join(errors), code=ec.INPUT_WRONG_SHAPE)

    def finish(self, outputs, prepared) -> TaskOutput:
        specs = {t["name"]: t for t in self.buckets[prepared.bucket]["outputs"]}
        out: dict[str, np.ndarray] = {}
        raw: dict[str, np.ndarray] = {}
        for k, v in outputs.items():
            v = np.asarray(v)
            spec = specs.get(k)
            if spec is not None and spec.get("quantization") and v.dtype.kind in "iu":
                raw[k] = v
                v = _dequantize(v, spec)
            out[k] = v
        raw_or_none = raw or None
        return TaskOutput(outputs=Outputs(out, raw=raw_or_none), raw_outputs=raw_or_none)

    @staticmethod
    def compare(reference, candidate) -> dict:
        """``cosine_mean`` of each sample's outputs (concatenated), scaled down by how far the
        candidate's magnitude is off the reference's beyond ``NORM_SLACK``: a cosine alone cannot see
        a wrong scale (a dequantization scale x50 keeps it at 1.0; a one-value output's cosine is ±1
        whatever its value), and a wrong scale is a wrong answer. The magnitude is the norm over every
        sample together (``norm_ratio``, candidate / reference): a near-zero sample's relative error
        does not swing it. Within the slack (an int8 path's norms are ~1% off) the figure is the plain
        cosine mean."""
        cos = []
        sa = sb = 0.0
        for r, c in zip(reference, candidate):
            ra, ca = _paired(r.outputs, c.outputs)
            a = np.concatenate([np.asarray(v).astype(np.float64).ravel() for v in ra])
            b = np.concatenate([np.asarray(v).astype(np.float64).ravel() for v in ca])
            na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
            sa, sb = sa + na * na, sb + nb * nb
            # two all-zero outputs (a ReLU's on a negative input) agree: their cosine is undefined, and
            # read as 0 it counted identical answers as opposite ones
            cos.append(1.0 if max(na, nb) <= 1e-12 else float(a @ b / max(na * nb, 1e-12)))
        if not cos:
            return {"metric": "cosine_mean", "value": None, "min": None, "samples": 0}
        ratio = math.sqrt(sb / sa) if sa > 1e-24 else (1.0 if sb <= 1e-24 else math.inf)
        off = max(ratio, 1 / ratio) if ratio > 0 else math.inf
        factor = min(1.0, NORM_SLACK / off)
        return {"metric": "cosine_mean", "value": float(np.mean(cos)) * factor, "min": float(np.min(cos)) * factor,
                "samples": len(cos), "norm_ratio": ratio if math.isfinite(ratio) else None, "norm_slack": NORM_SLACK}

    @staticmethod
    def load_samples(path) -> list:
        """One sample per index along the arrays' first axis. Every array is read once (``data[k]``
        decompresses the whole member at each access: a sample loop re-read it per sample), and the
        arrays must hold as many samples each (before, the first array's count was taken and longer
        ones were cut short without a word)."""
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        if not arrays:
            raise InputError(f"{path} holds no arrays; {_NPZ}", code=ec.CONVERT_CALIBRATION_INVALID)
        counts = {k: (len(v) if v.ndim else None) for k, v in arrays.items()}
        if any(n is None for n in counts.values()) or len(set(counts.values())) != 1:
            told = ", ".join(f"{k}: {'a 0-d array' if n is None else n}" for k, n in counts.items())
            raise InputError(f"{path}: the arrays hold different numbers of samples along the first axis ({told}); "
                             f"{_NPZ}", code=ec.CONVERT_CALIBRATION_INVALID)
        n = next(iter(counts.values()))
        return [{k: v[i] for k, v in arrays.items()} for i in range(n or 0)]


def _as_array(value, name: str, spec: dict, real: bool = False) -> np.ndarray:
    """``value`` as the model's input ``spec``; ``real``: a quantized input takes real values (a
    converted artifact's float source contract) and quantizes them, else it takes its codes."""
    dtype = np.dtype(spec["dtype"])
    if type(value) is np.ndarray and value.dtype == dtype:     # the common case, first (codes when quantized)
        return value
    quant = spec.get("quantization")
    if isinstance(value, np.ma.MaskedArray):
        if np.ma.getmaskarray(value).any():     # the values under the mask would be fed as if given
            raise InputError(f"input {name!r} is a masked array with masked elements: the model takes every "
                             "element; fill them first (arr.filled(value))", code=ec.INPUT_WRONG_TYPE)
        value = np.asarray(value.data)
    if isinstance(value, np.generic) and not isinstance(value, (np.bool_, np.str_, np.bytes_, np.void)):
        value = np.asarray(value)           # numpy's scalars as Python's (np.float64 always was one)
    # an array already in the input's own quantized dtype holds its codes (what the variant's metadata
    # declares to a served client); any other number is a real value
    if real and quant and dtype.kind in "iu" and not (isinstance(value, np.ndarray) and value.dtype == dtype):
        return _quantize(value, name, dtype, quant)
    if isinstance(value, np.ndarray):
        value = np.asarray(value)           # a subclass (np.matrix) as a plain array
        if value.dtype == dtype:
            return value
        # same_kind, and integers of either signedness (numpy's default int64 for a uint8 input), range-checked
        if value.dtype.kind in "biuf" and (np.can_cast(value.dtype, dtype, casting="same_kind")
                                           or (value.dtype.kind in "iu" and dtype.kind in "iu")):
            if quant:
                _check_codes(value.dtype, dtype, name, quant)
            if not np.can_cast(value.dtype, dtype, casting="safe"):     # int64 300 would wrap to int8 44
                _in_range(value, dtype, name)
            return _cast(value, dtype, name)
        raise InputError(f"input {name!r} has dtype {value.dtype}, model wants {dtype}{_quant_hint(dtype, quant)}",
                         code=ec.INPUT_WRONG_DTYPE)
    if isinstance(value, (list, tuple, int, float)) and not isinstance(value, bool):
        arr = _numeric_list(value, name, bool_ok=dtype.kind == "b")
        if dtype.kind in "biu" and arr.dtype.kind == "f":
            raise InputError(f"input {name!r} has floats, model wants {dtype}{_quant_hint(dtype, quant)}",
                             code=ec.INPUT_WRONG_DTYPE)
        if quant and arr.dtype.kind == "b":
            _check_codes(arr.dtype, dtype, name, quant)
        _in_range(arr, dtype, name)
        return _cast(arr, dtype, name)
    raise InputError(f"input {name!r}: expected an array, got {type(value).__name__}", code=ec.INPUT_WRONG_TYPE)


def _numeric_list(value, name: str, bool_ok: bool = False) -> np.ndarray:
    """A list, tuple or Python number as a numeric array (``InputError`` when it is ragged or not numbers)."""
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InputError(f"input {name!r} is not a rectangular numeric array: {exc}", code=ec.INPUT_WRONG_TYPE) from None
    if arr.dtype.kind not in "biuf":
        raise InputError(f"input {name!r} is not numeric", code=ec.INPUT_WRONG_TYPE)
    if arr.dtype.kind != "b" and not bool_ok and _has_bool(value):
        # numpy reads [true, 2] as [1, 2]: a JSON true among numbers is a mistake, not the number one
        raise InputError(f"input {name!r} mixes booleans (true/false) with numbers: a boolean is not a number for "
                         "this input; give numbers only", code=ec.INPUT_WRONG_TYPE)
    return arr


def _has_bool(value) -> bool:
    """Whether a nested list or tuple that numpy read as a rectangular array holds a Python or numpy
    boolean: flattened level by level and its element types read in C (about 10 ns an element)."""
    flat = value if isinstance(value, (list, tuple)) else [value]
    while flat and isinstance(flat[0], (list, tuple)):
        flat = list(chain.from_iterable(flat))
    types = set(map(type, flat))
    return bool in types or np.bool_ in types


def _quantize(value, name: str, dtype: np.dtype, quant) -> np.ndarray:
    """Real values (a float source model's input) as the quantized input's codes:
    ``round(x / scale) + zero_point`` (half to even, as the image task and ONNX's QuantizeLinear),
    saturated to the dtype as the int8 model's own quantize step saturates."""
    if isinstance(value, np.ndarray):
        arr = np.asarray(value)
        if arr.dtype.kind not in "biuf":
            raise InputError(f"input {name!r} has dtype {arr.dtype}, model wants real numbers (quantized to {dtype})",
                             code=ec.INPUT_WRONG_DTYPE)
    elif isinstance(value, (list, tuple, int, float)) and not isinstance(value, bool):
        arr = _numeric_list(value, name)
    else:
        raise InputError(f"input {name!r}: expected an array, got {type(value).__name__}", code=ec.INPUT_WRONG_TYPE)
    x = arr.astype(np.float64)
    if x.size and not np.isfinite(x).all():     # NaN has no code; an infinity is no value to saturate to
        raise InputError(f"input {name!r} contains NaN or infinity", code=ec.INPUT_NONFINITE)
    info = np.iinfo(dtype)
    codes = np.rint(x / float(quant["scale"])) + float(quant["zero_point"])
    return np.clip(codes, info.min, info.max).astype(dtype)


def _quant_hint(dtype: np.dtype, quant) -> str:
    if not quant or dtype.kind not in "iu":
        return ""
    return (f" (quantized codes: scale {quant.get('scale')}, zero point {quant.get('zero_point')}; quantize a real "
            f"value x as round(x / scale) + zero_point, clipped to {dtype})")


def _check_codes(src: np.dtype, dtype: np.dtype, name: str, quant) -> None:
    """A quantized input takes the model's own integer codes. Booleans are not codes, and an integer
    array of the same width but the other signedness (uint8 for an int8 input, int8 for a uint8 one)
    holds codes of another quantization (their zero points differ by 128): cast, it was fed as is
    whenever every value happened to fit (a dark uint8 image into an int8 model) and refused
    otherwise. Wider integer arrays (numpy's default int64) are plain values, range-checked."""
    if src.kind == "b" or (src.kind in "iu" and dtype.kind in "iu" and src.kind != dtype.kind
                           and src.itemsize == dtype.itemsize):
        raise InputError(f"input {name!r} has dtype {src}, but the model's input is quantized {dtype}: "
                         f"{src} values are not its codes{_quant_hint(dtype, quant)}", code=ec.INPUT_WRONG_DTYPE)


def _cast(arr: np.ndarray, dtype: np.dtype, name: str) -> np.ndarray:
    """``arr`` as ``dtype``: a float input that narrows (float64/int to float16, float64 to float32)
    must not overflow to infinity, whatever ``allow_nonfinite`` lets through (a finite 1e5 became
    float16 inf and was fed as one)."""
    if dtype.kind == "b" and arr.dtype.kind in "iu" and arr.size and not np.isin(arr, (0, 1)).all():
        raise InputError(f"input {name!r} has values other than 0 and 1 for a bool input (2 or -1 would be "
                         "fed as True)", code=ec.INPUT_OUT_OF_RANGE)
    if dtype.kind != "f" or np.can_cast(arr.dtype, dtype, casting="safe"):
        return arr.astype(dtype)
    try:
        with np.errstate(over="raise"):     # a finite value cast past the range; inf and NaN given stay as given
            return arr.astype(dtype)
    except FloatingPointError:
        raise InputError(f"input {name!r} has values outside {dtype}'s range (±{float(np.finfo(dtype).max):.6g})",
                         code=ec.INPUT_OUT_OF_RANGE) from None


def _in_range(arr: np.ndarray, dtype: np.dtype, name: str) -> None:
    """Integer values must fit the model's integer dtype: a cast would wrap them silently
    (uint8 200 fed to an int8 input as -56). Floats narrowing to a float dtype are checked by
    ``_cast``."""
    if dtype.kind in "iu" and arr.dtype.kind in "iub" and arr.size:
        info = np.iinfo(dtype)
        if int(arr.min()) < info.min or int(arr.max()) > info.max:
            raise InputError(f"input {name!r} has values outside {dtype} ([{info.min}, {info.max}])",
                             code=ec.INPUT_OUT_OF_RANGE)


def _value_bytes(value, itemsize: int) -> int:
    """One raw input value's size for the request limit: an array's bytes; a (nested) list's
    element count, read along its first elements (a ragged list is refused when converted),
    times the model's item size."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    n = 1
    while isinstance(value, (list, tuple)):
        if not value:
            return 0
        n *= len(value)
        value = value[0]
    if isinstance(value, np.ndarray):
        return n * int(value.nbytes)
    return n * itemsize if isinstance(value, (int, float, np.generic)) else 0


def _dequantize(arr: np.ndarray, spec: dict) -> np.ndarray:
    """``(q - zero_point) * scale`` as float32. 8- and 16-bit codes are exact in float32: the shared
    ``dequantize`` (the classifiers' path, bit for bit). Wider codes (int32) are not: float32 holds
    24 bits, so a code past 2**24 was rounded before its zero point was taken off (2**24 + 1 with
    zero point 2**24 gave 0, not 1); they are subtracted as integers and scaled in float64."""
    if arr.dtype.itemsize <= 2:
        return dequantize(arr, spec)
    q = spec["quantization"]
    zp, scale = q["zero_point"], float(q["scale"])
    if arr.dtype.itemsize <= 4 and float(zp).is_integer():
        diff = (arr.astype(np.int64) - np.int64(int(zp))).astype(np.float64)
    else:
        diff = arr.astype(np.float64) - float(zp)
    return (diff * scale).astype(np.float32)


def _paired(ref: dict, cand: dict) -> tuple[list, list]:
    """The two results' outputs in one order: by name when both have the same names (a variant may
    list its outputs in another order than the reference: paired by position, output a was compared
    with output b), by position otherwise."""
    if ref.keys() == cand.keys():
        names = list(ref)
        return [ref[k] for k in names], [cand[k] for k in names]
    return list(ref.values()), list(cand.values())


def _check_quantization(spec, bucket) -> None:
    """A tensor's ``quantization`` as ``finish`` and the callers use it: a finite scale above 0 and an
    integer zero point its integer dtype holds. Anything else dequantized every output wrongly and
    silently (scale 0: all zeros; negative: negated; NaN: NaN, after the non-finite guard, which
    scans the integer outputs before dequantization), so the artifact is refused at load."""
    q = spec["quantization"]
    where = f"bucket {bucket!r} tensor {spec.get('name')!r}"
    scale = q.get("scale") if hasattr(q, "get") else None
    zp = q.get("zero_point") if hasattr(q, "get") else None
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ArtifactError(f"{where}: quantization scale must be a finite number above 0, got {scale!r}",
                            file="manifest.json", code=ec.MANIFEST_FIELD_INVALID)
    if isinstance(zp, bool) or not isinstance(zp, (int, float)) or not math.isfinite(zp) or not float(zp).is_integer():
        raise ArtifactError(f"{where}: quantization zero_point must be an integer, got {zp!r}",
                            file="manifest.json", code=ec.MANIFEST_FIELD_INVALID)
    dtype = np.dtype(spec["dtype"])
    if dtype.kind in "iu" and not np.iinfo(dtype).min <= zp <= np.iinfo(dtype).max:
        raise ArtifactError(f"{where}: quantization zero_point {zp} is outside {dtype}", file="manifest.json",
                            code=ec.MANIFEST_FIELD_INVALID)
