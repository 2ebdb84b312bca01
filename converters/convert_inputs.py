"""What ``convert()`` builds from before any target: the source at QDQ's opset, its
fp32 buckets with static dims, the calibration and held-out samples, and the
source's manifest record (with the opset upgrade's check)."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path

from edge_runtime.artifact import sha256_file
from edge_runtime import error_codes as ec
from edge_runtime.errors import EdgeRuntimeError, InputError
from edge_runtime.limits import Limits

from .build_variant import Fp32Bucket, Job, Samples
from .onnx_io import QDQ_MIN_OPSET, io_specs, static_dims, upgrade_opset
from .request import ConvertRequest, data_name, fills_preprocess, sample_policy, task_of

# a detector's --preprocess keys as the family defaults' option names (models.object_detection.family_input,
# import's); size, channels, layout and input are the source input's unless stated
_AS_OPTION = {"resize": "resize_mode", "interpolation": "resize", "scale": "scale", "mean": "mean", "std": "std",
              "pad": "pad", "pad_position": "pad_position", "channel_order": "channel_order"}
_FROM_INPUT = ("size", "channels", "layout")


def upgrade_source(req: ConvertRequest, opset: int, work: Path, progress) -> Path:
    """The source, upgraded to QDQ's opset where it is older (QDQ's per-channel axis needs opset 13)."""
    if opset >= QDQ_MIN_OPSET:
        return Path(req.source)
    progress(f"upgrading the source from opset {opset} to {QDQ_MIN_OPSET} with onnx.version_converter "
             "(per-channel QDQ needs it)")
    source = work / f"source_opset{QDQ_MIN_OPSET}.onnx"
    try:
        upgrade_opset(req.source, source, QDQ_MIN_OPSET)
    except ValueError as exc:
        raise InputError(f"{req.source} is opset {opset}; int8 QDQ needs opset {QDQ_MIN_OPSET} or later and "
                         f"onnx.version_converter cannot upgrade it ({exc}); re-export the model at opset "
                         f"{QDQ_MIN_OPSET}+", code=ec.CONVERT_SOURCE_OPSET) from None
    return source


def fix_static_shapes(req: ConvertRequest, source: Path, src_inputs: list[dict], work: Path,
                      progress) -> list[Fp32Bucket]:
    """One fp32 model per bucket with every dim static (a task with sequence buckets: one per length)."""
    from .onnx_shapes import fix_input_dims

    progress("fixing static shapes per bucket")

    def fix(src, dst, dims):
        try:
            fix_input_dims(src, dst, dims)
        except Exception as exc:  # ValueError (bad dims), onnx's ValidationError / InferenceError
            raise InputError(f"{req.source}: cannot fix static input shapes {dims}: {type(exc).__name__}: "
                             f"{str(exc)[:300]}", code=ec.CONVERT_SHAPE_INVALID) from None

    seqs: list[int | None] = [None]
    if task_of(req).sequence_buckets:
        assert req.buckets is not None, "the pipeline sets a sequence task's buckets first"
        seqs = list(req.buckets)
    fp32: list[Fp32Bucket] = []
    for seq in seqs:
        try:
            dims = static_dims(src_inputs, seq_len=seq, overrides=req.input_shapes)
        except ValueError as exc:
            raise InputError(str(exc), code=ec.CONVERT_SHAPE_DYNAMIC) from None
        name = f"seq{seq}" if seq else "static"
        path = work / f"fp32_{name}.onnx"
        fix(source, path, dims)
        if source != Path(req.source) and not fp32:   # the source as given, to check the upgrade against
            fix(req.source, work / "fp32_original.onnx", dims)
        ins, outs = io_specs(path)
        fp32.append(Fp32Bucket(name, path, {"name": name, "file": "", "inputs": ins, "outputs": outs}))
    return fp32


def detector_preprocess(req: ConvertRequest, inputs: list[dict], outputs: list[dict], progress) -> ConvertRequest:
    """An object detector's pre-processing: its family's usual input, the one import and the
    runtime take (``family_input``: Ultralytics' RGB/255 letterboxed for yolo, YOLOX's BGR 0..255,
    NanoDet's BGR mean/std), with every key --preprocess states winning and the size, channels and
    layout read from the static source input; the keys filled in are recorded under
    ``defaults``. Calibration, the fp32 reference (parity, probe set) and the runtime all read
    this one section. Another task's request comes back as it is."""
    from dataclasses import replace

    from edge_runtime.models.image_import import image_layout
    from edge_runtime.models.object_detection import FAMILY_INPUT, family_input, guess_family

    if not fills_preprocess(task_of(req)):
        return req
    stated = dict(req.preprocess or {})
    if len(inputs) != 1 or image_layout([int(d) for d in inputs[0]["shape"]]) is None:
        if "size" in stated:
            return req          # no image input to fill it from: the task's own check names what does not fit
        shown = ", ".join(f"{i['name']!r} {i['shape']}" for i in inputs)
        raise InputError(f"object-detection: the source's inputs ({shown}) are not one image input to take the "
                         "size from: state --preprocess", code=ec.CONVERT_PREPROCESS_MISSING)
    family = (req.postprocess or {}).get("family") or guess_family(outputs)
    if family not in FAMILY_INPUT:      # no family known: the task's check names it (state --family)
        return replace(req, preprocess={"size": _size(inputs[0]), **stated})
    warnings: list[str] = []
    pre = family_input(family, inputs[0], {_AS_OPTION[k]: v for k, v in stated.items() if k in _AS_OPTION}, warnings)
    pre.update({k: v for k, v in stated.items() if k not in _AS_OPTION})
    keys = [k for k in _AS_OPTION if k in pre and k not in stated]
    shape = [k for k in _FROM_INPUT if k not in stated]
    if keys or shape:
        pre["defaults"] = {"family": family, "keys": keys, "from_input": shape, "stated": sorted(stated)}
    for w in warnings:
        progress(f"warning: preprocess: {w}")
    line = defaults_line(pre)
    if line:
        progress(line)
    return replace(req, preprocess=pre)


def _size(spec: dict) -> list[int]:
    from edge_runtime.models.image_import import image_layout

    shape = [int(d) for d in spec["shape"]]
    return shape[1:3] if image_layout(shape) == "NHWC" else shape[2:4]


def defaults_line(pre: dict) -> str | None:
    """What a detector's convert filled into its pre-processing (``preprocess.defaults``), one line."""
    d = pre.get("defaults")
    if not isinstance(d, dict):
        return None

    def show(k):
        v = pre.get(k)
        return ",".join(f"{x:g}" for x in v) if isinstance(v, list) and k in ("mean", "std") else v

    parts = []
    if d.get("keys"):
        parts.append(f"the {d.get('family')} family's usual input ({', '.join(f'{k} {show(k)}' for k in d['keys'])})")
    if d.get("from_input"):
        parts.append(f"the model input's {', '.join(f'{k} {show(k)}' for k in d['from_input'])}")
    given = f"--preprocess states {', '.join(d['stated'])}" if d.get("stated") else "no --preprocess given"
    return f"preprocess: {' and '.join(parts)} ({given})"


def split_samples(job: Job, task_ref, progress) -> Samples:
    """Calibration and held-out samples: --parity-data, else a seeded split of --calibration;
    counted (what the task can prepare) and judged by the sample-count policy.

    Only samples the task can prepare are kept (a corrupt image, a macOS ``._x.png``, an empty
    line calibrated nothing and parity skipped it, yet both were counted in the manifest's
    ``calibration.samples`` and the held-out split), and each input the model would see once: two
    files with the same pixels (a copy under another name, a ``.ipynb_checkpoints`` twin) are one
    sample, never one calibrated on and its twin "held out". What is left out is said in a
    warning and in ``parity.data``."""
    req, limits = job.req, job.limits
    progress("loading calibration and held-out samples")
    cal = _pool(task_ref, _load_samples(job.task_cls, req.calibration, "--calibration"), "--calibration",
                "calibration", progress, limits)
    order = list(range(len(cal.samples)))
    random.Random(req.seed).shuffle(order)
    if req.parity_data:
        _not_the_calibration_path(req)
        par = _pool(task_ref, _load_samples(job.task_cls, req.parity_data, "--parity-data"), "--parity-data",
                    "held-out parity", progress, limits)
        used = order[: req.max_calibration]
        calib = [cal.samples[i] for i in used]
        held, seen = _not_calibrated(par, {cal.keys[i] for i in used}, progress)
        data = f"{data_name(req.parity_data)} ({len(held)} samples{par.note}{seen})"
    else:
        n_held = max(1, int(round(len(cal.samples) * req.heldout_fraction)))
        if len(cal.samples) - n_held < 1:
            raise InputError("calibration data too small to hold samples out", code=ec.CONVERT_CALIBRATION_SMALL)
        held = [cal.samples[i] for i in order[:n_held]]
        calib = [cal.samples[i] for i in order[n_held:]][: req.max_calibration]
        data = f"held-out split of {data_name(req.calibration)} ({len(held)} of {len(cal.samples)}{cal.note})"
    return Samples(calib, held, data, sample_policy(req, len(calib), len(held), progress),
                   cal.note.removeprefix("; "))


@dataclass(frozen=True)
class _Pool:
    """The samples of one path the model can take, each distinct input once, in load order."""
    samples: list
    keys: list[str]     # per sample: what the model is fed for it (bucket and feeds), hashed
    note: str           # what was left out, for the parity record ("" when nothing)


def _pool(task, raws: list, option: str, what: str, progress, limits: Limits) -> _Pool:
    """``raws`` less the samples the task cannot prepare (under the artifact's ``limits``: what
    its runtime refuses is no sample) and the repeats of an input already
    kept (the same feeds in the same bucket: the same bytes under another name, or another
    encoding of the same pixels), with a warning for each kind; none usable is an InputError
    quoting why the first failed (as before). What the loader did not read (an image folder's
    ``left_out``: .webp/.gif/.tif files, looping symlinks...) is warned of and leads the note;
    the symlinked subfolders it entered are said in one line."""
    if getattr(task, "input_kind", None) == "image":
        _one_image_as_a_batch(raws, option)
    read_notes = list(getattr(raws, "left_out", None) or [])
    for line in read_notes:
        progress(f"warning: {option}: {line}")
    entered = list(getattr(raws, "entered", None) or [])
    if entered:
        progress(f"{option}: read {len(entered)} symlinked subfolder{'s' if len(entered) > 1 else ''} (each real "
                 f"folder once): {', '.join(entered[:5])}{', ...' if len(entered) > 5 else ''}")
    samples, keys, seen = [], [], set()
    unusable, why, repeats = 0, None, 0
    for raw in raws:
        try:
            prep = task.prepare(raw, limits)
        except EdgeRuntimeError as exc:
            unusable += 1
            why = why or exc.message
            continue
        _fits_the_model(task, prep, option)
        key = _feeds_key(prep.bucket, prep.feeds)
        if key in seen:
            repeats += 1
            continue
        seen.add(key)
        samples.append(raw)
        keys.append(key)
    if not samples:
        also = f" ({'; '.join(read_notes)})" if read_notes else ""
        raise InputError(f"none of the {len(raws)} {what} samples fits the model: {why}{also}",
                         code=ec.CONVERT_CALIBRATION_INVALID)
    notes = []
    if unusable:
        progress(f"warning: {unusable} of the {len(raws)} {option} samples cannot be prepared for the model and are "
                 f"left out (the first: {str(why)[:200]})")
        notes.append(f"{unusable} the model cannot take")
    if repeats:
        progress(f"warning: {repeats} of the {len(raws)} {option} samples repeat an input already there (the same "
                 "pre-processed feeds) and are left out: each input counts once")
        notes.append(f"{repeats} repeats")
    if notes:
        read_notes.append(f"{' and '.join(notes)} left out")
    return _Pool(samples, keys, "".join(f"; {n}" for n in read_notes))


def _fits_the_model(task, prep, option: str) -> None:
    """A prepared sample's feeds against the bucket's input shapes: a pre-processing that lays the
    tensor out otherwise (``--preprocess '{"layout": "NHWC"}'`` for an NCHW source: the vision tasks
    take a size that fits either layout) is the request's fault, said before any model runs; it
    reached onnxruntime as an untyped InvalidArgument (exit 1, ``unexpected``)."""
    import numpy as np

    buckets = getattr(task, "buckets", None) or []
    if not 0 <= prep.bucket < len(buckets):
        return
    specs = {i.get("name"): i for i in buckets[prep.bucket].get("inputs") or [] if isinstance(i, dict)}
    for name, value in prep.feeds.items():
        spec = specs.get(name)
        shape = spec.get("shape") if spec else None
        if not isinstance(shape, list) or not all(isinstance(d, int) and d > 0 for d in shape):
            continue            # a dim the model leaves open takes any size
        got = list(np.shape(value))
        if got != shape:
            pre = getattr(task, "pre", None) or {}
            said = f" (preprocess layout {pre['layout']})" if isinstance(pre, dict) and "layout" in pre else ""
            raise InputError(f"{option}: the task's pre-processing gives input {name!r} the shape {got}{said}, the "
                             f"model takes {shape}: check --preprocess (layout NCHW is channels first, NHWC "
                             "channels last)", code=ec.CONVERT_PREPROCESS_INVALID)


def _feeds_key(bucket: int, feeds: dict) -> str:
    """What the model is fed for a sample, hashed: its bucket and every feed's name, dtype, shape and bytes."""
    import numpy as np

    h = hashlib.sha256(f"{bucket}".encode())
    for name in sorted(feeds, key=str):
        a = np.ascontiguousarray(feeds[name])
        h.update(f"\x00{name}:{a.dtype.str}:{list(a.shape)}\x01".encode("utf-8"))
        h.update(a.tobytes())
    return h.hexdigest()


def _one_image_as_a_batch(raws: list, option: str) -> None:
    """A ``.npy`` of one H×W×C image read as a batch: each of its H rows (W×3 values) became a
    W×3 grayscale "image", H of them calibrated and counted. Refused: image samples whose last
    axis is 3 or 4 values wide are an image's colour channels, not a row of pixels, and so is an
    H×W×1 image's last axis (its H rows read as H images one pixel wide, calibrated with exit 0).
    An H×W grayscale image's rows are no image at all: said as what the .npy holds."""
    import numpy as np

    if raws and all(isinstance(r, np.ndarray) and r.ndim == 2 and r.shape[1] in (1, 3, 4) for r in raws) \
            and raws[0].shape[0] > 4:
        h, c = len(raws), raws[0].shape[1]
        raise InputError(f"{option}: the .npy holds one {h}x{raws[0].shape[0]}x{c} image, not a batch of images "
                         f"(it would be read as {h} grayscale images {c} pixel{'s' if c > 1 else ''} wide); save a "
                         "batch: numpy.save(F, numpy.stack([image, ...]))", code=ec.CONVERT_CALIBRATION_INVALID)
    if raws and all(isinstance(r, np.ndarray) and r.ndim == 1 for r in raws):
        raise InputError(f"{option}: the .npy holds one {len(raws)}x{raws[0].shape[0]} array (one grayscale image?), "
                         "not a batch of images (N x H x W, or N x H x W x C); save a batch: "
                         "numpy.save(F, numpy.stack([image, ...]))", code=ec.CONVERT_CALIBRATION_INVALID)


def _not_the_calibration_path(req: ConvertRequest) -> None:
    """--parity-data naming the --calibration file or folder (through ./, a trailing slash or a
    link) is refused whatever the sample cap leaves uncalibrated."""
    if req.parity_data is not None and Path(req.parity_data).resolve() == Path(req.calibration).resolve():
        raise InputError(f"--parity-data {req.parity_data} is the --calibration data ({req.calibration}): each of its "
                         "samples is also a calibration sample, and parity measured on the data the quantizer "
                         "calibrated on is not held-out parity; give "
                         "held-out samples (or leave --parity-data out to hold out a split of --calibration)",
                         code=ec.CONVERT_PARITY_IS_CALIBRATION)


def _not_calibrated(par: _Pool, calibrated: set[str], progress) -> tuple[list, str]:
    """The --parity-data samples that are not also calibration samples (the same input to the
    model: byte-equal, or the same pixels in another file), and what the parity record says of
    the ones left out. Parity on data the quantizer calibrated on is not held-out parity (its
    activation ranges were fitted to exactly those inputs): a --parity-data that is the
    calibration data is refused, one that shares some samples with it is measured on the
    others, said in a warning and in the record."""
    kept = [s for s, k in zip(par.samples, par.keys) if k not in calibrated]
    held = par.samples
    dropped = len(held) - len(kept)
    if not dropped:
        return held, ""
    if not kept:
        raise InputError(f"every one of the {len(held)} --parity-data samples is also a calibration sample: parity "
                         "measured on the data the quantizer calibrated on is not held-out parity; give "
                         "--parity-data samples the calibration does not hold (or leave --parity-data out to "
                         "hold out a split of --calibration)", code=ec.CONVERT_PARITY_IS_CALIBRATION)
    progress(f"warning: {dropped} of the {len(held)} --parity-data samples are also calibration samples: left out of "
             f"parity, which is measured on the {len(kept)} others")
    return kept, f"; {dropped} that are also calibration samples left out"


def _load_samples(task_cls, path, what: str) -> list:
    try:
        samples = task_cls.load_samples(path)
    except EdgeRuntimeError:
        raise
    except Exception as exc:  # an unreadable/ill-formed file: numpy, zipfile, json, PIL or OS errors
        raise InputError(f"{what} {path}: cannot read samples ({type(exc).__name__}: {str(exc)[:200]})",
                         code=ec.CONVERT_CALIBRATION_INVALID) from None
    if not samples:
        raise InputError(f"{what} {path} holds no samples", code=ec.CONVERT_CALIBRATION_INVALID)
    return samples


def _usable(task, samples, what: str, limits: Limits, first_only: bool = False) -> tuple[int, dict]:
    """How many samples the task can prepare for the model (what calibration and parity use),
    and the first one's feeds; none at all is an InputError quoting why the first failed."""
    n, why = 0, None
    first: dict | None = None
    for s in samples:
        try:
            prep = task.prepare(s, limits)
        except EdgeRuntimeError as exc:
            why = why or exc.message
            continue
        n += 1
        if first is None:
            first = prep.feeds
            if first_only:
                break
    if first is None:     # set with the first usable sample: no sample fits
        raise InputError(f"none of the {len(samples)} {what} samples fits the model: {why}",
                         code=ec.CONVERT_CALIBRATION_INVALID)
    return n, first


def record_source(job: Job, source_info: dict, source: Path, src_inputs, src_outputs, samples: Samples) -> dict:
    """The manifest's source record; an upgraded opset is checked on one sample and recorded."""
    req, opset = job.req, source_info["opset"]
    record = {"file": Path(req.source).name, "sha256": sha256_file(req.source), "opset": opset,
              "inputs": src_inputs, "outputs": src_outputs}
    if source == Path(req.source):
        return record
    _, feeds = _usable(job.task([job.fp32[0].spec]), samples.calib, "calibration", job.limits, first_only=True)
    check = _upgrade_check(job.work / "fp32_original.onnx", job.fp32[0].path, feeds)
    if not check["passed"]:
        raise InputError(f"{req.source}: the opset {opset} -> {QDQ_MIN_OPSET} upgrade changed the model's "
                         f"outputs (max abs diff {check['max_abs_diff']:.3g}); re-export the model at opset "
                         f"{QDQ_MIN_OPSET}+", code=ec.CONVERT_SOURCE_OPSET)
    record.update(opset_upgraded_from=opset, opset_upgraded_to=QDQ_MIN_OPSET,
                  opset_upgrade={"tool": "onnx.version_converter", "check": check})
    return record


def _upgrade_check(original: Path, upgraded: Path, feeds: dict) -> dict:
    """Run the source as given and as upgraded on one sample: the upgrade must not change the model."""
    import numpy as np
    import onnxruntime as ort

    outs = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, feeds)
            for p in (original, upgraded)]
    diff = max((float(np.max(np.abs(a.astype(np.float64) - b))) if a.size else 0.0) for a, b in zip(*outs))
    scale = max((float(np.max(np.abs(a))) if a.size else 0.0) for a in outs[0])
    return {"max_abs_diff": diff, "max_abs_output": scale, "samples": 1,
            "passed": bool(diff <= 1e-4 * max(scale, 1.0))}
