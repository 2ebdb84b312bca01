"""``convert()``: one source model → one artifact with one variant per target.

Steps: fix static shapes per bucket → load and split samples → build each
target's int8 bucket models with the calibration data (through the task's
pre-processing) → measure parity against the fp32 source on held-out samples
→ write the hashed manifest. The artifact is assembled in a temporary
directory and moved into place only when every target meets its parity
budget, so a failed convert never leaves something that looks valid.
"""

from __future__ import annotations

import os
import platform
import random
import shutil
import tempfile
import time
from pathlib import Path

from edge_runtime.artifact import ArtifactWriter, sha256_file
from edge_runtime.devices import registry
from edge_runtime.errors import ArtifactError, EdgeRuntimeError, InputError, ParityError
from edge_runtime.limits import DEFAULT_LIMITS
from edge_runtime.manifest import FORMAT, FORMAT_VERSION
from edge_runtime.models import get_task

from . import parity
from .onnx_io import QDQ_MIN_OPSET, io_specs, read_source, static_dims, upgrade_opset
from .parity_trials import Reference, measure_target
from .registry import ConversionFailed, get_converter
from .request import (TEXT_TASKS, ConvertRequest, available_targets, check_recipe, check_request,  # noqa: F401
                      fingerprint, recipe_for, sample_policy, toolchain)


def _sections(req: ConvertRequest, writer: ArtifactWriter, outputs: list[dict]) -> tuple[dict, dict]:
    first = outputs[0]
    if req.task in TEXT_TASKS:
        pre = {"kind": "text", "tokenizer": writer.add_file("tokenizer.json", req.tokenizer),
               "max_length": max(req.buckets), "pad_id": 0}
    elif req.task == "image-classification":
        pre = {"kind": "image", **req.preprocess}
    else:
        pre = {"kind": "tensors", **(req.preprocess or {})}
    post: dict = {}
    if req.task in ("text-classification", "image-classification"):
        post = {"output": first["name"], "softmax": True}
        if req.task == "image-classification":
            post["top_k"] = 5
        if req.labels:
            post["labels"] = writer.add_file("labels.txt", req.labels)
    elif req.task == "text-embedding":
        post = {"output": first["name"], "pooling": "mean" if len(first["shape"]) == 3 else "none",
                "normalize": True}
    return pre, post


def _load_samples(task_cls, path, what: str) -> list:
    try:
        samples = task_cls.load_samples(path)
    except EdgeRuntimeError:
        raise
    except Exception as exc:  # an unreadable/ill-formed file: numpy, zipfile, json, PIL or OS errors
        raise InputError(f"{what} {path}: cannot read samples ({type(exc).__name__}: {str(exc)[:200]})",
                         code="convert_calibration_invalid") from None
    if not samples:
        raise InputError(f"{what} {path} holds no samples", code="convert_calibration_invalid")
    return samples


def _usable(task, samples, what: str, first_only: bool = False) -> tuple[int, dict | None]:
    """How many samples the task can prepare for the model (what calibration and parity use),
    and the first one's feeds; none at all is an InputError quoting why the first failed."""
    n, first, why = 0, None, None
    for s in samples:
        try:
            prep = task.prepare(s, DEFAULT_LIMITS)
        except EdgeRuntimeError as exc:
            why = why or exc.message
            continue
        n += 1
        if first is None:
            first = prep.feeds
            if first_only:
                break
    if not n:
        raise InputError(f"none of the {len(samples)} {what} samples fits the model: {why}",
                         code="convert_calibration_invalid")
    return n, first


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


def _policy_fields(policy: dict, side: str) -> dict:
    """The sample-count policy as recorded next to the count it judged."""
    rec = policy[side]
    out = {"min_samples": rec["min_samples"], "warn_below_samples": rec["warn_below"]}
    if "warning" in rec:
        out["warning"] = rec["warning"]
    if rec.get("allow_few_samples"):
        out["allow_few_samples"] = True
    return out


