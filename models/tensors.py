"""tensors: named numpy arrays in, named arrays out (no pre/post-processing).

Inputs are fed as given (in the model's own dtype: a quantized input takes
its integers). Outputs come back as ``res.outputs``: each quantized output
(an integer tensor with a scale and zero point in the manifest) dequantized
to float32 with the model's own parameters, ``(q - zero_point) * scale``;
every other output as the model returned it. The quantized arrays exactly as
returned are kept in ``res.raw_outputs`` (only the outputs that were
dequantized; ``None`` when none was). Parity (``compare``) runs on the
dequantized values.
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path

import numpy as np

from edge_runtime import error_codes as ec
from edge_runtime.errors import InputError

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

    @property
    def allows_nonfinite_outputs(self) -> bool:
        # an artifact built to pass NaN/inf through (--preprocess allow_nonfinite) may return them too
        return bool(self.pre.get("allow_nonfinite", False))

    def bucket_samples(self, limits) -> list:
        return [{t["name"]: np.zeros(t["shape"], dtype=t["dtype"]) for t in b["inputs"]} for b in self.buckets]

    def request_bytes(self, raw) -> int:
        if isinstance(raw, dict):
            return sum(int(v.nbytes) if isinstance(v, np.ndarray) else 0 for v in raw.values())
        return super().request_bytes(raw)

    def prepare(self, raw, limits) -> Prepared:
        if isinstance(raw, np.ndarray) and len(self.buckets[0]["inputs"]) == 1:
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
                arr = _as_array(raw[name], name, spec)
                shape = list(spec["shape"])
                if list(arr.shape) == shape[1:] and shape[0] == 1:
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
                v = dequantize(v, spec)
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
            a = np.concatenate([v.astype(np.float64).ravel() for v in r.outputs.values()])
            b = np.concatenate([v.astype(np.float64).ravel() for v in c.outputs.values()])
            na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
            sa, sb = sa + na * na, sb + nb * nb
            cos.append(float(a @ b / max(na * nb, 1e-12)))
        if not cos:
            return {"metric": "cosine_mean", "value": None, "min": None, "samples": 0}
        ratio = math.sqrt(sb / sa) if sa > 1e-24 else (1.0 if sb <= 1e-24 else math.inf)
        off = max(ratio, 1 / ratio) if ratio > 0 else math.inf
        factor = min(1.0, NORM_SLACK / off)
        return {"metric": "cosine_mean", "value": float(np.mean(cos)) * factor, "min": float(np.min(cos)) * factor,
                "samples": len(cos), "norm_ratio": ratio if math.isfinite(ratio) else None, "norm_slack": NORM_SLACK}

    @staticmethod
    def load_samples(path) -> list:
        with np.load(path, allow_pickle=False) as data:
            names = list(data.files)
            n = len(data[names[0]])
            return [{k: data[k][i] for k in names} for i in range(n)]


def _as_array(value, name: str, spec: dict) -> np.ndarray:
    dtype = np.dtype(spec["dtype"])
    if isinstance(value, np.ndarray):
        if value.dtype == dtype:
            return value
        if value.dtype.kind in "biuf" and np.can_cast(value.dtype, dtype, casting="same_kind"):
            if not np.can_cast(value.dtype, dtype, casting="safe"):     # int64 300 would wrap to int8 44
                _in_range(value, dtype, name)
            return value.astype(dtype)
        raise InputError(f"input {name!r} has dtype {value.dtype}, model wants {dtype}", code=ec.INPUT_WRONG_DTYPE)
    if isinstance(value, (list, tuple, int, float)) and not isinstance(value, bool):
        try:
            arr = np.asarray(value)
        except (ValueError, TypeError) as exc:
            raise InputError(f"input {name!r} is not a rectangular numeric array: {exc}", code=ec.INPUT_WRONG_TYPE) from None
        if arr.dtype.kind not in "biuf":
            raise InputError(f"input {name!r} is not numeric", code=ec.INPUT_WRONG_TYPE)
        if dtype.kind in "iu" and arr.dtype.kind == "f":
            raise InputError(f"input {name!r} has floats, model wants {dtype}", code=ec.INPUT_WRONG_DTYPE)
        _in_range(arr, dtype, name)
        return arr.astype(dtype)
    raise InputError(f"input {name!r}: expected an array, got {type(value).__name__}", code=ec.INPUT_WRONG_TYPE)


def _in_range(arr: np.ndarray, dtype: np.dtype, name: str) -> None:
    """Integer values must fit the model's integer dtype: a cast would wrap them silently
    (uint8 200 fed to an int8 input as -56). Floats narrowing to float32 overflow to infinity,
    which the non-finite check refuses."""
    if dtype.kind in "iu" and arr.dtype.kind in "iub" and arr.size:
        info = np.iinfo(dtype)
        if int(arr.min()) < info.min or int(arr.max()) > info.max:
            raise InputError(f"input {name!r} has values outside {dtype} ([{info.min}, {info.max}])",
                             code=ec.INPUT_OUT_OF_RANGE)