def convert(req: ConvertRequest, progress=lambda step: None) -> dict:
    check_request(req)
    source_info = read_source(req.source)   # a TFLite, unparsable or already-quantized source: InputError
    check_recipe(req)
    targets, skipped = available_targets(req.targets, progress, allow_skip=req.allow_skip)
    import onnxruntime  # noqa: F401  (the fp32 reference runs on it)

    task_cls = get_task(req.task)
    if req.task in TEXT_TASKS:
        req.buckets = sorted(set(req.buckets or [64, 128]))
    out = Path(req.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    work = Path(tempfile.mkdtemp(prefix="edge-infer-convert-"))
    t_start = time.perf_counter()
    try:
        writer = ArtifactWriter(tmp)
        src_inputs, src_outputs = io_specs(req.source)
        source, opset = Path(req.source), source_info["opset"]
        if opset < QDQ_MIN_OPSET:   # QDQ's per-channel axis needs opset 13: upgrade where onnx can
            progress(f"upgrading the source from opset {opset} to {QDQ_MIN_OPSET} with onnx.version_converter "
                     "(per-channel QDQ needs it)")
            source = work / f"source_opset{QDQ_MIN_OPSET}.onnx"
            try:
                upgrade_opset(req.source, source, QDQ_MIN_OPSET)
            except ValueError as exc:
                raise InputError(f"{req.source} is opset {opset}; int8 QDQ needs opset {QDQ_MIN_OPSET} or later and "
                                 f"onnx.version_converter cannot upgrade it ({exc}); re-export the model at opset "
                                 f"{QDQ_MIN_OPSET}+", code="convert_source_opset") from None

        progress("fixing static shapes per bucket")
        from .onnx_shapes import fix_input_dims

        def fix(src, dst, dims):
            try:
                fix_input_dims(src, dst, dims)
            except Exception as exc:  # ValueError (bad dims), onnx's ValidationError / InferenceError
                raise InputError(f"{req.source}: cannot fix static input shapes {dims}: {type(exc).__name__}: "
                                 f"{str(exc)[:300]}", code="convert_shape_invalid") from None

        lengths = req.buckets if req.task in TEXT_TASKS else [None]
        fp32 = []  # (bucket name, fp32 path, bucket spec)
        for seq in lengths:
            try:
                dims = static_dims(src_inputs, seq_len=seq, overrides=req.input_shapes)
            except ValueError as exc:
                raise InputError(str(exc), code="convert_shape_dynamic") from None
            bname = f"seq{seq}" if seq else "static"
            path = work / f"fp32_{bname}.onnx"
            fix(source, path, dims)
            if source != Path(req.source) and not fp32:   # the source as given, to check the upgrade against
                fix(req.source, work / "fp32_original.onnx", dims)
            ins, outs = io_specs(path)
            fp32.append((bname, path, {"name": bname, "file": "", "inputs": ins, "outputs": outs}))

        pre, post = _sections(req, writer, src_outputs)
        draft = {"preprocess": pre, "postprocess": post}

        def read(rel):
            return (tmp / rel).read_bytes()

        ref_buckets = [b for _, _, b in fp32]
        try:
            task_ref = task_cls(draft, read, ref_buckets)
        except ArtifactError as exc:   # the contract refuses what the caller gave (labels, preprocess): theirs
            raise InputError(f"{exc.message} (from --labels / --preprocess and the source model)",
                             code=exc.code) from None

        progress("loading calibration and held-out samples")
        samples = _load_samples(task_cls, req.calibration, "--calibration")
        rng = random.Random(req.seed)
        order = list(range(len(samples)))
        rng.shuffle(order)
        if req.parity_data:
            held = _load_samples(task_cls, req.parity_data, "--parity-data")
            calib = [samples[i] for i in order][: req.max_calibration]
            parity_source = f"{Path(req.parity_data).name} ({len(held)} samples)"
        else:
            n_held = max(1, int(round(len(samples) * req.heldout_fraction)))
            if len(samples) - n_held < 1:
                raise InputError("calibration data too small to hold samples out", code="convert_calibration_small")
            held = [samples[i] for i in order[:n_held]]
            calib = [samples[i] for i in order[n_held:]][: req.max_calibration]
            parity_source = f"held-out split of {Path(req.calibration).name} ({len(held)} of {len(samples)})"
        n_calib, _ = _usable(task_ref, calib, "calibration")
        n_held, _ = _usable(task_ref, held, "held-out parity")
        policy = sample_policy(req, n_calib, n_held, progress)
        source_record = {"file": Path(req.source).name, "sha256": sha256_file(req.source), "opset": opset,
                         "inputs": src_inputs, "outputs": src_outputs}
        if source != Path(req.source):
            _, feeds = _usable(task_cls(draft, read, [fp32[0][2]]), calib, "calibration", first_only=True)
            check = _upgrade_check(work / "fp32_original.onnx", fp32[0][1], feeds)
            if not check["passed"]:
                raise InputError(f"{req.source}: the opset {opset} -> {QDQ_MIN_OPSET} upgrade changed the model's "
                                 f"outputs (max abs diff {check['max_abs_diff']:.3g}); re-export the model at opset "
                                 f"{QDQ_MIN_OPSET}+", code="convert_source_opset")
            source_record.update(opset_upgraded_from=opset, opset_upgraded_to=QDQ_MIN_OPSET,
                                 opset_upgrade={"tool": "onnx.version_converter", "check": check})

        ort_backend = registry.get_backend("onnxruntime")
        ref_sessions = [ort_backend.load(p, b, "cpu", {}) for _, p, b in fp32]
        reference = Reference(task_ref, ref_sessions, held, parity_source, req.min_parity)
        variants, failures = [], []
        for target in targets:
            converter = get_converter(target)
            buckets, quant, parity_files = [], None, []
            recipe = recipe_for(req.recipe, target, converter)
            budget = parity.budget_for(task_cls.parity_metric, req.min_parity)
            for bname, path, bspec in fp32:
                progress(f"{target}: quantizing bucket {bname} with {len(calib)} calibration samples")
                one = task_cls(draft, read, [bspec])
                prepared = []
                for s in calib:
                    try:
                        prepared.append(one.prepare(s, DEFAULT_LIMITS))
                    except InputError:
                        continue
                rel = f"{target}/{bname}{converter.suffix}"
                dst = tmp / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                try:
                    info = converter.build_bucket(path, dst, [p.feeds for p in prepared], {
                        "task": req.task, "recipe": recipe, "overrides": req.recipe_overrides, "work": work,
                        "task_obj": one, "prepared": prepared, "budget": budget, "torch_source": req.torch_source})
                except ConversionFailed as exc:  # the toolchain cannot build this source
                    raise InputError(f"{target}: {exc}", code="convert_target_failed") from None
                except ValueError as exc:  # a bad recipe/override or unusable calibration data
                    raise InputError(f"{target}: {exc}", code="convert_recipe_invalid") from None
                fields = info.pop("bucket_fields", None)   # a converter that names its own I/O
                quant = quant or info
                bucket = {"name": bname, "file": rel}
                if dst.is_dir():   # a package directory (.mlpackage): every file inside hashed
                    tree = writer.add_tree(rel)
                    entry = f"{rel}/{(fields or {}).pop('entry', '')}"
                    if entry not in tree:
                        raise InputError(f"{target}: package {rel} has no entry file {entry}",
                                         code="convert_target_failed")
                    bucket.update(file=entry, package=rel, extra_files=[f for f in tree if f != entry])
                else:
                    writer.add_file(rel)
                if fields:
                    ins, outs = fields.pop("inputs"), fields.pop("outputs")
                    if "parity_model" in fields:     # parity measured on a stand-in (see the converter)
                        parity_files.append(fields.pop("parity_model"))
                    bucket.update(fields)
                elif hasattr(converter, "describe"):
                    ins, outs, extra = converter.describe(dst)
                    if extra:
                        bucket["extra_files"] = [writer.add_file(f"{target}/{Path(e).name}") for e in extra]
                else:
                    ins, outs = io_specs(dst)
                bucket.update(inputs=ins, outputs=outs)
                buckets.append(bucket)
            quant = dict(quant)
            quant["calibration"] = {"samples": len(calib), "fingerprint": fingerprint(calib),
                                    "source": Path(req.calibration).name, **_policy_fields(policy, "calibration")}
            task_cand = task_cls(draft, read, buckets)
            runtime_opts, par, trials = measure_target(reference, target, converter, tmp, buckets, task_cand,
                                                       quant, parity_files, budget, progress)
            par.update(_policy_fields(policy, "parity"))
            if par["passed"] is False:
                failures.append(f"{target}: {par['metric']} {par['value']:.4f} < budget {par['budget']}")
            variant = {"target": target, "buckets": buckets, "quantization": quant, "parity": par,
                       "toolchain": toolchain(converter)}
            if len(trials) > 1 or runtime_opts:
                variant["runtime"] = runtime_opts
                variant["runtime_trials"] = [{"options": o, "parity": p["value"], "min": p.get("min"),
                                              "device_ms_median": p["device_ms_median"]} for o, p in trials]
            variants.append(variant)
        for s in ref_sessions:
            s.close()

        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "model": {"name": req.name or Path(req.source).stem, "version": req.version,
                      "source": source_record},
            "task": req.task,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": {},
            "preprocess": pre,
            "postprocess": post,
            "limits": dict(req.limits),
            "variants": variants,
            **({"skipped_targets": skipped} if skipped else {}),
            "build": {"seconds": round(time.perf_counter() - t_start, 1), "host": platform.machine()},
        }
        writer.write_manifest(manifest)
        if failures:
            raise ParityError("parity under budget: " + "; ".join(failures), variants=[
                {"target": v["target"], "parity": v["parity"]} for v in variants])
        if out.exists():
            shutil.rmtree(out)
        os.chmod(tmp, 0o755)  # mkdtemp makes it owner-only
        os.replace(tmp, out)
        return manifest
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


